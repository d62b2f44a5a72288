//! svc, the command-line tool for svc sandboxes and workspaces.
#![forbid(unsafe_code)]

#[macro_use]
mod out;
mod audit_cmd;
mod client;
mod config_cmd;
mod egress_cmd;
mod exec_cmd;
mod sandbox_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// svc runs microVM sandboxes for coding agents and fences everything they can reach.
#[derive(Debug, Parser)]
#[command(name = "svc", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    socket: sandbox_cmd::SocketArg,
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
    /// Read the audit log: what the fence, the DNS guard and the proxy decided, per record.
    Audit(audit_cmd::AuditArgs),
    /// Print svcd's events (sandbox.created, workspace.ready, sandbox.destroyed, …).
    Events {
        /// Keep printing new events as they happen.
        #[arg(long, short)]
        follow: bool,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// Only events after this sequence number.
        #[arg(long, default_value_t = 0)]
        after: i64,
    },
    /// Replace the running svcd with the binary now installed at its path (re-exec). Running
    /// sandboxes keep running and are re-adopted; their mounts and credential model cannot
    /// change (recreate a sandbox for that).
    SupervisorUpgrade {
        /// Do it (without it, svcd explains what would happen).
        #[arg(long)]
        force: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Config(cmd) => config_cmd::run(cmd),
        Command::Egress(cmd) => egress_cmd::run(cmd),
        Command::Sandbox(cmd) => sandbox_cmd::run(cmd, &cli.socket),
        Command::Audit(a) => audit_cmd::run(&cli.socket, a),
        Command::Events {
            follow,
            json,
            after,
        } => sandbox_cmd::events(&cli.socket, follow, json, after),
        Command::SupervisorUpgrade { force } => sandbox_cmd::upgrade(&cli.socket, force),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("svc: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
