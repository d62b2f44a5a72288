//! `readiness`: named profiles of what must be up before the workspace is ready.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::pointer::escape;
use crate::config::UniqueMap;

/// `readiness`: named profiles of what must be up before the workspace is ready.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Readiness {
    #[serde(default)]
    pub profiles: UniqueMap<Vec<ReadinessEntry>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ReadinessEntry {
    #[schemars(length(min = 1))]
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ReadinessKind,
    #[schemars(length(min = 1))]
    pub service_name: String,
}

/// Kinds of readiness entry: `service`, the only kind this build knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ReadinessKind {
    Service,
}

impl Readiness {
    /// Profile and entry names not empty; each entry's service one of `defined`.
    pub(super) fn validate(&self, defined: &[&String], err: &mut impl FnMut(String, String)) {
        for (profile, entries) in &self.profiles.0 {
            let base = format!("/readiness/profiles/{}", escape(profile));
            if profile.trim().is_empty() {
                err(base.clone(), "profile name must not be empty".into());
            }
            for (i, e) in entries.iter().enumerate() {
                e.validate(&format!("{base}/{i}"), defined, err);
            }
        }
    }
}

impl ReadinessEntry {
    fn validate(&self, base: &str, defined: &[&String], err: &mut impl FnMut(String, String)) {
        if self.name.trim().is_empty() {
            err(format!("{base}/name"), "must not be empty".into());
        }
        if self.service_name.trim().is_empty() {
            err(format!("{base}/serviceName"), "must not be empty".into());
        } else if !defined.contains(&&self.service_name) {
            err(
                format!("{base}/serviceName"),
                format!(
                    "no service {:?} in services.definitions (defined: {})",
                    self.service_name,
                    if defined.is_empty() {
                        "none".to_owned()
                    } else {
                        defined
                            .iter()
                            .map(|d| d.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ),
            );
        }
    }
}
