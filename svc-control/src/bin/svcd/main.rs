//! svcd, the host supervisor.
//!
//! `svcd run` is the supervisor: the API socket, the sandboxes, the fence, the DNS guard and the
//! proxy. `svcd fence …` are the operator's fence tools on the pinned objects.
#![forbid(unsafe_code)]

mod fence_run;
mod images;
mod man;
mod setup_host;
mod stop_sandboxes;

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use svc_control::{
    config::{env, loader},
    dataplane::{self, Fence},
};

/// svcd: the svc host supervisor.
#[derive(Debug, Parser)]
#[command(
    name = "svcd",
    version,
    about = "svcd, the svc host supervisor",
    long_about = "svcd, the svc host supervisor: runs sandboxes and fences everything they can \
                  reach. `svcd run` starts it (as root; see packaging/svcd.service); `svc` \
                  talks to it over its unix socket."
)]
struct Cli {
    /// Host configuration file (default: /etc/svc/svcd.toml if it exists, else built-in
    /// defaults).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the supervisor until SIGTERM/SIGINT: API socket, sandboxes, fence, DNS guard, proxy.
    /// Log detail: RUST_LOG (default info).
    Run {
        /// The nftables table svcd owns.
        #[arg(long, default_value = "svc")]
        nft_table: String,
        /// Seconds in-flight API calls get at shutdown.
        #[arg(long, default_value_t = 10)]
        grace: u64,
    },
    /// Inspect and operate the eBPF fence directly (operator diagnostics).
    #[command(subcommand)]
    Fence(FenceCommand),
    /// Check the host configuration as `svcd run` would load it, without running: every
    /// error at once with its file and line, warnings for settings that are valid but likely
    /// not meant. Exits 0 when it is valid, 78 when it is not.
    #[command(alias = "configtest")]
    CheckConfig,
    /// Print the JSON Schema of one audit line (schema/audit.v1.json).
    AuditSchema,
    /// Check the coding agent's credentials once, as a running svcd's guardian does, and
    /// refresh the token if it expires within the lead time (credentials.agent_home,
    /// credentials.agent_token_endpoint). Prints the outcome as JSON; exits 1 when the refresh
    /// failed.
    Guardian {
        /// Take this instant as now (milliseconds since the Unix epoch) instead of the clock.
        #[arg(long, value_name = "UNIX_MS")]
        now: Option<u64>,
    },
    /// Make the host accounts svcd needs if they are missing: the API group (api_group) and
    /// the backends' system users (container.user, microvm.user), each with a free range of
    /// 65536 ids in /etc/subuid and /etc/subgid (container.id_ranges = "per-sandbox": 65536 per
    /// sandbox the ipv4_pool allows, plus one). Idempotent; the Debian package runs it.
    SetupHost {
        /// Only say what would be made.
        #[arg(long)]
        dry_run: bool,
    },
    /// The sandboxes' images: `build` them from Debian packages on this host (idempotent),
    /// or see their `status`.
    #[command(subcommand)]
    Images(images::ImagesCommand),
    /// Stop every sandbox's guest while svcd is stopped, keeping their state (the Debian
    /// package's prerm runs it on `apt remove`): SIGTERM, then SIGKILL after --grace. The next
    /// svcd lists them as dead; `svc sandbox destroy` or `apt purge` removes their state.
    /// Refused while svcd runs on the same state directory.
    StopSandboxes {
        /// Seconds a guest gets to end after SIGTERM before it is killed.
        #[arg(long, default_value_t = 5, value_name = "SECONDS")]
        grace: u64,
    },
    /// Write the man pages into DIR/man8 (svcd.8, one per subcommand) and DIR/man5
    /// (svcd.toml.5, every configuration key).
    Man {
        /// The man directory's root, e.g. /usr/local/share/man.
        dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
enum FenceCommand {
    /// Load the fence and pin its programs and maps (idempotent; pinned maps are reused).
    Load(PinArgs),
    /// Attach the fence to the host end of a guest link (pinned TCX link: it stays when svcd
    /// exits, so the fence fails closed).
    Attach {
        /// The host-side interface name, e.g. svc3.
        link: String,
        #[command(flatten)]
        pins: PinArgs,
    },
    /// Detach the fence from a link.
    Detach {
        /// The host-side interface name, e.g. svc3.
        link: String,
        #[command(flatten)]
        pins: PinArgs,
    },
    /// Print the verdict counters (packets and bytes per reason, summed over CPUs).
    Counters {
        #[command(flatten)]
        pins: PinArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Detach from every link and remove everything pinned under the pin directory.
    Unload(PinArgs),
    /// Own the fence of one link from a spec file (JSON) and write its drop events to an
    /// audit log (JSON lines) until SIGTERM/SIGINT. Everything stays pinned afterwards.
    Run {
        /// The spec: link, sandbox, mode, addresses, allow entries (see docs/fence.md).
        #[arg(long)]
        spec: PathBuf,
        /// Audit log to append to.
        #[arg(long, default_value = "/var/log/svc/fence.jsonl")]
        audit: PathBuf,
        #[command(flatten)]
        pins: PinArgs,
    },
}

#[derive(Debug, clap::Args)]
struct PinArgs {
    /// bpffs directory the fence is pinned under (default: the host configuration's pin_dir,
    /// /sys/fs/bpf/svc).
    #[arg(long)]
    pin_dir: Option<PathBuf>,
}

/// svcd's exit status for an invalid configuration: `EX_CONFIG` of sysexits.h, as `svc` says
/// it (svcd.service's `RestartPreventExitStatus` keeps systemd from restarting into it).
const EXIT_CONFIG: u8 = 78;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if matches!(cli.command, Command::CheckConfig) {
        return check_config(cli.config.as_deref());
    }
    if let Command::Man { dir } = &cli.command {
        // No configuration needed (nor read) to write the pages.
        return match man::write(<Cli as clap::CommandFactory>::command(), dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("svcd: error: {e:#}");
                ExitCode::from(1)
            }
        };
    }
    if let Err(e) = env::check_removed(|v| std::env::var(v).ok()) {
        eprintln!("svcd: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }
    let host = match loader::check_host_config(cli.config.as_deref()) {
        Ok(checked) => run_warnings(&cli.command, checked),
        Err(e) => {
            eprintln!("svcd: invalid configuration:\n{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let result = match cli.command {
        Command::Fence(cmd) => fence(cmd, &host.pin_dir),
        Command::AuditSchema => serde_json::to_string_pretty(&svc_control::audit::schema())
            .map(|s| println!("{s}"))
            .map_err(anyhow::Error::from),
        Command::Run { nft_table, grace } => supervise(host, nft_table, grace),
        Command::CheckConfig => Ok(()),
        Command::Guardian { now } => return guardian(&host, now),
        Command::SetupHost { dry_run } => setup_host::run(&host, dry_run),
        Command::Images(cmd) => return images::run(cmd, &host),
        Command::StopSandboxes { grace } => {
            stop_sandboxes::run(&host, std::time::Duration::from_secs(grace))
        }
        Command::Man { .. } => Ok(()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("svcd: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// The checked configuration, its warnings printed first when svcd is to run with it.
fn run_warnings(
    command: &Command,
    checked: loader::HostChecked,
) -> svc_control::config::host::HostConfig {
    if matches!(command, Command::Run { .. }) {
        for w in &checked.warnings {
            eprintln!("svcd: warning: {w}");
        }
    }
    checked.config
}

/// `svcd check-config`: the file's errors (each on a line of its own, file:line first) and
/// warnings on stderr, `FILE: ok` on stdout when it is valid.
fn check_config(path: Option<&std::path::Path>) -> ExitCode {
    match loader::check_host_config(path) {
        Ok(checked) => {
            for w in &checked.warnings {
                eprintln!("warning: {w}");
            }
            if checked.present {
                println!("{}: ok", checked.file.display());
            } else {
                println!(
                    "{}: absent, every default applies: ok",
                    checked.file.display()
                );
            }
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{e}");
            }
            let file = errors.0.first().map_or_else(
                || config_path(path).display().to_string(),
                |e| e.file.display().to_string(),
            );
            let n = errors.0.len();
            eprintln!(
                "svcd: {file}: invalid configuration ({n} error{})",
                if n == 1 { "" } else { "s" }
            );
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

/// The configuration file svcd reads: `--config`, else the default path.
fn config_path(path: Option<&std::path::Path>) -> PathBuf {
    path.map_or_else(
        || PathBuf::from(svc_control::config::host::DEFAULT_PATH),
        std::path::Path::to_owned,
    )
}

fn guardian(host: &svc_control::config::host::HostConfig, now: Option<u64>) -> ExitCode {
    let now = now.map(|ms| std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms));
    let outcome = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|rt| rt.block_on(svc_control::daemon::guardian_once(host, now)));
    match outcome {
        Ok(o) => {
            println!("{}", serde_json::to_string(&o).unwrap_or_default());
            if matches!(o, svc_control::creds::guardian::Outcome::Failed { .. }) {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("svcd: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// The fewest descriptors svcd should be able to open (each sandbox holds a few, each guest
/// connection through the proxy two): below this it says how to give it more.
const DESCRIPTORS_WANTED: u64 = 65_536;

/// Raise the soft descriptor limit to the hard one: systemd and login shells start services at
/// a soft 1,024, which a few guests' connections would exhaust for every sandbox.
fn raise_descriptor_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) => {
            if soft < hard {
                match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                    Ok(()) => tracing::info!(from = soft, to = hard, "raised the descriptor limit"),
                    Err(e) => tracing::warn!(
                        error = %e,
                        soft,
                        hard,
                        "could not raise the descriptor limit to its hard limit"
                    ),
                }
            }
            if hard < DESCRIPTORS_WANTED {
                tracing::warn!(
                    hard,
                    wanted = DESCRIPTORS_WANTED,
                    "the descriptor limit is low for many sandboxes: set LimitNOFILE in svcd's \
                     unit (the shipped unit sets 1048576)"
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "reading the descriptor limit"),
    }
}

fn supervise(
    host: svc_control::config::host::HostConfig,
    nft_table: String,
    grace: u64,
) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    raise_descriptor_limit();
    // The path as started, so an upgrade runs the binary now installed there.
    let exe = std::env::current_exe().context("finding svcd's own binary")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let ended = rt.block_on(svc_control::daemon::run(
        host,
        svc_control::daemon::RunOptions {
            nft_table,
            exe: exe.clone(),
            grace: std::time::Duration::from_secs(grace),
        },
    ))?;
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    if ended == svc_control::daemon::Ended::Upgrade {
        use std::os::unix::process::CommandExt as _;
        let err = std::process::Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .exec();
        anyhow::bail!("re-executing {}: {err}", exe.display());
    }
    Ok(())
}

fn fence(cmd: FenceCommand, default_pin_dir: &std::path::Path) -> anyhow::Result<()> {
    let dir = |p: PinArgs| p.pin_dir.unwrap_or_else(|| default_pin_dir.to_owned());
    match cmd {
        FenceCommand::Load(p) => {
            let fence = Fence::load(dir(p))?;
            println!("fence loaded, pinned under {}", fence.pin_dir().display());
        }
        FenceCommand::Attach { link, pins } => {
            let mut fence = Fence::load(dir(pins))?;
            fence.attach(&link)?;
            println!(
                "fence attached to {link} (ingress and egress), ingress link pinned at {}",
                fence
                    .link_pin(&link, dataplane::Direction::Ingress)
                    .display()
            );
        }
        FenceCommand::Detach { link, pins } => {
            let mut fence = Fence::load(dir(pins))?;
            fence.detach(&link)?;
            println!("fence detached from {link}");
        }
        FenceCommand::Counters { pins, json } => {
            let pin_dir = dir(pins);
            let counters = dataplane::read_pinned_counters(&pin_dir).with_context(|| {
                format!(
                    "reading the fence counters under {} (is the fence loaded? `svcd fence load`)",
                    pin_dir.display()
                )
            })?;
            if json {
                println!("{}", serde_json::to_string_pretty(&counters)?);
            } else {
                println!(
                    "{:<22} {:>8} {:>12} {:>12}",
                    "reason", "verdict", "packets", "bytes"
                );
                for r in &counters.reasons {
                    println!(
                        "{:<22} {:>8} {:>12} {:>12}",
                        r.reason,
                        if r.drop { "drop" } else { "pass" },
                        r.packets,
                        r.bytes
                    );
                }
            }
        }
        FenceCommand::Run { spec, audit, pins } => {
            fence_run::run(&spec, &dir(pins), &audit)?;
        }
        FenceCommand::Unload(p) => {
            let pin_dir = dir(p);
            dataplane::remove_pin_dir(&pin_dir).map_err(|errors| {
                anyhow::anyhow!(
                    "unloading {}: {}",
                    pin_dir.display(),
                    errors
                        .iter()
                        .map(|e| format!("{e}"))
                        .collect::<Vec<_>>()
                        .join("; ")
                )
            })?;
            println!("fence unloaded from {}", pin_dir.display());
        }
    }
    Ok(())
}
