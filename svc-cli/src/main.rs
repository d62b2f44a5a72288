//! svc, the command-line tool for svc sandboxes and workspaces.
#![forbid(unsafe_code)]

#[macro_use]
mod out;
mod audit_cmd;
mod canary_cmd;
mod client;
mod command;
mod complete;
mod config_cmd;
mod doctor_cmd;
mod egress_cmd;
mod events_cmd;
mod exec_cmd;
mod exit;
mod git_snapshot;
mod man;
mod output;
mod project;
mod sandbox_cmd;
mod sandbox_table;
mod secret_cmd;
mod stats_cmd;
mod trust;
mod workspace_cmd;

use std::process::ExitCode;

use clap::{FromArgMatches as _, Parser, Subcommand};

/// svc runs isolated sandboxes for coding agents and fences everything they can reach.
#[derive(Debug, Parser)]
#[command(
    name = "svc",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_help = exit::AFTER_HELP
)]
struct Cli {
    #[command(flatten)]
    socket: client::SocketArg,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check and show a workspace's configuration (.svc/workspace.json, .svc/config.yaml, or
    /// its compose file).
    #[command(subcommand)]
    Config(config_cmd::ConfigCommand),
    /// Explain how the egress perimeter decides a request.
    #[command(subcommand)]
    Egress(egress_cmd::EgressCommand),
    /// Create, inspect, use and destroy sandboxes (through svcd).
    #[command(subcommand)]
    Sandbox(sandbox_cmd::SandboxCommand),
    /// The named secret store: set, list, rm, rotate, share, unshare (values from stdin or a file, sealed on
    /// the host; sandboxes use them with --secret VAR@store:NAME).
    #[command(subcommand)]
    Secret(secret_cmd::SecretCommand),
    /// A sandbox for a project directory: `up` makes it (the workspace's egress, hooks,
    /// runtime), `logs` shows its hooks' output, `down` runs onTeardown and destroys it.
    #[command(subcommand)]
    Workspace(workspace_cmd::WorkspaceCommand),
    /// Read the audit log: what the fence, the DNS guard and the proxy decided, per record.
    Audit(audit_cmd::AuditArgs),
    /// Run the workspace's doctor checks: its probes, then (if every required probe passed)
    /// its tests; exit 1 if a required check failed.
    Doctor(doctor_cmd::DoctorArgs),
    /// Print a shell completion script: `svc completions bash > /etc/bash_completion.d/svc`.
    ///
    /// The script asks svc at each tab, so sandbox and secret names come from the running
    /// svcd (nothing is offered, quietly, when it does not answer within half a second).
    Completions {
        /// The shell the script is for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (svc.1 and one per subcommand) into DIR.
    Man {
        /// Where to write them (e.g. /usr/local/share/man/man1).
        dir: std::path::PathBuf,
    },
    /// The lifecycle canary: create a microvm sandbox, pause, fork, resume, destroy; each
    /// step's time, and whether each sandbox answered. Run it regularly on a host.
    Canary(canary_cmd::CanaryArgs),
    /// Print svcd's events (sandbox.created, workspace.ready, sandbox.destroyed, …).
    Events(events_cmd::EventsArgs),
    /// Replace the running svcd with the binary now installed at its path (re-exec). Running
    /// sandboxes keep running and are re-adopted; their mounts and credential model cannot
    /// change (recreate a sandbox for that).
    SupervisorUpgrade {
        /// Do it (without it, svcd explains what would happen).
        #[arg(long)]
        force: bool,
    },
}

/// The arguments as the command tree (`command::command`) parses them.
fn parse() -> Cli {
    let matches = command::command().get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

fn main() -> ExitCode {
    complete::answer_if_asked(command::command);
    let cli = parse();
    let result = match cli.command {
        Command::Config(cmd) => config_cmd::run(cmd, &cli.socket),
        Command::Egress(cmd) => egress_cmd::run(cmd, &cli.socket),
        Command::Sandbox(cmd) => sandbox_cmd::run(cmd, &cli.socket),
        Command::Secret(cmd) => secret_cmd::run(cmd, &cli.socket),
        Command::Workspace(cmd) => workspace_cmd::run(cmd, &cli.socket),
        Command::Audit(a) => audit_cmd::run(&cli.socket, a),
        Command::Doctor(a) => doctor_cmd::run(&cli.socket, a),
        Command::Completions { shell } => complete::script(shell),
        Command::Man { dir } => man::pages(&dir),
        Command::Canary(a) => canary_cmd::run(&cli.socket, a),
        Command::Events(a) => events_cmd::run(&cli.socket, a),
        Command::SupervisorUpgrade { force } => sandbox_cmd::upgrade(&cli.socket, force),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("svc: error: {e:#}");
            exit::status_of(&e)
        }
    }
}
