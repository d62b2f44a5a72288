//! The supervisor: sandboxes from creation to destruction, their state in the store, their
//! links in the fence and the nftables table, their entries in the registry the guard, the
//! proxy and the broker read; re-adoption after a restart.

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, Ipv4Addr},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::SystemTime,
};

use ipnet::{IpNet, Ipv4Net};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tracing::{Instrument as _, info, info_span, warn};

use super::wiring::{Registered, Registry};
use crate::{
    api::{
        self, CreateSandbox, Destroyed, EgressChoice, Event, PlaceholderView, SandboxView,
        SecretValue,
    },
    audit::rfc3339,
    config::{
        egress::{EgressConfig, RepoName},
        host::HostConfig,
    },
    dataplane::{self, Fence, Links, Nft, SandboxLink},
    dns::SandboxDns,
    policy::{
        creation,
        credentials::{CredentialKind, Placeholder, PlaceholderEntry, PlaceholderTable},
        host::{Allowlist, HostPattern},
        mode::{AllowAllKind, EgressMode, ModeNow},
        request::SandboxPolicy,
    },
    proxy::{ProxySandbox, ca::SandboxCa, guest_trust},
    runtime::{
        Backend, BoxFuture, ExecHandle, GuestCommand, GuestHandle, GuestLinks, GuestSpec,
        RuntimeError,
    },
    store::{Store, StoreError},
};

/// The default AllowedBranches (SPEC 8).
pub const DEFAULT_BRANCHES: &str = "refs/heads/svc/**";

/// An API failure: a stable code, an HTTP status, a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub status: u16,
    pub code: &'static str,
    pub message: String,
}

impl Failure {
    pub fn bad(message: impl Into<String>) -> Self {
        Self {
            status: 400,
            code: "bad-request",
            message: message.into(),
        }
    }
    pub fn not_found(name: &str) -> Self {
        Self {
            status: 404,
            code: "not-found",
            message: format!("no sandbox named {name:?} (svc sandbox list shows them)"),
        }
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: 500,
            code: "internal",
            message: message.into(),
        }
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self {
            status: 409,
            code: "unsupported",
            message: message.into(),
        }
    }
    pub fn to_api(&self) -> api::ApiError {
        api::ApiError {
            code: self.code.to_owned(),
            error: self.message.clone(),
        }
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Exists(n) => Self {
                status: 409,
                code: "exists",
                message: format!("a sandbox named {n:?} already exists"),
            },
            StoreError::NotFound(n) => Self::not_found(&n),
            StoreError::Full(n) => Self {
                status: 507,
                code: "full",
                message: format!("all {n} sandbox slots of the address pool are in use"),
            },
            other => Self::internal(other.to_string()),
        }
    }
}

/// A stored placeholder.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredPlaceholder {
    value: String,
    kind: String,
    hosts: Vec<String>,
}

/// The sandbox envelope (SPEC 2.1), fixed at creation and stored as JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Envelope {
    backend: String,
    /// `--allow-host` hosts, as given (validated).
    extra_hosts: Vec<String>,
    repo: Option<String>,
    egress: EgressChoice,
    context_path: Option<String>,
    allowed_branches: Vec<String>,
    link: String,
    guest_v4: Ipv4Addr,
    gateway_v4: Ipv4Addr,
    placeholders: Vec<StoredPlaceholder>,
}

/// A running sandbox, in memory.
#[derive(Debug, Clone)]
struct Live {
    name: String,
    id: u32,
    envelope: Envelope,
    guest: GuestHandle,
    ifindex: u32,
    created_at: String,
    created: SystemTime,
    secrets: Vec<(String, String)>,
    ca: Arc<SandboxCa>,
    policy: Arc<SandboxPolicy>,
    /// The guest's environment for exec.
    env: Vec<(String, String)>,
    /// The mode in force on the link.
    mode: EgressMode,
    /// Frozen by `svc sandbox pause`.
    paused: bool,
}

/// Settings the daemon passes in.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    pub host: HostConfig,
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
    backend: Arc<dyn Backend>,
    registry: Arc<Registry>,
    live: Mutex<BTreeMap<String, Live>>,
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
        backend: Arc<dyn Backend>,
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
            backend,
            registry,
            live: Mutex::default(),
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

    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    pub fn events_after(&self, after: i64, limit: usize) -> Result<Vec<Event>, Failure> {
        Ok(self.store().events_after(after, limit)?)
    }

    /// Record an event and tell the followers.
    pub fn event(&self, kind: &str, sandbox: Option<&str>, detail: serde_json::Value) {
        match self.store().add_event(&now_text(), kind, sandbox, &detail) {
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

    // ---------------------------------------------------------------- create

    /// `POST /v1/sandboxes`. Logged in a span `sandbox{name}`.
    pub async fn create(&self, req: CreateSandbox) -> Result<SandboxView, Failure> {
        api::check_name(&req.name).map_err(Failure::bad)?;
        let span = info_span!("sandbox", name = %req.name);
        self.create_in_span(req).instrument(span).await
    }

    async fn create_in_span(&self, mut req: CreateSandbox) -> Result<SandboxView, Failure> {
        self.host_code_token(&mut req)?;
        let plan = self.plan(&req)?;
        let created = SystemTime::now();
        let created_at = rfc3339(created);
        let prelim =
            serde_json::to_string(&plan.envelope).map_err(|e| Failure::internal(e.to_string()))?;
        let id = self
            .store()
            .reserve(&req.name, &prelim, &created_at, self.max_id())?;
        match self.build(&req, plan, id, created, created_at).await {
            Ok(view) => Ok(view),
            Err(f) => {
                warn!(sandbox = %req.name, error = %f.message, "creation failed; removing what was built");
                self.teardown(&req.name, id, &format!("svc{id}")).await;
                let _ = self.store().delete(&req.name);
                Err(f)
            }
        }
    }

    /// `--repo` brokers the host's code-host token (`credentials.code_host_token_file`) as
    /// CODE_HOST_TOKEN when `policy::creation` says so.
    fn host_code_token(&self, req: &mut CreateSandbox) -> Result<(), Failure> {
        let Some(path) = &self.config.host.code_host_token_file else {
            return Ok(());
        };
        let secrets = creation_secrets(&req.secrets);
        if !creation::brokers_host_code_token(&creation_request(req, &secrets)) {
            return Ok(());
        }
        let text = std::fs::read_to_string(path).map_err(|e| {
            Failure::internal(format!(
                "reading the host's code-host token {} (credentials.code_host_token_file): {e}",
                path.display()
            ))
        })?;
        req.secrets.push(SecretValue {
            name: creation::CODE_HOST_TOKEN.into(),
            source: format!("host:{}", path.display()),
            value: text.trim_end_matches(['\r', '\n']).to_owned(),
        });
        Ok(())
    }

    /// The request checked by `policy::creation`, and the envelope it makes.
    fn plan(&self, req: &CreateSandbox) -> Result<Plan, Failure> {
        let secrets = creation_secrets(&req.secrets);
        let plan = creation::plan(&self.config.host, &creation_request(req, &secrets))
            .map_err(|e| Failure::bad(e.to_string()))?;
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
        Ok(Plan {
            envelope: Envelope {
                backend: self.backend.name().to_owned(),
                extra_hosts: plan.extra_hosts.iter().map(ToString::to_string).collect(),
                repo: req.repo.clone(),
                egress: match plan.egress {
                    EgressMode::Curated => EgressChoice::Curated,
                    EgressMode::AllowAll => EgressChoice::AllowAll,
                },
                context_path: req.context_path.clone(),
                allowed_branches: vec![DEFAULT_BRANCHES.to_owned()],
                link: String::new(),
                guest_v4: Ipv4Addr::UNSPECIFIED,
                gateway_v4: Ipv4Addr::UNSPECIFIED,
                placeholders,
            },
            policy: plan.policy,
        })
    }

    async fn build(
        &self,
        req: &CreateSandbox,
        plan: Plan,
        id: u32,
        created: SystemTime,
        created_at: String,
    ) -> Result<SandboxView, Failure> {
        let name = req.name.clone();
        let (gateway, guest) = self.addresses(id);
        let link = format!("svc{id}");
        let mut envelope = plan.envelope;
        envelope.link = link.clone();
        envelope.guest_v4 = guest;
        envelope.gateway_v4 = gateway;
        let ca = Arc::new(
            SandboxCa::generate(&name).map_err(|e| Failure::internal(format!("CA: {e}")))?,
        );
        let dir = self.sandbox_dir(&name);
        let files = write_guest_files(&dir, &name, gateway, &ca.ca_pem())
            .map_err(|e| Failure::internal(format!("{}: {e}", dir.display())))?;
        let started = self
            .backend
            .start(
                &GuestSpec {
                    name: name.clone(),
                    dir: dir.clone(),
                    files,
                },
                &SandboxLinks {
                    links: &self.links,
                    link: &link,
                    gateway,
                    guest,
                },
            )
            .await
            .map_err(|e| Failure::internal(e.to_string()))?;
        let guest_handle = started.guest;
        let mut live = Live {
            name: name.clone(),
            id,
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
            mode: EgressMode::Curated,
            paused: false,
        };
        live.env = guest_env(&live);
        self.live().insert(name.clone(), live.clone());
        let secret_values: HashMap<String, String> = req
            .secrets
            .iter()
            .map(|s| (s.name.clone(), s.value.clone()))
            .collect();
        self.enforce(&mut live, secret_values)?;
        self.live().insert(name.clone(), live.clone());
        self.sync_nft().await?;
        let envelope_json =
            serde_json::to_string(&envelope).map_err(|e| Failure::internal(e.to_string()))?;
        self.store().set_running(
            &name,
            &envelope_json,
            &ca.ca_pem(),
            &ca.ca_key_pem(),
            guest_handle.pid,
            guest_handle.start,
            &req.secrets,
        )?;
        let view = self.view(&live);
        info!(sandbox = %name, id, link = %link, guest = %guest, mode = %view.mode, "sandbox created");
        self.event(
            "sandbox.created",
            Some(&name),
            serde_json::json!({"id": id, "mode": view.mode, "link": link}),
        );
        // No workspace configuration to wait for yet: ready now.
        self.event("workspace.ready", Some(&name), serde_json::json!({}));
        Ok(view)
    }

    /// Put the sandbox's policy on its link (fence record, attach) and in the registry.
    fn enforce(&self, live: &mut Live, secrets: HashMap<String, String>) -> Result<(), Failure> {
        let mode = self.mode_now(live).mode;
        live.mode = mode;
        let link = SandboxLink {
            ifindex: live.ifindex,
            sandbox: live.id,
            mode,
            proxy: mode == EgressMode::Curated,
            guest_v4: live.envelope.guest_v4,
            gateway_v4: live.envelope.gateway_v4,
            guest_v6: None,
            guest_v6_link_local: None,
            gateway_v6: None,
        };
        {
            let mut fence = self.fence();
            // After a restart the record is usually in force already: keep it and the entries
            // the guard wrote (the guest may still use them), and only re-attach.
            if !fence.record_in_force(&link) {
                fence
                    .install_sandbox(&link, &[], &[])
                    .map_err(|e| Failure::internal(e.to_string()))?;
            }
            fence
                .attach(&live.envelope.link)
                .map_err(|e| Failure::internal(e.to_string()))?;
        }
        let allowed = if mode == EgressMode::Curated {
            live.policy.allowed.clone()
        } else {
            Allowlist(Vec::new())
        };
        self.registry.remove(live.id);
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
            secrets,
        });
        Ok(())
    }

    /// Put every live sandbox's link in the nftables table (one batch).
    /// The first time (at start) the whole table is written; after that only its link set
    /// changes (one batch either way; the whole table again if the set update fails, e.g. the
    /// table was removed by hand).
    async fn sync_nft(&self) -> Result<(), Failure> {
        let mut written = self.nft_lock.lock().await;
        let links: Vec<String> = self
            .live()
            .values()
            .filter(|l| l.ifindex != 0)
            .map(|l| l.envelope.link.clone())
            .collect();
        let nft = self.nft.clone();
        let whole = !*written;
        let result = tokio::task::spawn_blocking(move || {
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
        self.destroy_in_span(name).instrument(span).await
    }

    async fn destroy_in_span(&self, name: &str) -> Result<Destroyed, Failure> {
        let row = self
            .store()
            .list()?
            .into_iter()
            .find(|r| r.name == name)
            .ok_or_else(|| Failure::not_found(name))?;
        self.store().set_destroying(name)?;
        let removed = self.teardown(name, row.id, &format!("svc{}", row.id)).await;
        self.store().delete(name)?;
        info!(sandbox = %name, "sandbox destroyed");
        self.event("sandbox.destroyed", Some(name), serde_json::json!({}));
        Ok(Destroyed {
            name: name.to_owned(),
            removed,
        })
    }

    /// Remove everything of a sandbox, best effort, in the order that keeps the fence closed:
    /// registry (no more DNS answers, no proxy), fence record (the link drops everything),
    /// processes, link, nftables, files. Returns what was removed.
    async fn teardown(&self, name: &str, id: u32, link: &str) -> Vec<String> {
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
        match self.backend.stop(name, &self.sandbox_dir(name)).await {
            Ok(parts) => removed.extend(parts),
            Err(e) => warn!(sandbox = %name, error = %e, "stopping the guest"),
        }
        if let Some(ifindex) = self.links.ifindex(link).await.ok().flatten() {
            match self.links.delete(ifindex).await {
                Ok(()) => removed.push(format!("link {link}")),
                Err(e) => warn!(sandbox = %name, error = %e, "deleting the link"),
            }
        }
        if self.sync_nft().await.is_ok() {
            removed.push("nftables link set entry".to_owned());
        }
        let dir = self.sandbox_dir(name);
        if dir.exists() && std::fs::remove_dir_all(&dir).is_ok() {
            removed.push(format!("files {}", dir.display()));
        }
        removed.push("state row".to_owned());
        removed
    }

    // ----------------------------------------------------------------- reads

    pub fn list(&self) -> Result<Vec<SandboxView>, Failure> {
        let live = self.live();
        Ok(live.values().map(|l| self.view(l)).collect())
    }

    pub fn show(&self, name: &str) -> Result<SandboxView, Failure> {
        api::check_name(name).map_err(Failure::bad)?;
        let live = self.live();
        live.get(name)
            .map(|l| self.view(l))
            .ok_or_else(|| Failure::not_found(name))
    }

    fn view(&self, l: &Live) -> SandboxView {
        let window_ends = (l.mode == EgressMode::AllowAll)
            .then(|| self.mode_now(l).window_ends.map(rfc3339))
            .flatten();
        let secrets: HashMap<&str, &str> = l
            .secrets
            .iter()
            .map(|(n, s)| (n.as_str(), s.as_str()))
            .collect();
        let placeholders = l
            .policy
            .placeholders
            .entries()
            .iter()
            .map(|e| {
                let env = e.env_name().unwrap_or_default();
                PlaceholderView {
                    brokered: secrets.contains_key(env.as_str()),
                    env,
                    kind: e.kind.name().to_owned(),
                    hosts: e.hosts.iter().map(ToString::to_string).collect(),
                }
            })
            .collect();
        SandboxView {
            name: l.name.clone(),
            id: l.id,
            state: if !self.backend.alive(&l.guest) {
                "dead".into()
            } else if l.paused {
                "paused".into()
            } else {
                "running".into()
            },
            backend: l.envelope.backend.clone(),
            mode: match l.mode {
                EgressMode::Curated => "curated".into(),
                EgressMode::AllowAll => "allow-all".into(),
            },
            window_ends,
            allowed_hosts: if l.mode == EgressMode::Curated {
                l.policy.allowed.0.iter().map(ToString::to_string).collect()
            } else {
                Vec::new()
            },
            allowed_branches: l.envelope.allowed_branches.clone(),
            repo: l.envelope.repo.clone(),
            context_path: l.envelope.context_path.clone(),
            link: l.envelope.link.clone(),
            guest_v4: l.envelope.guest_v4,
            gateway_v4: l.envelope.gateway_v4,
            pid: l.guest.pid,
            created_at: l.created_at.clone(),
            placeholders,
            secrets: l.secrets.iter().map(|(n, s)| format!("{n}@{s}")).collect(),
        }
    }

    /// Start a command for `svc sandbox exec`. Standard input and a terminal need an
    /// `interactive` (upgraded) connection to carry them.
    pub async fn exec(
        &self,
        name: &str,
        req: &api::ExecRequest,
        interactive: bool,
    ) -> Result<ExecHandle, Failure> {
        api::check_name(name).map_err(Failure::bad)?;
        if !interactive && (req.stdin || req.tty.is_some()) {
            return Err(Failure::bad(format!(
                "stdin and tty need an upgraded connection (Connection: Upgrade, Upgrade: {})",
                api::EXEC_UPGRADE
            )));
        }
        if let Some(t) = req.tty
            && (t.rows == 0 || t.cols == 0)
        {
            return Err(Failure::bad(format!(
                "tty size {}x{}: rows and columns must be at least 1",
                t.rows, t.cols
            )));
        }
        let (guest, mut env, paused) = {
            let live = self.live();
            let l = live.get(name).ok_or_else(|| Failure::not_found(name))?;
            (l.guest.clone(), l.env.clone(), l.paused)
        };
        if paused {
            return Err(Failure::unsupported(format!(
                "sandbox {name:?} is paused: `svc sandbox resume {name}` first"
            )));
        }
        if req.argv.is_empty() {
            return Err(Failure::bad(
                "exec needs a command: svc sandbox exec NAME -- CMD…",
            ));
        }
        for (k, _) in &req.env {
            if k.is_empty() || k.contains(['=', '\0']) {
                return Err(Failure::bad(format!("bad environment variable name {k:?}")));
            }
        }
        env.extend(req.env.iter().cloned());
        self.backend
            .exec(
                &guest,
                &GuestCommand {
                    argv: req.argv.clone(),
                    env,
                    cwd: req.cwd.clone(),
                    stdin: req.stdin,
                    tty: req.tty.map(|t| (t.rows, t.cols)),
                },
            )
            .await
            .map_err(|e| match e {
                RuntimeError::NotRunning => Failure::unsupported(format!(
                    "sandbox {name:?} is not running (its processes are gone): destroy it"
                )),
                other => Failure::internal(other.to_string()),
            })
    }

    /// pause / resume / fork: the backend says whether it can.
    pub async fn lifecycle(&self, name: &str, op: &str) -> Result<SandboxView, Failure> {
        api::check_name(name).map_err(Failure::bad)?;
        let guest = {
            let live = self.live();
            live.get(name)
                .ok_or_else(|| Failure::not_found(name))?
                .guest
                .clone()
        };
        let r = match op {
            "pause" => self.backend.pause(&guest).await,
            "resume" => self.backend.resume(&guest).await,
            _ => self.backend.fork(&guest),
        };
        r.map_err(|e| match e {
            RuntimeError::Unsupported { .. } => Failure::unsupported(e.to_string()),
            other => Failure::internal(other.to_string()),
        })?;
        if let Some(l) = self.live().get_mut(name) {
            match op {
                "pause" => l.paused = true,
                "resume" => l.paused = false,
                _ => {}
            }
        }
        let kind = match op {
            "pause" => "sandbox.paused",
            "resume" => "sandbox.resumed",
            _ => "sandbox.forked",
        };
        self.event(kind, Some(name), serde_json::json!({}));
        self.show(name)
    }

    // --------------------------------------------------------------- restart

    /// At start: re-adopt every running sandbox whose guest is still there, tear down what a
    /// crash left half-built or half-destroyed, and put every link in the nftables table.
    pub async fn reconcile(&self) -> Result<(), Failure> {
        let rows = self.store().list()?;
        for row in rows {
            if row.state != "running" {
                warn!(sandbox = %row.name, state = %row.state, "found a sandbox a crash interrupted; removing it");
                self.teardown(&row.name, row.id, &format!("svc{}", row.id))
                    .await;
                let _ = self.store().delete(&row.name);
                continue;
            }
            match self.adopt(&row).await {
                Ok(()) => {
                    info!(sandbox = %row.name, "re-adopted");
                    self.event("sandbox.adopted", Some(&row.name), serde_json::json!({}));
                }
                Err(f) => {
                    self.dead
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .insert(row.name.clone());
                    warn!(sandbox = %row.name, error = %f.message, "cannot re-adopt; its fence stays closed");
                    self.event(
                        "sandbox.dead",
                        Some(&row.name),
                        serde_json::json!({"reason": f.message}),
                    );
                }
            }
        }
        self.sync_nft().await
    }

    async fn adopt(&self, row: &crate::store::SandboxRow) -> Result<(), Failure> {
        let envelope: Envelope = serde_json::from_str(&row.envelope)
            .map_err(|e| Failure::internal(format!("stored envelope: {e}")))?;
        let guest = row
            .pid
            .zip(row.pid_start)
            .map(|(pid, start)| GuestHandle {
                name: row.name.clone(),
                pid,
                start,
            })
            .ok_or_else(|| Failure::internal("no guest recorded"))?;
        let (Some(cert), Some(key)) = (&row.ca_cert, &row.ca_key) else {
            return Err(Failure::internal("no CA recorded"));
        };
        let ca = Arc::new(
            SandboxCa::restore(&row.name, cert, key)
                .map_err(|e| Failure::internal(format!("CA: {e}")))?,
        );
        let policy = self.policy_from(&envelope)?;
        let created = humantime::parse_rfc3339_weak(&row.created_at).unwrap_or(SystemTime::now());
        let alive = self.backend.alive(&guest);
        let ifindex = self
            .links
            .ifindex(&envelope.link)
            .await
            .ok()
            .flatten()
            .unwrap_or(0);
        let secrets = self.store().secrets(&row.name)?;
        let mut live = Live {
            name: row.name.clone(),
            id: row.id,
            envelope,
            guest,
            ifindex,
            created_at: row.created_at.clone(),
            created,
            secrets: secrets
                .iter()
                .map(|s| (s.name.clone(), s.source.clone()))
                .collect(),
            ca,
            policy: Arc::new(policy),
            env: Vec::new(),
            mode: EgressMode::Curated,
            paused: false,
        };
        live.env = guest_env(&live);
        if !alive || ifindex == 0 {
            // Keep it listed (state "dead") so the operator sees it and destroys it; its
            // fence record goes, so the link (if any) drops everything.
            if ifindex != 0 {
                let _ = self.fence().remove_sandbox(ifindex);
            }
            self.live().insert(row.name.clone(), live);
            return Err(Failure::internal(if alive {
                "its link is gone".to_owned()
            } else {
                "its processes are gone".to_owned()
            }));
        }
        let known: Vec<IpAddr> = self
            .fence()
            .allow_entries(row.id)
            .into_iter()
            .map(|(a, _)| a)
            .collect();
        self.registry.bind_unknown(row.id, known);
        self.enforce(&mut live, to_map(&secrets))?;
        self.live().insert(row.name.clone(), live);
        Ok(())
    }

    fn policy_from(&self, envelope: &Envelope) -> Result<SandboxPolicy, Failure> {
        let host = &self.config.host;
        let extra: Vec<HostPattern> = envelope
            .extra_hosts
            .iter()
            .filter_map(|h| HostPattern::parse(h).ok())
            .collect();
        let repo = envelope
            .repo
            .as_deref()
            .and_then(|r| RepoName::parse(r).ok());
        let agent = Allowlist(host.agent_hosts.clone());
        let egress = EgressConfig::default();
        let allowed =
            SandboxPolicy::allowed_hosts(&agent, &extra, &host.code, repo.is_some(), &egress);
        let mut entries = Vec::new();
        for p in &envelope.placeholders {
            let placeholder = Placeholder::parse(&p.value)
                .ok_or_else(|| Failure::internal("a stored placeholder does not parse"))?;
            let kind = CredentialKind::from_name(&p.kind).ok_or_else(|| {
                Failure::internal(format!("a stored placeholder has kind {:?}", p.kind))
            })?;
            let hosts = p
                .hosts
                .iter()
                .filter_map(|h| HostPattern::parse(h).ok())
                .collect();
            entries.push(PlaceholderEntry {
                placeholder,
                kind,
                hosts,
            });
        }
        Ok(SandboxPolicy {
            allowed,
            agent_hosts: agent,
            bound_repo: repo,
            code: host.code.clone(),
            egress,
            placeholders: PlaceholderTable::new(entries),
        })
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
                .filter(|l| !self.backend.alive(&l.guest) && dead.insert(l.name.clone()))
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

    /// The mode in force for a sandbox now, as `policy::mode` decides it (an AllowAll window
    /// counts from the later of its creation and svcd's start, SPEC 5.1.1).
    fn mode_now(&self, l: &Live) -> ModeNow {
        crate::policy::mode::mode_now(
            l.envelope.egress == EgressChoice::AllowAll,
            Some(AllowAllKind::for_creation(
                l.envelope.context_path.is_some(),
            )),
            l.created,
            self.started,
            SystemTime::now(),
        )
    }
}

struct Plan {
    envelope: Envelope,
    policy: SandboxPolicy,
}

/// The secrets of a request as `policy::creation` reads them.
fn creation_secrets(secrets: &[SecretValue]) -> Vec<creation::Secret<'_>> {
    secrets
        .iter()
        .map(|s| creation::Secret {
            name: &s.name,
            source: &s.source,
            value: &s.value,
        })
        .collect()
}

/// A create request as `policy::creation` reads it.
fn creation_request<'a>(
    req: &'a CreateSandbox,
    secrets: &'a [creation::Secret<'a>],
) -> creation::Request<'a> {
    creation::Request {
        egress: req.egress.map(|e| match e {
            EgressChoice::Curated => EgressMode::Curated,
            EgressChoice::AllowAll => EgressMode::AllowAll,
        }),
        context_path: req.context_path.is_some(),
        allow_hosts: &req.allow_hosts,
        repo: req.repo.as_deref(),
        secrets,
    }
}

fn to_map(secrets: &[SecretValue]) -> HashMap<String, String> {
    secrets
        .iter()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect()
}

/// The environment every command in the sandbox gets.
fn guest_env(l: &Live) -> Vec<(String, String)> {
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
    for (k, v) in guest_trust::guest_env() {
        env.push((k.to_owned(), v.to_owned()));
    }
    if l.envelope.egress == EgressChoice::Curated {
        env.extend(l.policy.placeholders.guest_env());
    }
    env
}

/// The files the guest sees read-only: its resolv.conf (the gateway is its only resolver), its
/// hosts file, the CA bundle (the host's roots plus the sandbox CA) and the CA alone.
fn write_guest_files(
    dir: &std::path::Path,
    name: &str,
    gateway: Ipv4Addr,
    ca_pem: &str,
) -> std::io::Result<Vec<(PathBuf, PathBuf)>> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let resolv = dir.join("resolv.conf");
    std::fs::write(&resolv, format!("nameserver {gateway}\noptions edns0\n"))?;
    let hosts = dir.join("hosts");
    std::fs::write(
        &hosts,
        format!("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n127.0.1.1\t{name}\n"),
    )?;
    let root = dir.join("root");
    let bundle = root.join(guest_trust::GUEST_BUNDLE.trim_start_matches('/'));
    if let Some(parent) = bundle.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let system = std::fs::read(guest_trust::GUEST_BUNDLE).unwrap_or_default();
    std::fs::write(&bundle, system)?;
    guest_trust::install(&root, ca_pem).map_err(std::io::Error::other)?;
    let ca_file = root.join(guest_trust::GUEST_CA_FILE.trim_start_matches('/'));
    Ok(vec![
        (resolv, PathBuf::from("/etc/resolv.conf")),
        (hosts, PathBuf::from("/etc/hosts")),
        (bundle, PathBuf::from(guest_trust::GUEST_BUNDLE)),
        (ca_file, PathBuf::from(guest_trust::GUEST_CA_FILE)),
    ])
}

/// How a sandbox's guest is plugged into its link: a veth whose host end `link` carries the
/// fence, its guest end moved into the guest's network namespace as `eth0`.
struct SandboxLinks<'a> {
    links: &'a Links,
    link: &'a str,
    gateway: Ipv4Addr,
    guest: Ipv4Addr,
}

impl GuestLinks for SandboxLinks<'_> {
    fn attach<'a>(
        &'a self,
        netns: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<u32, RuntimeError>> {
        Box::pin(async move {
            let err = |m: String| RuntimeError::Start {
                name: self.link.to_owned(),
                message: format!("plugging in the link: {m}"),
            };
            let net = |e: dataplane::DataplaneError| err(e.to_string());
            let peer = format!("{}g", self.link);
            let ifindex = self
                .links
                .create_veth(self.link, &peer)
                .await
                .map_err(net)?;
            let peer_index = self
                .links
                .ifindex(&peer)
                .await
                .map_err(net)?
                .ok_or_else(|| err(format!("{peer} vanished")))?;
            let ns =
                std::fs::File::open(netns).map_err(|e| err(format!("{}: {e}", netns.display())))?;
            self.links
                .move_to_netns(peer_index, &ns)
                .await
                .map_err(net)?;
            let guest_net =
                IpNet::V4(Ipv4Net::new(self.guest, 30).map_err(|e| err(e.to_string()))?);
            let netns = netns.to_path_buf();
            let gateway = self.gateway;
            tokio::task::spawn_blocking(move || {
                dataplane::configure_guest(&netns, &peer, "eth0", guest_net, IpAddr::V4(gateway))
            })
            .await
            .map_err(|e| err(e.to_string()))?
            .map_err(net)?;
            let gw_net = IpNet::V4(Ipv4Net::new(self.gateway, 30).map_err(|e| err(e.to_string()))?);
            self.links.add_address(ifindex, gw_net).await.map_err(net)?;
            self.links.up(ifindex).await.map_err(net)?;
            Ok(ifindex)
        })
    }
}
