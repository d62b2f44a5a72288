//! `svcd stop-sandboxes`: stop every sandbox's guest while svcd is stopped, keeping their
//! state. The Debian package's `prerm` runs it on `apt remove`, after stopping svcd: with svcd
//! gone nothing would supervise the guests (their links keep dropping everything, but they
//! would go on using the host's CPU and memory with no svcd to stop them). Their state, layers
//! and shares stay: the next svcd lists them as dead (`svc sandbox destroy` removes them), and
//! `apt purge` removes the whole state directory.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use nix::{sys::signal::Signal, unistd::Pid};
use svc_control::{
    config::host::HostConfig,
    runtime::{is_zombie, start_time},
    store::Store,
};

/// How long a guest gets to end after SIGKILL before this is reported as a failure.
const KILL_WAIT: Duration = Duration::from_secs(10);

/// Stop the guest of every sandbox in `host`'s state: SIGTERM, then SIGKILL after `grace`.
/// Refused while an svcd runs on that state.
pub fn run(host: &HostConfig, grace: Duration) -> anyhow::Result<()> {
    let state = &host.state_dir;
    if !state.join("svcd.db").exists() {
        say(&format!(
            "no sandboxes' state in {}: nothing to stop",
            state.display()
        ));
        return Ok(());
    }
    // The lock every svcd holds on its state: taken, so no svcd runs (or starts) meanwhile.
    let _no_svcd = svc_control::daemon::instance_lock(state)?;
    let store = Store::open(state).with_context(|| format!("opening {}", state.display()))?;
    let rows = store.list().context("listing the sandboxes")?;
    let mut stopped = 0;
    for row in &rows {
        match row.pid.zip(row.pid_start) {
            Some((pid, start)) if running(pid, start) => {
                stop(pid, start, grace)
                    .with_context(|| format!("stopping sandbox {} (pid {pid})", row.name))?;
                say(&format!("sandbox {}: stopped (pid {pid})", row.name));
                stopped += 1;
            }
            _ => say(&format!("sandbox {}: not running", row.name)),
        }
    }
    say(&format!(
        "{stopped} stopped; their state stays in {} until `svc sandbox destroy` or `apt purge`",
        state.display()
    ));
    Ok(())
}

/// The names of the sandboxes in `host`'s state whose guests still run (none without state).
/// Reads the store beside a running svcd (it takes no lock).
pub fn running_guests(host: &HostConfig) -> anyhow::Result<Vec<String>> {
    let state = &host.state_dir;
    if !state.join("svcd.db").exists() {
        return Ok(Vec::new());
    }
    let store = Store::open(state).with_context(|| {
        format!(
            "opening {} to see whether sandboxes run on the images",
            state.display()
        )
    })?;
    let rows = store.list().context("listing the sandboxes")?;
    Ok(rows
        .into_iter()
        .filter(|row| {
            row.pid
                .zip(row.pid_start)
                .is_some_and(|(p, s)| running(p, s))
        })
        .map(|row| row.name)
        .collect())
}

fn say(what: &str) {
    println!("svcd stop-sandboxes: {what}");
}

/// Whether process `pid` is still the guest started at `start`, and not yet dead.
fn running(pid: u32, start: u64) -> bool {
    start_time(pid) == Some(start) && !is_zombie(pid)
}

/// SIGTERM, up to `grace` for the guest to end, then SIGKILL.
fn stop(pid: u32, start: u64, grace: Duration) -> anyhow::Result<()> {
    let target = Pid::from_raw(i32::try_from(pid).context("pid out of range")?);
    let _ = nix::sys::signal::kill(target, Signal::SIGTERM);
    if gone_within(pid, start, grace) {
        return Ok(());
    }
    let _ = nix::sys::signal::kill(target, Signal::SIGKILL);
    anyhow::ensure!(
        gone_within(pid, start, KILL_WAIT),
        "it still runs {} s after SIGKILL",
        KILL_WAIT.as_secs()
    );
    Ok(())
}

/// Wait up to `limit` for the guest to end; whether it did.
fn gone_within(pid: u32, start: u64, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while running(pid, start) {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}
