//! `svc config …`: local commands that read a workspace's configuration; svcd is asked only
//! whether its perimeter is approved (`svc workspace trust`), and need not be running.

use std::{fmt::Write as _, path::PathBuf, process::ExitCode};

use clap::Subcommand;
use svc_control::config::{
    ConfigError,
    effective::{ApiParams, EffectiveAuth, EffectiveWorkspace, Source},
    env,
    loader::{self, LoadedWorkspace},
    workspace::{Check, WorkspaceFile},
};

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a workspace's configuration and print the effective result.
    ///
    /// Reads DIR/.svc/workspace.json and DIR/.svc/config.yaml; without a workspace.json, the
    /// compose file in DIR (compose.yaml, compose.yml, docker-compose.yml,
    /// docker-compose.yaml: the first found) gives the Spotlight forwards. Every error is
    /// reported with its file, location and reason. Then svcd is asked whether you approved
    /// the workspace's perimeter as it is now (`svc workspace trust DIR`); its answer is shown,
    /// and does not change the exit code. Exits 0 when valid, 1 when not, 78 when DIR is
    /// not a directory.
    Check {
        /// The workspace root.
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// Print one JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the JSON Schema of .svc/workspace.json version 1 (as shipped in
    /// schema/workspace.v1.json).
    Schema,
}

pub fn run(cmd: ConfigCommand, socket: &crate::client::SocketArg) -> anyhow::Result<ExitCode> {
    match cmd {
        ConfigCommand::Check { dir, json } => Ok(check(&dir, json, socket)),
        ConfigCommand::Schema => {
            outln!("{}", schema_json());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The v1 schema, pretty-printed, exactly as committed in `schema/workspace.v1.json`.
pub fn schema_json() -> String {
    let schema = svc_control::config::workspace::json_schema::<WorkspaceFile>();
    serde_json::to_string_pretty(&schema).unwrap_or_default()
}

/// svcd's answer on the approval of `l`'s perimeter, or why there is none.
fn approval(
    l: &LoadedWorkspace,
    socket: &crate::client::SocketArg,
) -> Result<svc_control::api::TrustCheck, String> {
    let client = crate::client::Client::new(&socket.socket);
    let root = std::fs::canonicalize(&l.root).map_err(|e| format!("{}: {e}", l.root.display()))?;
    let perimeter = crate::trust::perimeter(l);
    let rt = crate::client::runtime().map_err(|e| e.to_string())?;
    rt.block_on(crate::trust::check(&client, &root, &perimeter))
        .map_err(|e| format!("{e:#}"))
}

/// The exit code of a workspace directory that is not there (sysexits' EX_CONFIG).
const EXIT_NO_DIRECTORY: u8 = 78;

/// Why `dir` cannot be a workspace, if it cannot: it is missing or no directory.
fn not_a_directory(dir: &std::path::Path) -> Option<ConfigError> {
    let why = match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => return None,
        Ok(_) => "not a directory".to_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "no such directory".to_owned(),
        Err(e) => e.to_string(),
    };
    Some(ConfigError::new(
        dir,
        svc_control::config::Location::default(),
        format!("{why}: svc config check takes a workspace directory (the one holding .svc/)"),
    ))
}

fn check(dir: &std::path::Path, json: bool, socket: &crate::client::SocketArg) -> ExitCode {
    let mut errors: Vec<ConfigError> = Vec::new();
    if let Err(e) = env::check_removed(|v| std::env::var(v).ok()) {
        errors.extend(e.0);
    }
    let missing = not_a_directory(dir);
    let loaded = match &missing {
        Some(e) => {
            errors.push(e.clone());
            None
        }
        None => match loader::load_workspace(dir, &ApiParams::default(), std::env::vars()) {
            Ok(l) => Some(l),
            Err(e) => {
                errors.extend(e.0);
                None
            }
        },
    };
    let ok = errors.is_empty();
    let approval = loaded.as_ref().filter(|_| ok).map(|l| approval(l, socket));
    if json {
        let (approval, approval_error) = match approval {
            Some(Ok(c)) => (Some(c), None),
            Some(Err(e)) => (None, Some(e)),
            None => (None, None),
        };
        let doc = serde_json::json!({
            "ok": ok,
            "root": dir,
            "workspace": loaded,
            "errors": errors,
            "approval": approval,
            "approvalError": approval_error,
        });
        outln!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else if let (true, Some(l)) = (ok, &loaded) {
        outln!("{}", render(l).trim_end());
        match approval {
            Some(Ok(c)) => {
                outln!("  approval      {}", crate::trust::summary(&c));
                if c.decision != "approved" {
                    crate::trust::describe(&c);
                }
            }
            Some(Err(e)) => outln!("  approval      unknown ({e})"),
            None => {}
        }
    } else {
        for e in &errors {
            eprintln!("✗ {e}");
        }
        let n = errors.len();
        eprintln!(
            "{n} error{} in {}",
            if n == 1 { "" } else { "s" },
            dir.display()
        );
    }
    if ok {
        ExitCode::SUCCESS
    } else if missing.is_some() {
        ExitCode::from(EXIT_NO_DIRECTORY)
    } else {
        ExitCode::from(crate::exit::CONFIG)
    }
}

fn render(l: &LoadedWorkspace) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "workspace {}", l.root.display());
    match &l.workspace_file {
        Some(p) => {
            let _ = writeln!(out, "  ✓ {} (version 1)", p.display());
        }
        None => {
            let _ = writeln!(out, "  · no {}", loader::WORKSPACE_JSON);
        }
    }
    match &l.egress {
        Some(e) => {
            let _ = writeln!(
                out,
                "  ✓ {} (egress: {} open, {} policy-gated, {} brokered secret{})",
                l.root.join(loader::CONFIG_YAML).display(),
                e.allow.len(),
                e.policy.len(),
                e.secrets.len(),
                if e.secrets.len() == 1 { "" } else { "s" }
            );
        }
        None => {
            let _ = writeln!(out, "  · no {}", loader::CONFIG_YAML);
        }
    }
    if let Some(c) = &l.compose {
        let _ = writeln!(
            out,
            "  ✓ {} (compose fallback: {} published port{})",
            c.file.display(),
            c.ports.forwards.len(),
            if c.ports.forwards.len() == 1 { "" } else { "s" }
        );
        for s in &c.ports.inactive_services {
            let _ = writeln!(
                out,
                "    · service {s} skipped: none of its profiles is active (COMPOSE_PROFILES)"
            );
        }
    }
    for w in &l.warnings {
        let _ = writeln!(out, "  ! {w}");
    }
    let _ = writeln!(
        out,
        "\neffective configuration (API parameters > workspace.json > built-in defaults):"
    );
    render_effective(&mut out, &l.effective);
    out
}

/// The effective configuration, a line (or a few) per section, each with where it came from.
fn render_effective(out: &mut String, e: &EffectiveWorkspace) {
    render_runtime(out, e);
    render_services(out, e);
    render_spotlight(out, e);
    render_auth(out, &e.auth);
    render_lifecycle(out, e);
    render_readiness(out, e);
    render_doctor(out, e);
}

/// Which layer `key` came from, as printed.
fn src(e: &EffectiveWorkspace, key: &str) -> &'static str {
    match e.sources.get(key) {
        Some(Source::Api) => "api",
        Some(Source::WorkspaceJson) => "workspace.json",
        Some(Source::Compose) => "compose",
        Some(Source::Default) | None => "default",
    }
}

/// `items` joined with commas, or `none`.
fn list(items: Vec<String>) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}

/// `runtime` and `capabilities`.
fn render_runtime(out: &mut String, e: &EffectiveWorkspace) {
    let runtime = if e.runtime.required.is_empty() {
        "automatic".to_owned()
    } else {
        format!(
            "{} (prefer-first)",
            list(
                e.runtime
                    .required
                    .iter()
                    .map(|b| b.name().to_owned())
                    .collect()
            )
        )
    };
    let _ = writeln!(
        out,
        "  runtime       {runtime}  [{}]",
        src(e, "runtime.required")
    );
    let _ = writeln!(
        out,
        "  capabilities  {}  [{}]",
        list(e.capabilities.iter().map(|c| c.name().to_owned()).collect()),
        src(e, "capabilities")
    );
}

/// The restart defaults, then a line per service.
fn render_services(out: &mut String, e: &EffectiveWorkspace) {
    let s = &e.services;
    let _ = writeln!(
        out,
        "  services      stopTimeoutMs={} [{}] autoRestart={} [{}] maxRestarts={} [{}] restartDelayMs={} [{}]",
        s.stop_timeout_ms,
        src(e, "services.stopTimeoutMs"),
        s.auto_restart,
        src(e, "services.autoRestart"),
        s.max_restarts,
        src(e, "services.maxRestarts"),
        s.restart_delay_ms,
        src(e, "services.restartDelayMs")
    );
    for d in &s.definitions {
        let _ = writeln!(
            out,
            "    service {:<12} {}  [autoRestart={} maxRestarts={} restartDelayMs={} stopTimeoutMs={}{}]",
            d.name,
            d.command,
            d.auto_restart,
            d.max_restarts,
            d.restart_delay_ms,
            d.stop_timeout_ms,
            if d.health_check.is_some() {
                " healthCheck"
            } else {
                ""
            }
        );
    }
}

fn render_spotlight(out: &mut String, e: &EffectiveWorkspace) {
    let forwards: Vec<String> = e
        .spotlight
        .iter()
        .map(|f| {
            format!(
                "{}:{} → localhost:{}",
                f.service, f.remote_port, f.local_port
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "  spotlight     {}  [{}]",
        list(forwards),
        src(e, "spotlight")
    );
}

fn render_auth(out: &mut String, a: &EffectiveAuth) {
    let profiles: Vec<String> = a
        .auth_profiles
        .iter()
        .map(|p| format!("{p:?}").to_lowercase())
        .collect();
    let mode = a.git_credential_mode.map_or("none", |_| "host-helper");
    let _ = writeln!(
        out,
        "  auth          profiles={} sshAgentForward={} gitCredentialMode={mode}",
        list(profiles),
        a.ssh_agent_forward
    );
}

fn render_lifecycle(out: &mut String, e: &EffectiveWorkspace) {
    let lc = &e.lifecycle;
    let _ = writeln!(
        out,
        "  lifecycle     onSetup={} onStart={} onTeardown={} command(s) timeoutMs={}  [{}]",
        lc.on_setup.len(),
        lc.on_start.len(),
        lc.on_teardown.len(),
        lc.timeout_ms,
        src(e, "lifecycle")
    );
}

fn render_readiness(out: &mut String, e: &EffectiveWorkspace) {
    let profiles: Vec<String> = e
        .readiness
        .iter()
        .map(|(name, entries)| {
            format!(
                "{name} ({} entr{})",
                entries.len(),
                if entries.len() == 1 { "y" } else { "ies" }
            )
        })
        .collect();
    let _ = writeln!(out, "  readiness     {}", list(profiles));
}

fn render_doctor(out: &mut String, e: &EffectiveWorkspace) {
    let checks = |cs: &[Check]| {
        list(
            cs.iter()
                .map(|c| format!("{}{}", c.name, if c.required { " (required)" } else { "" }))
                .collect(),
        )
    };
    let _ = writeln!(
        out,
        "  doctor        probes: {}; tests: {}",
        checks(&e.doctor.probes),
        checks(&e.doctor.tests)
    );
}
