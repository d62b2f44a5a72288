//! One attempt of a check: the [`Runner`] trait, checks run on this host ([`OnHost`]: no
//! shell, their own process group, killed whole at the timeout) and the result read from
//! coreutils' `timeout` for runners that cannot kill a group themselves.

use std::{path::Path, process::Stdio, time::Duration};

use tokio::io::AsyncReadExt as _;

use super::report::Status;
use crate::config::workspace::Check;

/// Bytes of a check's output kept for the report (the end of it).
const OUTPUT_TAIL: usize = 4096;

/// One attempt's outcome: (status, exit code, reason, output tail).
pub type Attempt = (Status, Option<i32>, Option<String>, String);

/// Where checks run: [`OnHost`], or (svc's CLI) inside a sandbox through svcd.
pub trait Runner {
    /// Run `check` once, killing it (and what it started) at its timeout.
    fn attempt(&self, check: &Check) -> impl std::future::Future<Output = Attempt>;
}

/// Checks run on this host, in a directory.
#[derive(Debug, Clone, Copy)]
pub struct OnHost<'a>(pub &'a Path);

impl Runner for OnHost<'_> {
    fn attempt(&self, check: &Check) -> impl std::future::Future<Output = Attempt> {
        attempt(check, self.0)
    }
}

/// The outcome of a check that exited with `code` after `elapsed`, `output` its stdout and
/// stderr, having been run under coreutils' `timeout` (124: TERM at the timeout, 137: KILL
/// after it): how a runner that cannot kill a process group itself reads its result.
pub fn under_timeout(check: &Check, code: i32, elapsed: Duration, output: &[u8]) -> Attempt {
    let tail = tail(output);
    if crate::workspace::timed_out(code, elapsed, check.timeout_ms) {
        return (
            Status::TimedOut,
            None,
            Some(format!("no result within {} ms: killed", check.timeout_ms)),
            tail,
        );
    }
    let reason = match code {
        0 => return (Status::Passed, Some(0), None, tail),
        126 => format!("cannot run {:?}: not executable (exit 126)", check.command),
        127 => format!("cannot run {:?}: not found (exit 127)", check.command),
        c => format!("exited with {c}"),
    };
    (Status::Failed, Some(code), Some(reason), tail)
}

/// One attempt on this host.
async fn attempt(check: &Check, cwd: &Path) -> Attempt {
    let mut cmd = tokio::process::Command::new(&check.command);
    cmd.args(&check.args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return (
                Status::Failed,
                None,
                Some(format!("cannot run {:?}: {e}", check.command)),
                String::new(),
            );
        }
    };
    let pgid = child.id().and_then(|p| i32::try_from(p).ok());
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let collect = async {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let read_out = async {
            if let Some(o) = out.as_mut() {
                let _ = o.read_to_end(&mut a).await;
            }
        };
        let read_err = async {
            if let Some(e) = err.as_mut() {
                let _ = e.read_to_end(&mut b).await;
            }
        };
        tokio::join!(read_out, read_err);
        a.extend_from_slice(&b);
        a
    };
    let limit = Duration::from_millis(check.timeout_ms);
    let run = async {
        let (output, status) = tokio::join!(collect, child.wait());
        (output, status)
    };
    match tokio::time::timeout(limit, run).await {
        Ok((output, status)) => exited(status, tail(&output)),
        Err(_) => {
            // The whole group: a shell script's children go too.
            if let Some(pg) = pgid {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pg),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            (
                Status::TimedOut,
                None,
                Some(format!("no result within {} ms: killed", check.timeout_ms)),
                String::new(),
            )
        }
    }
}

/// The attempt of a check that ended within its timeout with `status`, `tail` its output.
fn exited(status: std::io::Result<std::process::ExitStatus>, tail: String) -> Attempt {
    match status {
        Ok(s) if s.success() => (Status::Passed, Some(0), None, tail),
        Ok(s) => (
            Status::Failed,
            s.code(),
            Some(match s.code() {
                Some(c) => format!("exited with {c}"),
                None => "killed by a signal".into(),
            }),
            tail,
        ),
        Err(e) => (Status::Failed, None, Some(format!("waiting: {e}")), tail),
    }
}

fn tail(output: &[u8]) -> String {
    let start = output.len().saturating_sub(OUTPUT_TAIL);
    String::from_utf8_lossy(&output[start..])
        .trim_end()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::tests::check;

    #[test]
    fn results_read_from_timeouts_exit_code() {
        let c = check("c", "x", 1000, 0, false);
        let ms = Duration::from_millis;
        let cases: [(&str, i32, Duration, Status, Option<&str>); 6] = [
            ("passed", 0, ms(5), Status::Passed, None),
            ("failed", 3, ms(5), Status::Failed, Some("exited with 3")),
            (
                "term_at_timeout",
                124,
                ms(1000),
                Status::TimedOut,
                Some("within 1000 ms"),
            ),
            (
                "kill_after_timeout",
                137,
                ms(6000),
                Status::TimedOut,
                Some("killed"),
            ),
            // A check that exits 124 on its own, early, failed: it did not time out.
            (
                "own_124_early",
                124,
                ms(5),
                Status::Failed,
                Some("exited with 124"),
            ),
            ("not_found", 127, ms(5), Status::Failed, Some("not found")),
        ];
        for (name, code, elapsed, status, says) in cases {
            let (got, _, reason, out) = under_timeout(&c, code, elapsed, b"some output\n");
            assert_eq!(got, status, "{name}");
            assert_eq!(out, "some output", "{name}");
            if let Some(says) = says {
                let r = reason.unwrap_or_default();
                assert!(r.contains(says), "{name}: {r}");
            }
        }
    }
}
