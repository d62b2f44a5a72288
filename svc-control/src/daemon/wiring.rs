//! Real implementations of the traits the modules declare.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::{
    dataplane::{AllowEntry, Fence, PortRule},
    dns::{Commit, CommitEntry, SandboxDns},
};

/// The DNS guard's commits, written into the fence's allow map for one link.
#[derive(Debug, Clone)]
pub struct FenceCommit {
    pub fence: Arc<Mutex<Fence>>,
    /// The host end of the sandbox's link.
    pub ifindex: u32,
    /// How long traffic keeps an entry alive past its TTL.
    pub idle: Duration,
}

impl Commit for FenceCommit {
    fn commit(&self, sandbox: &SandboxDns, entries: &[CommitEntry]) -> Result<(), String> {
        let mut fence = self
            .fence
            .lock()
            .map_err(|_| "the fence lock is poisoned".to_owned())?;
        for e in entries {
            let entry = AllowEntry {
                addr: e.addr,
                rules: e.tcp_ports.iter().map(|p| PortRule::Tcp(*p)).collect(),
                host_id: sandbox.id,
                ttl: Some(e.ttl),
                idle: self.idle,
            };
            fence
                .add_allow(self.ifindex, &entry)
                .map_err(|err| err.to_string())?;
        }
        Ok(())
    }
}
