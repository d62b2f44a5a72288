//! Warm pools (docs/pool.md): sandboxes made ahead of their requests up to the point where
//! nothing depends on the request — state row reserved (its id: link, addresses, fence entry,
//! host id slice), directory, link made and fenced closed and in the nftables link set, guest
//! created and started with its init — kept ready per backend and refilled in the background at `[pool]
//! refill_per_second`. `pool_claim` gives one to a request that fits; svcd's stop drains them.
//!
//! A pooled sandbox is a store row in state `creating` named `pool.<backend>.<n>` (a name no
//! request can give: sandbox names have no dot), never in the live map: nothing lists it,
//! and a start after a crash tears it down with every other half-made row.

use std::{
    net::Ipv4Addr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, SystemTime},
};

use tracing::{info, warn};

use super::{Failure, Supervisor, sandbox::Envelope};
use crate::{
    api::EgressChoice, audit::rfc3339, policy::mode::EgressMode, proxy::ca::SandboxCa,
    runtime::Started,
};

/// The first part of every pooled sandbox's name.
pub(super) const POOL_PREFIX: &str = "pool.";

/// How long a refill waits after a pooled sandbox could not be made.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(5);

/// How long svcd's stop waits for a pooled sandbox being made before it drains the pool.
const DRAIN_WAIT: Duration = Duration::from_secs(60);

/// A sandbox made ahead, ready to be claimed.
#[derive(Debug)]
pub(super) struct Pooled {
    /// Its row's name, and the runtime's name for its guest (kept after the claim).
    pub(super) name: String,
    pub(super) backend: &'static str,
    pub(super) id: u32,
    pub(super) started: Started,
}

/// The pools' state.
#[derive(Debug, Default)]
pub(super) struct Pool {
    ready: Mutex<Vec<Pooled>>,
    /// Pooled sandboxes being made now.
    making: AtomicUsize,
    /// The next pooled sandbox's number.
    seq: AtomicU64,
    /// svcd is stopping: nothing more is made, what is ready goes.
    stopping: AtomicBool,
}

impl Pool {
    fn ready(&self) -> std::sync::MutexGuard<'_, Vec<Pooled>> {
        self.ready
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Sandboxes of `backend` ready now.
    pub(super) fn count(&self, backend: &str) -> usize {
        self.ready().iter().filter(|p| p.backend == backend).count()
    }

    /// A ready sandbox of `backend`, taken out of the pool.
    pub(super) fn take(&self, backend: &str) -> Option<Pooled> {
        let mut ready = self.ready();
        let at = ready.iter().position(|p| p.backend == backend)?;
        Some(ready.remove(at))
    }

    /// The host links of the ready sandboxes (each in the nftables link set from its making).
    pub(super) fn links(&self) -> Vec<String> {
        self.ready()
            .iter()
            .map(|p| format!("svc{}", p.id))
            .collect()
    }

    /// `p` back in the pool (a claim that could not use it).
    pub(super) fn put(&self, p: Pooled) {
        self.ready().push(p);
    }
}

impl Supervisor {
    /// How many sandboxes `backend`'s pool keeps (`[pool]`; 0: no pool).
    pub(super) fn pool_target(&self, backend: &str) -> usize {
        let pool = &self.config.host.pool;
        let n = if backend == crate::runtime::registry::CONTAINER.name {
            pool.container
        } else if backend == crate::runtime::registry::MICROVM.name {
            pool.microvm
        } else {
            0
        };
        usize::try_from(n).unwrap_or(0)
    }

    /// The pools' sizes now, by backend, for status and doctor: (backend, ready, target).
    pub fn pool_status(&self) -> Vec<(&'static str, usize, usize)> {
        crate::runtime::registry::KINDS
            .iter()
            .map(|k| (k.name, self.pool.count(k.name), self.pool_target(k.name)))
            .filter(|(_, _, target)| *target > 0)
            .collect()
    }

    /// Keep each pool filled until `stop` says stop, making at most `[pool]
    /// refill_per_second` sandboxes a second per backend, one at a time.
    pub fn spawn_pool(self: &Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        // Pooled names are new to every svcd: a claimed sandbox (adopted by a later svcd)
        // keeps its runtime name for life.
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
        let first = now.map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0));
        self.pool.seq.store(first, Ordering::SeqCst);
        for kind in crate::runtime::registry::KINDS {
            if self.pool_target(kind.name) > 0 {
                self.spawn_refill(kind.name, stop.clone());
            }
        }
    }

    /// Keep `backend`'s pool filled until `stop` says stop.
    fn spawn_refill(
        self: &Arc<Self>,
        backend: &'static str,
        stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let rate = self.config.host.pool.refill_per_second.max(1);
        let sup = self.clone();
        tokio::spawn(async move {
            let mut stop = stop;
            let mut every = tokio::time::interval(Duration::from_secs(1) / rate);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = every.tick() => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
                if sup.pool.stopping.load(Ordering::SeqCst) {
                    break;
                }
                if sup.pool.count(backend) < sup.pool_target(backend) && !sup.refill(backend).await
                {
                    tokio::time::sleep(RETRY_AFTER_FAILURE).await;
                }
            }
        });
    }

    /// Make one pooled sandbox of `backend` and put it in the pool; whether it was made.
    async fn refill(&self, backend: &'static str) -> bool {
        self.pool.making.fetch_add(1, Ordering::SeqCst);
        let made = self.prepare_pooled(backend).await;
        let ok = made.is_ok();
        match made {
            Ok(p) if self.pool.stopping.load(Ordering::SeqCst) => self.discard(p).await,
            Ok(p) => self.pool.put(p),
            Err(f) => warn!(backend, error = %f.message, "could not make a pooled sandbox"),
        }
        self.pool.making.fetch_sub(1, Ordering::SeqCst);
        self.config
            .metrics
            .pool_size(backend, self.pool.count(backend));
        ok
    }

    /// At svcd's stop: make no more, and remove every pooled sandbox (nothing is kept for the
    /// next svcd, which would tear them down anyway).
    pub async fn drain_pool(&self) {
        self.pool.stopping.store(true, Ordering::SeqCst);
        let until = std::time::Instant::now() + DRAIN_WAIT;
        while self.pool.making.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let all: Vec<Pooled> = std::mem::take(&mut *self.pool.ready());
        if !all.is_empty() {
            info!(count = all.len(), "removing the pooled sandboxes");
        }
        for p in all {
            let backend = p.backend;
            self.discard(p).await;
            self.config.metrics.pool_size(backend, 0);
        }
    }

    /// Remove pooled sandbox `p` and its row.
    pub(super) async fn discard(&self, p: Pooled) {
        self.teardown(&p.name, p.id, &format!("svc{}", p.id), p.backend)
            .await;
        let _ = self.store().delete(&p.name);
    }

    /// Make a sandbox of `backend` up to its request: its row reserved, its directory and
    /// stand-in guest files, its guest started on its link, fenced closed (no registry entry:
    /// the guard answers it nothing, so no address is ever allowed).
    async fn prepare_pooled(&self, backend: &'static str) -> Result<Pooled, Failure> {
        let n = self.pool.seq.fetch_add(1, Ordering::SeqCst);
        let name = format!("{POOL_PREFIX}{backend}.{n}");
        let mut envelope = blank_envelope(backend);
        let prelim =
            serde_json::to_string(&envelope).map_err(|e| Failure::internal(e.to_string()))?;
        let made = rfc3339(SystemTime::now());
        let id = self.store().reserve_for(
            &name,
            &prelim,
            &made,
            &crate::audit::Incarnation::fresh_key(),
            self.max_id(),
            0,
        )?;
        let (gateway, guest) = self.addresses(id);
        envelope.link = format!("svc{id}");
        envelope.guest_v4 = guest;
        envelope.gateway_v4 = gateway;
        let started = async {
            // A stand-in CA: the claim writes the claimer's over it, in place.
            let ca =
                SandboxCa::generate(&name).map_err(|e| Failure::internal(format!("CA: {e}")))?;
            let files = self.guest_files(&name, gateway, &ca).await?;
            let started = self
                .start_guest(&name, id, &envelope, EgressMode::Curated, files, None)
                .await?;
            // Its link's element now, not at the claim: it only puts the link under the
            // table's rules (the guard and the proxy only; the fence is closed).
            self.sync_nft(Some((&envelope.link, true))).await?;
            Ok(started)
        }
        .await;
        match started {
            Ok(started) => Ok(Pooled {
                name,
                backend,
                id,
                started,
            }),
            Err(f) => {
                self.rollback(&name, id, backend).await;
                Err(f)
            }
        }
    }
}

/// The envelope of a pooled sandbox before its claim: nothing of any request.
pub(super) fn blank_envelope(backend: &str) -> Envelope {
    Envelope {
        backend: backend.to_owned(),
        backend_reason: "a warm pool's".to_owned(),
        live_mounts: Vec::new(),
        extra_hosts: Vec::new(),
        repo: None,
        egress: EgressChoice::Curated,
        context_path: None,
        allowed_branches: Vec::new(),
        https_push_branches: false,
        ssh_repos: Vec::new(),
        workspace: None,
        egress_section: None,
        policy_generation: 0,
        link: String::new(),
        guest_v4: Ipv4Addr::UNSPECIFIED,
        gateway_v4: Ipv4Addr::UNSPECIFIED,
        placeholders: Vec::new(),
        runtime_id: None,
        rootfs: Vec::new(),
        pod: None,
    }
}
