//! Destruction: `destroy` (the API's), and `teardown`, which removes everything of a sandbox
//! in the order that keeps its fence closed — also what a failed creation's rollback and
//! start-up's clean-up of a half-built sandbox call.

use std::time::Duration;

use tracing::{Instrument as _, info, info_span, warn};

use super::{Failure, Supervisor, row_backend};
use crate::{
    api::{Destroyed, SandboxName},
    dataplane,
};

/// How long teardown waits for a sandbox's open connections, relay sessions and streams to let
/// go of its slots once told to end, before it frees the id anyway (and logs what is left).
pub(super) const DRAIN_BOUND: Duration = Duration::from_secs(2);

impl Supervisor {
    /// `DELETE /v1/sandboxes/{name}`. Logged in a span `sandbox{name}`.
    pub async fn destroy(&self, name: &str) -> Result<Destroyed, Failure> {
        SandboxName::check(name).map_err(Failure::bad)?;
        let span = info_span!("sandbox", name = %name);
        let started = std::time::Instant::now();
        let result = self.destroy_in_span(name).instrument(span).await;
        if result.is_ok() {
            self.config.metrics.destroyed(started.elapsed());
            self.config.metrics.forget(name);
        }
        result
    }

    async fn destroy_in_span(&self, name: &str) -> Result<Destroyed, Failure> {
        let row = self
            .store()
            .list()?
            .into_iter()
            .find(|r| r.name == name)
            .ok_or_else(|| Failure::not_found(name))?;
        // Only a made sandbox is destroyed, and by one destroy at a time: a creation still
        // under way holds its id and cleans up after itself when it fails (a destroy now would
        // free the id, and that clean-up would take whatever sandbox got the id meanwhile); a
        // second destroy at once would tear down, by id, the next sandbox given it. A row a
        // failed destroy left `destroying` may be destroyed again.
        if row.state == "creating" {
            return Err(Failure::busy(name, &row.state));
        }
        let _one = OneDestroy::take(&self.destroying, name)?;
        self.store().set_destroying(name).map_err(|e| match e {
            crate::store::StoreError::NotFound(_) => Failure::busy(name, "destroying"),
            other => other.into(),
        })?;
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
    /// registry (no more DNS answers, no proxy), its open proxy connections, relay sessions and
    /// DNS-over-TCP connections told to end, fence record (the link drops everything),
    /// processes, link, nftables, files; last, at most [`DRAIN_BOUND`] after they were told,
    /// those connections gone (before the caller frees the id). Returns what was removed.
    pub(super) async fn teardown(
        &self,
        name: &str,
        id: u32,
        link: &str,
        backend: &str,
    ) -> Vec<String> {
        let mut removed = Vec::new();
        let registered = self.registry.by_id(id).map(|r| r.incarnation.key.clone());
        self.registry.remove(id);
        self.registry.unbind(id);
        self.dead
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(name);
        let live = self.live().remove(name);
        let told = std::time::Instant::now();
        let ending = live
            .as_ref()
            .map(|l| l.incarnation.key.clone())
            .or(registered)
            .map(|key| self.config.limits.end(&crate::limits::Guest::new(id, key)));
        let ifindex = match live.as_ref().map(|l| l.ifindex).filter(|i| *i != 0) {
            Some(i) => Some(i),
            None => self.links.ifindex(link).await.ok().flatten(),
        };
        if let Some(ifindex) = ifindex
            && self.fence.remove_sandbox(ifindex).is_ok()
        {
            removed.push("fence map entries".to_owned());
        }
        match self.fence.detach(link) {
            Ok(()) => removed.push(format!("fence on {link}")),
            Err(dataplane::DataplaneError::NotAttached { .. }) => {}
            Err(e) => warn!(sandbox = %name, error = %e, "detaching the fence"),
        }
        // A frozen guest's processes take no signal until thawed (cgroup v1's freezer): a
        // paused sandbox is resumed first, behind its closed fence, so its init can be killed.
        if let Some(l) = live.as_ref().filter(|l| l.paused) {
            match self.backends.get(backend).resume(&l.guest).await {
                Ok(()) => removed.push("pause (thawed to be stopped)".to_owned()),
                Err(e) => warn!(sandbox = %name, error = %e, "thawing the paused guest"),
            }
        }
        // A sandbox taken from a warm pool: its guest has the runtime name it was made under.
        let runtime = live
            .as_ref()
            .map(|l| l.guest.name.clone())
            .or_else(|| self.stored_runtime_id(name))
            .unwrap_or_else(|| name.to_owned());
        match self
            .backends
            .get(backend)
            .stop(&runtime, &self.sandbox_dir(name))
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
        if runtime != name {
            // A pooled guest's directory's first name, left as a link for its runtime.
            let first = self.sandbox_dir(&runtime);
            if first.symlink_metadata().is_ok_and(|m| m.is_symlink()) {
                let _ = std::fs::remove_file(&first);
            }
        }
        if let Some(ending) = ending {
            removed.extend(drained(name, ending, told).await);
        }
        removed.push("state row".to_owned());
        removed
    }

    /// The runtime name its stored envelope gives sandbox `name`'s guest, if another.
    fn stored_runtime_id(&self, name: &str) -> Option<String> {
        let row = self
            .store()
            .list()
            .ok()?
            .into_iter()
            .find(|r| r.name == name)?;
        serde_json::from_str::<super::sandbox::Envelope>(&row.envelope)
            .ok()?
            .runtime_id
    }
}

/// Wait for what sandbox `name` held when it was told to end (at `told`) to be let go, within
/// [`DRAIN_BOUND`] of then; what was cut, for the list of what was removed.
async fn drained(
    name: &str,
    ending: crate::limits::Ending,
    told: std::time::Instant,
) -> Vec<String> {
    let cut: Vec<String> = ending.cut.iter().map(|(k, n)| format!("{n} {k}")).collect();
    let within = DRAIN_BOUND.saturating_sub(told.elapsed());
    match ending.drained(within).await {
        Ok(()) if cut.is_empty() => Vec::new(),
        Ok(()) => {
            info!(sandbox = %name, cut = %cut.join(", "), "the sandbox's open connections were cut");
            vec![format!("open connections ({})", cut.join(", "))]
        }
        Err(left) => {
            let left: Vec<String> = left.iter().map(|(k, n)| format!("{n} {k}")).collect();
            warn!(sandbox = %name, cut = %cut.join(", "), left = %left.join(", "),
                "the sandbox's open connections were told to end; some were still open {} s later",
                DRAIN_BOUND.as_secs());
            vec![format!("open connections ({})", cut.join(", "))]
        }
    }
}

/// A name a destroy is taking down, given back when that destroy ends (whatever its outcome).
struct OneDestroy {
    names: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    name: String,
}

impl OneDestroy {
    /// Take `name`, or refuse while another destroy has it.
    fn take(
        names: &std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
        name: &str,
    ) -> Result<Self, Failure> {
        let mut taken = names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !taken.insert(name.to_owned()) {
            return Err(Failure::busy(name, "destroying"));
        }
        Ok(Self {
            names: names.clone(),
            name: name.to_owned(),
        })
    }
}

impl Drop for OneDestroy {
    fn drop(&mut self) {
        self.names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.name);
    }
}
