//! Live allowlist changes (`svc sandbox allow`): a running Curated sandbox's `--allow-host`
//! hosts change without a restart. One change is one new policy generation, switched for the
//! DNS guard and the proxy together (one registry update: the guard answers from it from the
//! next question, the proxy decides every request with it from the next request), then the
//! fence moves to a new generation without the addresses the removed names were answered
//! with (an address shared with a kept name stays, with only the kept names' ports), and the
//! proxy resets its connections to the addresses that left. Stored before it is applied, so
//! it survives an svcd restart.

use std::{net::IpAddr, sync::Arc};

use tracing::info;

use super::{
    Supervisor,
    sandbox::{Live, guest_env, stored_placeholders, to_map},
};
use crate::{
    api::{AllowChange, SandboxName, SandboxView},
    audit::{AuditEvent, PolicyEvent},
    config::egress::RepoName,
    daemon::failure::Failure,
    dataplane::{Carry, PortRule},
    policy::{creation, credentials::PlaceholderTable, mode::EgressMode, request::SandboxPolicy},
};

impl Supervisor {
    /// `POST /v1/sandboxes/{name}/allow`, by the API caller `by`. Changes are serialised: two
    /// callers end in two generations, each applied whole.
    pub async fn allow(
        &self,
        name: &str,
        change: AllowChange,
        by: &str,
    ) -> Result<SandboxView, Failure> {
        SandboxName::check(name).map_err(Failure::bad)?;
        let _one_at_a_time = self.policy_lock.lock().await;
        let mut l = self
            .live()
            .get(name)
            .cloned()
            .ok_or_else(|| Failure::not_found(name))?;
        if self.mode_now(&l).mode != EgressMode::Curated {
            return Err(Failure::bad(
                creation::CreationError::ChangeInAllowAll.to_string(),
            ));
        }
        let (policy, after) = self.changed_policy(&l, &change)?;
        let before: Vec<String> = l.envelope.extra_hosts.clone();
        let added: Vec<String> = after
            .iter()
            .filter(|h| !before.contains(h))
            .cloned()
            .collect();
        let removed: Vec<String> = before
            .iter()
            .filter(|h| !after.contains(h))
            .cloned()
            .collect();
        l.envelope.extra_hosts = after;
        l.envelope.placeholders = stored_placeholders(&policy);
        l.envelope.policy_generation = l.envelope.policy_generation.wrapping_add(1);
        l.policy = Arc::new(policy);
        l.env = guest_env(&l);
        // Stored first: what is in force is never newer than what a restart would restore.
        let json =
            serde_json::to_string(&l.envelope).map_err(|e| Failure::internal(e.to_string()))?;
        self.store().set_envelope(name, &json)?;
        // The guard and the proxy switch in one registry update.
        let secrets = self.sandbox_secrets(name).map(|s| to_map(&s))?;
        self.reregister(&l, secrets);
        let (fence_generation, cut) = self.cut_fence(&l)?;
        self.live().insert(name.to_owned(), l.clone());
        let generation = l.envelope.policy_generation;
        info!(sandbox = %name, generation, fence_generation, ?added, ?removed, cut, %by,
            "allowlist changed");
        self.report_change(&l, Change { added, removed, by });
        Ok(self.view(&l))
    }

    /// The sandbox's policy with `change` made, and its `--allow-host` hosts after it.
    fn changed_policy(
        &self,
        l: &Live,
        change: &AllowChange,
    ) -> Result<(SandboxPolicy, Vec<String>), Failure> {
        let host = &self.config.host;
        let agent = crate::hosts::Allowlist(host.agent_hosts.clone());
        let extra = creation::change_allowlist(
            &l.envelope.extra_hosts,
            &change.add,
            &change.remove,
            &agent,
            &host.code,
            l.envelope.repo.is_some(),
        )
        .map_err(|e| Failure::bad(e.to_string()))?;
        let repo = l
            .envelope
            .repo
            .as_deref()
            .and_then(|r| RepoName::parse(r).ok());
        let mut policy =
            SandboxPolicy::for_sandbox(host, &extra, repo, l.envelope.project_egress()?)
                .map_err(|e| Failure::bad(e.to_string()))?;
        policy.https_push_branches = l.envelope.https_push_branches(&policy.egress);
        // Kept hosts keep their placeholders (commands already running hold them); added hosts
        // get new ones; removed hosts' are gone, so the proxy no longer swaps them.
        let entries = policy
            .placeholders
            .entries()
            .iter()
            .map(|e| {
                l.policy
                    .placeholders
                    .entries()
                    .iter()
                    .find(|old| old.kind == e.kind && old.hosts == e.hosts)
                    .cloned()
                    .unwrap_or_else(|| e.clone())
            })
            .collect();
        policy.placeholders = PlaceholderTable::new(entries);
        Ok((policy, extra.iter().map(ToString::to_string).collect()))
    }

    /// Each address the guard answered keeps the ports of its names still allowed: one only
    /// removed names were answered with (or whose names died with a previous svcd) leaves
    /// the fence's next generation, its connections reset; one shared with a kept name
    /// loses the removed names' ports. The fence's new generation, and how many addresses
    /// were cut.
    fn cut_fence(&self, l: &Live) -> Result<(u32, usize), Failure> {
        let allowed = l.policy.allowed.clone();
        let open = self.registry.still_open(l.id, |n| {
            allowed.host_ports(&crate::hosts::HostKind::Exact(n.to_owned()))
        });
        let lost: Vec<IpAddr> = open
            .iter()
            .filter(|(_, ports)| ports.is_empty())
            .map(|(a, _)| *a)
            .collect();
        let fence_generation = if l.ifindex == 0 {
            0
        } else {
            self.fence
                .regenerate(l.ifindex, &|a| match open.get(&a) {
                    // Not answered by the guard since svcd started (bindings forgotten
                    // wholesale at their bound): as before, carried.
                    None => Carry::Keep,
                    Some(ports) if ports.is_empty() => Carry::Drop,
                    Some(ports) => Carry::Only(ports.iter().map(|p| PortRule::Tcp(*p)).collect()),
                })
                .map_err(|e| Failure::internal(format!("the fence's new generation: {e}")))?
        };
        let cut = lost.len();
        self.registry.revoke(l.id, lost);
        Ok((fence_generation, cut))
    }

    /// The change's audit record and event.
    fn report_change(&self, l: &Live, change: Change<'_>) {
        let (name, generation) = (&l.name, l.envelope.policy_generation);
        let event = AuditEvent::Policy(PolicyEvent {
            change: "allowlist",
            added: change.added.clone(),
            removed: change.removed.clone(),
            generation,
            by: change.by.to_owned(),
        });
        if let Err(e) = self.config.audit.emit_of(l.id, &l.incarnation, event) {
            tracing::warn!(sandbox = %name, error = %e, "writing the policy change's audit record");
        }
        self.event(
            "sandbox.policy_changed",
            Some(name),
            serde_json::json!({
                "generation": generation,
                "added": change.added,
                "removed": change.removed,
                "by": change.by,
            }),
        );
    }
}

/// One allowlist change, as reported.
struct Change<'a> {
    added: Vec<String>,
    removed: Vec<String>,
    by: &'a str,
}
