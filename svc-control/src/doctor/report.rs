//! The doctor's report: each check's result ([`CheckResult`]) and the whole run ([`Report`],
//! JSON Schema `schema/doctor-report.v1.json`).

use std::time::Instant;

use schemars::JsonSchema;
use serde::Serialize;

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

/// One built-in host probe's outcome: `Ok(detail)` or `Err((what is wrong, how to fix it))`.
pub(super) type HostOutcome = Result<String, (String, &'static str)>;

/// The result of built-in host probe `name` (reported as `host:NAME`), started at `started`.
pub(super) fn host_result(
    name: &str,
    required: bool,
    started: Instant,
    outcome: HostOutcome,
) -> CheckResult {
    host_result_named(&format!("host:{name}"), required, started, outcome)
}

/// The result of a built-in probe reported as `name` whole, started at `started`.
pub(super) fn host_result_named(
    name: &str,
    required: bool,
    started: Instant,
    outcome: HostOutcome,
) -> CheckResult {
    let (status, reason, output) = match outcome {
        Ok(detail) => (Status::Passed, None, detail),
        Err((wrong, fix)) => (
            Status::Failed,
            Some(format!("{wrong} — fix: {fix}")),
            String::new(),
        ),
    };
    CheckResult {
        phase: Phase::Probe,
        name: name.to_owned(),
        status,
        required,
        attempts: 1,
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        exit_code: None,
        reason,
        output,
    }
}
