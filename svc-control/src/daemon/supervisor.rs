//! The supervisor: sandboxes from creation to destruction, their state in the store, their
//! links in the fence and the nftables table, their entries in the registry the guard, the
//! proxy and the broker read. Re-adoption after a restart is in `adopt`, the sandbox's records
//! and what its guest gets in `sandbox`; the creation rules are `policy::creation`'s.

mod adopt;
mod git_ssh;
mod gitdir;
mod grants;
mod guardian;
mod live_policy;
mod ownership;
mod running;
mod sandbox;
mod secrets;
mod services_state;
mod spotlight;
mod task;
mod trust;
mod workspace;
mod workspace_log;
mod workspace_services;

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::SystemTime,
};

use tokio::sync::broadcast;
use tracing::{Instrument as _, info, info_span, warn};

use self::sandbox::{
    Envelope, Live, Phases, SandboxLinks, StoredPlaceholder, creation_request, creation_secrets,
    fence_link, guest_env, link_record, to_map, write_guest_files,
};
pub use super::failure::Failure;
use super::wiring::{Registered, Registry};
use crate::{
    api::{self, CreateSandbox, Destroyed, EgressChoice, Event, SandboxView, SecretValue},
    audit::rfc3339,
    config::host::HostConfig,
    dataplane::{self, Fence, Links, Nft},
    dns::SandboxDns,
    policy::{
        creation,
        host::Allowlist,
        mode::{AllowAllKind, EgressMode, ModeNow},
        ownership::Principal,
        request::SandboxPolicy,
    },
    proxy::{ProxySandbox, ca::SandboxCa},
    runtime::{Backends, GuestSpec, SharedDir},
    store::Store,
};

pub use crate::policy::ssh::DEFAULT_BRANCHES;

/// Settings the daemon passes in.
#[derive(Clone)]
pub struct SupervisorConfig {
    pub host: HostConfig,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Where the relay's session records go (the proxy and the guard write theirs there too).
    pub audit: Arc<dyn crate::audit::AuditSink>,
    /// svcd's own HTTPS requests (token endpoints).
    pub host_client: Option<Arc<dyn crate::creds::oauth::FormPost>>,
    /// Seals stored secrets and sandboxes' values in the state.
    pub key: Arc<crate::creds::HostKey>,
    /// The coding agent's credential guardian, one task per running sandbox that shares the
    /// agent's home (SPEC 5.2.4); `None`: off.
    pub guardian: Option<crate::creds::guardian::Guardian>,
    /// The host's resolver, for the git relay's servers.
    pub resolver: Arc<dyn crate::proxy::Resolve>,
    /// The destination classes every address svc dials for a guest passes (the relay's).
    pub network: crate::policy::destination::HostNetwork,
    /// Per-guest caps (`[limits]`): exec and Spotlight streams, relay sessions.
    pub limits: Arc<crate::limits::GuestLimits>,
}

/// The supervisor. Share it with `Arc`.
pub struct Supervisor {
    config: SupervisorConfig,
    store: Mutex<Store>,
    fence: Arc<Mutex<Fence>>,
    nft: Nft,
    /// Serialises changes of the nftables table; whether it has been written whole.
    nft_lock: tokio::sync::Mutex<bool>,
    links: Links,
    backends: Backends,
    registry: Arc<Registry>,
    live: Mutex<BTreeMap<String, Live>>,
    /// Serialises live policy changes (`allow`).
    policy_lock: tokio::sync::Mutex<()>,
    /// Brokered OAuth secrets by name: the current version's grant (sandboxes hold theirs).
    grants: Mutex<HashMap<String, Arc<crate::creds::grant::Grant>>>,
    /// Sandboxes whose processes were found gone (reported once).
    dead: Mutex<std::collections::HashSet<String>>,
    events: broadcast::Sender<Event>,
    started: SystemTime,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor").finish_non_exhaustive()
    }
}

/// The backend a stored sandbox was made with (the container backend's when the envelope
/// does not say, as before the microvm backend).
fn row_backend(row: &crate::store::SandboxRow) -> String {
    serde_json::from_str::<serde_json::Value>(&row.envelope)
        .ok()
        .and_then(|v| v["backend"].as_str().map(str::to_owned))
        .unwrap_or_else(|| "container".to_owned())
}

/// Whether the coding agent's home `dir` goes into a sandbox `who` creates: its owner's and
/// root's (a directory svcd cannot stat is nobody's but root's).
fn agent_home_for(dir: &std::path::Path, who: &Principal) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let owner = std::fs::metadata(dir).map_or(0, |m| m.uid());
    crate::policy::ownership::shares_agent_home(who, owner)
}

fn now_text() -> String {
    rfc3339(SystemTime::now())
}

impl Supervisor {
    #[expect(clippy::too_many_arguments, reason = "the parts the daemon wires in")]
    pub fn new(
        config: SupervisorConfig,
        store: Store,
        fence: Arc<Mutex<Fence>>,
        nft: Nft,
        links: Links,
        backends: Backends,
        registry: Arc<Registry>,
        started: SystemTime,
    ) -> Self {
        let (events, _) = broadcast::channel(1024);
        Self {
            config,
            store: Mutex::new(store),
            fence,
            nft,
            nft_lock: tokio::sync::Mutex::new(false),
            links,
            backends,
            registry,
            live: Mutex::default(),
            policy_lock: tokio::sync::Mutex::new(()),
            grants: Mutex::default(),
            dead: Mutex::default(),
            events,
            started,
        }
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn live(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Live>> {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn fence(&self) -> std::sync::MutexGuard<'_, Fence> {
        self.fence
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn started(&self) -> SystemTime {
        self.started
    }

    pub fn count(&self) -> usize {
        self.live().len()
    }

    /// The coding agent's home, (host directory, guest path), if svcd.toml sets one.
    pub fn agent_home(&self) -> Option<&(PathBuf, PathBuf)> {
        self.config.host.agent_home.as_ref()
    }

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn events_after(&self, after: i64, limit: usize) -> Result<Vec<Event>, Failure> {
        Ok(self.store().events_after(after, limit)?)
    }

    /// Record an event (its sandbox's owner's) and tell the followers.
    pub fn event(&self, kind: &str, sandbox: Option<&str>, detail: serde_json::Value) {
        self.event_owned(kind, sandbox, None, detail);
    }

    /// Record an event that belongs to `owner` (`None`: its sandbox's owner, or nobody's).
    pub fn event_owned(
        &self,
        kind: &str,
        sandbox: Option<&str>,
        owner: Option<u32>,
        detail: serde_json::Value,
    ) {
        match self
            .store()
            .add_event(&now_text(), kind, sandbox, owner, &detail)
        {
            Ok(e) => {
                let _ = self.events.send(e);
            }
            Err(e) => warn!(error = %e, kind, "could not record an event"),
        }
    }

    fn max_id(&self) -> u32 {
        let pool = self.config.host.ipv4_pool;
        let slots = 1u64 << (30u8.saturating_sub(pool.prefix_len()));
        slots.min(u64::from(u32::MAX - 1)) as u32
    }

    /// The /30 of sandbox `id`: (gateway, guest).
    fn addresses(&self, id: u32) -> (Ipv4Addr, Ipv4Addr) {
        let base = u32::from(self.config.host.ipv4_pool.network()) + (id - 1) * 4;
        (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2))
    }

    fn sandbox_dir(&self, name: &str) -> PathBuf {
        self.config.host.state_dir.join("sandboxes").join(name)
    }

    /// Where a sandbox's workspace log is kept (with the sandbox: destroy removes it).
    fn workspace_log(&self, name: &str) -> PathBuf {
        self.sandbox_dir(name).join("workspace.log")
    }

    // ---------------------------------------------------------------- create

    /// `POST /v1/sandboxes`. Logged in a span `sandbox{name}`.
    /// `who` is the API peer: the sandbox is theirs, and so must a workspace's project
    /// directory and the stored secrets it binds be (or be shared with them).
    pub async fn create(
        self: &Arc<Self>,
        req: CreateSandbox,
        who: &Principal,
    ) -> Result<SandboxView, Failure> {
        api::check_name(&req.name).map_err(Failure::bad)?;
        let mut listeners = Vec::new();
        self.check_project_trust(&req, Some(who.uid))?;
        if let Some(w) = &req.workspace {
            self.check_project_dir(&w.root, Some(who.uid))?;
            if let Some(id) = &w.auth.git_identity {
                id.check().map_err(Failure::bad)?;
            }
            // Spotlight's host ports, taken now: one in use refuses the creation.
            listeners = spotlight::bind_all(&w.forwards, who)?;
        }
        let span = info_span!("sandbox", name = %req.name);
        let started = std::time::Instant::now();
        let name = req.name.clone();
        let result = self
            .create_in_span(req, None, who, who.uid)
            .instrument(span)
            .await;
        if result.is_ok() {
            self.config.metrics.created(started.elapsed());
            if let Some(run) = self.live().get(&name).and_then(|l| l.workspace.clone()) {
                self.start_forwards(&name, &run, listeners);
            }
            self.start_workspace(&name, &[workspace::Phase::Setup, workspace::Phase::Start]);
        }
        result
    }

    /// `policy::project` on the directory as the host shows it now.
    fn check_project_dir(&self, root: &str, caller: Option<u32>) -> Result<(), Failure> {
        use std::os::unix::fs::MetadataExt;
        let canonical = std::fs::canonicalize(root).ok();
        let meta = canonical.as_ref().and_then(|c| std::fs::metadata(c).ok());
        let host = &self.config.host;
        crate::policy::project::check(
            &crate::policy::project::ProjectDir {
                asked: root,
                canonical: canonical.as_deref(),
                is_dir: meta.as_ref().is_some_and(std::fs::Metadata::is_dir),
                owner_uid: meta.as_ref().map_or(u32::MAX, MetadataExt::uid),
            },
            caller,
            &[
                ("state", host.state_dir.as_path()),
                ("audit", host.audit_dir.as_path()),
            ],
        )
        .map_err(|e| Failure::bad(e.to_string()))
    }

    /// Create a sandbox for `owner` at `who`'s request; a fork's clone starts from `restore`
    /// instead of booting.
    pub(super) async fn create_in_span(
        &self,
        mut req: CreateSandbox,
        restore: Option<(crate::runtime::Snapshot, Vec<SharedDir>)>,
        who: &Principal,
        owner: u32,
    ) -> Result<SandboxView, Failure> {
        self.resolve_store_secrets(who, &mut req)?;
        self.host_code_token(who, &mut req).await?;
        let mut plan = self.plan(&req, who)?;
        if let Some((_, mounts)) = &restore {
            // A clone has its source's devices, whatever the configuration says now.
            plan.envelope.live_mounts.clone_from(mounts);
        }
        let backend = plan.envelope.backend.clone();
        let created = SystemTime::now();
        let created_at = rfc3339(created);
        let prelim =
            serde_json::to_string(&plan.envelope).map_err(|e| Failure::internal(e.to_string()))?;
        let id = self
            .store()
            .reserve_for(&req.name, &prelim, &created_at, self.max_id(), owner)?;
        match self
            .build(
                &req,
                plan,
                id,
                (created, created_at),
                restore.map(|(s, _)| s),
                owner,
            )
            .await
        {
            Ok(view) => Ok(view),
            Err(f) => {
                warn!(sandbox = %req.name, error = %f.message, "creation failed; removing what was built");
                self.teardown(&req.name, id, &format!("svc{id}"), &backend)
                    .await;
                let _ = self.store().delete(&req.name);
                Err(f)
            }
        }
    }

    /// `--repo` brokers the host's code-host token (`credentials.code_host_token_file`) as
    /// CODE_HOST_TOKEN when `policy::creation` says so.
    ///
    /// Where CODE_HOST_TOKEN comes from, first found wins: the request's own
    /// `--secret CODE_HOST_TOKEN@store:|env:|file:…`; `credentials.code_host_token_file`; the
    /// host's code-host CLI login (`gh auth token --hostname <code_host>`, `credentials.
    /// code_host_cli`). None of them: refused now, naming each — not a 401 later.
    /// The host's token is the operator's (`policy::ownership::host_code_token`): a caller
    /// other than root and `credentials.code_host_token_group` gives its own.
    async fn host_code_token(
        &self,
        who: &Principal,
        req: &mut CreateSandbox,
    ) -> Result<(), Failure> {
        let secrets = creation_secrets(&req.secrets);
        if !creation::brokers_host_code_token(&creation_request(req, &secrets, None)) {
            return Ok(());
        }
        crate::policy::ownership::host_code_token(
            who,
            self.config.host.code_host_token_group.as_ref(),
        )
        .map_err(|e| Failure::forbidden(e.to_string()))?;
        let (source, value) = if let Some(path) = &self.config.host.code_host_token_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Failure::internal(format!(
                    "reading the host's code-host token {} (credentials.code_host_token_file): {e}",
                    path.display()
                ))
            })?;
            (
                format!("host:{}", path.display()),
                text.trim_end_matches(['\r', '\n']).to_owned(),
            )
        } else if let Some(token) = self.code_host_cli_token().await {
            token
        } else {
            let host = self.config.host.code.code_host.to_string();
            return Err(Failure::bad(format!(
                "--repo {} needs the code host's token (CODE_HOST_TOKEN) and none was found: give \
                 --secret CODE_HOST_TOKEN@store:NAME (svc secret set NAME), @env:VAR or @file:PATH; \
                 or set credentials.code_host_token_file in svcd.toml; or log in the host's code-host \
                 CLI for root (gh auth login --hostname {host})",
                req.repo.as_deref().unwrap_or("")
            )));
        };
        req.secrets.push(SecretValue {
            name: creation::CODE_HOST_TOKEN.into(),
            source,
            value,
        });
        Ok(())
    }

    /// The host's code-host CLI login: `<code_host_cli> auth token --hostname <code_host>`
    /// (GitHub's `gh`), if the CLI is there and logged in. (source, token).
    async fn code_host_cli_token(&self) -> Option<(String, String)> {
        let cli = self.config.host.code_host_cli.as_ref()?;
        let host = self.config.host.code.code_host.to_string();
        // A local read of the CLI's own login; bounded all the same.
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            tokio::process::Command::new(cli)
                .args(["auth", "token", "--hostname", &host])
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .ok()?
        .ok()?;
        let token = String::from_utf8(out.stdout).ok()?.trim().to_owned();
        (out.status.success() && !token.is_empty() && !token.contains(char::is_whitespace))
            .then(|| (format!("host:{} auth token", cli.display()), token))
    }

    /// The request checked by `policy::creation`, and the envelope it makes.
    fn plan(&self, req: &CreateSandbox, who: &Principal) -> Result<Plan, Failure> {
        let secrets = creation_secrets(&req.secrets);
        let offered = self.backends.offered();
        let why_not = |b: crate::config::workspace::Backend| match b.canonical() {
            crate::config::workspace::Backend::Microvm => self
                .backends
                .microvm_unavailable()
                .unwrap_or_else(|| "offered".into()),
            _ => "offered".into(),
        };
        let (backend, backend_reason) = match (&req.backend, &req.runtime_required) {
            (None, Some(required)) => creation::select_runtime(required, &offered, why_not)
                .map_err(|e| Failure::unsupported(e.to_string()))?,
            (asked, _) => {
                let b = creation::backend(asked.as_deref(), &offered).map_err(|e| match e {
                    creation::CreationError::BackendUnavailable("microvm", _) => {
                        Failure::unsupported(format!(
                            "{e}: {}",
                            why_not(crate::config::workspace::Backend::Microvm)
                        ))
                    }
                    creation::CreationError::BackendUnavailable(..) => {
                        Failure::unsupported(e.to_string())
                    }
                    other => Failure::bad(other.to_string()),
                })?;
                let reason = if asked.is_some() {
                    format!("--backend {}", b.name())
                } else {
                    "the default (svcd's embedded backend)".to_owned()
                };
                (b, reason)
            }
        };
        // The workspace's `.svc/config.yaml` egress section, checked again here: the request
        // is the caller's word for what the file says.
        let project_egress = req
            .workspace
            .as_ref()
            .and_then(|w| w.egress.clone())
            .map(|f| {
                crate::config::egress::validate(
                    std::path::Path::new(crate::config::loader::CONFIG_YAML),
                    f,
                )
                .map_err(|e| Failure::bad(e.to_string()))
            })
            .transpose()?;
        let plan = creation::plan(
            &self.config.host,
            &creation_request(req, &secrets, project_egress.as_ref()),
        )
        .map_err(|e| Failure::bad(e.to_string()))?;
        // The relay's repositories: the request's, and the section's `egress.policy` repos.
        let mut asked_repos: Vec<(String, String)> = req
            .ssh_repos
            .iter()
            .map(|r| (r.host.clone(), r.repo.clone()))
            .collect();
        for p in project_egress.iter().flat_map(|e| e.policy.values()) {
            asked_repos.extend(
                p.repos
                    .iter()
                    .map(|r| (p.host.to_string(), r.as_str().to_owned())),
            );
        }
        let ssh_repos = creation::ssh_repos(&asked_repos)
            .map_err(|e| Failure::bad(e.to_string()))?
            .into_iter()
            .map(|(host, repo)| api::SshRepo { host, repo })
            .collect();
        let placeholders = plan
            .policy
            .placeholders
            .entries()
            .iter()
            .map(|e| StoredPlaceholder {
                value: e.placeholder.expose().to_owned(),
                kind: e.kind.name().to_owned(),
                hosts: e.hosts.iter().map(ToString::to_string).collect(),
            })
            .collect();
        // The project's git directory: what host git executes stays read-only in the guest.
        let workspace_mount = match &req.workspace {
            Some(w) => Some(gitdir::workspace_mount(w, backend.name())?),
            None => None,
        };
        let envelope = Envelope {
            backend: backend.name().to_owned(),
            backend_reason,
            // The coding agent's live mount (SPEC 5.2), fixed now: the microvm
            // backend shares it over virtio-fs, the container backend as an idmapped bind.
            // Only into its owner's (and root's) sandboxes: another member's is made without
            // it (`policy::ownership::shares_agent_home`).
            live_mounts: self
                .config
                .host
                .agent_home
                .iter()
                .filter(|(host, _)| agent_home_for(host, who))
                .map(|(host, guest)| SharedDir::plain(host.clone(), guest.clone()))
                .chain(workspace_mount)
                .collect(),
            extra_hosts: plan.extra_hosts.iter().map(ToString::to_string).collect(),
            repo: req.repo.clone(),
            egress: match plan.egress {
                EgressMode::Curated => EgressChoice::Curated,
                EgressMode::AllowAll => EgressChoice::AllowAll,
            },
            context_path: req.context_path.clone(),
            allowed_branches: vec![DEFAULT_BRANCHES.to_owned()],
            https_push_branches: req.https_push_branches,
            ssh_repos,
            workspace: req.workspace.clone(),
            policy_generation: 0,
            link: String::new(),
            guest_v4: Ipv4Addr::UNSPECIFIED,
            gateway_v4: Ipv4Addr::UNSPECIFIED,
            placeholders,
        };
        let mut policy = plan.policy;
        policy.https_push_branches = envelope.https_push_branches(&policy.egress);
        Ok(Plan { envelope, policy })
    }

    async fn build(
        &self,
        req: &CreateSandbox,
        plan: Plan,
        id: u32,
        (created, created_at): (SystemTime, String),
        restore: Option<crate::runtime::Snapshot>,
        owner: u32,
    ) -> Result<SandboxView, Failure> {
        let name = req.name.clone();
        let (gateway, guest) = self.addresses(id);
        let link = format!("svc{id}");
        let mut envelope = plan.envelope;
        envelope.link = link.clone();
        envelope.guest_v4 = guest;
        envelope.gateway_v4 = gateway;
        let mut phases = Phases::start();
        let mode = self.mode_of(&envelope, created).mode;
        let ca = Arc::new(
            SandboxCa::generate(&name).map_err(|e| Failure::internal(format!("CA: {e}")))?,
        );
        let dir = self.sandbox_dir(&name);
        sandbox::clear_leftover(&dir, &name).await?;
        let files = write_guest_files(&dir, &name, gateway, &ca.ca_pem())
            .map_err(|e| Failure::internal(format!("{}: {e}", dir.display())))?;
        phases.mark("files");
        let started = self
            .backends
            .get(&envelope.backend)
            .start(
                &GuestSpec {
                    name: name.clone(),
                    id,
                    dir: dir.clone(),
                    files,
                    restore,
                    shared: envelope.live_mounts.clone(),
                },
                &SandboxLinks {
                    links: &self.links,
                    fence: &self.fence,
                    link: &link,
                    record: link_record(id, &envelope, 0, mode),
                },
            )
            .await
            .map_err(|e| Failure::internal(e.to_string()))?;
        phases.mark("guest");
        let guest_handle = started.guest;
        let mut live = Live {
            name: name.clone(),
            id,
            owner,
            envelope: envelope.clone(),
            guest: guest_handle.clone(),
            ifindex: started.ifindex,
            created_at,
            created,
            secrets: req
                .secrets
                .iter()
                .map(|s| (s.name.clone(), s.source.clone()))
                .collect(),
            ca: ca.clone(),
            policy: Arc::new(plan.policy),
            env: Vec::new(),
            mode,
            paused: false,
            guardian: None,
            workspace: envelope.workspace.clone().map(|spec| {
                Arc::new(workspace::WorkspaceRun::new(
                    spec,
                    self.workspace_log(&name),
                    "starting",
                ))
            }),
        };
        live.env = guest_env(&live);
        live.guardian = self.start_guardian(&live);
        self.serve_git_ssh(&live)
            .await
            .map_err(|e| Failure::internal(format!("the git SSH relay: {e}")))?;
        phases.mark("relay");
        self.live().insert(name.clone(), live.clone());
        let secret_values: HashMap<String, String> = req
            .secrets
            .iter()
            .map(|s| (s.name.clone(), s.value.clone()))
            .collect();
        // The link was fenced while the guest started (`SandboxLinks::prepare`).
        self.register(&live, secret_values);
        phases.mark("register");
        self.live().insert(name.clone(), live.clone());
        self.sync_nft(Some((&link, true))).await?;
        phases.mark("nft");
        let envelope_json =
            serde_json::to_string(&envelope).map_err(|e| Failure::internal(e.to_string()))?;
        let sealed = self.sealed_for(&name, &req.secrets)?;
        self.store().set_running(
            &name,
            &envelope_json,
            &ca.ca_pem(),
            &ca.ca_key_pem(),
            guest_handle.pid,
            guest_handle.start,
            &sealed,
        )?;
        phases.mark("state");
        let view = self.view(&live);
        info!(sandbox = %name, id, link = %link, guest = %guest, mode = %view.mode, phases = %phases, "sandbox created");
        self.event(
            "sandbox.created",
            Some(&name),
            serde_json::json!({"id": id, "mode": view.mode, "link": link}),
        );
        // A sandbox without a workspace has nothing more to wait for: ready now. A workspace
        // is ready when its hooks have run (`start_workspace`).
        if envelope.workspace.is_none() {
            self.event("workspace.ready", Some(&name), serde_json::json!({}));
        }
        Ok(view)
    }

    /// Put the sandbox's policy on its link (fence record, attach) and in the registry.
    fn enforce(&self, live: &mut Live, secrets: HashMap<String, String>) -> Result<(), Failure> {
        let mode = self.mode_now(live).mode;
        live.mode = mode;
        let record = link_record(live.id, &live.envelope, live.ifindex, mode);
        fence_link(&self.fence, &record, &live.envelope.link)?;
        self.register(live, secrets);
        Ok(())
    }

    /// Put the sandbox in the registry the DNS guard, the proxy and the broker read.
    fn register(&self, live: &Live, secrets: HashMap<String, String>) {
        self.registry.remove(live.id);
        self.reregister(live, secrets);
    }

    /// Replace the sandbox's registry entry in one update (no moment without it).
    fn reregister(&self, live: &Live, secrets: HashMap<String, String>) {
        let mode = live.mode;
        let allowed = if mode == EgressMode::Curated {
            live.policy.allowed.clone()
        } else {
            Allowlist(Vec::new())
        };
        self.registry.insert(Registered {
            id: live.id,
            name: live.name.clone(),
            ifindex: live.ifindex,
            guest: IpAddr::V4(live.envelope.guest_v4),
            dns: Arc::new(SandboxDns {
                id: live.id,
                allowed,
                allow_all: mode == EgressMode::AllowAll,
            }),
            proxy: (mode == EgressMode::Curated).then(|| {
                Arc::new(ProxySandbox {
                    id: live.id,
                    policy: (*live.policy).clone(),
                    ca: live.ca.clone(),
                })
            }),
            bearers: if mode == EgressMode::Curated {
                crate::creds::broker::bearers_by_placeholder(
                    &live.policy.placeholders,
                    &secrets,
                    &|name, version| self.grant(name, version),
                )
            } else {
                HashMap::new()
            },
        });
    }

    /// Put every live sandbox's link in the nftables table (one batch).
    /// The first time (at start) the whole table is written; after that `change` — a link
    /// added or removed — is one element of its link set, whatever the number of sandboxes
    /// (without one, or if that fails, the whole set is written again; the whole table if that
    /// fails too, e.g. it was removed by hand).
    async fn sync_nft(&self, change: Option<(&str, bool)>) -> Result<(), Failure> {
        let mut written = self.nft_lock.lock().await;
        let links: Vec<String> = self
            .live()
            .values()
            .filter(|l| l.ifindex != 0)
            .map(|l| l.envelope.link.clone())
            .collect();
        let nft = self.nft.clone();
        let whole = !*written;
        let change = change.map(|(l, add)| (l.to_owned(), add));
        let result = tokio::task::spawn_blocking(move || {
            if let Some((link, add)) = &change
                && !whole
                && nft.change_link(link, *add).is_ok()
            {
                return Ok(());
            }
            if !whole && nft.set_links(&links).is_ok() {
                return Ok(());
            }
            nft.apply(&links)
        })
        .await
        .map_err(|e| Failure::internal(e.to_string()))?
        .map_err(|e| Failure::internal(e.to_string()));
        *written = result.is_ok();
        result
    }

    // --------------------------------------------------------------- destroy

    /// `DELETE /v1/sandboxes/{name}`. Logged in a span `sandbox{name}`.
    pub async fn destroy(&self, name: &str) -> Result<Destroyed, Failure> {
        api::check_name(name).map_err(Failure::bad)?;
        let span = info_span!("sandbox", name = %name);
        let started = std::time::Instant::now();
        let result = self.destroy_in_span(name).instrument(span).await;
        if result.is_ok() {
            self.config.metrics.destroyed(started.elapsed());
            self.config.metrics.forget(name);
        }
        result
    }

    /// The metrics' text: the fence's counters and the sandboxes' states read now.
    pub fn metrics_text(&self) -> String {
        let counters = self
            .fence()
            .counters()
            .map(|c| c.reasons)
            .unwrap_or_default();
        let fence: Vec<(&str, u32, u64, u64)> = counters
            .iter()
            .map(|r| (r.reason, r.code, r.packets, r.bytes))
            .collect();
        let states: Vec<String> = self
            .list()
            .unwrap_or_default()
            .into_iter()
            .map(|s| s.state)
            .collect();
        self.config.metrics.encode(&fence, &states)
    }

    async fn destroy_in_span(&self, name: &str) -> Result<Destroyed, Failure> {
        let row = self
            .store()
            .list()?
            .into_iter()
            .find(|r| r.name == name)
            .ok_or_else(|| Failure::not_found(name))?;
        self.store().set_destroying(name)?;
        // The workspace's onTeardown hooks, while everything is still up.
        self.teardown_workspace(name).await;
        let removed = self
            .teardown(name, row.id, &format!("svc{}", row.id), &row_backend(&row))
            .await;
        self.store().delete(name)?;
        info!(sandbox = %name, "sandbox destroyed");
        self.event_owned(
            "sandbox.destroyed",
            Some(name),
            Some(row.owner_uid),
            serde_json::json!({}),
        );
        Ok(Destroyed {
            name: name.to_owned(),
            removed,
        })
    }

    /// Remove everything of a sandbox, best effort, in the order that keeps the fence closed:
    /// registry (no more DNS answers, no proxy), fence record (the link drops everything),
    /// processes, link, nftables, files. Returns what was removed.
    async fn teardown(&self, name: &str, id: u32, link: &str, backend: &str) -> Vec<String> {
        let mut removed = Vec::new();
        self.registry.remove(id);
        self.registry.unbind(id);
        self.dead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(name);
        let live = self.live().remove(name);
        let ifindex = match live.as_ref().map(|l| l.ifindex).filter(|i| *i != 0) {
            Some(i) => Some(i),
            None => self.links.ifindex(link).await.ok().flatten(),
        };
        if let Some(ifindex) = ifindex {
            let mut fence = self.fence();
            if fence.remove_sandbox(ifindex).is_ok() {
                removed.push("fence map entries".to_owned());
            }
        }
        {
            let mut fence = self.fence();
            match fence.detach(link) {
                Ok(()) => removed.push(format!("fence on {link}")),
                Err(dataplane::DataplaneError::NotAttached { .. }) => {}
                Err(e) => warn!(sandbox = %name, error = %e, "detaching the fence"),
            }
        }
        match self
            .backends
            .get(backend)
            .stop(name, &self.sandbox_dir(name))
            .await
        {
            Ok(parts) => removed.extend(parts),
            Err(e) => warn!(sandbox = %name, error = %e, "stopping the guest"),
        }
        if let Some(ifindex) = self.links.ifindex(link).await.ok().flatten() {
            match self.links.delete(ifindex).await {
                Ok(()) => removed.push(format!("link {link}")),
                Err(e) => warn!(sandbox = %name, error = %e, "deleting the link"),
            }
        }
        if self.sync_nft(Some((link, false))).await.is_ok() {
            removed.push("nftables link set entry".to_owned());
        }
        let dir = self.sandbox_dir(name);
        if dir.exists() {
            // However deep the guest made its tree (std's remove_dir_all recurses on svcd's
            // stack with a descriptor per level).
            match crate::runtime::container::rootfs::remove_tree(&dir).await {
                Ok(()) => removed.push(format!("files {}", dir.display())),
                Err(e) => warn!(sandbox = %name, error = %e, "removing the sandbox's files"),
            }
        }
        removed.push("state row".to_owned());
        removed
    }

    /// Every few seconds: AllowAll windows that ended fall back to Curated (SPEC 5.1.1).
    pub fn tick(&self) {
        // Guests whose processes died under us: their fence closes, and it is said once.
        let gone: Vec<(String, u32)> = {
            let live = self.live();
            let mut dead = self
                .dead
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            live.values()
                .filter(|l| {
                    !self.backends.get(&l.envelope.backend).alive(&l.guest)
                        && dead.insert(l.name.clone())
                })
                .map(|l| (l.name.clone(), l.ifindex))
                .collect()
        };
        for (name, ifindex) in gone {
            warn!(sandbox = %name, "the sandbox's processes are gone; destroy it to clean up");
            if ifindex != 0 {
                let _ = self.fence().remove_sandbox(ifindex);
            }
            self.event(
                "sandbox.dead",
                Some(&name),
                serde_json::json!({"reason": "its processes are gone"}),
            );
        }
        let due: Vec<String> = {
            let live = self.live();
            live.values()
                .filter(|l| {
                    l.mode == EgressMode::AllowAll && self.mode_now(l).mode == EgressMode::Curated
                })
                .map(|l| l.name.clone())
                .collect()
        };
        for name in due {
            let Some(mut l) = self.live().get(&name).cloned() else {
                continue;
            };
            let secrets = self
                .store()
                .secrets(&name)
                .map(|s| to_map(&s))
                .unwrap_or_default();
            match self.enforce(&mut l, secrets) {
                Ok(()) => {
                    info!(sandbox = %name, "AllowAll window ended: curated with the agent hosts");
                    self.live().insert(name.clone(), l);
                    self.event("egress.window-ended", Some(&name), serde_json::json!({}));
                }
                Err(f) => warn!(sandbox = %name, error = %f.message, "ending the AllowAll window"),
            }
        }
        if let Err(e) = self.fence().collect_expired() {
            warn!(error = %e, "collecting expired fence entries");
        }
    }

    /// Drop events from the fence, for the audit log.
    pub fn drain_drops(&self) -> Vec<svc_ebpf_common::DropEvent> {
        self.fence().drain_events()
    }

    /// The pinned fence directory (for `bpftool` hints).
    pub fn pin_dir(&self) -> PathBuf {
        self.config.host.pin_dir.clone()
    }

    /// The audit log svcd writes (rotated to `<file>.1`).
    pub fn audit_path(&self) -> PathBuf {
        self.config.host.audit_dir.join("audit.jsonl")
    }

    /// The mode in force for a sandbox now, as `policy::mode` decides it (an AllowAll window
    /// counts from the later of its creation and svcd's start, SPEC 5.1.1).
    fn mode_now(&self, l: &Live) -> ModeNow {
        self.mode_of(&l.envelope, l.created)
    }

    /// The mode in force now for a sandbox with `envelope`, created at `created`.
    fn mode_of(&self, envelope: &Envelope, created: SystemTime) -> ModeNow {
        crate::policy::mode::mode_now(
            envelope.egress == EgressChoice::AllowAll,
            Some(AllowAllKind::for_creation(envelope.context_path.is_some())),
            created,
            self.started,
            SystemTime::now(),
        )
    }
}

struct Plan {
    envelope: Envelope,
    policy: SandboxPolicy,
}
