//! Shell completion: `svc completions SHELL` prints a script that asks `svc` itself what to
//! offer at each tab (clap's dynamic completion, `COMPLETE=SHELL svc -- WORDS…`), so sandbox
//! and secret names come from the running svcd, and values with a fixed set of choices offer
//! exactly those.

use std::{process::ExitCode, time::Duration};

use clap_complete::engine::{ArgValueCandidates, CompletionCandidate};
use http::Method;
use svc_control::api::{SandboxView, SecretInfo};

use crate::client::{Client, DEFAULT_SOCKET};

/// The variable the registration script sets to ask `svc` for candidates.
pub const VAR: &str = "COMPLETE";

/// How long a tab waits for svcd before offering nothing.
const ASK_SVCD_FOR: Duration = Duration::from_millis(500);

/// `svc completions SHELL`: the script that registers `svc`'s completer with SHELL.
pub fn script(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    let mut out = Vec::new();
    let name = shell.to_string();
    let shells = clap_complete::env::Shells::builtins();
    let completer = shells
        .completer(&name)
        .ok_or_else(|| anyhow::anyhow!("no completion script for {name}"))?;
    completer.write_registration(VAR, "svc", "svc", "svc", &mut out)?;
    // A closed pipe (`| head`) is the reader's choice, not an error.
    match std::io::Write::write_all(&mut std::io::stdout(), &out) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::anyhow!("writing the completion script: {e}"))
        }
        _ => Ok(ExitCode::SUCCESS),
    }
}

/// Answer a completion request (`COMPLETE=SHELL svc -- WORDS…`) and exit; return at once on
/// an ordinary run.
pub fn answer_if_asked(factory: fn() -> clap::Command) {
    clap_complete::CompleteEnv::with_factory(factory)
        .var(VAR)
        .complete();
}

/// What a value completes to, beside what clap knows from the argument itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Names {
    /// The sandboxes svcd has (that the caller may see).
    Sandboxes,
    /// The secrets in the store the caller may use.
    Secrets,
    /// A fixed list.
    Fixed(&'static [&'static str]),
}

impl Names {
    /// The argument's completer.
    pub fn candidates(self) -> ArgValueCandidates {
        ArgValueCandidates::new(move || self.list())
    }

    fn list(self) -> Vec<CompletionCandidate> {
        let names: Vec<String> = match self {
            Names::Sandboxes => ask::<SandboxView>("/v1/sandboxes")
                .into_iter()
                .map(|s| s.name)
                .collect(),
            Names::Secrets => ask::<SecretInfo>("/v1/secrets")
                .into_iter()
                .map(|s| s.name)
                .collect(),
            Names::Fixed(all) => all.iter().map(|s| (*s).to_owned()).collect(),
        };
        names.into_iter().map(CompletionCandidate::new).collect()
    }
}

/// A list from svcd at `path`, or nothing: svcd not running, not reachable in time, or
/// refusing; a tab prints nothing of that.
fn ask<T: serde::de::DeserializeOwned>(path: &str) -> Vec<T> {
    let socket = std::env::var_os("SVC_SOCKET").unwrap_or_else(|| DEFAULT_SOCKET.into());
    let client = Client::new(std::path::Path::new(&socket));
    let Ok(rt) = crate::client::runtime() else {
        return Vec::new();
    };
    rt.block_on(async {
        match tokio::time::timeout(
            ASK_SVCD_FOR,
            client.call::<(), Vec<T>>(Method::GET, path, None),
        )
        .await
        {
            Ok(Ok(all)) => all,
            _ => Vec::new(),
        }
    })
}
