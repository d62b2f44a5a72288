//! Whom the proxy serves: a sandbox as the proxy sees it, the directory that finds one by its
//! source address (with the DNS guard's view of what it dialled, and live revocations), and a
//! revocation.

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use tokio::net::TcpStream;

use super::ca::SandboxCa;
use crate::{audit::Incarnation, policy::request::SandboxPolicy};

/// One sandbox as the proxy sees it.
#[derive(Debug)]
pub struct ProxySandbox {
    pub id: u32,
    pub policy: SandboxPolicy,
    pub ca: Arc<SandboxCa>,
    /// Which creation of the sandbox this is: its connections' audit records carry it, and a
    /// connection never takes the policy of a later sandbox given the same id and address.
    pub incarnation: Incarnation,
}

impl ProxySandbox {
    /// Whose its slots are (`[limits]`): this creation of the sandbox.
    pub fn guest(&self) -> crate::limits::Guest {
        crate::limits::Guest::new(self.id, self.incarnation.key.clone())
    }
}

/// Who is connecting, by source address.
pub trait Sandboxes: Send + Sync {
    fn sandbox_for(&self, source: IpAddr) -> Option<Arc<ProxySandbox>>;

    /// Whether the address the guest dialled (before the fence redirected it to the proxy) is
    /// one the DNS guard answered `name` with for this sandbox — or `name` is that address
    /// itself. The default knows no bindings and accepts (for a proxy without a DNS guard).
    fn dialled_matches(&self, _sandbox: u32, _dialled: IpAddr, _name: &str) -> bool {
        true
    }

    /// Addresses a sandbox may no longer reach (its allowlist changed): the proxy cuts its
    /// connections to them. The default never says any.
    fn revocations(&self) -> tokio::sync::broadcast::Receiver<Revocation> {
        tokio::sync::broadcast::channel(1).1
    }

    /// Sandbox `id`'s policy as it is now (after live changes), if it still has one.
    fn policy_of(&self, _id: u32) -> Option<Arc<ProxySandbox>> {
        None
    }

    /// Where the guest's connection was going before the fence redirected it to the proxy
    /// (`SO_ORIGINAL_DST`): the address the proxy binds the name to and dials upstream.
    fn original_destination(&self, conn: &TcpStream) -> Option<SocketAddr> {
        super::dial::so_original_dst(conn)
    }
}

/// A sandbox's addresses that left its allowlist.
#[derive(Debug, Clone)]
pub struct Revocation {
    pub sandbox: u32,
    pub addrs: Arc<Vec<IpAddr>>,
}
