//! What the guard knows about a sandbox ([`SandboxDns`]) and what it asks of svcd: who is
//! asking ([`Directory`]) and the fence's side ([`Commit`]).

use std::{net::IpAddr, sync::Arc, time::Duration};

use crate::{audit::Incarnation, hosts::Allowlist, policy::destination::HostNetwork};

/// What the guard knows about one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxDns {
    pub id: u32,
    /// Names it may resolve (its allowlist).
    pub allowed: Allowlist,
    /// AllowAll mode: every name resolves (the allowlist is not consulted).
    pub allow_all: bool,
    /// Which creation of the sandbox this is, for its questions' audit records.
    pub incarnation: Incarnation,
}

impl SandboxDns {
    /// A Curated sandbox: the names of `allowed`.
    pub fn curated(id: u32, allowed: Allowlist) -> Self {
        Self {
            id,
            allowed,
            allow_all: false,
            incarnation: Incarnation::default(),
        }
    }

    /// Whose its slots are (`[limits]`): this creation of the sandbox.
    pub fn guest(&self) -> crate::limits::Guest {
        crate::limits::Guest::new(self.id, self.incarnation.key.clone())
    }

    /// No sandbox (a question from an address that is none): id 0.
    pub fn unknown() -> Self {
        Self::curated(0, Allowlist(Vec::new()))
    }
}

/// Who is asking: a sandbox by its source address.
pub trait Directory: Send + Sync {
    fn sandbox_for(&self, source: IpAddr) -> Option<Arc<SandboxDns>>;
}

/// One address to open for a sandbox: which ports (from the host pattern) and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitEntry {
    /// The name asked (normalised: lowercase, no trailing dot); the address answers for it.
    pub name: String,
    pub addr: IpAddr,
    /// TCP ports the address opens (the pattern's port, or 443 and 80).
    pub tcp_ports: Vec<u16>,
    pub ttl: Duration,
}

/// The fence's side: make addresses reachable for a sandbox. The guard answers only after this
/// returns `Ok`; an error becomes SERVFAIL.
pub trait Commit: Send + Sync {
    fn commit(&self, sandbox: &SandboxDns, entries: &[CommitEntry]) -> Result<(), String>;
}

/// Context for classifying answer addresses.
#[derive(Debug, Clone, Default)]
pub struct Destinations {
    pub network: HostNetwork,
}
