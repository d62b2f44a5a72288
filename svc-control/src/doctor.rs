//! `svc doctor`'s workspace checks (SPEC 2.7, 4.2): each `doctor.probes` / `doctor.tests`
//! entry is run without a shell (`command` + `args`), in its own process group so a timeout
//! kills everything it started, retried `retries` times on failure; the tests run only when
//! every required probe passed, and are reported as skipped (with the probe that failed)
//! otherwise. The report's shape is [`Report`] (JSON Schema: `schema/doctor-report.v1.json`).

use std::{
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use schemars::JsonSchema;
use serde::Serialize;
use tokio::io::AsyncReadExt as _;

use crate::config::workspace::Check;

/// Bytes of a check's output kept for the report (the end of it).
const OUTPUT_TAIL: usize = 4096;

/// `probe` or `test`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Probe,
    Test,
}

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Passed,
    Failed,
    /// Killed at its timeout (counted as failed).
    TimedOut,
    /// Not run: a required probe failed.
    Skipped,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct CheckResult {
    pub phase: Phase,
    pub name: String,
    pub status: Status,
    pub required: bool,
    /// Runs made (1 + retries used); 0 when skipped.
    pub attempts: u32,
    /// All attempts together.
    pub duration_ms: u64,
    /// The last attempt's exit code, if it exited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it failed or was skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The end of the last attempt's standard output and error.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub output: String,
}

impl CheckResult {
    pub fn failed(&self) -> bool {
        matches!(self.status, Status::Failed | Status::TimedOut)
    }
}

/// Every check of a doctor run, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Report {
    /// `svc-doctor-report/v1`.
    pub version: String,
    pub results: Vec<CheckResult>,
    /// Whether a required check failed (the doctor's exit code is then non-zero).
    pub required_failed: bool,
}

/// The JSON Schema of [`Report`] (`schema/doctor-report.v1.json`).
pub fn schema() -> schemars::Schema {
    schemars::schema_for!(Report)
}

/// One attempt: (status, exit code, reason, output tail).
async fn attempt(check: &Check, cwd: &Path) -> (Status, Option<i32>, Option<String>, String) {
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
        Ok((output, status)) => {
            let tail = tail(&output);
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

fn tail(output: &[u8]) -> String {
    let start = output.len().saturating_sub(OUTPUT_TAIL);
    String::from_utf8_lossy(&output[start..])
        .trim_end()
        .to_owned()
}

/// Run one check with its retries.
pub async fn run_check(phase: Phase, check: &Check, cwd: &Path) -> CheckResult {
    let started = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (status, exit_code, reason, output) = attempt(check, cwd).await;
        if status == Status::Passed || attempts > check.retries {
            return CheckResult {
                phase,
                name: check.name.clone(),
                status,
                required: check.required,
                attempts,
                duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                exit_code,
                reason,
                output,
            };
        }
    }
}

/// Probes, then tests unless a required probe failed (SPEC 4.2); each result goes to
/// `progress` as soon as it is known.
pub async fn run(
    probes: &[Check],
    tests: &[Check],
    cwd: &Path,
    mut progress: impl FnMut(&CheckResult),
) -> Report {
    let mut results = Vec::new();
    for c in probes {
        let r = run_check(Phase::Probe, c, cwd).await;
        progress(&r);
        results.push(r);
    }
    let blocking: Vec<String> = results
        .iter()
        .filter(|r| r.required && r.failed())
        .map(|r| r.name.clone())
        .collect();
    for c in tests {
        let r = if blocking.is_empty() {
            run_check(Phase::Test, c, cwd).await
        } else {
            CheckResult {
                phase: Phase::Test,
                name: c.name.clone(),
                status: Status::Skipped,
                required: c.required,
                attempts: 0,
                duration_ms: 0,
                exit_code: None,
                reason: Some(format!("required probe failed: {}", blocking.join(", "))),
                output: String::new(),
            }
        };
        progress(&r);
        results.push(r);
    }
    let required_failed = results.iter().any(|r| r.required && r.failed());
    Report {
        version: "svc-doctor-report/v1".into(),
        results,
        required_failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, script: &str, timeout_ms: u64, retries: u32, required: bool) -> Check {
        Check {
            name: name.into(),
            command: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            timeout_ms,
            retries,
            required,
        }
    }

    #[tokio::test]
    async fn a_check_past_its_timeout_is_killed_with_its_children_and_counted_failed() {
        let dir = std::env::temp_dir();
        let marker = dir.join(format!("svc-doctor-child-{}", std::process::id()));
        let _ = std::fs::remove_file(&marker);
        // The shell starts a child that would write the marker after the timeout.
        let script = format!("(sleep 1; touch {}) & sleep 30", marker.display());
        let t0 = Instant::now();
        let r = run_check(Phase::Probe, &check("slow", &script, 200, 0, true), &dir).await;
        assert_eq!(r.status, Status::TimedOut);
        assert!(r.failed());
        assert_eq!(r.reason.as_deref(), Some("no result within 200 ms: killed"));
        assert!(t0.elapsed() < Duration::from_secs(10), "not waited out");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!marker.exists(), "the check's child outlived the timeout");
    }

    #[tokio::test]
    async fn retries_rerun_a_failing_check_until_it_passes_or_they_run_out() {
        let dir = std::env::temp_dir().join(format!("svc-doctor-retry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        // Passes on the third run (two files counted before it).
        let flaky = "n=$(ls | wc -l); touch run$n; echo attempt $n; [ $n -ge 2 ]";
        let r = run_check(Phase::Test, &check("flaky", flaky, 5000, 2, false), &dir).await;
        assert_eq!((r.status, r.attempts), (Status::Passed, 3), "{r:?}");
        assert_eq!(r.output, "attempt 2");
        let r = run_check(
            Phase::Test,
            &check("never", "echo no >&2; exit 3", 5000, 1, false),
            &dir,
        )
        .await;
        assert_eq!(
            (
                r.status,
                r.attempts,
                r.exit_code,
                r.reason.as_deref(),
                r.output.as_str()
            ),
            (Status::Failed, 2, Some(3), Some("exited with 3"), "no")
        );
        let missing = Check {
            command: "/nonexistent/tool".into(),
            args: vec![],
            ..check("missing", "", 5000, 0, false)
        };
        let r = run_check(Phase::Probe, &missing, &dir).await;
        assert!(
            r.reason
                .as_deref()
                .is_some_and(|w| w.starts_with("cannot run \"/nonexistent/tool\"")),
            "{r:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn tests_run_only_when_every_required_probe_passed() {
        let dir = std::env::temp_dir();
        let probes = [
            check("optional-fails", "exit 1", 5000, 0, false),
            check("required-passes", "true", 5000, 0, true),
        ];
        let tests = [check("t", "true", 5000, 0, true)];
        let mut heard = Vec::new();
        let r = run(&probes, &tests, &dir, |c| heard.push(c.name.clone())).await;
        assert_eq!(heard, ["optional-fails", "required-passes", "t"]);
        assert_eq!(r.results[2].status, Status::Passed);
        assert!(
            !r.required_failed,
            "an optional failure does not fail the doctor"
        );

        let probes = [check("needed", "exit 2", 5000, 0, true)];
        let r = run(&probes, &tests, &dir, |_| {}).await;
        assert_eq!(r.results[1].status, Status::Skipped);
        assert_eq!(
            r.results[1].reason.as_deref(),
            Some("required probe failed: needed")
        );
        assert!(r.required_failed);
        let v = serde_json::to_value(&r).expect("json");
        assert_eq!(v["results"][0]["phase"], "probe");
        assert_eq!(v["results"][1]["phase"], "test");
        assert_eq!(v["results"][1]["status"], "skipped");
    }
}
