//! The workspace part of the API: what `svc workspace up` asks for, and what svcd says of a
//! running workspace and its hooks.

use serde::{Deserialize, Serialize};

/// Where a workspace's project directory appears inside its sandbox.
pub const WORKSPACE_GUEST_DIR: &str = "/workspace";

/// The workspace part of a creation request, read by `svc workspace up` as the calling user
/// and checked again by svcd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceSpec {
    /// The project directory on the host (absolute, without symbolic links), shared
    /// read-write at [`WORKSPACE_GUEST_DIR`]; its owner's files are the guest root's.
    pub root: String,
    /// `.svc/config.yaml`'s egress section: its hosts join the allowlist, its path rules and
    /// code-host carve-outs gate requests, its secrets are brokered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<crate::config::egress::EgressFile>,
    /// Lifecycle hooks, run in the sandbox by svcd.
    #[serde(default)]
    pub lifecycle: crate::config::effective::EffectiveLifecycle,
    /// Services supervised in the sandbox once the hooks have run (their restart policy
    /// resolved).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<svc_guest::services::ServiceSpec>,
    /// The readiness profile in force: the workspace is ready when each of its services is
    /// running (and healthy, if it has a health check). `None`: every service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<ReadinessProfile>,
    /// Spotlight port forwards (host `127.0.0.1:localPort` to the sandbox's `remotePort`),
    /// open from the first `workspace.ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forwards: Vec<crate::config::workspace::SpotlightForward>,
    /// `auth.defaults`, as it applies in the sandbox.
    #[serde(default)]
    pub auth: WorkspaceAuth,
    /// What host git would execute in the project as `svc workspace up` found it (its
    /// executable configuration and hooks), kept by svcd where the guest cannot change it, for
    /// `svc workspace down` to report what changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_snapshot: Option<crate::policy::gitdir::Snapshot>,
}

/// A workspace's `auth.defaults` (docs/workspaces.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceAuth {
    /// `authProfiles: ["gitconfig"]`: the calling user's git identity, read on the host by
    /// `svc workspace up`, given to git in the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_identity: Option<GitIdentity>,
    /// `sshAgentForward`: git over SSH through svcd's relay (never an agent socket); off, the
    /// relay refuses the sandbox's sessions.
    #[serde(default)]
    pub ssh_agent_forward: bool,
    /// `gitCredentialMode: host-helper`: git's HTTPS requests to the code host carry the
    /// sandbox's CODE_HOST_TOKEN placeholder, which the proxy swaps for the real token.
    #[serde(default)]
    pub git_host_helper: bool,
    /// `gitConfigWritable`: the project's `.git/config` and `.git/hooks` are writable in the
    /// sandbox (default: read-only binds; `policy::gitdir`).
    #[serde(default)]
    pub git_config_writable: bool,
}

/// A git identity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitIdentity {
    pub name: String,
    pub email: String,
}

impl GitIdentity {
    /// Names and addresses git would write: one line, no control characters, at most 256
    /// bytes each.
    pub fn check(&self) -> Result<(), String> {
        for (what, v) in [("name", &self.name), ("email", &self.email)] {
            if v.is_empty() || v.len() > 256 || v.chars().any(char::is_control) {
                return Err(format!(
                    "git identity {what} {v:?}: expected 1 to 256 bytes without control characters"
                ));
            }
        }
        Ok(())
    }
}

/// The readiness profile a workspace waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadinessProfile {
    pub name: String,
    /// Service names.
    pub services: Vec<String>,
}

/// A workspace's state, as `svc sandbox show` and `svc workspace status` show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceView {
    /// The project directory on the host.
    pub root: String,
    /// Where the guest sees it.
    pub guest_dir: String,
    /// `starting` (hooks running), `ready`, `failed` (a hook failed: see `failure`),
    /// `stopping` (onTeardown running), or `unknown` (svcd restarted since; nothing re-runs).
    pub state: String,
    /// The phase running or last run: `setup`, `start` or `teardown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// What failed, e.g. `onSetup[1] "make deps" exited with 2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Where svcd keeps the hooks' output (`svc workspace logs NAME`).
    pub log: String,
    /// Port forwards: `127.0.0.1:LOCAL -> SERVICE:REMOTE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub forwards: Vec<String>,
    /// What host git would execute in the project when the workspace came up (see
    /// [`WorkspaceSpec::git_snapshot`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_snapshot: Option<crate::policy::gitdir::Snapshot>,
}

/// One record of a workspace's log (`GET /v1/sandboxes/{name}/workspace/log`, JSON lines).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceLogRecord {
    /// 1, 2, … in the order written.
    pub seq: u64,
    /// RFC 3339.
    pub time: String,
    /// `setup`, `start`, `services` or `teardown`.
    pub phase: String,
    /// What this record says: `hook_started`, `output`, `hook_finished`, `hook_failed`,
    /// `phase_finished`, `phase_skipped`, `service_started`, `service_exited`,
    /// `service_restarting`, `service_failed`, `service_healthy`, `service_unhealthy`,
    /// `service_stopped`, `ready`, `workspace_failed`.
    pub kind: String,
    /// The hook's place in its phase (0, 1, …), for hook records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<usize>,
    /// The service, for service records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// A service's restarts so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<u32>,
    /// The hook's shell command, for hook records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// `stdout` or `stderr`, for output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// One line of output (without its line break; invalid UTF-8 replaced), or the message of
    /// a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The hook's exit code, when it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// How long the hook ran, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}
