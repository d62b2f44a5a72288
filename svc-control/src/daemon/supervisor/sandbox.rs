//! A sandbox as the supervisor holds it: its envelope (stored), its live record (in memory),
//! the environment and files its guest gets, and how its guest is plugged into its link.

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    sync::Arc,
    time::SystemTime,
};

use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Serialize};

use super::effects::{HostLinks, SandboxFence};
use crate::{
    api::{EgressChoice, SecretValue},
    daemon::failure::Failure,
    dataplane::{self, SandboxLink},
    policy::{mode::EgressMode, request::SandboxPolicy},
    proxy::{ca::SandboxCa, guest_trust},
    runtime::{BoxFuture, GuestHandle, GuestLinks, GuestNet, HostEnd, RuntimeError},
};

/// A stored placeholder.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StoredPlaceholder {
    pub(super) value: String,
    pub(super) kind: String,
    pub(super) hosts: Vec<String>,
}

/// The sandbox envelope, fixed at creation and stored as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    pub(super) backend: String,
    /// Why this backend (absent in sandboxes made before it was recorded).
    #[serde(default)]
    pub(super) backend_reason: String,
    /// Host directories the guest sees live (fixed at creation).
    #[serde(default)]
    pub(super) live_mounts: Vec<crate::runtime::SharedDir>,
    /// `--allow-host` hosts, as given (validated).
    pub(super) extra_hosts: Vec<String>,
    pub(super) repo: Option<String>,
    pub(super) egress: EgressChoice,
    pub(super) context_path: Option<String>,
    pub(super) allowed_branches: Vec<String>,
    /// `--https-push-branches`: smart-HTTP pushes held to `allowed_branches` too (a workspace
    /// can also ask in its egress section: [`Envelope::https_push_branches`]).
    #[serde(default)]
    pub(super) https_push_branches: bool,
    /// Repositories git may reach over SSH through the relay (normalised, fixed at creation).
    #[serde(default)]
    pub(super) ssh_repos: Vec<crate::api::SshRepo>,
    /// Its workspace (`svc workspace up`): project directory, egress section, hooks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) workspace: Option<crate::api::WorkspaceSpec>,
    /// The egress section of the project it was made from without a workspace (`svc sandbox
    /// create --workspace DIR`): the approved perimeter's, the same one a workspace carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) egress_section: Option<crate::config::egress::EgressFile>,
    /// The root file system it was made on (`--rootfs`: a tree, or layers top first), or
    /// none: the base image.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) rootfs: Vec<std::path::PathBuf>,
    /// Bumped by each live change of `extra_hosts` (`svc sandbox allow`).
    #[serde(default)]
    pub(super) policy_generation: u32,
    pub(super) link: String,
    pub(super) guest_v4: Ipv4Addr,
    pub(super) gateway_v4: Ipv4Addr,
    pub(super) placeholders: Vec<StoredPlaceholder>,
    /// The runtime's name for the guest when it is not the sandbox's: a sandbox taken from a
    /// warm pool keeps the name its guest was made under (`pool.container.N`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) runtime_id: Option<String>,
    /// The Kubernetes pod it was made for (its audit records and metrics carry it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) pod: Option<crate::api::PodRef>,
}

impl Envelope {
    /// The AllowedBranches smart-HTTP pushes are held to, when the sandbox asked for it
    /// (`policy::http_push`): by its creation flag or its workspace's `egress` section.
    pub(super) fn https_push_branches(
        &self,
        egress: &crate::config::egress::EgressConfig,
    ) -> Option<Vec<String>> {
        (self.https_push_branches || egress.https_push_branches)
            .then(|| self.allowed_branches.clone())
    }

    /// The project's `.svc/config.yaml` egress section (checked when the sandbox was made):
    /// its workspace's, or the one it was made with, or none.
    pub(super) fn project_egress(&self) -> Result<crate::config::egress::EgressConfig, Failure> {
        let file = match &self.workspace {
            Some(w) => w.egress.clone(),
            None => self.egress_section.clone(),
        };
        match file {
            None => Ok(crate::config::egress::EgressConfig::default()),
            Some(file) => crate::config::egress::validate(
                std::path::Path::new(crate::config::loader::CONFIG_YAML),
                file,
            )
            .map_err(|e| Failure::bad(e.to_string())),
        }
    }
}

/// A running sandbox, in memory.
#[derive(Debug, Clone)]
pub(super) struct Live {
    pub(super) name: String,
    pub(super) id: u32,
    /// The uid that created it (`policy::ownership`).
    pub(super) owner: u32,
    pub(super) envelope: Envelope,
    pub(super) guest: GuestHandle,
    pub(super) ifindex: u32,
    pub(super) created_at: String,
    pub(super) created: SystemTime,
    /// Which creation of a sandbox of this name and id this is (its audit records carry it).
    pub(super) incarnation: crate::audit::Incarnation,
    pub(super) secrets: Vec<(String, String)>,
    pub(super) ca: Arc<SandboxCa>,
    pub(super) policy: Arc<SandboxPolicy>,
    /// The guest's environment for exec.
    pub(super) env: Vec<(String, String)>,
    /// The mode in force on the link.
    pub(super) mode: EgressMode,
    /// Frozen by `svc sandbox pause`.
    pub(super) paused: bool,
    /// Its credential guardian (stopped when the last copy of this goes).
    pub(super) guardian: Option<Arc<super::task::TaskGuard>>,
    /// Its workspace's hooks and log (`svc workspace up`).
    pub(super) workspace: Option<Arc<super::workspace::WorkspaceRun>>,
}

/// How long each step of a creation took, for its log line (`files=3ms guest=40ms …`).
pub(super) struct Phases {
    last: std::time::Instant,
    done: Vec<(&'static str, std::time::Duration)>,
}

impl Phases {
    pub(super) fn start() -> Self {
        Self {
            last: std::time::Instant::now(),
            done: Vec::new(),
        }
    }

    pub(super) fn mark(&mut self, step: &'static str) {
        let now = std::time::Instant::now();
        self.done.push((step, now - self.last));
        self.last = now;
    }
}

impl std::fmt::Display for Phases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (step, d)) in self.done.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{step}={:.1}ms", d.as_secs_f64() * 1000.0)?;
        }
        Ok(())
    }
}

pub(super) fn to_map(secrets: &[SecretValue]) -> HashMap<String, String> {
    secrets
        .iter()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect()
}

/// The policy's placeholders as the envelope stores them.
pub(super) fn stored_placeholders(policy: &SandboxPolicy) -> Vec<StoredPlaceholder> {
    policy
        .placeholders
        .entries()
        .iter()
        .map(|e| StoredPlaceholder {
            value: e.placeholder.expose().to_owned(),
            kind: e.kind.name().to_owned(),
            hosts: e.hosts.iter().map(ToString::to_string).collect(),
        })
        .collect()
}

/// Where the images put the git SSH shim.
pub(super) const GIT_SSH_SHIM: &str = "/usr/local/bin/svc-git-ssh";

/// The environment every command in the sandbox gets.
pub(super) fn guest_env(l: &Live) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", "/root"),
        ("LANG", "C.UTF-8"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    env.push(("SVC_SANDBOX".into(), l.name.clone()));
    // git's SSH goes through the relay: the shim is in both backends' images.
    env.push(("GIT_SSH_COMMAND".into(), GIT_SSH_SHIM.into()));
    env.push(("GIT_SSH_VARIANT".into(), "ssh".into()));
    for (k, v) in guest_trust::guest_env() {
        env.push((k.to_owned(), v.to_owned()));
    }
    if l.envelope.egress == EgressChoice::Curated {
        env.extend(l.policy.placeholders.guest_env());
    }
    env.extend(workspace_git_config(l));
    env
}

/// A workspace's `auth.defaults` for git, as git's own `GIT_CONFIG_COUNT`/`KEY_n`/`VALUE_n`
/// variables: its identity, and (`gitCredentialMode: host-helper`) the code host's
/// `http.extraHeader` carrying the CODE_HOST_TOKEN placeholder — the proxy swaps it for the
/// real token on the wire; the guest never has the token.
fn workspace_git_config(l: &Live) -> Vec<(String, String)> {
    let Some(auth) = l.envelope.workspace.as_ref().map(|w| &w.auth) else {
        return Vec::new();
    };
    let mut cfg: Vec<(String, String)> = Vec::new();
    if let Some(id) = &auth.git_identity {
        cfg.push(("user.name".into(), id.name.clone()));
        cfg.push(("user.email".into(), id.email.clone()));
    }
    if auth.git_host_helper && l.envelope.egress == EgressChoice::Curated {
        let code = l
            .policy
            .placeholders
            .entries()
            .iter()
            .find(|e| e.kind == crate::policy::credentials::CredentialKind::CodeHost);
        if let Some(e) = code {
            cfg.push((
                format!("http.https://{}/.extraHeader", l.policy.code.code_host),
                format!("Authorization: Bearer {}", e.placeholder.expose()),
            ));
        }
    }
    if cfg.is_empty() {
        return Vec::new();
    }
    let mut env = vec![("GIT_CONFIG_COUNT".to_owned(), cfg.len().to_string())];
    for (i, (k, v)) in cfg.into_iter().enumerate() {
        env.push((format!("GIT_CONFIG_KEY_{i}"), k));
        env.push((format!("GIT_CONFIG_VALUE_{i}"), v));
    }
    env
}

/// Before a sandbox is built: its name is new to the store, so whatever is at its directory was
/// left by an earlier sandbox of that name (a removal that failed, a crash). That guest wrote
/// the writable layer there; it goes before anything is made, or the create is refused naming
/// it — never set up again under a new guest (docs/isolation.md, "The runtime's own escapes").
pub(super) async fn clear_leftover(dir: &std::path::Path, name: &str) -> Result<(), Failure> {
    if !dir.exists() {
        return Ok(());
    }
    tracing::warn!(sandbox = %name, dir = %dir.display(), "removing an earlier sandbox's leftover files");
    crate::runtime::container::rootfs::remove_tree(dir)
        .await
        .map_err(|e| {
            Failure::internal(format!(
                "an earlier sandbox named {name} left files svcd cannot remove ({e}); remove \
                 them by hand, or pick another name"
            ))
        })
}

/// The files the guest sees read-only, each as (its path under the sandbox's directory, its
/// path in the guest, its contents): its resolv.conf (the gateway is its only resolver), its
/// hosts file, the CA bundle (the host's roots plus the sandbox CA) and the CA alone.
pub(super) fn guest_files_of(
    name: &str,
    gateway: Ipv4Addr,
    ca_pem: &str,
) -> std::io::Result<Vec<(PathBuf, PathBuf, Vec<u8>)>> {
    let system = std::fs::read_to_string(guest_trust::GUEST_BUNDLE).unwrap_or_default();
    let trust = guest_trust::trust_files(&system, ca_pem).map_err(std::io::Error::other)?;
    let in_root = |guest: &str| PathBuf::from("root").join(guest.trim_start_matches('/'));
    Ok(vec![
        (
            "resolv.conf".into(),
            "/etc/resolv.conf".into(),
            format!("nameserver {gateway}\noptions edns0\n").into_bytes(),
        ),
        (
            "hosts".into(),
            "/etc/hosts".into(),
            format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n127.0.1.1\t{name}\n")
                .into_bytes(),
        ),
        (
            in_root(guest_trust::GUEST_BUNDLE),
            guest_trust::GUEST_BUNDLE.into(),
            trust.bundle.into_bytes(),
        ),
        (
            in_root(guest_trust::GUEST_CA_FILE),
            guest_trust::GUEST_CA_FILE.into(),
            trust.ca_file.into_bytes(),
        ),
    ])
}

/// The guest files of [`guest_files_of`] written under `dir` (made first); returns each as
/// (host copy, path in the guest). A sandbox's own files, made again whenever it is: written
/// plainly, without fsync or rename.
pub(super) fn write_guest_files(
    dir: &std::path::Path,
    name: &str,
    gateway: Ipv4Addr,
    ca_pem: &str,
) -> std::io::Result<Vec<(PathBuf, PathBuf)>> {
    use std::os::unix::fs::DirBuilderExt as _;
    let files = guest_files_of(name, gateway, ca_pem)?;
    let mut written = Vec::with_capacity(files.len());
    for (rel, guest, contents) in files {
        let host = dir.join(rel);
        if let Some(parent) = host.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)?;
        }
        std::fs::write(&host, contents)?;
        written.push((host, guest));
    }
    Ok(written)
}

/// The length of the prefix of each sandbox's guest address (a /30: gateway and guest).
pub(super) const GUEST_PREFIX: u8 = 30;

/// How a sandbox's guest is plugged into its link: a veth whose host end `link` carries the
/// fence, its guest end moved into the guest's network namespace as `eth0`. The host end is
/// made and fenced first (while the runtime creates the guest), the guest end moved in after.
pub(super) struct SandboxLinks<'a> {
    pub(super) links: &'a Arc<dyn HostLinks>,
    pub(super) fence: &'a Arc<dyn SandboxFence>,
    pub(super) link: &'a str,
    /// The fence's record for the link (its ifindex is filled in once the link exists).
    pub(super) record: SandboxLink,
}

impl SandboxLinks<'_> {
    fn err(&self, m: String) -> RuntimeError {
        RuntimeError::Start {
            name: self.link.to_owned(),
            message: format!("plugging in the link: {m}"),
        }
    }

    fn peer(&self) -> String {
        format!("{}g", self.link)
    }
}

impl GuestLinks for SandboxLinks<'_> {
    fn link(&self) -> &str {
        self.link
    }

    fn guest_net(&self) -> GuestNet {
        GuestNet {
            address: self.record.guest_v4,
            prefix: GUEST_PREFIX,
            gateway: self.record.gateway_v4,
        }
    }

    fn make_tap(&self) -> BoxFuture<'_, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.links
                .create_tap(self.link)
                .await
                .map(|_| ())
                .map_err(|e| self.err(e.to_string()))
        })
    }

    fn prepare(&self, end: HostEnd) -> BoxFuture<'_, Result<u32, RuntimeError>> {
        Box::pin(async move {
            let net = |e: dataplane::DataplaneError| self.err(e.to_string());
            let ifindex = match end {
                HostEnd::Veth => self
                    .links
                    .create_veth(self.link, &self.peer())
                    .await
                    .map_err(net)?,
                HostEnd::Tap => self
                    .links
                    .ifindex(self.link)
                    .await
                    .map_err(net)?
                    .ok_or_else(|| self.err(format!("no tap {}: make_tap first", self.link)))?,
            };
            self.links.disable_ipv6(self.link).map_err(net)?;
            let gw_net = IpNet::V4(
                Ipv4Net::new(self.record.gateway_v4, 30).map_err(|e| self.err(e.to_string()))?,
            );
            self.links.add_address(ifindex, gw_net).await.map_err(net)?;
            self.links.up(ifindex).await.map_err(net)?;
            // Fenced before its other end reaches the guest: nothing ever passes unchecked.
            let record = SandboxLink {
                ifindex,
                ..self.record
            };
            let (fence, link) = (self.fence.clone(), self.link.to_owned());
            tokio::task::spawn_blocking(move || fence_link(fence.as_ref(), &record, &link))
                .await
                .map_err(|e| self.err(e.to_string()))?
                .map_err(|f| self.err(f.message))?;
            Ok(ifindex)
        })
    }

    fn attach<'a>(&'a self, netns: &'a std::path::Path) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let net = |e: dataplane::DataplaneError| self.err(e.to_string());
            let peer = self.peer();
            let peer_index = self
                .links
                .ifindex(&peer)
                .await
                .map_err(net)?
                .ok_or_else(|| self.err(format!("{peer} vanished")))?;
            let ns = std::fs::File::open(netns)
                .map_err(|e| self.err(format!("{}: {e}", netns.display())))?;
            self.links
                .move_to_netns(peer_index, &ns)
                .await
                .map_err(net)?;
            let guest_net = IpNet::V4(
                Ipv4Net::new(self.record.guest_v4, 30).map_err(|e| self.err(e.to_string()))?,
            );
            let netns = netns.to_path_buf();
            let gateway = self.record.gateway_v4;
            let links = self.links.clone();
            tokio::task::spawn_blocking(move || {
                links.configure_guest(&netns, &peer, "eth0", guest_net, IpAddr::V4(gateway))
            })
            .await
            .map_err(|e| self.err(e.to_string()))?
            .map_err(net)
        })
    }
}

/// The fence's record of sandbox `id`'s link `ifindex` in `mode`.
pub(super) fn link_record(
    id: u32,
    envelope: &Envelope,
    ifindex: u32,
    mode: EgressMode,
) -> SandboxLink {
    SandboxLink {
        ifindex,
        sandbox: id,
        mode,
        proxy: mode == EgressMode::Curated,
        guest_v4: envelope.guest_v4,
        gateway_v4: envelope.gateway_v4,
        guest_v6: None,
        guest_v6_link_local: None,
        gateway_v6: None,
    }
}

/// Put `record` on `link` in the fence and attach the fence's programs to it. A record already
/// in force (after a restart) is kept with the entries the guard wrote, which the guest may
/// still use.
pub(super) fn fence_link(
    fence: &dyn SandboxFence,
    record: &SandboxLink,
    link: &str,
) -> Result<(), Failure> {
    fence
        .put(record, link)
        .map_err(|e| Failure::internal(e.to_string()))
}

/// A sandbox whose guest runs, before `publish`: what it holds besides its request.
pub(super) struct Made {
    pub(super) envelope: Envelope,
    pub(super) started: crate::runtime::Started,
    pub(super) ca: Arc<SandboxCa>,
    pub(super) policy: SandboxPolicy,
    pub(super) mode: EgressMode,
    /// When it was made (and as stored), and its incarnation's key.
    pub(super) when: (SystemTime, String, String),
}

/// The live record of sandbox `id` of `owner`, made for `req` as `m`.
pub(super) fn live_of(req: &crate::api::CreateSandbox, (id, owner): (u32, u32), m: Made) -> Live {
    Live {
        name: req.name.to_string(),
        id,
        owner,
        envelope: m.envelope,
        guest: m.started.guest,
        ifindex: m.started.ifindex,
        incarnation: crate::audit::Incarnation::new(req.name.as_str(), &m.when.2),
        created_at: m.when.1,
        created: m.when.0,
        secrets: req
            .secrets
            .iter()
            .map(|s| (s.name.clone(), s.source.clone()))
            .collect(),
        ca: m.ca,
        policy: Arc::new(m.policy),
        env: Vec::new(),
        mode: m.mode,
        paused: false,
        guardian: None,
        workspace: None,
    }
}
