//! A sandbox's request policy as svcd builds it at creation: the allowlist, the agent hosts,
//! the bound repository, the code-host family, `.svc/config.yaml`'s egress and the
//! placeholders (what `request::decide` reads).

use super::credentials::{self, PlaceholderTable};
use crate::config::{
    egress::{EgressConfig, RepoName},
    host::CodeHostFamily,
};
use crate::hosts::{Allowlist, HostPattern};

/// Everything the decision needs to know about one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxPolicy {
    /// The envelope's AllowedHosts (Curated: non-empty).
    pub allowed: Allowlist,
    pub agent_hosts: Allowlist,
    pub bound_repo: Option<RepoName>,
    pub code: CodeHostFamily,
    pub egress: EgressConfig,
    pub placeholders: PlaceholderTable,
    /// AllowedBranches for smart-HTTP pushes too (`policy::http_push`), when the sandbox
    /// asked for it; `None`: a push to the bound repository may update any ref.
    pub https_push_branches: Option<Vec<String>>,
}

impl SandboxPolicy {
    /// The policy of a Curated sandbox, as svcd builds it at creation: the allowlist (see
    /// [`Self::allowed_hosts`]) and a fresh placeholder table. Every allowed host that is not an
    /// agent host and not in the code-host family gets its own placeholder; with a bound repo,
    /// the code host, its API and its uploads host share `CODE_HOST_TOKEN`; the first agent
    /// host gets `AGENT_AUTH_TOKEN`.
    pub fn for_sandbox(
        host: &crate::config::host::HostConfig,
        extra_hosts: &[HostPattern],
        bound_repo: Option<RepoName>,
        egress: EgressConfig,
    ) -> Result<Self, credentials::PlaceholderError> {
        let agent = Allowlist(host.agent_hosts.clone());
        let code = host.code.clone();
        let allowed =
            Self::allowed_hosts(&agent, extra_hosts, &code, bound_repo.is_some(), &egress);
        let family = [
            code.code_host.clone(),
            code.api_host.clone(),
            code.uploads_host.clone(),
        ];
        let own: Vec<HostPattern> = allowed
            .0
            .iter()
            .filter(|h| !agent.0.contains(h) && !family.contains(h))
            .cloned()
            .collect();
        let code_hosts: &[HostPattern] = if bound_repo.is_some() { &family } else { &[] };
        let placeholders = PlaceholderTable::mint(&own, code_hosts, agent.0.first())?;
        Ok(Self {
            allowed,
            agent_hosts: agent,
            bound_repo,
            code,
            egress,
            placeholders,
            https_push_branches: None,
        })
    }

    /// The allowlist of a Curated sandbox: the agent hosts, the extra hosts, the code-host
    /// family when a repo is bound, and every host `.svc/config.yaml` names.
    pub fn allowed_hosts(
        agent: &Allowlist,
        extra: &[HostPattern],
        code: &CodeHostFamily,
        bound: bool,
        egress: &EgressConfig,
    ) -> Allowlist {
        let mut all: Vec<HostPattern> = agent.0.clone();
        all.extend(extra.iter().cloned());
        if bound {
            all.extend([
                code.code_host.clone(),
                code.api_host.clone(),
                code.uploads_host.clone(),
                code.archive_host.clone(),
            ]);
        }
        all.extend(egress.allow.iter().cloned());
        all.extend(egress.policy.values().map(|p| p.host.clone()));
        all.extend(egress.secrets.iter().flat_map(|s| s.hosts.iter().cloned()));
        let mut seen = std::collections::HashSet::new();
        all.retain(|h| seen.insert(h.to_string()));
        Allowlist(all)
    }
}
