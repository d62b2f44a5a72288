//! The effective workspace configuration, in order of precedence: explicit API request
//! parameters, then `.svc/workspace.json`, then built-in defaults. One function, [`resolve`].
//!
//! Merging is per key for `services.defaults` and `auth.defaults` (an API request that sets
//! only `autoRestart` keeps the file's `stopTimeoutMs`), and per block for everything else (an
//! API request that gives `lifecycle` replaces the file's whole `lifecycle`).

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    compose::ComposePorts,
    workspace::{
        AuthDefaults, AuthProfile, Backend, Capability, Check, GitCredentialMode, Lifecycle,
        ReadinessEntry, Selection, ServiceDefaults, ServiceDefinition, SpotlightForward, Workspace,
        WorkspaceFile,
    },
};

/// Built-in defaults (the bottom layer): svc's own, documented in the README.
pub mod defaults {
    pub const STOP_TIMEOUT_MS: u64 = 10_000;
    pub const AUTO_RESTART: bool = true;
    pub const MAX_RESTARTS: u32 = 3;
    pub const RESTART_DELAY_MS: u64 = 1_000;
    pub const SSH_AGENT_FORWARD: bool = false;
    /// A service health check's interval and timeout.
    pub const HEALTH_INTERVAL_MS: u64 = 1_000;
    pub const HEALTH_TIMEOUT_MS: u64 = 5_000;
    /// How long one lifecycle hook may run.
    pub const HOOK_TIMEOUT_MS: u64 = 600_000;
}

/// Where a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    Api,
    WorkspaceJson,
    Compose,
    Default,
}

/// Explicit parameters of an API request (the top layer). `None` = not given.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ApiParams {
    pub service_defaults: ServiceDefaults,
    pub spotlight: Option<Vec<SpotlightForward>>,
    pub auth: AuthDefaults,
    pub lifecycle: Option<Lifecycle>,
    pub runtime_required: Option<Vec<Backend>>,
    pub runtime_selection: Option<Selection>,
    pub capabilities: Option<Vec<Capability>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveServices {
    pub stop_timeout_ms: u64,
    pub auto_restart: bool,
    pub max_restarts: u32,
    pub restart_delay_ms: u64,
    /// `services.definitions`, each with its restart policy resolved over these defaults.
    pub definitions: Vec<svc_guest::services::ServiceSpec>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveAuth {
    pub auth_profiles: Vec<AuthProfile>,
    pub ssh_agent_forward: bool,
    pub git_credential_mode: Option<GitCredentialMode>,
    /// `gitConfigWritable`: the project's `.git/config` and `.git/hooks` writable in the
    /// sandbox.
    pub git_config_writable: bool,
}

/// The hooks a workspace runs; also what `svc workspace up` sends svcd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EffectiveLifecycle {
    #[serde(default)]
    pub on_setup: Vec<String>,
    #[serde(default)]
    pub on_start: Vec<String>,
    #[serde(default)]
    pub on_teardown: Vec<String>,
    /// Per hook, milliseconds.
    #[serde(default = "default_hook_timeout")]
    pub timeout_ms: u64,
}

impl Default for EffectiveLifecycle {
    fn default() -> Self {
        Self {
            on_setup: Vec::new(),
            on_start: Vec::new(),
            on_teardown: Vec::new(),
            timeout_ms: defaults::HOOK_TIMEOUT_MS,
        }
    }
}

const fn default_hook_timeout() -> u64 {
    defaults::HOOK_TIMEOUT_MS
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveRuntime {
    /// Empty: the daemon selects automatically from available capabilities.
    pub required: Vec<Backend>,
    pub selection: Selection,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EffectiveDoctor {
    pub probes: Vec<Check>,
    pub tests: Vec<Check>,
}

/// The configuration a workspace runs with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EffectiveWorkspace {
    pub readiness: BTreeMap<String, Vec<ReadinessEntry>>,
    pub services: EffectiveServices,
    pub spotlight: Vec<SpotlightForward>,
    pub auth: EffectiveAuth,
    pub lifecycle: EffectiveLifecycle,
    pub runtime: EffectiveRuntime,
    pub capabilities: Vec<Capability>,
    pub doctor: EffectiveDoctor,
    /// Which layer each key came from (`services.stopTimeoutMs`, `spotlight`, …).
    pub sources: BTreeMap<&'static str, Source>,
}

// ReadinessEntry holds only strings and an enum, so Eq is sound for the effective type.
impl Eq for ReadinessEntry {}

/// Which layer each key came from.
type Sources = BTreeMap<&'static str, Source>;

/// Resolve the effective configuration. `compose` is used for Spotlight only when there is no
/// workspace.json.
pub fn resolve(
    api: &ApiParams,
    file: Option<&Workspace>,
    compose: Option<&ComposePorts>,
) -> EffectiveWorkspace {
    let f = file.map(Workspace::file);
    let mut sources = BTreeMap::new();
    let services = services(api, f, &mut sources);
    let auth = auth(api, f, &mut sources);
    let spotlight = spotlight(api, f, compose, &mut sources);
    let lifecycle = lifecycle(api, f, &mut sources);
    let runtime = runtime(api, f, &mut sources);
    let capabilities = pick(
        &mut sources,
        "capabilities",
        api.capabilities.clone(),
        f.and_then(|f| f.capabilities.as_ref())
            .map(|c| c.required.clone()),
        Vec::new(),
    );
    let readiness = f
        .and_then(|f| f.readiness.as_ref())
        .map(|r| r.profiles.0.clone());
    sources.insert("readiness", file_or_default(readiness.is_some()));
    let doctor = f.and_then(|f| f.doctor.clone());
    sources.insert("doctor", file_or_default(doctor.is_some()));
    let doctor = doctor
        .map(|d| EffectiveDoctor {
            probes: d.probes,
            tests: d.tests,
        })
        .unwrap_or_default();

    EffectiveWorkspace {
        readiness: readiness.unwrap_or_default(),
        services,
        spotlight,
        auth,
        lifecycle,
        runtime,
        capabilities,
        doctor,
        sources,
    }
}

/// The restart defaults per key, then each definition's policy over them.
fn services(
    api: &ApiParams,
    f: Option<&WorkspaceFile>,
    sources: &mut Sources,
) -> EffectiveServices {
    let file_services = f
        .and_then(|f| f.services.as_ref())
        .and_then(|s| s.defaults.clone())
        .unwrap_or_default();
    let mut services = EffectiveServices {
        stop_timeout_ms: pick(
            sources,
            "services.stopTimeoutMs",
            api.service_defaults.stop_timeout_ms,
            file_services.stop_timeout_ms,
            defaults::STOP_TIMEOUT_MS,
        ),
        auto_restart: pick(
            sources,
            "services.autoRestart",
            api.service_defaults.auto_restart,
            file_services.auto_restart,
            defaults::AUTO_RESTART,
        ),
        max_restarts: pick(
            sources,
            "services.maxRestarts",
            api.service_defaults.max_restarts,
            file_services.max_restarts,
            defaults::MAX_RESTARTS,
        ),
        restart_delay_ms: pick(
            sources,
            "services.restartDelayMs",
            api.service_defaults.restart_delay_ms,
            file_services.restart_delay_ms,
            defaults::RESTART_DELAY_MS,
        ),
        definitions: Vec::new(),
    };
    services.definitions = f
        .and_then(|f| f.services.as_ref())
        .and_then(|s| s.definitions.as_ref())
        .map(|d| {
            d.0.iter()
                .map(|(name, d)| service_spec(&services, name, d))
                .collect()
        })
        .unwrap_or_default();
    services
}

/// One service as the guest runs it: its own restart policy over the defaults in `policy`.
fn service_spec(
    policy: &EffectiveServices,
    name: &str,
    d: &ServiceDefinition,
) -> svc_guest::services::ServiceSpec {
    svc_guest::services::ServiceSpec {
        name: name.to_owned(),
        command: d.command.clone(),
        cwd: d.cwd.clone(),
        env: d.env.clone().unwrap_or_default(),
        health_check: d
            .health_check
            .as_ref()
            .map(|h| svc_guest::services::HealthCheck {
                command: h.command.clone(),
                interval_ms: h.interval_ms.unwrap_or(defaults::HEALTH_INTERVAL_MS),
                timeout_ms: h.timeout_ms.unwrap_or(defaults::HEALTH_TIMEOUT_MS),
            }),
        stop_timeout_ms: d.stop_timeout_ms.unwrap_or(policy.stop_timeout_ms),
        auto_restart: d.auto_restart.unwrap_or(policy.auto_restart),
        max_restarts: d.max_restarts.unwrap_or(policy.max_restarts),
        restart_delay_ms: d.restart_delay_ms.unwrap_or(policy.restart_delay_ms),
    }
}

/// `auth.defaults`, per key.
fn auth(api: &ApiParams, f: Option<&WorkspaceFile>, sources: &mut Sources) -> EffectiveAuth {
    let file_auth = f
        .and_then(|f| f.auth.as_ref())
        .and_then(|a| a.defaults.clone())
        .unwrap_or_default();
    EffectiveAuth {
        auth_profiles: pick(
            sources,
            "auth.authProfiles",
            api.auth.auth_profiles.clone(),
            file_auth.auth_profiles,
            Vec::new(),
        ),
        ssh_agent_forward: pick(
            sources,
            "auth.sshAgentForward",
            api.auth.ssh_agent_forward,
            file_auth.ssh_agent_forward,
            defaults::SSH_AGENT_FORWARD,
        ),
        git_credential_mode: pick(
            sources,
            "auth.gitCredentialMode",
            api.auth.git_credential_mode.map(Some),
            file_auth.git_credential_mode.map(Some),
            None,
        ),
        git_config_writable: pick(
            sources,
            "auth.gitConfigWritable",
            api.auth.git_config_writable,
            file_auth.git_config_writable,
            false,
        ),
    }
}

/// The forwards of the API, else the file, else (without a workspace.json) the compose file.
fn spotlight(
    api: &ApiParams,
    f: Option<&WorkspaceFile>,
    compose: Option<&ComposePorts>,
    sources: &mut Sources,
) -> Vec<SpotlightForward> {
    let file_spotlight = f
        .and_then(|f| f.spotlight.as_ref())
        .map(|s| s.defaults.clone());
    if let Some(api_spotlight) = &api.spotlight {
        sources.insert("spotlight", Source::Api);
        api_spotlight.clone()
    } else if let Some(fs) = file_spotlight {
        sources.insert("spotlight", Source::WorkspaceJson);
        fs
    } else if let (None, Some(compose)) = (f, compose) {
        sources.insert("spotlight", Source::Compose);
        compose
            .forwards
            .iter()
            .map(|c| SpotlightForward {
                service: c.service.clone(),
                remote_port: c.remote_port,
                local_port: c.local_port,
            })
            .collect()
    } else {
        sources.insert("spotlight", Source::Default);
        Vec::new()
    }
}

/// `lifecycle`, as a block.
fn lifecycle(
    api: &ApiParams,
    f: Option<&WorkspaceFile>,
    sources: &mut Sources,
) -> EffectiveLifecycle {
    let lifecycle = pick(
        sources,
        "lifecycle",
        api.lifecycle.clone(),
        f.and_then(|f| f.lifecycle.clone()),
        Lifecycle::default(),
    );
    EffectiveLifecycle {
        on_setup: lifecycle.on_setup.unwrap_or_default(),
        on_start: lifecycle.on_start.unwrap_or_default(),
        on_teardown: lifecycle.on_teardown.unwrap_or_default(),
        timeout_ms: lifecycle.timeout_ms.unwrap_or(defaults::HOOK_TIMEOUT_MS),
    }
}

/// `runtime.required` and `runtime.selection`.
fn runtime(api: &ApiParams, f: Option<&WorkspaceFile>, sources: &mut Sources) -> EffectiveRuntime {
    let file_runtime = f.and_then(|f| f.runtime.clone());
    EffectiveRuntime {
        required: pick(
            sources,
            "runtime.required",
            api.runtime_required.clone(),
            file_runtime.as_ref().map(|r| r.required.clone()),
            Vec::new(),
        ),
        selection: pick(
            sources,
            "runtime.selection",
            api.runtime_selection,
            file_runtime.and_then(|r| r.selection),
            Selection::PreferFirst,
        ),
    }
}

/// A key only the file sets: from the file if present, else the default.
fn file_or_default(present: bool) -> Source {
    if present {
        Source::WorkspaceJson
    } else {
        Source::Default
    }
}

/// The first of API, file, default that is present, recording which.
fn pick<T>(
    sources: &mut Sources,
    key: &'static str,
    api: Option<T>,
    file: Option<T>,
    default: T,
) -> T {
    let (value, source) = match (api, file) {
        (Some(v), _) => (v, Source::Api),
        (None, Some(v)) => (v, Source::WorkspaceJson),
        (None, None) => (default, Source::Default),
    };
    sources.insert(key, source);
    value
}
