//! The approval of a project's perimeter: `svc workspace trust DIR`, the check that
//! `svc workspace up` and `svc sandbox create --workspace` make before they ask svcd for a
//! sandbox, and the line `svc config check` prints.
//!
//! svcd keeps the approvals (per API caller, outside every project) and decides with
//! `policy::trust`; this module shows its answer and, on a terminal, asks.

use std::{
    io::IsTerminal as _,
    path::{Path, PathBuf},
    process::ExitCode,
};

use http::Method;
use svc_control::{
    api::{TrustCheck, TrustRequest},
    config::{
        effective::ApiParams,
        loader::{self, LoadedWorkspace},
        workspace::GitCredentialMode,
    },
    policy::trust::Perimeter,
};

use crate::client::Client;

/// What a project's files say about its sandbox's perimeter.
pub fn perimeter(loaded: &LoadedWorkspace) -> Perimeter {
    let e = &loaded.effective;
    Perimeter {
        egress: loaded.egress.as_ref().map(|e| e.to_file()),
        runtime: e.runtime.required.clone(),
        capabilities: e.capabilities.clone(),
        ssh_agent_forward: e.auth.ssh_agent_forward,
        git_host_helper: e.auth.git_credential_mode == Some(GitCredentialMode::HostHelper),
        git_config_writable: e.auth.git_config_writable,
    }
}

/// Before a creation from the project at `root`: `Ok(true)` to approve its perimeter with the
/// request (`--trust`, or the user said yes), `Ok(false)` when it is already approved, or the
/// exit code when it is refused (the reason printed).
pub async fn ensure(
    client: &Client,
    root: &Path,
    perimeter: &Perimeter,
    trust: bool,
) -> anyhow::Result<Result<bool, ExitCode>> {
    if trust {
        return Ok(Ok(true));
    }
    let c = check(client, root, perimeter).await?;
    if c.decision == "approved" {
        return Ok(Ok(false));
    }
    let shown = root.display();
    describe(&c);
    if std::io::stdin().is_terminal() && std::io::stderr().is_terminal() {
        eprint!("enforce this perimeter and remember your approval? [y/N] ");
        let mut answer = String::new();
        std::io::stdin().read_line(&mut answer)?;
        if matches!(answer.trim(), "y" | "Y" | "yes") {
            return Ok(Ok(true));
        }
        eprintln!("✗ not approved: nothing was created");
    } else {
        eprintln!(
            "✗ refused: review it, then approve it with `svc workspace trust {shown}` (or pass \
             --trust)"
        );
    }
    Ok(Err(ExitCode::from(crate::exit::FAILURE)))
}

/// svcd's answer for the caller: is the project's perimeter approved as it is now?
pub async fn check(
    client: &Client,
    root: &Path,
    perimeter: &Perimeter,
) -> anyhow::Result<TrustCheck> {
    client
        .call(
            Method::POST,
            "/v1/trust/check",
            Some(&request(root, perimeter)),
        )
        .await
}

/// `svc workspace trust DIR`: approve the perimeter as it is now.
pub async fn approve(client: &Client, dir: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let (root, loaded) = match load_valid(dir)? {
        Ok(l) => l,
        Err(code) => return Ok(code),
    };
    let c: TrustCheck = client
        .call(
            Method::POST,
            "/v1/trust",
            Some(&request(&root, &perimeter(&loaded))),
        )
        .await?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        outln!("approved for uid {} ({}):", c.uid, c.digest);
        outln!("{}", indent(&c.content).trim_end());
        outln!(
            "svc workspace up {} enforces this perimeter until it changes",
            root.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Print why `c` is not approved: the whole perimeter, or the change.
pub fn describe(c: &TrustCheck) {
    match (c.decision.as_str(), &c.diff) {
        ("changed", Some(diff)) => {
            eprintln!(
                "! the perimeter of {} changed since you (uid {}) approved it ({}); - approved, \
                 + now:",
                c.root,
                c.uid,
                c.approved_at.as_deref().unwrap_or("?")
            );
            eprint!("{}", indent(diff));
        }
        _ => {
            eprintln!(
                "! the perimeter of {} is not approved by you (uid {}); it says:",
                c.root, c.uid
            );
            eprint!("{}", indent(&c.content));
        }
    }
}

/// The `approval` line of `svc config check`.
pub fn summary(c: &TrustCheck) -> String {
    match c.decision.as_str() {
        "approved" => format!(
            "approved by uid {} ({}, {})",
            c.uid,
            c.digest,
            c.approved_at.as_deref().unwrap_or("?")
        ),
        "changed" => format!(
            "CHANGED since uid {} approved it: svc workspace up refuses it until `svc workspace \
             trust {}`",
            c.uid, c.root
        ),
        _ => format!(
            "not approved by uid {}: svc workspace up refuses it until `svc workspace trust {}`",
            c.uid, c.root
        ),
    }
}

fn request(root: &Path, perimeter: &Perimeter) -> TrustRequest {
    TrustRequest {
        root: root.display().to_string(),
        perimeter: perimeter.clone(),
    }
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

/// The workspace in `dir` loaded for a command that needs it valid (`svc doctor`, `svc
/// workspace up`): its canonical root and configuration, or — its errors printed, each with
/// its place — exit code 2.
pub(crate) fn load_valid(
    dir: &std::path::Path,
) -> anyhow::Result<Result<(PathBuf, LoadedWorkspace), ExitCode>> {
    use anyhow::Context as _;
    let root = std::fs::canonicalize(dir)
        .with_context(|| format!("the workspace directory {}", dir.display()))?;
    match loader::load_workspace(&root, &ApiParams::default(), std::env::vars()) {
        Ok(l) => Ok(Ok((root, l))),
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("✗ {e}");
            }
            eprintln!(
                "the workspace's configuration is invalid: svc config check {}",
                root.display()
            );
            Ok(Err(ExitCode::from(crate::exit::CONFIG)))
        }
    }
}
