//! `.svc/workspace.json`, version 1 (SPEC 2.4–2.7, 4.2, 9).
//!
//! Strict JSON: no comments, no trailing commas, no duplicate keys, no unknown fields. The file
//! types below are also the source of `schema/workspace.v1.json` (`svc config schema`).

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    error::{ConfigError, ConfigErrors, Location},
    unique_map::UniqueMap,
};

/// The only `version` this build reads.
pub const VERSION: u64 = 1;
/// Default per-check timeout of doctor checks, in milliseconds (SPEC 2.7, 8).
pub const DEFAULT_CHECK_TIMEOUT_MS: u64 = 60_000;

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

/// Kinds of readiness entry. SPEC 2.4 shows `service`, the only kind this build knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ReadinessKind {
    Service,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Services {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<ServiceDefaults>,
    /// The services to run in the sandbox, by name, once the hooks have run (svc's own key:
    /// SPEC 2.4 shows only `defaults`).
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
    pub env: Option<std::collections::BTreeMap<String, String>>,
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

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Spotlight {
    #[serde(default)]
    pub defaults: Vec<SpotlightForward>,
}

/// One port forward: `remotePort` inside the sandbox to `localPort` on the host.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SpotlightForward {
    #[schemars(length(min = 1))]
    pub service: String,
    #[schemars(range(min = 1, max = 65535))]
    pub remote_port: u16,
    #[schemars(range(min = 1, max = 65535))]
    pub local_port: u16,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<AuthDefaults>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AuthDefaults {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_profiles: Option<Vec<AuthProfile>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_agent_forward: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_credential_mode: Option<GitCredentialMode>,
    /// Let the sandbox write the project's `.git/config` and `.git/hooks` (default: false,
    /// they are read-only there). Whatever it writes there runs as you on the host at your
    /// next git command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_config_writable: Option<bool>,
}

/// Auth profiles. SPEC 2.4 shows `gitconfig`, the only one this build knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AuthProfile {
    Gitconfig,
}

/// Git credential modes. SPEC 2.4 shows `host-helper`, the only one this build knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum GitCredentialMode {
    HostHelper,
}

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

/// `runtime` (SPEC 2.5).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    /// Backends, in order of preference; empty: the daemon selects automatically.
    #[serde(default)]
    pub required: Vec<Backend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<Selection>,
}

/// Registered sandbox backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// A microVM guest (QEMU `-M microvm`): the isolation boundary for hostile code.
    Microvm,
    /// An unprivileged OCI container (user namespace, own root file system, seccomp, cgroup
    /// limits): the embedded default; shares the host's kernel.
    Container,
    /// The former name of `container`, still accepted.
    Netns,
}

impl Backend {
    pub const ALL: [Self; 3] = [Self::Microvm, Self::Container, Self::Netns];
    /// The backend a name stands for (`netns` is `container`).
    pub const fn canonical(self) -> Self {
        match self {
            Self::Netns => Self::Container,
            other => other,
        }
    }
    pub const fn name(self) -> &'static str {
        match self {
            Self::Microvm => "microvm",
            Self::Container | Self::Netns => "container",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Selection {
    /// The first available backend listed in `required`.
    PreferFirst,
}

/// `capabilities` (SPEC 2.6).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    #[serde(default)]
    pub required: Vec<Capability>,
}

/// The capability registry: every capability a workspace may require. An unknown name fails
/// workspace creation (SPEC 2.6, 7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
pub enum Capability {
    /// Port forwarding from the sandbox to the host (Spotlight).
    #[serde(rename = "spotlight.tunnel")]
    SpotlightTunnel,
    /// Git over SSH relayed through the host's SSH agent.
    #[serde(rename = "git.ssh-relay")]
    GitSshRelay,
    /// Placeholder credentials swapped for real ones by the host proxy.
    #[serde(rename = "credentials.broker")]
    CredentialsBroker,
    /// Supervised services with restart policy and readiness.
    #[serde(rename = "services.supervisor")]
    ServicesSupervisor,
}

impl Capability {
    pub const ALL: [Self; 4] = [
        Self::SpotlightTunnel,
        Self::GitSshRelay,
        Self::CredentialsBroker,
        Self::ServicesSupervisor,
    ];
    pub const fn name(self) -> &'static str {
        match self {
            Self::SpotlightTunnel => "spotlight.tunnel",
            Self::GitSshRelay => "git.ssh-relay",
            Self::CredentialsBroker => "credentials.broker",
            Self::ServicesSupervisor => "services.supervisor",
        }
    }
}

/// `doctor` (SPEC 2.7).
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
    let defined: Vec<&String> = w
        .services
        .as_ref()
        .and_then(|s| s.definitions.as_ref())
        .map(|d| d.0.keys().collect())
        .unwrap_or_default();
    if let Some(defs) = w.services.as_ref().and_then(|s| s.definitions.as_ref()) {
        for (name, d) in &defs.0 {
            let base = format!("/services/definitions/{}", escape(name));
            if let Err(why) = crate::names::check_name(name) {
                err(base.clone(), format!("service name: {why}"));
            }
            if d.command.trim().is_empty() {
                err(
                    format!("{base}/command"),
                    "shell command must not be empty".into(),
                );
            }
            if let Some(cwd) = &d.cwd
                && !cwd.starts_with('/')
            {
                err(
                    format!("{base}/cwd"),
                    format!("expected an absolute path in the sandbox, got {cwd:?}"),
                );
            }
            for k in d.env.iter().flat_map(|e| e.keys()) {
                if k.is_empty() || k.contains(['=', '\0']) {
                    err(format!("{base}/env"), format!("bad variable name {k:?}"));
                }
            }
            if let Some(h) = &d.health_check {
                if h.command.trim().is_empty() {
                    err(
                        format!("{base}/healthCheck/command"),
                        "shell command must not be empty".into(),
                    );
                }
                for (key, v) in [("intervalMs", h.interval_ms), ("timeoutMs", h.timeout_ms)] {
                    if v == Some(0) {
                        err(
                            format!("{base}/healthCheck/{key}"),
                            "expected at least 1 ms, got 0".into(),
                        );
                    }
                }
            }
        }
    }
    if let Some(readiness) = &w.readiness {
        for (profile, entries) in &readiness.profiles.0 {
            let base = format!("/readiness/profiles/{}", escape(profile));
            if profile.trim().is_empty() {
                err(base.clone(), "profile name must not be empty".into());
            }
            for (i, e) in entries.iter().enumerate() {
                if e.name.trim().is_empty() {
                    err(format!("{base}/{i}/name"), "must not be empty".into());
                }
                if e.service_name.trim().is_empty() {
                    err(
                        format!("{base}/{i}/serviceName"),
                        "must not be empty".into(),
                    );
                } else if !defined.contains(&&e.service_name) {
                    err(
                        format!("{base}/{i}/serviceName"),
                        format!(
                            "no service {:?} in services.definitions (defined: {})",
                            e.service_name,
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
    }
    if let Some(spotlight) = &w.spotlight {
        for (i, f) in spotlight.defaults.iter().enumerate() {
            if f.service.trim().is_empty() {
                err(
                    format!("/spotlight/defaults/{i}/service"),
                    "must not be empty".into(),
                );
            }
            for (key, port) in [("remotePort", f.remote_port), ("localPort", f.local_port)] {
                if port == 0 {
                    err(
                        format!("/spotlight/defaults/{i}/{key}"),
                        "expected a port from 1 to 65535, got 0".into(),
                    );
                }
            }
        }
    }
    if let Some(lifecycle) = &w.lifecycle {
        for (key, cmds) in [
            ("onSetup", &lifecycle.on_setup),
            ("onStart", &lifecycle.on_start),
            ("onTeardown", &lifecycle.on_teardown),
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
        if lifecycle.timeout_ms == Some(0) {
            err(
                "/lifecycle/timeoutMs".into(),
                "expected a timeout of at least 1 ms, got 0".into(),
            );
        }
    }
    if let Some(runtime) = &w.runtime {
        for (i, b) in runtime.required.iter().enumerate() {
            if runtime.required[..i]
                .iter()
                .any(|o| o.canonical() == b.canonical())
            {
                err(
                    format!("/runtime/required/{i}"),
                    format!("backend {:?} is listed twice", b.name()),
                );
            }
        }
    }
    if let Some(doctor) = &w.doctor {
        let mut seen: Vec<(&str, String)> = Vec::new();
        for (phase, checks) in [("probes", &doctor.probes), ("tests", &doctor.tests)] {
            for (i, c) in checks.iter().enumerate() {
                let base = format!("/doctor/{phase}/{i}");
                if c.name.trim().is_empty() {
                    err(format!("{base}/name"), "must not be empty".into());
                } else if let Some((_, first)) = seen.iter().find(|(n, _)| *n == c.name) {
                    err(
                        format!("{base}/name"),
                        format!(
                            "check name {:?} is already used at {first}; names must be unique across probes and tests",
                            c.name
                        ),
                    );
                } else {
                    seen.push((&c.name, format!("{base}/name")));
                }
                if c.command.trim().is_empty() {
                    err(format!("{base}/command"), "must not be empty".into());
                }
                if c.timeout_ms == 0 {
                    err(
                        format!("{base}/timeoutMs"),
                        "expected a timeout of at least 1 ms, got 0".into(),
                    );
                }
            }
        }
    }
    errors
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

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The JSON Schema of `T` (draft 2020-12), as shipped in `schema/workspace.v1.json`.
pub fn json_schema<T: JsonSchema>() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(T)).unwrap_or_default()
}
