//! A creation served from a warm pool (docs/pool.md): whether the request fits, and the claim
//! — the pooled row renamed to the request's sandbox (its id, link, addresses, fence entry and
//! host id slice kept), its directory moved to the sandbox's, the guest files rewritten in
//! place with the sandbox's CA and host name, its shared directories (the project, the agent's
//! home) moved into the guest's mount namespace, the guest's host name set, then the same
//! `publish` and `announce` as a fresh creation (policy, placeholders, relay, registry,
//! nftables, state row).

use std::{path::Path, sync::Arc, time::SystemTime};

use tracing::warn;

use super::{
    Failure, Supervisor,
    create::Plan,
    pool::Pooled,
    sandbox::{self, Phases},
    sandbox::{Made, live_of},
};
use crate::{
    api::{CreateSandbox, EgressChoice, SandboxView},
    audit::rfc3339,
    proxy::ca::SandboxCa,
};

/// Why a planned creation cannot take a pooled sandbox of a backend described as `backend`;
/// `None` when it can.
pub(super) fn miss_reason(
    plan: &Plan,
    forked: bool,
    backend: crate::runtime::Description,
) -> Option<&'static str> {
    if forked {
        // A fork's clone starts from its source's memory.
        Some("fork")
    } else if !plan.envelope.live_mounts.is_empty()
        && (!backend.share_into_running || nested(&plan.envelope.live_mounts))
    {
        // The project share and the agent's home are made when its guest starts; one inside
        // another is made in the outer one's files by the runtime as the guest's root, which a
        // claim (the host's root) cannot do through the outer one's id mapping.
        Some("mounts")
    } else if !plan.envelope.rootfs.is_empty() {
        // A pooled guest runs on the base image; a handed root file system is mounted at make.
        Some("rootfs")
    } else if plan.envelope.egress == EgressChoice::AllowAll {
        // A pooled link is fenced curated.
        Some("allow-all")
    } else {
        None
    }
}

/// Whether one of `dirs` is shared at a guest path inside another's.
fn nested(dirs: &[crate::runtime::SharedDir]) -> bool {
    dirs.iter().enumerate().any(|(i, a)| {
        dirs.iter()
            .enumerate()
            .any(|(j, b)| i != j && a.guest.starts_with(&b.guest))
    })
}

impl Supervisor {
    /// A pooled sandbox for `plan` if its backend has a pool and it fits; a miss counted with
    /// its reason otherwise.
    pub(super) async fn pooled_for(&self, plan: &Plan, forked: bool) -> Option<Pooled> {
        let backend = plan.envelope.backend.as_str();
        if self.pool_target(backend) == 0 {
            return None;
        }
        let metrics = &self.config.metrics;
        let about = self.backends.get(backend).describe();
        if let Some(reason) = miss_reason(plan, forked, about) {
            metrics.pool_miss(backend, reason);
            return None;
        }
        let taken = self.pool.take(backend);
        metrics.pool_size(backend, self.pool.count(backend));
        match taken {
            Some(p) if self.backends.get(backend).alive(&p.started.guest) => Some(p),
            Some(p) => {
                warn!(pooled = %p.name, "a pooled sandbox's guest is gone; removing it");
                metrics.pool_miss(backend, "gone");
                self.discard(p).await;
                None
            }
            None => {
                metrics.pool_miss(backend, "empty");
                None
            }
        }
    }

    /// Make `req`'s sandbox from `pooled` (see the module's comment); on failure everything
    /// of it goes, as a fresh creation's does.
    pub(super) async fn claim(
        &self,
        req: &CreateSandbox,
        plan: Plan,
        pooled: Pooled,
        owner: u32,
    ) -> Result<SandboxView, Failure> {
        let name = req.name.to_string();
        let created = SystemTime::now();
        // A new incarnation: nothing the pooled sandbox was is the claimer's audit identity.
        let when = (
            created,
            rfc3339(created),
            crate::audit::Incarnation::fresh_key(),
        );
        let mut envelope = plan.envelope;
        let (gateway, guest) = self.addresses(pooled.id);
        envelope.link = format!("svc{}", pooled.id);
        envelope.guest_v4 = guest;
        envelope.gateway_v4 = gateway;
        envelope.runtime_id = Some(pooled.name.clone());
        let json =
            serde_json::to_string(&envelope).map_err(|e| Failure::internal(e.to_string()))?;
        if let Err(e) =
            self.store()
                .claim_reserved(&pooled.name, &name, &json, &when.1, &when.2, owner)
        {
            // Its name is taken (or the store failed): the pooled sandbox stays pooled.
            self.pool.put(pooled);
            return Err(e.into());
        }
        let (id, backend) = (pooled.id, pooled.backend);
        let made = Made {
            envelope,
            started: pooled.started.clone(),
            ca: Arc::new(
                SandboxCa::generate(&name).map_err(|e| Failure::internal(format!("CA: {e}")))?,
            ),
            policy: plan.policy,
            mode: crate::policy::mode::EgressMode::Curated,
            when,
        };
        match self.bind(req, &pooled, made, owner).await {
            Ok(view) => {
                self.config.metrics.pool_hit(backend);
                Ok(view)
            }
            Err(f) => {
                warn!(sandbox = %name, error = %f.message, "taking a pooled sandbox failed; removing it");
                self.rollback(&name, id, backend).await;
                Err(f)
            }
        }
    }

    /// Give the pooled guest to `req`'s sandbox (`made`) and publish it.
    async fn bind(
        &self,
        req: &CreateSandbox,
        pooled: &Pooled,
        made: Made,
        owner: u32,
    ) -> Result<SandboxView, Failure> {
        let name = req.name.to_string();
        let mut phases = Phases::start();
        let dir = self.sandbox_dir(&name);
        sandbox::clear_leftover(&dir, &name).await?;
        let from = self.sandbox_dir(&pooled.name);
        // The runtime keeps the bundle's path it was made with (it works there at each exec):
        // the old name stays, a link to the new one, until the sandbox goes.
        std::fs::rename(&from, &dir)
            .and_then(|()| std::os::unix::fs::symlink(&name, &from))
            .map_err(|e| {
                Failure::internal(format!(
                    "moving {} to {}: {e}",
                    from.display(),
                    dir.display()
                ))
            })?;
        let files = rewrite_guest_files(&dir, &name, made.envelope.gateway_v4, &made.ca.ca_pem())
            .map_err(|e| Failure::internal(format!("{}: {e}", dir.display())))?;
        phases.mark("files");
        let backend = self.backends.get(pooled.backend);
        let guest = &pooled.started.guest;
        // The project and the agent's home, in the order a guest being made gets them.
        let dirs = &made.envelope.live_mounts;
        if !dirs.is_empty() {
            backend
                .share_into(guest, pooled.id, &dir, dirs)
                .await
                .map_err(|e| Failure::internal(e.to_string()))?;
            phases.mark("shares");
        }
        let claim = crate::runtime::Claim {
            hostname: name.clone(),
            net: crate::runtime::GuestNet {
                address: made.envelope.guest_v4,
                prefix: sandbox::GUEST_PREFIX,
                gateway: made.envelope.gateway_v4,
            },
            files,
        };
        backend
            .claim_guest(guest, &claim)
            .await
            .map_err(|e| Failure::internal(e.to_string()))?;
        phases.mark("guest");
        let mut live = live_of(req, (pooled.id, owner), made);
        self.publish(&mut live, &req.secrets, &mut phases).await?;
        Ok(self.announce(&live, &phases))
    }
}

/// The guest files of sandbox `name` written over the pooled ones in `dir`, each in place
/// (a container guest's binds hold the files themselves, not their names). Returns them as
/// (host copy, path in the guest).
fn rewrite_guest_files(
    dir: &Path,
    name: &str,
    gateway: std::net::Ipv4Addr,
    ca_pem: &str,
) -> std::io::Result<Vec<(std::path::PathBuf, std::path::PathBuf)>> {
    let files = sandbox::guest_files_of(name, gateway, ca_pem)?;
    let mut written = Vec::with_capacity(files.len());
    for (rel, guest, contents) in files {
        let host = dir.join(rel);
        // Truncated and written through the same inode the guest's bind holds.
        std::fs::write(&host, contents)?;
        written.push((host, guest));
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        config::host::HostConfig,
        policy::request::SandboxPolicy,
        runtime::{
            SharedDir,
            registry::{CONTAINER_ABOUT, MICROVM_ABOUT},
        },
    };

    fn plan(shared: usize) -> Plan {
        let mut envelope = super::super::pool::blank_envelope("container");
        envelope.live_mounts = (0..shared)
            .map(|i| SharedDir::plain(format!("/h{i}").into(), format!("/g{i}").into()))
            .collect();
        Plan {
            envelope,
            policy: SandboxPolicy::for_sandbox(
                &HostConfig::default(),
                &[],
                None,
                Default::default(),
            )
            .expect("a policy"),
        }
    }

    /// Shared directories keep a request out of the pool only on a backend that cannot share
    /// a directory into a running guest; the other reasons stay whatever the backend.
    #[test]
    fn shared_directories_miss_only_where_the_backend_cannot_share_into_a_running_guest() {
        assert_eq!(miss_reason(&plan(0), false, CONTAINER_ABOUT), None);
        assert_eq!(miss_reason(&plan(2), false, CONTAINER_ABOUT), None);
        assert_eq!(miss_reason(&plan(0), false, MICROVM_ABOUT), None);
        assert_eq!(miss_reason(&plan(1), false, MICROVM_ABOUT), Some("mounts"));
        assert_eq!(miss_reason(&plan(2), true, CONTAINER_ABOUT), Some("fork"));
        let mut inside = plan(2);
        inside.envelope.live_mounts[1].guest = "/g0/in".into();
        assert_eq!(miss_reason(&inside, false, CONTAINER_ABOUT), Some("mounts"));
        let mut rooted = plan(1);
        rooted.envelope.rootfs = vec!["/r".into()];
        assert_eq!(miss_reason(&rooted, false, CONTAINER_ABOUT), Some("rootfs"));
        let mut open = plan(1);
        open.envelope.egress = EgressChoice::AllowAll;
        assert_eq!(
            miss_reason(&open, false, CONTAINER_ABOUT),
            Some("allow-all")
        );
    }
}
