//! `.svc/workspace.json`, version 1.
//!
//! Strict JSON: no comments, no trailing commas, no duplicate keys, no unknown fields. The file
//! types below are also the source of `schema/workspace.v1.json` (`svc config schema`).
//!
//! One file per section, each with its types as written and the rules its types cannot say;
//! this file holds the whole: [`WorkspaceFile`], [`parse`] and the check that calls each
//! section in turn.

mod auth;
mod capabilities;
mod doctor;
mod lifecycle;
mod pointer;
mod readiness;
mod runtime;
mod services;
mod spotlight;

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use auth::{Auth, AuthDefaults, AuthProfile, GitCredentialMode};
pub use capabilities::{Capabilities, Capability};
pub use doctor::{Check, DEFAULT_CHECK_TIMEOUT_MS, Doctor};
pub use lifecycle::Lifecycle;
pub use readiness::{Readiness, ReadinessEntry, ReadinessKind};
pub use runtime::{Backend, Runtime, Selection};
pub use services::{HealthCheckFile, ServiceDefaults, ServiceDefinition, Services};
pub use spotlight::{Spotlight, SpotlightForward};

use super::error::{ConfigError, ConfigErrors, Location};

/// The only `version` this build reads.
pub const VERSION: u64 = 1;

/// The whole file, as written.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "svc workspace configuration (.svc/workspace.json), version 1")]
pub struct WorkspaceFile {
    /// Relative path to the v1 schema file, for editors.
    #[serde(rename = "$schema", default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// Format version; must be 1.
    #[schemars(range(min = 1, max = 1))]
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<Readiness>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<Services>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spotlight: Option<Spotlight>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<Auth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifecycle: Option<Lifecycle>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<Runtime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub doctor: Option<Doctor>,
}

/// A `.svc/workspace.json` that parsed and passed every check. The only way to get one is
/// [`parse`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Workspace(WorkspaceFile);

impl Workspace {
    pub fn file(&self) -> &WorkspaceFile {
        &self.0
    }
}

/// Parse and validate the text of a workspace.json. `file` is only used in messages.
pub fn parse(file: &Path, text: &str) -> Result<Workspace, ConfigErrors> {
    // The typed parse is strict on syntax, duplicates and unknown fields, with line and column;
    // the schema also holds the shapes serde alone would let through (serde accepts an array
    // where a struct belongs). Checking both keeps the shipped schema and this parser in
    // agreement.
    let schema_errs = schema_errors(file, text);
    let parsed: WorkspaceFile = match super::parse_json(file, text) {
        Ok(p) => p,
        Err(mut e) => {
            // A schema type error above the typed error's location is the real cause.
            let above = |s: &ConfigError| {
                s.message.contains("is not of type")
                    && e.location
                        .path
                        .starts_with(&format!("{}/", s.location.path))
            };
            let type_errors: Vec<ConfigError> = schema_errs.into_iter().filter(above).collect();
            if !type_errors.is_empty() {
                return Err(ConfigErrors(type_errors));
            }
            let line = e
                .location
                .line
                .and_then(|l| text.lines().nth(l - 1))
                .unwrap_or("");
            if line.trim_start().starts_with("//") || line.trim_start().starts_with("/*") {
                e.message
                    .push_str(" (comments are not allowed: workspace.json is strict JSON)");
            }
            return Err(e.into());
        }
    };
    let mut errors = schema_errs;
    errors.extend(validate(file, &parsed));
    if errors.is_empty() {
        Ok(Workspace(parsed))
    } else {
        Err(ConfigErrors(errors))
    }
}

/// Errors of the text against the v1 JSON Schema, each at its JSON pointer.
fn schema_errors(file: &Path, text: &str) -> Vec<ConfigError> {
    static VALIDATOR: std::sync::OnceLock<Option<jsonschema::Validator>> =
        std::sync::OnceLock::new();
    let Some(validator) = VALIDATOR
        .get_or_init(|| jsonschema::validator_for(&json_schema::<WorkspaceFile>()).ok())
        .as_ref()
    else {
        return vec![ConfigError::new(
            file,
            Location::default(),
            "internal error: the v1 schema does not compile",
        )];
    };
    let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
        return Vec::new(); // the typed parse already reported the syntax error
    };
    validator
        .iter_errors(&value)
        .map(|e| {
            ConfigError::new(
                file,
                Location::at(e.instance_path().as_str()),
                e.masked().to_string(),
            )
        })
        .collect()
}

/// Every rule the types cannot say, each error with its JSON pointer.
fn validate(file: &Path, w: &WorkspaceFile) -> Vec<ConfigError> {
    let mut errors = Vec::new();
    let mut err = |pointer: String, message: String| {
        errors.push(ConfigError::new(file, Location::at(pointer), message));
    };
    check_header(w, &mut err);
    if let Some(services) = &w.services {
        services.validate(&mut err);
    }
    if let Some(readiness) = &w.readiness {
        let defined = w
            .services
            .as_ref()
            .map(Services::defined)
            .unwrap_or_default();
        readiness.validate(&defined, &mut err);
    }
    if let Some(spotlight) = &w.spotlight {
        spotlight.validate(&mut err);
    }
    if let Some(lifecycle) = &w.lifecycle {
        lifecycle.validate(&mut err);
    }
    if let Some(runtime) = &w.runtime {
        runtime.validate(&mut err);
    }
    if let Some(doctor) = &w.doctor {
        doctor.validate(&mut err);
    }
    errors
}

/// `version` is the one this build reads; `$schema` is a relative path.
fn check_header(w: &WorkspaceFile, err: &mut impl FnMut(String, String)) {
    if w.version != VERSION {
        err(
            "/version".into(),
            format!(
                "unsupported version {}: this svc reads workspace.json version {VERSION}",
                w.version
            ),
        );
    }
    if let Some(schema) = &w.schema
        && let Some(why) = not_relative_path(schema)
    {
        err(
            "/$schema".into(),
            format!("expected a relative path to the v1 schema file, got {schema:?} ({why})"),
        );
    }
}

/// Why `s` is not a relative path, if it is not.
fn not_relative_path(s: &str) -> Option<&'static str> {
    if s.is_empty() {
        Some("empty")
    } else if s.starts_with('/') || s.starts_with('\\') {
        Some("absolute")
    } else if s.contains("://")
        || s.split_once(':').is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        })
    {
        Some("a URL")
    } else if s.contains('\0') {
        Some("contains NUL")
    } else {
        None
    }
}

/// The JSON Schema of `T` (draft 2020-12), as shipped in `schema/workspace.v1.json`.
pub fn json_schema<T: JsonSchema>() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default()
}
