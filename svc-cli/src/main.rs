//! svc, the command-line tool for svc sandboxes and workspaces.
#![forbid(unsafe_code)]

#[macro_use]
mod out;
mod config_cmd;
mod egress_cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// svc runs microVM sandboxes for coding agents and fences everything they can reach.
#[derive(Debug, Parser)]
#[command(name = "svc", version, about, long_about = None, propagate_version = true)]
struct Cli {
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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Config(cmd) => config_cmd::run(cmd),
        Command::Egress(cmd) => egress_cmd::run(cmd),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("svc: error: {e:#}");
            ExitCode::from(1)
        }
    }
}
