//! The supervisor: sandboxes from creation to destruction, their state in the store, their
//! links in the fence and the nftables table, their entries in the registry the guard, the
//! proxy and the broker read. Creation is in `create` (plan, build, rollback), destruction in
//! `destroy`, re-adoption after a restart in `adopt`, the data path's entries in `register`,
//! the sandbox's records and what its guest gets in `sandbox`; the creation rules are
//! `policy::creation`'s. The state store and the kernel effects are behind narrow traits
//! (`state`, `effects`), so the unit tests (`tests`) run all of it over fakes.

mod adopt;
mod create;
mod ctr_root;
mod destroy;
mod effects;
#[cfg(test)]
mod fake;
#[cfg(test)]
mod fake_store;
mod git_ssh;
mod gitdir;
mod grants;
mod guardian;
mod live_policy;
mod ownership;
mod pool;
mod pool_claim;
mod register;
mod rootfs;
mod running;
mod sandbox;
mod secrets;
mod services_state;
mod spotlight;
mod state;
mod stats;
mod task;
#[cfg(test)]
mod tests;
mod trust;
mod workspace;
mod workspace_log;
mod workspace_services;

use std::{
    collections::{BTreeMap, HashMap},
    net::Ipv4Addr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::SystemTime,
};

use tokio::sync::broadcast;
use tracing::{info, warn};

use self::{
    effects::{HostLinks, LinkSet, SandboxFence},
    sandbox::{Envelope, Live, to_map},
    state::StateStore,
};
pub use super::failure::Failure;
use super::wiring::Registry;
use crate::{
    api::{EgressChoice, Event},
    audit::rfc3339,
    config::host::HostConfig,
    dataplane::{Fence, Links, Nft},
    policy::mode::{AllowAllKind, EgressMode, ModeNow},
    runtime::Backends,
    store::Store,
};

pub use crate::policy::ssh::DEFAULT_BRANCHES;

/// The kernel effects a supervisor has (production: `dataplane`'s; tests: fakes).
struct Effects {
    fence: Arc<dyn SandboxFence>,
    nft: Arc<dyn LinkSet>,
    links: Arc<dyn HostLinks>,
}

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
    /// agent's home; `None`: off.
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
    /// The state store (production: the SQLite [`Store`]; tests: a fake over one).
    store: Arc<dyn StateStore>,
    fence: Arc<dyn SandboxFence>,
    nft: Arc<dyn LinkSet>,
    /// Serialises changes of the nftables table; whether it has been written whole.
    nft_lock: tokio::sync::Mutex<bool>,
    links: Arc<dyn HostLinks>,
    backends: Backends,
    registry: Arc<Registry>,
    live: Mutex<BTreeMap<String, Live>>,
    /// Serialises live policy changes (`allow`).
    policy_lock: tokio::sync::Mutex<()>,
    /// Brokered OAuth secrets by name: the current version's grant (sandboxes hold theirs).
    grants: Mutex<HashMap<String, Arc<crate::creds::grant::Grant>>>,
    /// Sandboxes whose processes were found gone (reported once).
    dead: Mutex<std::collections::HashSet<String>>,
    /// Sandboxes a destroy is taking down now (one destroy at a time for a name).
    destroying: Arc<Mutex<std::collections::HashSet<String>>>,
    /// The warm pools: sandboxes made ahead of their requests (`pool`).
    pool: pool::Pool,
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
        .unwrap_or_else(|| crate::runtime::registry::CONTAINER.name.to_owned())
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
        Self::with_effects(
            config,
            Arc::new(Mutex::new(store)),
            Effects {
                fence,
                nft: Arc::new(nft),
                links: Arc::new(links),
            },
            backends,
            registry,
            started,
        )
    }

    /// A supervisor whose state goes to `store` and kernel effects through `effects` (the
    /// tests' fakes).
    fn with_effects(
        config: SupervisorConfig,
        store: Arc<dyn StateStore>,
        effects: Effects,
        backends: Backends,
        registry: Arc<Registry>,
        started: SystemTime,
    ) -> Self {
        let (events, _) = broadcast::channel(1024);
        Self {
            config,
            store,
            fence: effects.fence,
            nft: effects.nft,
            nft_lock: tokio::sync::Mutex::new(false),
            links: effects.links,
            backends,
            registry,
            live: Mutex::default(),
            policy_lock: tokio::sync::Mutex::new(()),
            grants: Mutex::default(),
            dead: Mutex::default(),
            destroying: Arc::default(),
            pool: pool::Pool::default(),
            events,
            started,
        }
    }

    fn store(&self) -> &dyn StateStore {
        self.store.as_ref()
    }

    fn live(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Live>> {
        self.live
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
    /// The backends this svcd has (`GET /v1/backends`).
    pub fn backends(&self) -> &Backends {
        &self.backends
    }

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
        self.config.host.max_sandbox_id()
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

    /// The metrics' text: the fence's counters and the sandboxes' states read now.
    pub fn metrics_text(&self) -> String {
        let counters = self.fence.counters().map(|c| c.reasons).unwrap_or_default();
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

    /// Every few seconds: AllowAll windows that ended fall back to Curated.
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
                let _ = self.fence.remove_sandbox(ifindex);
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
        if let Err(e) = self.fence.collect_expired() {
            warn!(error = %e, "collecting expired fence entries");
        }
    }

    /// Drop events from the fence, for the audit log.
    pub fn drain_drops(&self) -> Vec<svc_ebpf_common::DropEvent> {
        self.fence.drain_events()
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
    /// counts from the later of its creation and svcd's start).
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
