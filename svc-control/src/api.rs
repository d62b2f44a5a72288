//! The svcd API: HTTP/1.1 + JSON on a unix socket (`/run/svc/svcd.sock`). These types are the
//! contract between svcd and the `svc` CLI (and any other client).
//!
//! | method and path                        | body                | answer                     |
//! |----------------------------------------|---------------------|----------------------------|
//! | `GET /v1/health`                       |                     | [`Health`]                 |
//! | `POST /v1/sandboxes`                   | [`CreateSandbox`]   | [`SandboxView`] (201)      |
//! | `GET /v1/sandboxes`                    |                     | `[SandboxView]`            |
//! | `GET /v1/sandboxes/{name}`             |                     | [`SandboxView`]            |
//! | `DELETE /v1/sandboxes/{name}`          |                     | [`Destroyed`]              |
//! | `POST /v1/sandboxes/{name}/exec`       | [`ExecRequest`]     | JSON lines of [`ExecFrame`]; upgraded: [`ExecInput`] in, [`ExecFrame`] out |
//! | `POST /v1/sandboxes/{name}/{pause,resume,fork}` |            | [`SandboxView`]            |
//! | `GET /v1/sandboxes/{name}/stats`       |                     | [`SandboxStats`]           |
//! | `GET /v1/events[?follow=1&after=N]`    |                     | JSON lines of [`Event`]    |
//! | `POST /v1/supervisor/upgrade`          | [`Upgrade`]         | [`Health`] of the new one  |
//! | `POST /v1/trust/check`, `POST /v1/trust` | [`TrustRequest`]  | [`TrustCheck`]             |
//! | `GET /v1/backends`                     |                     | [`Backends`]               |
//!
//! Every error is an [`ApiError`] with a non-2xx status.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

/// What the running svcd's backends are and use.
mod backends;
pub use backends::{BackendInfo, Backends, Used};
/// The approval of a project's perimeter, per API caller.
mod trust;
pub use trust::{ProjectPerimeter, TrustCheck, TrustRequest};
/// What changes a running sandbox: its allowlist, a fork into clones.
mod changes;
pub use changes::{AllowChange, ForkRequest};
/// A pod container's root file system attached into its pod's sandbox.
pub mod ctr_root;
/// A pod's identity (Kubernetes namespace and name), checked as it is read.
mod pod;
/// A workspace's part of a creation request, and what svcd says of a workspace.
mod workspace;
pub use pod::{PodNamespacesChange, PodRef};
/// What a sandbox uses (`GET /v1/sandboxes/{name}/stats`).
mod stats;
pub use stats::SandboxStats;
pub use workspace::{
    GitIdentity, ReadinessProfile, WORKSPACE_GUEST_DIR, WorkspaceAuth, WorkspaceLogRecord,
    WorkspaceSpec, WorkspaceView,
};

/// Version prefix of every path.
pub const PREFIX: &str = "/v1";

pub use crate::names::{MAX_NAME, SandboxName};

/// The egress mode asked for at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EgressChoice {
    /// The built-in agent hosts plus `--allow-host` and `--repo` hosts; everything else closed.
    Curated,
    /// Open egress (never the refused destination classes) for a window of 72 hours, no proxy,
    /// no credentials; then Curated with the agent hosts.
    AllowAll,
}

impl EgressChoice {
    pub const VALUES: [&'static str; 2] = ["curated", "allow-all"];

    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "curated" => Ok(Self::Curated),
            "allow-all" => Ok(Self::AllowAll),
            other => Err(format!(
                "unknown egress mode {other:?}; allowed: {}",
                Self::VALUES.join(", ")
            )),
        }
    }
}

/// A secret brokered into a sandbox: the guest gets a placeholder in variable `name`; the
/// proxy swaps it for `value` on that variable's hosts. The CLI reads the value from its
/// source (`env:VAR`, `file:PATH`); it never reaches the guest.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretValue {
    pub name: String,
    /// Where it came from, for `show` (`env:GH_TOKEN`), never the value.
    pub source: String,
    pub value: String,
}

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretValue")
            .field("name", &self.name)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSandbox {
    /// Checked as the body is read: a bad name refuses the request.
    pub name: SandboxName,
    #[serde(default)]
    pub allow_hosts: Vec<String>,
    /// `owner/repo` on the code host.
    #[serde(default)]
    pub repo: Option<String>,
    #[serde(default)]
    pub egress: Option<EgressChoice>,
    #[serde(default)]
    pub secrets: Vec<SecretValue>,
    /// `--context-path` (`--file`): AllowAll for 72 hours.
    #[serde(default)]
    pub context_path: Option<String>,
    /// The backend asked for (`container`, its old name `netns`, `microvm`); default: the
    /// embedded default, `container`.
    #[serde(default)]
    pub backend: Option<String>,
    /// A workspace's `runtime.required`, used when `backend` is not given: the
    /// first of these this svcd offers; empty: automatic.
    #[serde(default)]
    pub runtime_required: Option<Vec<crate::config::workspace::Backend>>,
    /// Repositories the sandbox's git may reach over SSH through the relay: the `repos` of
    /// `.svc/config.yaml` `egress.policy` (`svc sandbox create --workspace` sends them).
    #[serde(default)]
    pub ssh_repos: Vec<SshRepo>,
    /// A workspace (`svc workspace up`): its project directory, egress section and hooks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceSpec>,
    /// The project the workspace or `runtime_required`/`ssh_repos` were read from, and its
    /// perimeter: svcd creates the sandbox only if the caller approved that perimeter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<ProjectPerimeter>,
    /// Hold git pushes over smart-HTTP to AllowedBranches too, as over SSH
    /// (`--https-push-branches`; a workspace's `.svc/config.yaml` `egress.httpsPushBranches`
    /// does the same). Default: a push to the bound repository may update any ref.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub https_push_branches: bool,
    /// AllowedBranches: the ref patterns pushes may update (a pod's `svc.dev/branches`);
    /// empty: the default, `refs/heads/svc/**`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_branches: Vec<String>,
    /// `--rootfs DIR`: the guest runs on this root file system (a directory on the host, or
    /// an unpacked image's layer directories top first, `TOP:…:BOTTOM` as overlayfs's
    /// lowerdir) instead of the base image, under the same overlay and id mapping; it is
    /// never written. Root callers only, container backend only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<String>,
    /// The Kubernetes pod the sandbox is (the containerd shim sends it from the CRI's
    /// annotations): kept with the sandbox, written in its audit records and on its metrics.
    /// Checked as the body is read (a DNS-1123 label and subdomain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

impl CreateSandbox {
    /// A request for sandbox `name` with nothing else asked: Curated with the built-in agent
    /// hosts, the default backend, no secrets, no workspace.
    pub fn named(name: SandboxName) -> Self {
        CreateSandbox {
            name,
            allow_hosts: Vec::new(),
            repo: None,
            egress: None,
            secrets: Vec::new(),
            context_path: None,
            backend: None,
            runtime_required: None,
            ssh_repos: Vec::new(),
            workspace: None,
            project: None,
            https_push_branches: false,
            allowed_branches: Vec::new(),
            rootfs: None,
            pod: None,
        }
    }
}

/// A repository on a host, reachable over SSH through the relay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SshRepo {
    /// The host name, as in the remote URL (no port: that comes from the URL).
    pub host: String,
    /// `owner/repo`.
    pub repo: String,
}

/// A stored secret as the API shows it: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretInfo {
    pub name: String,
    /// 1 when stored, one more at each rotation.
    pub version: u32,
    pub created_at: String,
    pub updated_at: String,
    /// `value` (a fixed value) or `oauth` (a refresh grant svcd keeps fresh).
    #[serde(default = "fixed")]
    pub kind: String,
    /// An OAuth secret's token endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_endpoint: Option<String>,
    /// When an OAuth secret's current access token expires (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// The uid that stored it: only it (and root) may change it or share it.
    #[serde(default)]
    pub owner_uid: u32,
    /// Its user name, where the host knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The group whose members may also use it (`svc secret share NAME --group G`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_gid: Option<u32>,
    /// The Kubernetes namespaces whose pods may name it in `svc.dev/secrets` (`*`: every one;
    /// none: no pod may), as `svc secret allow` set them.
    #[serde(default)]
    pub pod_namespaces: Vec<String>,
}

/// `POST /v1/secrets/{name}/share`: let the members of a unix group of the host use it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShareSecret {
    /// The group's name or gid, resolved on the host; `None`: shared with nobody (unshare).
    pub group: Option<String>,
}

fn fixed() -> String {
    "value".into()
}

/// An OAuth secret's provider: `value` is then its refresh token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OAuthSpec {
    /// `https://…`: where svcd sends the refresh grant.
    pub token_endpoint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
}

/// `POST /v1/secrets`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetSecret {
    pub name: String,
    pub value: String,
    /// Set: an OAuth secret whose `value` is the refresh token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth: Option<OAuthSpec>,
    /// The Kubernetes namespaces whose pods may name it (`--pod-namespace`); none by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_namespaces: Vec<String>,
}

/// `POST /v1/secrets/{name}/rotate`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RotateSecret {
    /// The new value (an OAuth secret: its new refresh token, same endpoint).
    pub value: String,
}

impl std::fmt::Debug for SetSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetSecret")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RotateSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RotateSecret").finish_non_exhaustive()
    }
}

/// The answer to a fork.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Forked {
    pub source: String,
    /// Pausing and saving the source.
    pub snapshot_ms: f64,
    pub clones: Vec<ForkedClone>,
}

/// One clone of a fork.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkedClone {
    #[serde(flatten)]
    pub view: SandboxView,
    /// From the start of its restore to its agent's setup done.
    pub ready_ms: f64,
}

/// One placeholder variable of a sandbox (never the real value).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlaceholderView {
    pub env: String,
    pub kind: String,
    pub hosts: Vec<String>,
    /// Whether a real credential stands behind it (else the proxy strips it).
    pub brokered: bool,
}

/// A sandbox as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxView {
    pub name: String,
    pub id: u32,
    /// `running`, or `dead` when its processes are gone (destroy it).
    pub state: String,
    pub backend: String,
    /// Why this backend (asked for, the workspace's runtime block, or the default).
    #[serde(default)]
    pub backend_reason: String,
    /// Host directories shared live into the guest (`HOST -> GUEST`), fixed at creation.
    #[serde(default)]
    pub live_mounts: Vec<String>,
    /// How a microvm guest's code runs: `kvm` or `tcg`, and why (microvm sandboxes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accel: Option<String>,
    /// `curated` or `allow-all`.
    pub mode: String,
    /// End of the AllowAll window (RFC 3339), counted from svcd's start.
    pub window_ends: Option<String>,
    pub allowed_hosts: Vec<String>,
    /// Bumped by every live change of the allowlist (`svc sandbox allow`).
    #[serde(default)]
    pub policy_generation: u32,
    pub allowed_branches: Vec<String>,
    /// Whether smart-HTTP pushes are held to `allowed_branches` too (else only SSH pushes).
    #[serde(default)]
    pub https_push_branches: bool,
    /// Repositories git may reach over SSH (the relay's policy).
    #[serde(default)]
    pub ssh_repos: Vec<SshRepo>,
    pub repo: Option<String>,
    pub context_path: Option<String>,
    pub link: String,
    pub guest_v4: Ipv4Addr,
    pub gateway_v4: Ipv4Addr,
    /// The host pid of the sandbox's init.
    pub pid: u32,
    pub created_at: String,
    /// The uid that created it: only it (and root) may act on it.
    #[serde(default)]
    pub owner_uid: u32,
    /// Its user name, where the host knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    pub placeholders: Vec<PlaceholderView>,
    pub secrets: Vec<String>,
    /// Its workspace, when made by `svc workspace up`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceView>,
    /// The Kubernetes pod it is, when made for one (the containerd shim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
}

/// `DELETE /v1/sandboxes/{name}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Destroyed {
    pub name: String,
    /// What was removed, in order.
    pub removed: Vec<String>,
}

/// `POST /v1/sandboxes/{name}/exec`.
///
/// Sent as a plain request, the command gets no standard input and its output comes back as
/// JSON lines of [`ExecFrame`]. Sent with `Connection: Upgrade` and `Upgrade:`
/// [`EXEC_UPGRADE`], svcd answers `101 Switching Protocols` and the connection carries JSON
/// lines both ways: [`ExecInput`] from the caller, [`ExecFrame`] from svcd (as `docker exec`
/// attaches).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    /// Extra environment (`KEY=VALUE` pairs as two strings), after the sandbox's own.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory inside the sandbox (default: [`WORKSPACE_GUEST_DIR`] in a workspace's
    /// sandbox, else `/`; svcd decides it).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Give the command a standard input fed by [`ExecInput::Stdin`] (upgraded calls only).
    #[serde(default)]
    pub stdin: bool,
    /// Run the command on a terminal of this size (upgraded calls only); its output then comes
    /// as `stdout` frames only.
    #[serde(default)]
    pub tty: Option<TermSize>,
    /// Run it as this user of the guest (ids as the guest sees them, within its id mapping);
    /// default: the guest's root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<ExecUser>,
    /// Run it chrooted into this attached container's root file system (its id,
    /// [`ctr_root::AttachRoot::id`]); `cwd` is then a path inside it. Default: the guest's own
    /// root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// Capabilities kept and `no_new_privs` (an OCI process's; `policy::exec_caps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardening: Option<crate::policy::exec_caps::ExecHardening>,
}

/// The guest user an exec runs as (an OCI spec's `process.user`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecUser {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
}

impl ExecUser {
    /// The guest's root with no supplementary groups: what an exec runs as by default.
    pub fn is_root(&self) -> bool {
        self.uid == 0 && self.gid == 0 && self.additional_gids.is_empty()
    }
}

/// The `Upgrade` token of an interactive exec.
pub const EXEC_UPGRADE: &str = "svc-exec.v1";

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TermSize {
    pub rows: u16,
    pub cols: u16,
}

/// One frame from the caller of an upgraded exec. Input bytes are base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecInput {
    Stdin(String),
    /// End of standard input.
    Eof,
    /// The caller's terminal changed size.
    Resize(TermSize),
    /// Send this signal (a number, e.g. 2 for SIGINT) to the command.
    Signal(i32),
}

/// One frame of an exec's output stream. Output bytes are base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecFrame {
    Stdout(String),
    Stderr(String),
    /// The exit code (128 + signal when killed).
    Exit(i32),
    /// The command could not be run.
    Error(String),
}

/// `GET /v1/events`: one line each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub seq: i64,
    pub time: String,
    /// `sandbox.created`, `workspace.ready`, `sandbox.destroyed`, `sandbox.adopted`,
    /// `sandbox.dead`, `egress.window-ended`, `supervisor.started`.
    pub kind: String,
    pub sandbox: Option<String>,
    #[serde(default)]
    pub detail: serde_json::Value,
    /// Whose it is (its sandbox's or secret's owner); none for svcd's own events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_uid: Option<u32>,
}

/// `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub version: String,
    pub pid: u32,
    pub started_at: String,
    pub sandboxes: usize,
    /// What the caller should know (`supervisor-upgrade --force`: the running sandboxes it
    /// cannot give the coding agent's live mount).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The warm pools that are on (`[pool]`): each backend's sandboxes ready and its size.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolStatus>,
}

/// One backend's warm pool in `GET /v1/health`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStatus {
    pub backend: String,
    /// Pooled sandboxes ready now.
    pub ready: usize,
    /// How many the pool keeps (`[pool]`).
    pub size: usize,
}

/// `POST /v1/supervisor/upgrade`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Upgrade {
    pub force: bool,
}

/// Every API error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// Stable, for scripts: `bad-request`, `not-found`, `exists`, `forbidden`, `unsupported`,
    /// `internal`, `too-large`.
    pub code: String,
    /// For people.
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let cases: &[(&str, bool)] = &[
            ("dev", true),
            ("a", true),
            ("agent-7", true),
            ("7up", true),
            ("", false),
            ("../x", false),
            ("a/b", false),
            ("Dev", false),
            ("-x", false),
            ("x-", false),
            ("a b", false),
            ("a.b", false),
            ("é", false),
            ("a\0", false),
        ];
        for (name, ok) in cases {
            assert_eq!(SandboxName::check(name).is_ok(), *ok, "{name:?}");
        }
        assert!(SandboxName::check(&"a".repeat(MAX_NAME)).is_ok());
        let long = SandboxName::check(&"a".repeat(MAX_NAME + 1)).unwrap_err();
        assert!(long.contains("limit is 48"), "{long}");
    }

    #[test]
    fn a_request_naming_a_bad_sandbox_is_refused_as_it_is_read() {
        let create = |name: &str| {
            serde_json::from_value::<CreateSandbox>(serde_json::json!({ "name": name }))
                .map(|c| c.name)
                .map_err(|e| e.to_string())
        };
        assert_eq!(create("dev").map(String::from), Ok("dev".to_owned()));
        assert_eq!(
            create("../x"),
            Err("sandbox name \"../x\" contains '.'; use lowercase letters, digits and '-'".into())
        );
        let fork = serde_json::from_value::<ForkRequest>(serde_json::json!({
            "clones": ["ok", "Not-ok"]
        }))
        .unwrap_err()
        .to_string();
        assert!(
            fork.starts_with("sandbox name \"Not-ok\" contains 'N'"),
            "{fork}"
        );
    }

    #[test]
    fn egress_values() {
        assert_eq!(EgressChoice::parse("curated"), Ok(EgressChoice::Curated));
        assert_eq!(EgressChoice::parse("allow-all"), Ok(EgressChoice::AllowAll));
        let e = EgressChoice::parse("open").unwrap_err();
        assert!(e.contains("curated, allow-all"), "{e}");
    }

    #[test]
    fn secret_debug_hides_the_value() {
        let s = SecretValue {
            name: "CODE_HOST_TOKEN".into(),
            source: "env:GH".into(),
            value: "ghp_real".into(),
        };
        assert!(!format!("{s:?}").contains("ghp_real"));
    }
}
