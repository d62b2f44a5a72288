//! `lifecycle`: the hooks (shell commands) run in the sandbox at setup, start and teardown.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Lifecycle hooks: shell commands run in the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Lifecycle {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_setup: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_start: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_teardown: Option<Vec<String>>,
    /// How long each hook may run, in milliseconds, before its whole process group is killed
    /// (default 600000, ten minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
}

impl Lifecycle {
    /// No empty hook, and a timeout of at least 1 ms.
    pub(super) fn validate(&self, err: &mut impl FnMut(String, String)) {
        for (key, cmds) in [
            ("onSetup", &self.on_setup),
            ("onStart", &self.on_start),
            ("onTeardown", &self.on_teardown),
        ] {
            for (i, c) in cmds.iter().flatten().enumerate() {
                if c.trim().is_empty() {
                    err(
                        format!("/lifecycle/{key}/{i}"),
                        "shell command must not be empty".into(),
                    );
                }
            }
        }
        if self.timeout_ms == Some(0) {
            err(
                "/lifecycle/timeoutMs".into(),
                "expected a timeout of at least 1 ms, got 0".into(),
            );
        }
    }
}
