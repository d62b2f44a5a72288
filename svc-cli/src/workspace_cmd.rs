//! `svc workspace up|down|logs`: a sandbox made from a project directory — its
//! `.svc/workspace.json` (or compose file) and `.svc/config.yaml` — with the directory shared at
//! /workspace and its lifecycle hooks run by svcd.

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Subcommand};
use http::Method;
use svc_control::api::{self, CreateSandbox, SandboxView, WorkspaceLogRecord, WorkspaceSpec};

use crate::{
    client::Client,
    client::{SocketArg, runtime},
    project::Project,
    sandbox_cmd::print_sandbox,
    secret_cmd::read_secret,
};

#[derive(Debug, Subcommand)]
pub enum WorkspaceCommand {
    /// Make a sandbox for the project in DIR and run its hooks; wait until it is ready.
    #[command(after_long_help = UP_HELP)]
    Up(UpArgs),
    /// Approve the perimeter of the project in DIR for you: its .svc/config.yaml egress
    /// section, its .svc/workspace.json runtime and capabilities, and the host credentials its
    /// auth block lends. `up` enforces only an approved perimeter.
    #[command(after_long_help = TRUST_HELP)]
    Trust {
        /// The project directory (default: the current one).
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// Print svcd's answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run the workspace's onTeardown hooks, then destroy its sandbox.
    Down {
        /// The workspace's sandbox (its name as `up` printed it).
        name: String,
        /// Print the log records and the result as JSON lines.
        #[arg(long)]
        json: bool,
    },
    /// Print the workspace's log: each hook, its output, and how it ended.
    Logs {
        /// The workspace's sandbox (its name as `up` printed it).
        name: String,
        /// Keep printing new records as they are written (until the sandbox is destroyed).
        #[arg(long, short)]
        follow: bool,
        /// One JSON record per line.
        #[arg(long)]
        json: bool,
    },
}

const UP_HELP: &str = "\
What up does, in order:
  1. reads DIR's configuration (the same checks as `svc config check DIR`; invalid, e.g. an
     unknown capability in capabilities.required: exit 2) and checks that you approved its
     perimeter (egress section, runtime, capabilities, auth; `svc workspace trust DIR`): not
     approved or changed since, it is shown and, on a terminal, you are asked; otherwise exit 2
     (--trust approves it as it is);
  2. asks svcd for a sandbox: the backend from runtime.required (or --backend), curated egress
     with .svc/config.yaml's hosts, path rules and brokered secrets, DIR shared read-write at
     /workspace (your files are the sandbox root's there; DIR must be yours);
  3. svcd runs lifecycle.onSetup, then lifecycle.onStart, each command as `/bin/sh -c` in
     /workspace, each killed with its processes after lifecycle.timeoutMs (default 600000);
     their output is shown here as it comes and kept (svc workspace logs NAME);
  4. then starts services.definitions under a supervisor in the sandbox (restarted per
     services.defaults) and waits for the readiness profile's services (--profile);
  5. then forwards 127.0.0.1:localPort on this host to each spotlight.defaults remotePort in
     the sandbox (without a workspace.json: every port the compose file publishes); a local
     port in use refuses step 2, naming who holds it.
Exit 0 when the workspace is ready (event workspace.ready), 1 when a hook or a needed service
failed (the sandbox stays up to look into: svc sandbox exec NAME -- sh; svc workspace down
NAME), 2 when the configuration is invalid or its perimeter not approved.

Examples:
  svc workspace up                      # the project in this directory, named after it
  svc workspace up ~/src/app --name app-review --secret SVC_CRED_API_EXAMPLE_COM_TOKEN@store:api
  svc workspace logs app -f
  svc workspace down app";

const TRUST_HELP: &str = "\
The sandbox can write its project directory, .svc/ included, so the next `up` must not take
the guest's word for its own perimeter. svcd keeps, per user (the API caller's uid) and per
project directory, the perimeter you approved (its canonical text and SHA-256 digest), in its
own state directory where no sandbox and no other user can write. `up` and `sandbox create
--workspace` go ahead only when the perimeter is the one you approved; otherwise they show it
(or what changed, as a diff) and ask on a terminal, or refuse naming this command.
`svc config check DIR` says whether the perimeter as it is now is approved.

Examples:
  svc config check ~/src/app            # read it first
  svc workspace trust ~/src/app";

#[derive(Debug, Args)]
pub struct UpArgs {
    /// The project directory (default: the current one).
    #[arg(default_value = ".")]
    pub dir: PathBuf,
    /// The sandbox's name (default: the directory's name, lowercased, other characters as '-').
    #[arg(long)]
    pub name: Option<String>,
    /// The backend (container or microvm), instead of the workspace's runtime block.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(svc_control::runtime::choices()))]
    pub backend: Option<String>,
    /// Also allow this host (repeatable).
    #[arg(long)]
    pub allow_host: Vec<String>,
    /// Bind a code-host repository (owner/repo).
    #[arg(long)]
    pub repo: Option<String>,
    /// Broker a credential: VAR@SOURCE (env:VAR, file:PATH, store:NAME; repeatable).
    #[arg(long)]
    pub secret: Vec<String>,
    /// The readiness profile to wait for (default: `default` if the workspace has one, else
    /// its only profile, else every service).
    #[arg(long)]
    pub profile: Option<String>,
    /// Return once the sandbox is made; the hooks go on (svc workspace logs NAME -f).
    #[arg(long, short)]
    pub detach: bool,
    /// Print the log records and the resulting sandbox as JSON lines.
    #[arg(long)]
    pub json: bool,
    /// Approve the project's perimeter as it is now without asking (for scripts that have
    /// reviewed it: svc config check DIR shows it).
    #[arg(long)]
    pub trust: bool,
}

pub fn run(cmd: WorkspaceCommand, socket: &SocketArg) -> anyhow::Result<ExitCode> {
    let client = Client::new(&socket.socket);
    let rt = runtime()?;
    rt.block_on(async move {
        match cmd {
            WorkspaceCommand::Up(a) => up(&client, a).await,
            WorkspaceCommand::Trust { dir, json } => {
                crate::trust::approve(&client, &dir, json).await
            }
            WorkspaceCommand::Down { name, json } => down(&client, &name, json).await,
            WorkspaceCommand::Logs { name, follow, json } => {
                let path = log_path(&name, follow);
                client
                    .get_lines(&path, |l| {
                        show_line(l, json);
                        Ok(())
                    })
                    .await?;
                Ok(ExitCode::SUCCESS)
            }
        }
    })
}

/// A sandbox name made from a directory's name.
fn default_name(root: &std::path::Path) -> String {
    let base = root
        .file_name()
        .map(|n| n.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let mut name: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    name.truncate(api::MAX_NAME);
    let name = name.trim_matches('-').to_owned();
    if name.is_empty() {
        "workspace".into()
    } else {
        name
    }
}

fn log_path(name: &str, follow: bool) -> String {
    format!(
        "/v1/sandboxes/{name}/workspace/log{}",
        if follow { "?follow=1" } else { "" }
    )
}

async fn up(client: &Client, a: UpArgs) -> anyhow::Result<ExitCode> {
    let project = match Project::load(&a.dir)? {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let (root, loaded) = (&project.root, &project.loaded);
    let readiness = match svc_control::workspace::readiness::pick_profile(
        &loaded.effective.readiness,
        a.profile.as_deref(),
    ) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("✗ {e}");
            return Ok(ExitCode::from(crate::exit::USAGE));
        }
    };
    let name = a.name.clone().unwrap_or_else(|| default_name(root));
    let name = api::SandboxName::new(name).map_err(|e| anyhow::anyhow!("--name: {e}"))?;
    let approved = match project.approve(client, a.trust).await? {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    let secrets = a
        .secret
        .iter()
        .map(|s| read_secret(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let git_snapshot = git_snapshot_reported(root);
    let mut req = CreateSandbox {
        name: name.clone(),
        allow_hosts: a.allow_host,
        repo: a.repo,
        egress: None,
        secrets,
        context_path: None,
        runtime_required: None,
        backend: a.backend,
        ssh_repos: Vec::new(),
        workspace: Some(workspace_spec(root, loaded, readiness, git_snapshot)),
        project: None,
        // The egress section carries its own `httpsPushBranches` to svcd.
        https_push_branches: false,
        allowed_branches: Vec::new(),
        rootfs: None,
        pod: None,
    };
    project.apply(approved, &mut req);
    if !a.json {
        outln!("creating sandbox {name} for {} …", root.display());
    }
    create_and_follow(client, &req, a.json, a.detach).await
}

/// What svcd gets of the workspace: its root, egress, hooks, services, readiness profile,
/// forwards, auth defaults and the git snapshot taken at `up`.
fn workspace_spec(
    root: &std::path::Path,
    loaded: &svc_control::config::loader::LoadedWorkspace,
    readiness: Option<api::ReadinessProfile>,
    git_snapshot: Option<svc_control::policy::gitdir::Snapshot>,
) -> WorkspaceSpec {
    WorkspaceSpec {
        root: root.display().to_string(),
        egress: loaded.egress.as_ref().map(|e| e.to_file()),
        lifecycle: loaded.effective.lifecycle.clone(),
        services: loaded.effective.services.definitions.clone(),
        readiness,
        forwards: loaded.effective.spotlight.clone(),
        auth: workspace_auth(root, &loaded.effective.auth),
        git_snapshot,
    }
}

/// Create the sandbox; unless detached, follow its hooks' log until the workspace is ready
/// or a hook failed, and say which.
async fn create_and_follow(
    client: &Client,
    req: &CreateSandbox,
    json: bool,
    detach: bool,
) -> anyhow::Result<ExitCode> {
    let name = &req.name;
    let s: SandboxView = client
        .call(Method::POST, "/v1/sandboxes", Some(req))
        .await?;
    if !json {
        outln!(
            "sandbox {} is {} on {} ({})",
            s.name,
            s.state,
            s.backend,
            s.backend_reason
        );
    }
    if detach {
        if json {
            outln!("{}", serde_json::to_string(&s)?);
        } else {
            print_sandbox(&s);
            outln!("hooks go on in the sandbox: svc workspace logs {name} -f");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let ready = follow_until_settled(client, name, json).await?;
    let s: SandboxView = client
        .call::<(), _>(Method::GET, &format!("/v1/sandboxes/{name}"), None)
        .await?;
    if json {
        outln!("{}", serde_json::to_string(&s)?);
    }
    Ok(settled(&s, name, ready, json))
}

/// Follow the log until the workspace is ready (`Some(true)`) or a hook failed.
async fn follow_until_settled(
    client: &Client,
    name: &str,
    json: bool,
) -> anyhow::Result<Option<bool>> {
    let mut outcome: Option<bool> = None;
    let follow = client
        .get_lines(&log_path(name, true), |l| {
            show_line(l, json);
            match serde_json::from_slice::<WorkspaceLogRecord>(l) {
                Ok(r) if r.kind == "ready" => outcome = Some(true),
                Ok(r) if r.kind == "workspace_failed" => outcome = Some(false),
                _ => return Ok(()),
            }
            Err(anyhow::anyhow!(StopFollowing))
        })
        .await;
    match follow {
        Err(e) if e.is::<StopFollowing>() => Ok(outcome),
        Err(e) => Err(e),
        Ok(()) => anyhow::bail!("the sandbox {name} went away while its hooks ran"),
    }
}

/// What `up` says once the hooks settled: the forwards and how to get in, or why not.
fn settled(s: &SandboxView, name: &str, ready: Option<bool>, json: bool) -> ExitCode {
    if ready == Some(true) {
        if !json {
            for f in s.workspace.iter().flat_map(|w| &w.forwards) {
                outln!("forward: {f}");
            }
            outln!("workspace {name} is ready: svc sandbox exec {name} -- sh");
        }
        ExitCode::SUCCESS
    } else {
        let why = s
            .workspace
            .as_ref()
            .and_then(|w| w.failure.clone())
            .unwrap_or_else(|| "a hook failed".into());
        eprintln!(
            "✗ {why}\n  the sandbox stays up to look into: svc sandbox exec {name} -- sh; \
             svc workspace logs {name}; svc workspace down {name}"
        );
        ExitCode::from(crate::exit::FAILURE)
    }
}

/// `auth.defaults` as the sandbox gets it: with the `gitconfig` profile, the identity git
/// would commit with here (`git config user.name` / `user.email` in the project, as the
/// calling user); none set is a warning, not an error.
fn workspace_auth(
    root: &std::path::Path,
    auth: &svc_control::config::effective::EffectiveAuth,
) -> api::WorkspaceAuth {
    use svc_control::config::workspace::{AuthProfile, GitCredentialMode};
    let git = |key: &str| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(root)
            .args(["config", "--get", key])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    let git_identity = if auth.auth_profiles.contains(&AuthProfile::Gitconfig) {
        match (git("user.name"), git("user.email")) {
            (Some(name), Some(email)) => Some(api::GitIdentity { name, email }),
            _ => {
                eprintln!(
                    "warning: auth.defaults.authProfiles has gitconfig, but git has no \
                     user.name and user.email here (git config --global user.name …): the \
                     sandbox's git gets no identity"
                );
                None
            }
        }
    } else {
        None
    };
    api::WorkspaceAuth {
        git_identity,
        ssh_agent_forward: auth.ssh_agent_forward,
        git_host_helper: auth.git_credential_mode == Some(GitCredentialMode::HostHelper),
        git_config_writable: auth.git_config_writable,
    }
}

/// Ends a followed stream early (not an error).
#[derive(Debug)]
struct StopFollowing;

impl std::fmt::Display for StopFollowing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stopped following")
    }
}

impl std::error::Error for StopFollowing {}

async fn down(client: &Client, name: &str, json: bool) -> anyhow::Result<ExitCode> {
    // What host git executed in the project when it came up, as svcd kept it.
    let before = client
        .call::<(), SandboxView>(Method::GET, &format!("/v1/sandboxes/{name}"), None)
        .await
        .ok()
        .and_then(|s| s.workspace)
        .and_then(|w| w.git_snapshot.map(|g| (w.root, g)));
    // What the log says from now on (onTeardown, the services stopping), shown while svcd
    // does it. A sandbox without a workspace is destroyed all the same.
    let mut last = 0;
    let _ = client
        .get_lines(&log_path(name, false), |l| {
            if let Ok(r) = serde_json::from_slice::<WorkspaceLogRecord>(l) {
                last = last.max(r.seq);
            }
            Ok(())
        })
        .await;
    let (following, mut followed) = tokio::sync::watch::channel(false);
    let follower = {
        let client = client.clone();
        let path = log_path(name, true);
        tokio::spawn(async move {
            let _ = client
                .get_lines(&path, |l| {
                    let _ = following.send(true);
                    if serde_json::from_slice::<WorkspaceLogRecord>(l).is_ok_and(|r| r.seq > last) {
                        show_line(l, json);
                    }
                    Ok(())
                })
                .await;
        })
    };
    // The follower is there (it has read the log so far) before the destroy starts.
    if last > 0 {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), followed.wait_for(|f| *f))
            .await;
    }
    let d: Result<api::Destroyed, _> = client
        .call::<(), _>(Method::DELETE, &format!("/v1/sandboxes/{name}"), None)
        .await;
    // The stream ends when the sandbox is gone; do not wait long for the last records.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), follower).await;
    let d = d?;
    if json {
        outln!("{}", serde_json::to_string(&d)?);
    } else {
        outln!("destroyed {}: {}", d.name, d.removed.join(", "));
    }
    // The guest is gone: nothing changes the project under this look.
    if let Some((root, before)) = before {
        report_git_changes(&root, &before, json)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// What host git executes in the project, for the report at `down`; and before anything
/// starts, what git on the host would run or be redirected by beyond the project's own
/// `.git/config` and hooks (a previous session's guest may have put it there:
/// `policy::gitdir::findings`), said on stderr.
fn git_snapshot_reported(root: &std::path::Path) -> Option<svc_control::policy::gitdir::Snapshot> {
    let s = crate::git_snapshot::take(root)?;
    let found = svc_control::policy::gitdir::findings(&s);
    if found.is_empty() {
        return Some(s);
    }
    eprintln!(
        "! git on this host would run code or take configuration from these in {} (paths \
         relative to it; a sandbox may have put them there): review them before your next \
         git command there",
        root.display()
    );
    for f in &found {
        eprintln!("    {f}");
    }
    Some(s)
}

/// Say what changed during the session in what host git executes in the project.
fn report_git_changes(
    root: &str,
    before: &svc_control::policy::gitdir::Snapshot,
    json: bool,
) -> anyhow::Result<()> {
    let after = crate::git_snapshot::take(std::path::Path::new(root)).unwrap_or_default();
    let changes = svc_control::policy::gitdir::changes(before, &after);
    if json {
        outln!(
            "{}",
            serde_json::json!({"kind": "git_changes", "root": root, "changes": changes})
        );
    } else if !changes.is_empty() {
        eprintln!(
            "! what git runs as you in {root} changed during the session (paths relative to \
             it; review them before your next git command there):"
        );
        for c in &changes {
            eprintln!("    {c}");
        }
    }
    Ok(())
}

/// Print one log record: as it is (`json`) or for people.
fn show_line(l: &[u8], json: bool) {
    if json {
        outln!("{}", String::from_utf8_lossy(l));
        return;
    }
    let Ok(r) = serde_json::from_slice::<WorkspaceLogRecord>(l) else {
        // Not a record (a follower that fell behind is told how many it missed).
        outln!("{}", String::from_utf8_lossy(l));
        return;
    };
    let key = match r.phase.as_str() {
        "setup" => "onSetup",
        "start" => "onStart",
        "teardown" => "onTeardown",
        other => other,
    };
    let hook = r.hook.map_or(String::new(), |i| format!("{key}[{i}]"));
    let service = r.service.clone().unwrap_or_default();
    let secs =
        |ms: Option<u64>| ms.map_or(String::new(), |m| format!(" ({:.1} s)", m as f64 / 1000.0));
    match r.kind.as_str() {
        "hook_started" => outln!("▸ {hook} {}", r.command.unwrap_or_default()),
        "output" if r.service.is_some() => {
            outln!("  {service} │ {}", r.text.unwrap_or_default());
        }
        "output" => outln!("  │ {}", r.text.unwrap_or_default()),
        "service_started" => outln!(
            "▸ service {service} started{}",
            r.restarts
                .filter(|n| *n > 0)
                .map_or(String::new(), |n| format!(" (restart {n})"))
        ),
        "service_exited" => outln!(
            "· service {service} exited with {}",
            r.exit_code.map_or("?".into(), |c| c.to_string())
        ),
        "service_restarting" => outln!("↻ service {service}: restart {}", r.restarts.unwrap_or(0)),
        "service_failed" => outln!("✗ service {service} failed: {}", r.text.unwrap_or_default()),
        "service_healthy" => outln!("✓ service {service} healthy"),
        "service_running" => outln!("✓ service {service} running"),
        "service_unhealthy" => outln!("! service {service} unhealthy"),
        "service_stopped" => outln!("■ service {service} stopped {}", r.text.unwrap_or_default()),
        "workspace_failed" => {}
        "hook_finished" => outln!("✓ {hook}{}", secs(r.duration_ms)),
        "hook_failed" => outln!("✗ {}{}", r.text.unwrap_or_default(), secs(r.duration_ms)),
        "phase_finished" => {}
        "ready" => outln!("● workspace ready"),
        _ => outln!("· {} {}", r.kind, r.text.unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_directories() {
        for (dir, want) in [
            ("/home/dev/my_App", "my-app"),
            ("/src/widget", "widget"),
            ("/src/--x--", "x"),
            ("/src/ü", "workspace"),
            ("/", "workspace"),
        ] {
            let got = default_name(std::path::Path::new(dir));
            assert_eq!(got, want, "{dir}");
            api::SandboxName::check(&got).unwrap_or_else(|e| panic!("{dir}: {e}"));
        }
    }
}
