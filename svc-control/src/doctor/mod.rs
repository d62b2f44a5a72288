//! `svc doctor`'s workspace checks: each `doctor.probes` / `doctor.tests`
//! entry is run without a shell (`command` + `args`), in its own process group so a timeout
//! kills everything it started, retried `retries` times on failure; the tests run only when
//! every required probe passed, and are reported as skipped (with the probe that failed)
//! otherwise. The report's shape is [`Report`] (JSON Schema: `schema/doctor-report.v1.json`).

mod attempt;
mod disk;
mod host;
mod ids;
mod images;
mod kubernetes;
mod report;

use std::time::Instant;

pub use attempt::{Attempt, OnHost, Runner, under_timeout};
pub use disk::{LOW_SPACE_BYTES, LOW_SPACE_PERCENT, free_space_probes, low_space};
pub use host::{host_probes, runtime_probe};
pub use ids::container_ids_probe;
pub use images::ImageSource;
pub use kubernetes::{DEFAULT_CONFIG as CONTAINERD_CONFIG, kubernetes_probes};
pub use report::{CheckResult, Phase, Report, Status, schema};

use crate::config::workspace::Check;

/// Run one check with its retries.
pub async fn run_check(phase: Phase, check: &Check, runner: &impl Runner) -> CheckResult {
    let started = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (status, exit_code, reason, output) = runner.attempt(check).await;
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

/// Probes — `host` (the built-in ones, already run) first — then tests unless a required
/// probe failed; each result goes to `progress` as soon as it is known.
pub async fn run(
    host: Vec<CheckResult>,
    probes: &[Check],
    tests: &[Check],
    runner: &impl Runner,
    mut progress: impl FnMut(&CheckResult),
) -> Report {
    let mut results = Vec::new();
    for r in host {
        progress(&r);
        results.push(r);
    }
    for c in probes {
        let r = run_check(Phase::Probe, c, runner).await;
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
            run_check(Phase::Test, c, runner).await
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
    use std::time::Duration;

    use super::*;

    /// A shell check (also for `attempt`'s tests).
    pub(super) fn check(
        name: &str,
        script: &str,
        timeout_ms: u64,
        retries: u32,
        required: bool,
    ) -> Check {
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
        let r = run_check(
            Phase::Probe,
            &check("slow", &script, 200, 0, true),
            &OnHost(&dir),
        )
        .await;
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
        let r = run_check(
            Phase::Test,
            &check("flaky", flaky, 5000, 2, false),
            &OnHost(&dir),
        )
        .await;
        assert_eq!((r.status, r.attempts), (Status::Passed, 3), "{r:?}");
        assert_eq!(r.output, "attempt 2");
        let r = run_check(
            Phase::Test,
            &check("never", "echo no >&2; exit 3", 5000, 1, false),
            &OnHost(&dir),
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
        let r = run_check(Phase::Probe, &missing, &OnHost(&dir)).await;
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
        let r = run(Vec::new(), &probes, &tests, &OnHost(&dir), |c| {
            heard.push(c.name.clone())
        })
        .await;
        assert_eq!(heard, ["optional-fails", "required-passes", "t"]);
        assert_eq!(r.results[2].status, Status::Passed);
        assert!(
            !r.required_failed,
            "an optional failure does not fail the doctor"
        );

        let probes = [check("needed", "exit 2", 5000, 0, true)];
        let r = run(Vec::new(), &probes, &tests, &OnHost(&dir), |_| {}).await;
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
