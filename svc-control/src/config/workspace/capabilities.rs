//! `capabilities`: what the workspace requires of svc, from a fixed registry.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `capabilities`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    #[serde(default)]
    pub required: Vec<Capability>,
}

/// The capability registry: every capability a workspace may require. An unknown name fails
/// workspace creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
pub enum Capability {
    /// Port forwarding from the sandbox to the host (Spotlight).
    #[serde(rename = "spotlight.tunnel")]
    SpotlightTunnel,
    /// Git over SSH relayed through the host's SSH agent.
    #[serde(rename = "git.ssh-relay")]
    GitSshRelay,
    /// Placeholder credentials swapped for real ones by the host proxy.
    #[serde(rename = "credentials.broker")]
    CredentialsBroker,
    /// Supervised services with restart policy and readiness.
    #[serde(rename = "services.supervisor")]
    ServicesSupervisor,
}

impl Capability {
    pub const ALL: [Self; 4] = [
        Self::SpotlightTunnel,
        Self::GitSshRelay,
        Self::CredentialsBroker,
        Self::ServicesSupervisor,
    ];
    pub const fn name(self) -> &'static str {
        match self {
            Self::SpotlightTunnel => "spotlight.tunnel",
            Self::GitSshRelay => "git.ssh-relay",
            Self::CredentialsBroker => "credentials.broker",
            Self::ServicesSupervisor => "services.supervisor",
        }
    }
}
