//! `svc canary`: the lifecycle canary: create a microvm sandbox, pause it, fork
//! it, resume it, destroy both, and say how long each step took. Each sandbox is checked to
//! answer a command where it should. Whatever the canary made is destroyed even when a step
//! fails; the exit code says whether it passed.

use std::{process::ExitCode, time::Instant};

use anyhow::Context as _;
use base64::Engine as _;
use http::Method;
use serde::Serialize;
use svc_control::api::{
    CreateSandbox, Destroyed, ExecFrame, ExecRequest, ForkRequest, Forked, SandboxName, SandboxView,
};

use crate::client::{Client, SocketArg};

#[derive(Debug, clap::Args)]
pub struct CanaryArgs {
    /// The backend to run it on (fork needs microvm).
    #[arg(long, default_value = "microvm")]
    pub backend: String,
    /// Name prefix of the sandboxes it makes (`<prefix>` and `<prefix>-fork`).
    #[arg(long, default_value = "canary")]
    pub name: String,
    /// One JSON object: the steps, their times, and whether it passed.
    #[arg(long)]
    pub json: bool,
}

/// One step of the canary.
#[derive(Debug, Serialize)]
struct Step {
    step: &'static str,
    ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<String>,
}

#[derive(Debug, Serialize)]
struct Report {
    backend: String,
    passed: bool,
    total_ms: f64,
    steps: Vec<Step>,
    #[serde(skip_serializing_if = "Option::is_none")]
    failed: Option<String>,
}

pub fn run(socket: &SocketArg, a: CanaryArgs) -> anyhow::Result<ExitCode> {
    let client = Client::new(&socket.socket);
    let source = a.name.clone();
    let clone = format!("{}-fork", a.name);
    let checked = |n: String| SandboxName::new(n).map_err(|e| anyhow::anyhow!("--name: {e}"));
    let (source, clone) = (checked(source)?, checked(clone)?);
    crate::client::runtime()?.block_on(async move {
        let started = Instant::now();
        let mut steps = Vec::new();
        let result = sequence(&client, &a, &source, &clone, &mut steps).await;
        // Whatever it made goes, pass or fail.
        let t = Instant::now();
        let mut destroyed = Vec::new();
        for name in [&clone, &source] {
            let d: anyhow::Result<Destroyed> = client
                .call::<(), _>(Method::DELETE, &format!("/v1/sandboxes/{name}"), None)
                .await;
            if d.is_ok() {
                destroyed.push(name.as_str());
            }
        }
        let destroy_failed = result.is_ok() && destroyed.len() < 2;
        steps.push(Step {
            step: "destroy",
            ms: ms(t),
            detail: Some(destroyed.join(", ")),
        });
        let failed = match result {
            Err(e) => Some(format!("{e:#}")),
            Ok(()) if destroy_failed => Some("destroy: not every sandbox went".into()),
            Ok(()) => None,
        };
        let report = Report {
            backend: a.backend.clone(),
            passed: failed.is_none(),
            total_ms: ms(started),
            steps,
            failed,
        };
        if a.json {
            outln!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            outln!("canary on {}:", report.backend);
            for s in &report.steps {
                outln!(
                    "  {:<8} {:>9.1} ms{}",
                    s.step,
                    s.ms,
                    s.detail
                        .as_ref()
                        .map(|d| format!("  ({d})"))
                        .unwrap_or_default()
                );
            }
            match &report.failed {
                None => outln!("canary passed in {:.1} s", report.total_ms / 1000.0),
                Some(e) => outln!("canary FAILED: {e}"),
            }
        }
        Ok(if report.passed {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(crate::exit::FAILURE)
        })
    })
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

async fn sequence(
    client: &Client,
    a: &CanaryArgs,
    source: &SandboxName,
    clone: &SandboxName,
    steps: &mut Vec<Step>,
) -> anyhow::Result<()> {
    let t = Instant::now();
    let v: SandboxView = client
        .call(
            Method::POST,
            "/v1/sandboxes",
            Some(&bare_sandbox(source, &a.backend)),
        )
        .await
        .context("create")?;
    steps.push(Step {
        step: "create",
        ms: ms(t),
        detail: Some(format!("{} {}", v.backend, v.state)),
    });
    answers(client, source).await.context("create: exec")?;

    let t = Instant::now();
    let v: SandboxView = client
        .call::<(), _>(Method::POST, &format!("/v1/sandboxes/{source}/pause"), None)
        .await
        .context("pause")?;
    anyhow::ensure!(v.state == "paused", "pause: the sandbox is {}", v.state);
    steps.push(Step {
        step: "pause",
        ms: ms(t),
        detail: None,
    });

    fork(client, source, clone, steps).await?;

    let t = Instant::now();
    let v: SandboxView = client
        .call::<(), _>(
            Method::POST,
            &format!("/v1/sandboxes/{source}/resume"),
            None,
        )
        .await
        .context("resume")?;
    anyhow::ensure!(v.state == "running", "resume: the sandbox is {}", v.state);
    steps.push(Step {
        step: "resume",
        ms: ms(t),
        detail: None,
    });
    answers(client, source).await.context("resume: exec")?;
    Ok(())
}

/// A sandbox of `backend` with nothing added: no hosts, repository, secrets or workspace.
fn bare_sandbox(name: &SandboxName, backend: &str) -> CreateSandbox {
    CreateSandbox {
        backend: Some(backend.to_owned()),
        ..CreateSandbox::named(name.clone())
    }
}

/// The fork step: one clone of the paused `source`, which must then answer.
async fn fork(
    client: &Client,
    source: &str,
    clone: &SandboxName,
    steps: &mut Vec<Step>,
) -> anyhow::Result<()> {
    let t = Instant::now();
    let f: Forked = client
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{source}/fork"),
            Some(&ForkRequest {
                clones: vec![clone.clone()],
            }),
        )
        .await
        .context("fork")?;
    steps.push(Step {
        step: "fork",
        ms: ms(t),
        detail: Some(format!(
            "snapshot {:.0} ms, clone ready {:.0} ms",
            f.snapshot_ms,
            f.clones.first().map_or(0.0, |c| c.ready_ms)
        )),
    });
    answers(client, clone)
        .await
        .context("fork: exec in the clone")
}

/// The sandbox runs a command and says its name.
async fn answers(client: &Client, name: &str) -> anyhow::Result<()> {
    let body = serde_json::to_vec(&ExecRequest {
        user: None,
        root: None,
        hardening: None,
        argv: vec!["hostname".into()],
        env: Vec::new(),
        cwd: None,
        stdin: false,
        tty: None,
    })?;
    let resp = client
        .send(
            Method::POST,
            &format!("/v1/sandboxes/{name}/exec"),
            Some(body),
        )
        .await?;
    let status = resp.status();
    if !status.is_success() {
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await?
            .to_bytes();
        return Err(crate::client::refused(status, &body).into());
    }
    let mut out = Vec::new();
    let mut code = None;
    crate::client::for_each_line(resp.into_body(), |line| {
        match serde_json::from_slice::<ExecFrame>(line)? {
            ExecFrame::Stdout(d) => {
                out.extend(base64::engine::general_purpose::STANDARD.decode(d)?);
            }
            ExecFrame::Stderr(_) => {}
            ExecFrame::Exit(c) => code = Some(c),
            ExecFrame::Error(e) => anyhow::bail!("{e}"),
        }
        Ok(())
    })
    .await?;
    let said = String::from_utf8_lossy(&out).trim().to_owned();
    anyhow::ensure!(
        code == Some(0) && said == name,
        "`hostname` in {name} said {said:?} (exit {code:?})"
    );
    Ok(())
}
