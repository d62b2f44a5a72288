//! `svc doctor [DIR]`: the built-in host probes (kernel, BTF, bpffs, nftables, tun, forwarding,
//! svcd; the microvm backend's when wanted; a Kubernetes node's with `--kubernetes`), the
//! workspace's `doctor.probes`, then — only if
//! every required probe passed — its `doctor.tests`, run on this host in the
//! workspace directory (or, `--sandbox NAME`, inside that sandbox in /workspace),
//! one line per check; `--report-json PATH` writes the structured report
//! (`schema/doctor-report.v1.json`). Exit code 1 iff a required check failed, 2 when the
//! workspace's configuration is invalid.

use std::{io::Write as _, path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use svc_control::doctor::{CheckResult, Phase, Status};

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  svc doctor\n  svc doctor ~/src/widget --report-json /tmp/doctor.json\n\n\
Checks run without a shell (command + args), in the workspace directory, each in its own \
process group: at timeoutMs (default 60000) the whole group is killed and the check counts as \
failed; a failed check is run again up to `retries` times. With --sandbox NAME they run inside \
that sandbox instead, in /workspace (under coreutils' timeout there, which kills the group)."
)]
pub struct DoctorArgs {
    /// The workspace directory (default: the current directory).
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// Also write the report as JSON to this file.
    #[arg(long, value_name = "PATH")]
    report_json: Option<PathBuf>,
    /// Print the report as JSON instead of lines.
    #[arg(long)]
    json: bool,
    /// Print the JSON Schema of the report (schema/doctor-report.v1.json) and exit.
    #[arg(long, exclusive = true)]
    schema: bool,
    /// Skip the built-in host probes (kernel, BTF, nftables, svcd, …): the workspace's checks
    /// only.
    #[arg(long)]
    no_host: bool,
    /// Also probe the microvm backend (the images the running svcd uses, /dev/kvm, QEMU);
    /// automatic when the workspace's runtime.required names microvm.
    #[arg(long)]
    microvm: bool,
    /// Also probe this host as a Kubernetes node for pods with `runtimeClassName: svc`:
    /// containerd-shim-svc-v1 on PATH, containerd's configuration registering the runtime type
    /// io.containerd.svc.v1, containerd's socket, and svcd answering.
    #[arg(long)]
    kubernetes: bool,
    /// containerd's configuration file (with --kubernetes).
    #[arg(long, value_name = "PATH", default_value = svc_control::doctor::CONTAINERD_CONFIG)]
    containerd_config: PathBuf,
    /// Run the workspace's checks inside this sandbox (in /workspace, through svcd) instead
    /// of on this host; the built-in host probes still run here.
    #[arg(long, value_name = "NAME")]
    sandbox: Option<String>,
}

/// Checks run inside a sandbox, through svcd's exec: `timeout` in the sandbox kills each
/// check's process group at its timeout.
struct InSandbox<'a> {
    client: &'a crate::client::Client,
    name: &'a str,
}

impl svc_control::doctor::Runner for InSandbox<'_> {
    async fn attempt(
        &self,
        check: &svc_control::config::workspace::Check,
    ) -> svc_control::doctor::Attempt {
        use base64::Engine as _;
        use svc_control::api::{ExecFrame, ExecRequest};
        let ms = check.timeout_ms;
        let argv = svc_control::workspace::under_guest_timeout(
            ms,
            std::iter::once(check.command.clone()).chain(check.args.iter().cloned()),
        );
        let req = ExecRequest {
            user: None,
            root: None,
            hardening: None,
            argv,
            env: Vec::new(),
            cwd: Some(svc_control::api::WORKSPACE_GUEST_DIR.into()),
            stdin: false,
            tty: None,
        };
        let t0 = std::time::Instant::now();
        let run = async {
            let body = serde_json::to_vec(&req)?;
            let resp = self
                .client
                .send(
                    http::Method::POST,
                    &format!("/v1/sandboxes/{}/exec", self.name),
                    Some(body),
                )
                .await?;
            let status = resp.status();
            if !status.is_success() {
                let bytes = http_body_util::BodyExt::collect(resp.into_body())
                    .await?
                    .to_bytes();
                return Err(crate::client::refused(status, &bytes).into());
            }
            let (mut out, mut code, mut error) = (Vec::new(), None, None);
            let b64 = base64::engine::general_purpose::STANDARD;
            crate::client::for_each_line(resp.into_body(), |l| {
                match serde_json::from_slice::<ExecFrame>(l) {
                    Ok(ExecFrame::Stdout(d) | ExecFrame::Stderr(d)) => {
                        out.extend(b64.decode(d).unwrap_or_default());
                    }
                    Ok(ExecFrame::Exit(c)) => code = Some(c),
                    Ok(ExecFrame::Error(e)) => error = Some(e),
                    Err(_) => {}
                }
                Ok(())
            })
            .await?;
            anyhow::Ok((out, code, error))
        };
        let limit = std::time::Duration::from_millis(ms + 15_000);
        match tokio::time::timeout(limit, run).await {
            Err(_) => (
                Status::TimedOut,
                None,
                Some(format!("no result within {ms} ms: killed")),
                String::new(),
            ),
            Ok(Err(e)) => (
                Status::Failed,
                None,
                Some(format!("cannot run it in sandbox {}: {e:#}", self.name)),
                String::new(),
            ),
            Ok(Ok((out, Some(code), _))) => {
                svc_control::doctor::under_timeout(check, code, t0.elapsed(), &out)
            }
            Ok(Ok((_, None, error))) => (
                Status::Failed,
                None,
                Some(error.unwrap_or_else(|| "it ended without an exit code".into())),
                String::new(),
            ),
        }
    }
}

fn line(r: &CheckResult) -> String {
    let (mark, status) = match r.status {
        Status::Passed => ("✓", "passed"),
        Status::Failed => ("✗", "failed"),
        Status::TimedOut => ("✗", "timed out"),
        Status::Skipped => ("-", "skipped"),
    };
    let phase = match r.phase {
        Phase::Probe => "probe",
        Phase::Test => "test ",
    };
    let mut s = format!(
        "{mark} {phase} {:<24} {status:<9} {:>6.1}s",
        r.name,
        r.duration_ms as f64 / 1000.0
    );
    if r.attempts > 1 {
        s.push_str(&format!(" ({} attempts)", r.attempts));
    }
    if r.required {
        s.push_str(" [required]");
    }
    if let Some(why) = &r.reason
        && r.status != Status::Passed
    {
        s.push_str(&format!(": {why}"));
    }
    s
}

/// The built-in host probes, read with svcd.toml's `microvm.user`, `container.runtime` and
/// audit and state directories when this caller may read the file (else their defaults); with
/// `microvm`, the microvm images the running svcd uses (or, when it does not answer, those
/// this environment and svcd.toml name).
async fn host_probes(socket: &crate::client::SocketArg, microvm: bool) -> Vec<CheckResult> {
    let h = svc_control::config::loader::load_host_config(None).unwrap_or_default();
    let source = match microvm {
        true => Some(microvm_source(socket, &h).await),
        false => None,
    };
    let mut host = svc_control::doctor::host_probes(source.as_ref(), &h.microvm.user, |v| {
        std::env::var(v).ok()
    });
    host.push(svc_control::doctor::runtime_probe(
        h.container.runtime.as_deref(),
    ));
    host.push(svc_control::doctor::container_ids_probe(&h));
    host.extend(svc_control::doctor::free_space_probes(&[
        ("audit", &h.audit_dir),
        ("state", &h.state_dir),
    ]));
    host
}

/// Where the microvm images are: the running svcd's (`GET /v1/backends`), else this
/// environment's and `h`'s (svcd.toml's), saying why.
async fn microvm_source(
    socket: &crate::client::SocketArg,
    h: &svc_control::config::host::HostConfig,
) -> svc_control::doctor::ImageSource {
    use svc_control::doctor::ImageSource;
    let client = crate::client::Client::new(&socket.socket);
    let at = socket.socket.display();
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        client.call::<(), svc_control::api::Backends>(http::Method::GET, "/v1/backends", None),
    )
    .await;
    match answer {
        Ok(Ok(b)) => ImageSource::Svcd(
            b.backends.into_iter().find(|b| b.kind == "microvm"),
            at.to_string(),
        ),
        Ok(Err(e)) => ImageSource::Local(h.microvm.images.clone(), format!("on {at}: {e:#}")),
        Err(_) => ImageSource::Local(h.microvm.images.clone(), format!("on {at} within 5 s")),
    }
}

/// Whether svcd answers on its socket (`host:svcd`).
async fn svcd_probe(socket: &crate::client::SocketArg) -> CheckResult {
    let t0 = std::time::Instant::now();
    let client = crate::client::Client::new(&socket.socket);
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        client.call::<(), svc_control::api::Health>(http::Method::GET, "/v1/health", None),
    )
    .await;
    let (status, reason, output) = match answer {
        Ok(Ok(h)) => (
            Status::Passed,
            None,
            format!(
                "svcd {} (pid {}), {} sandboxes{}",
                h.version,
                h.pid,
                h.sandboxes,
                h.pools
                    .iter()
                    .map(|p| format!(", {} pool {} of {} ready", p.backend, p.ready, p.size))
                    .collect::<String>()
            ),
        ),
        Ok(Err(e)) => (
            Status::Failed,
            Some(format!(
                "svcd does not answer on {}: {e:#} — fix: start it (systemctl start svcd, or svcd run)",
                socket.socket.display()
            )),
            String::new(),
        ),
        Err(_) => (
            Status::Failed,
            Some(format!(
                "svcd did not answer on {} within 5 s — fix: check its log (journalctl -u svcd)",
                socket.socket.display()
            )),
            String::new(),
        ),
    };
    CheckResult {
        phase: Phase::Probe,
        name: "host:svcd".into(),
        status,
        required: true,
        attempts: 1,
        duration_ms: u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX),
        exit_code: None,
        reason,
        output,
    }
}

pub fn run(socket: &crate::client::SocketArg, a: DoctorArgs) -> anyhow::Result<ExitCode> {
    if a.schema {
        outln!(
            "{}",
            serde_json::to_string_pretty(&svc_control::doctor::schema())?
        );
        return Ok(ExitCode::SUCCESS);
    }
    let (root, loaded) = match crate::trust::load_valid(&a.dir)? {
        Ok(l) => l,
        Err(code) => return Ok(code),
    };
    let doctor = &loaded.effective.doctor;
    if doctor.probes.is_empty() && doctor.tests.is_empty() && !a.json {
        outln!(
            "no doctor checks in {} (doctor.probes, doctor.tests)",
            root.display()
        );
    }
    let json = a.json;
    let microvm = a.microvm
        || loaded
            .effective
            .runtime
            .required
            .contains(&svc_control::config::workspace::Backend::MICROVM);
    let rt = crate::client::runtime()?;
    let report = rt.block_on(async {
        let mut host = Vec::new();
        if !a.no_host {
            host = host_probes(socket, microvm).await;
        }
        if !a.no_host || a.kubernetes {
            host.push(svcd_probe(socket).await);
        }
        if a.kubernetes {
            let path = std::env::var("PATH").unwrap_or_default();
            host.extend(svc_control::doctor::kubernetes_probes(
                &a.containerd_config,
                &path,
            ));
        }
        let progress = |r: &CheckResult| {
            if !json {
                outln!("{}", line(r));
            }
        };
        match &a.sandbox {
            None => {
                svc_control::doctor::run(
                    host,
                    &doctor.probes,
                    &doctor.tests,
                    &svc_control::doctor::OnHost(&root),
                    progress,
                )
                .await
            }
            Some(name) => {
                let client = crate::client::Client::new(&socket.socket);
                let runner = InSandbox {
                    client: &client,
                    name,
                };
                svc_control::doctor::run(host, &doctor.probes, &doctor.tests, &runner, progress)
                    .await
            }
        }
    });
    let text = serde_json::to_string_pretty(&report)?;
    if let Some(path) = &a.report_json {
        write_whole(path, &text)?;
    }
    if json {
        outln!("{text}");
    } else {
        outln!("{}", summary(&report));
    }
    Ok(if report.required_failed {
        ExitCode::from(crate::exit::FAILURE)
    } else {
        ExitCode::SUCCESS
    })
}

/// Write `text` to `path` whole or not at all: a temporary file beside it, then a rename.
fn write_whole(path: &std::path::Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("writing the report to {}", path.display()))
}

/// The last line: how many checks passed, failed and were skipped.
fn summary(report: &svc_control::doctor::Report) -> String {
    let failed = report.results.iter().filter(|r| r.failed()).count();
    let skipped = report
        .results
        .iter()
        .filter(|r| r.status == Status::Skipped)
        .count();
    format!(
        "{} checks: {} passed, {failed} failed, {skipped} skipped{}",
        report.results.len(),
        report.results.len() - failed - skipped,
        if report.required_failed {
            " — a required check failed"
        } else {
            ""
        }
    )
}
