//! `doctor`: the workspace's own probes and tests, run by `svc doctor`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default per-check timeout of doctor checks, in milliseconds.
pub const DEFAULT_CHECK_TIMEOUT_MS: u64 = 60_000;

/// `doctor`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Doctor {
    #[serde(default)]
    pub probes: Vec<Check>,
    #[serde(default)]
    pub tests: Vec<Check>,
}

/// One doctor check.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Check {
    /// Unique across probes and tests; used in reports.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Executable path or name.
    #[schemars(length(min = 1))]
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Per-check timeout, milliseconds.
    #[serde(default = "default_timeout_ms")]
    #[schemars(range(min = 1))]
    pub timeout_ms: u64,
    /// Retries on failure.
    #[serde(default)]
    pub retries: u32,
    /// A failed required check makes the doctor exit non-zero; a failed required probe skips
    /// the tests.
    #[serde(default)]
    pub required: bool,
}

const fn default_timeout_ms() -> u64 {
    DEFAULT_CHECK_TIMEOUT_MS
}

impl Doctor {
    /// Names not empty and unique across probes and tests; commands not empty; timeouts at
    /// least 1 ms.
    pub(super) fn validate(&self, err: &mut impl FnMut(String, String)) {
        let mut seen: Vec<(&str, String)> = Vec::new();
        for (phase, checks) in [("probes", &self.probes), ("tests", &self.tests)] {
            for (i, c) in checks.iter().enumerate() {
                c.validate(&format!("/doctor/{phase}/{i}"), &mut seen, err);
            }
        }
    }
}

impl Check {
    /// `seen` holds the names met so far, each with its pointer.
    fn validate<'a>(
        &'a self,
        base: &str,
        seen: &mut Vec<(&'a str, String)>,
        err: &mut impl FnMut(String, String),
    ) {
        if self.name.trim().is_empty() {
            err(format!("{base}/name"), "must not be empty".into());
        } else if let Some((_, first)) = seen.iter().find(|(n, _)| *n == self.name) {
            err(
                format!("{base}/name"),
                format!(
                    "check name {:?} is already used at {first}; names must be unique across probes and tests",
                    self.name
                ),
            );
        } else {
            seen.push((&self.name, format!("{base}/name")));
        }
        if self.command.trim().is_empty() {
            err(format!("{base}/command"), "must not be empty".into());
        }
        if self.timeout_ms == 0 {
            err(
                format!("{base}/timeoutMs"),
                "expected a timeout of at least 1 ms, got 0".into(),
            );
        }
    }
}
