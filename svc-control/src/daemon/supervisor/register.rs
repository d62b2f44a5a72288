//! A sandbox's entries where the data path reads them: its record on its link in the fence,
//! its registry entry (the DNS guard, the proxy and the broker), its link in the nftables
//! table. Creation, adoption, live changes and the AllowAll window's end all go through here.

use std::{collections::HashMap, net::IpAddr, sync::Arc};

use super::{
    Failure, Supervisor,
    sandbox::{Live, fence_link, link_record},
};
use crate::{
    daemon::wiring::Registered, dns::SandboxDns, hosts::Allowlist, policy::mode::EgressMode,
    proxy::ProxySandbox,
};

impl Supervisor {
    /// Put the sandbox's policy on its link (fence record, attach) and in the registry.
    pub(super) fn enforce(
        &self,
        live: &mut Live,
        secrets: HashMap<String, String>,
    ) -> Result<(), Failure> {
        let mode = self.mode_now(live).mode;
        live.mode = mode;
        let record = link_record(live.id, &live.envelope, live.ifindex, mode);
        fence_link(self.fence.as_ref(), &record, &live.envelope.link)?;
        self.register(live, secrets);
        Ok(())
    }

    /// Put the sandbox in the registry the DNS guard, the proxy and the broker read.
    pub(super) fn register(&self, live: &Live, secrets: HashMap<String, String>) {
        self.registry.remove(live.id);
        self.reregister(live, secrets);
    }

    /// Replace the sandbox's registry entry in one update (no moment without it).
    pub(super) fn reregister(&self, live: &Live, secrets: HashMap<String, String>) {
        let mode = live.mode;
        let allowed = if mode == EgressMode::Curated {
            live.policy.allowed.clone()
        } else {
            Allowlist(Vec::new())
        };
        self.registry.insert(Registered {
            id: live.id,
            name: live.name.clone(),
            incarnation: live.incarnation.clone(),
            created: live.created,
            pod: live.envelope.pod.clone(),
            ifindex: live.ifindex,
            guest: IpAddr::V4(live.envelope.guest_v4),
            dns: Arc::new(SandboxDns {
                id: live.id,
                allowed,
                allow_all: mode == EgressMode::AllowAll,
                incarnation: live.incarnation.clone(),
            }),
            proxy: (mode == EgressMode::Curated).then(|| {
                Arc::new(ProxySandbox {
                    id: live.id,
                    policy: (*live.policy).clone(),
                    ca: live.ca.clone(),
                    incarnation: live.incarnation.clone(),
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

    /// Put every live and pooled sandbox's link in the nftables table (one batch).
    /// The first time (at start) the whole table is written; after that `change` — a link
    /// added or removed — is one element of its link set, whatever the number of sandboxes
    /// (if that fails, the whole set is written again; the whole table if that fails too, e.g.
    /// it was removed by hand). Without a change, nothing is written once the table is.
    pub(super) async fn sync_nft(&self, change: Option<(&str, bool)>) -> Result<(), Failure> {
        let mut written = self.nft_lock.lock().await;
        let whole = !*written;
        if change.is_none() && !whole {
            return Ok(());
        }
        let mut links: Vec<String> = self
            .live()
            .values()
            .filter(|l| l.ifindex != 0)
            .map(|l| l.envelope.link.clone())
            .chain(self.pool.links())
            .collect();
        // The link being added may be in neither yet (a pooled sandbox being made, a claim
        // between the pool and the live map); the one being removed may be in one still.
        if let Some((link, add)) = change {
            links.retain(|l| l != link);
            if add {
                links.push(link.to_owned());
            }
        }
        let nft = self.nft.clone();
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
}
