//! `services`: the shell commands supervised in the sandbox, and their restart defaults.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::pointer::escape;
use crate::config::UniqueMap;

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Services {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<ServiceDefaults>,
    /// The services to run in the sandbox, by name, once the hooks have run (svc's own key
    /// beside `defaults`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub definitions: Option<UniqueMap<ServiceDefinition>>,
}

/// One service: a shell command supervised in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceDefinition {
    /// Run as `/bin/sh -c COMMAND`.
    #[schemars(length(min = 1))]
    pub command: String,
    /// Working directory in the sandbox (default `/workspace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    /// Healthy when this shell command exits 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheckFile>,
    /// This service's own restart policy, over `services.defaults`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_restart: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_delay_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HealthCheckFile {
    #[schemars(length(min = 1))]
    pub command: String,
    /// Default 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub interval_ms: Option<u64>,
    /// Default 5000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
}

/// `services.defaults`; each key optional, built-in defaults in `effective`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceDefaults {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_restart: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_delay_ms: Option<u64>,
}

impl Services {
    /// The names of `definitions` (none when absent).
    pub(super) fn defined(&self) -> Vec<&String> {
        self.definitions
            .as_ref()
            .map(|d| d.0.keys().collect())
            .unwrap_or_default()
    }

    /// Each definition's name, command, directory, variables and health check.
    pub(super) fn validate(&self, err: &mut impl FnMut(String, String)) {
        for (name, d) in self.definitions.iter().flat_map(|d| &d.0) {
            let base = format!("/services/definitions/{}", escape(name));
            if let Err(why) = crate::names::SandboxName::check(name) {
                err(base.clone(), format!("service name: {why}"));
            }
            d.validate(&base, err);
        }
    }
}

impl ServiceDefinition {
    fn validate(&self, base: &str, err: &mut impl FnMut(String, String)) {
        if self.command.trim().is_empty() {
            err(
                format!("{base}/command"),
                "shell command must not be empty".into(),
            );
        }
        if let Some(cwd) = &self.cwd
            && !cwd.starts_with('/')
        {
            err(
                format!("{base}/cwd"),
                format!("expected an absolute path in the sandbox, got {cwd:?}"),
            );
        }
        for k in self.env.iter().flat_map(|e| e.keys()) {
            if !crate::names::is_env_name(k) {
                err(format!("{base}/env"), format!("bad variable name {k:?}"));
            }
        }
        if let Some(h) = &self.health_check {
            h.validate(&format!("{base}/healthCheck"), err);
        }
    }
}

impl HealthCheckFile {
    fn validate(&self, base: &str, err: &mut impl FnMut(String, String)) {
        if self.command.trim().is_empty() {
            err(
                format!("{base}/command"),
                "shell command must not be empty".into(),
            );
        }
        for (key, v) in [
            ("intervalMs", self.interval_ms),
            ("timeoutMs", self.timeout_ms),
        ] {
            if v == Some(0) {
                err(
                    format!("{base}/{key}"),
                    "expected at least 1 ms, got 0".into(),
                );
            }
        }
    }
}
