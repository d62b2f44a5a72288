//! Start-up: re-adopt every sandbox a previous svcd left running, and tear down what a crash
//! left half-built or half-destroyed.

use std::{net::IpAddr, sync::Arc, time::SystemTime};

use futures::StreamExt;
use tracing::{info, warn};

use super::{
    Supervisor,
    sandbox::{Envelope, Live, guest_env, to_map},
    workspace::WorkspaceRun,
};
use crate::{
    api::SecretValue,
    config::egress::RepoName,
    daemon::failure::Failure,
    hosts::{Allowlist, HostPattern},
    policy::{
        credentials::{CredentialKind, Placeholder, PlaceholderEntry, PlaceholderTable},
        mode::EgressMode,
        request::SandboxPolicy,
    },
    proxy::ca::SandboxCa,
    runtime::GuestHandle,
    store::SandboxRow,
};

/// How many sandboxes are adopted at once at start.
const ADOPT_AT_ONCE: usize = 16;

impl Supervisor {
    /// At start: tear down what a crash left half-built or half-destroyed, re-adopt every
    /// running sandbox whose guest is still there ([`ADOPT_AT_ONCE`] at a time), and put every
    /// link in the nftables table.
    pub async fn reconcile(&self) -> Result<(), Failure> {
        let (running, interrupted): (Vec<_>, Vec<_>) = self
            .store()
            .list()?
            .into_iter()
            .partition(|row| row.state == "running");
        for row in interrupted {
            warn!(sandbox = %row.name, state = %row.state, "found a sandbox a crash interrupted; removing it");
            self.teardown(
                &row.name,
                row.id,
                &format!("svc{}", row.id),
                &super::row_backend(&row),
            )
            .await;
            let _ = self.store().delete(&row.name);
        }
        // Adopted side by side: each may wait on its guest (a hung VM's monitor answers
        // nothing for its whole limit), so svcd is ready within about one such wait, not one
        // per guest.
        futures::stream::iter(running)
            .for_each_concurrent(ADOPT_AT_ONCE, |row| async move {
                let outcome = self.adopt(&row).await;
                self.adopted(&row, outcome).await;
            })
            .await;
        // The whole table again, with every adopted link: tearing down an interrupted sandbox
        // above wrote it whole before any adoption was in (and marked it written).
        *self.nft_lock.lock().await = false;
        self.sync_nft(None).await
    }

    /// Say how adopting `row` went: its event, and, when it failed, its fence closed and the
    /// sandbox listed as dead.
    async fn adopted(&self, row: &SandboxRow, outcome: Result<(bool, Option<String>), Failure>) {
        match outcome {
            Ok((paused, unknown)) => {
                info!(sandbox = %row.name, paused, "re-adopted");
                let mut said = serde_json::json!({"paused": paused});
                if let Some(why) = unknown {
                    said["paused_unknown"] = why.into();
                }
                self.event("sandbox.adopted", Some(&row.name), said);
            }
            Err(f) => {
                // Whatever failed, its link drops everything until it is destroyed.
                self.close_fence(row.id).await;
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

    /// Remove the fence record of sandbox `id`'s link, if the link is there: it then drops
    /// everything.
    async fn close_fence(&self, id: u32) {
        if let Some(ifindex) = self.links.ifindex(&format!("svc{id}")).await.ok().flatten() {
            let _ = self.fence.remove_sandbox(ifindex);
        }
    }

    /// Re-adopt the running sandbox of `row`: its record again on its link, its registry
    /// entry, guardian and relay, and whether it is paused (an earlier svcd paused it: it
    /// stays so, and says so, until resumed), with why that could not be told (then it is
    /// taken as running); that. A guest or link that is gone leaves it listed as dead.
    async fn adopt(&self, row: &SandboxRow) -> Result<(bool, Option<String>), Failure> {
        let envelope: Envelope = serde_json::from_str(&row.envelope)
            .map_err(|e| Failure::internal(format!("stored envelope: {e}")))?;
        let guest = row
            .pid
            .zip(row.pid_start)
            .map(|(pid, start)| GuestHandle {
                // A pooled sandbox's guest keeps the runtime name it was made under.
                name: envelope
                    .runtime_id
                    .clone()
                    .unwrap_or_else(|| row.name.clone()),
                pid,
                start,
            })
            .ok_or_else(|| Failure::internal("no guest recorded"))?;
        let backend = self.backends.get(&super::row_backend(row));
        let alive = backend.alive(&guest);
        let ifindex = self
            .links
            .ifindex(&envelope.link)
            .await
            .ok()
            .flatten()
            .unwrap_or(0);
        let secrets = self.sandbox_secrets(&row.name)?;
        let mut live = self.restored(row, envelope, guest, ifindex, &secrets)?;
        if !alive || ifindex == 0 {
            // Keep it listed (state "dead") so the operator sees it and destroys it; its
            // fence record goes (`reconcile`), so the link (if any) drops everything.
            self.live().insert(row.name.clone(), live);
            return Err(Failure::internal(if alive {
                "its link is gone".to_owned()
            } else {
                "its processes are gone".to_owned()
            }));
        }
        let unknown = match backend.paused(&live.guest).await {
            Ok(paused) => {
                live.paused = paused;
                None
            }
            Err(e) => {
                warn!(sandbox = %row.name, error = %e, "cannot tell whether it is paused; taken as running");
                Some(e.to_string())
            }
        };
        let known: Vec<IpAddr> = self.fence.allow_entries(row.id);
        self.registry.bind_unknown(row.id, known);
        self.enforce(&mut live, to_map(&secrets))?;
        live.guardian = self.start_guardian(&live);
        if let Err(e) = self.serve_git_ssh(&live).await {
            warn!(sandbox = %row.name, error = %e, "git over SSH will not work in this sandbox until it is recreated");
        }
        let paused = live.paused;
        self.live().insert(row.name.clone(), live);
        Ok((paused, unknown))
    }

    /// The sandbox of `row` as it was (its CA, policy, secrets' sources, workspace run and
    /// guest environment), on link `ifindex`, not yet enforced.
    fn restored(
        &self,
        row: &SandboxRow,
        envelope: Envelope,
        guest: GuestHandle,
        ifindex: u32,
        secrets: &[SecretValue],
    ) -> Result<Live, Failure> {
        let (Some(cert), Some(key)) = (&row.ca_cert, &row.ca_key) else {
            return Err(Failure::internal("no CA recorded"));
        };
        let ca = Arc::new(
            SandboxCa::restore(&row.name, cert, key)
                .map_err(|e| Failure::internal(format!("CA: {e}")))?,
        );
        let policy = self.policy_from(&envelope)?;
        let created = humantime::parse_rfc3339_weak(&row.created_at).unwrap_or(SystemTime::now());
        let mut live = Live {
            name: row.name.clone(),
            id: row.id,
            owner: row.owner_uid,
            envelope,
            guest,
            ifindex,
            created_at: row.created_at.clone(),
            created,
            incarnation: crate::audit::Incarnation::new(&row.name, &row.incarnation),
            secrets: secrets
                .iter()
                .map(|s| (s.name.clone(), s.source.clone()))
                .collect(),
            ca,
            policy: Arc::new(policy),
            env: Vec::new(),
            mode: EgressMode::Curated,
            paused: false,
            guardian: None,
            workspace: None,
        };
        live.workspace = live.envelope.workspace.clone().map(|spec| {
            Arc::new(WorkspaceRun::new(
                spec,
                self.workspace_log(&row.name),
                "unknown",
            ))
        });
        live.env = guest_env(&live);
        Ok(live)
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
        let egress = envelope.project_egress()?;
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
            https_push_branches: envelope.https_push_branches(&egress),
            egress,
            placeholders: PlaceholderTable::new(entries),
        })
    }
}
