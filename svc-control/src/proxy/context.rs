//! The state the stages take: the proxy's shared parts ([`Ctx`]), one guest connection's
//! ([`Conn`]) and one request's ([`Exchange`]).

use std::{net::IpAddr, sync::Arc, time::Instant};

use super::{
    config::ProxyConfig,
    resolve::Resolve,
    revoke::Cut,
    sandboxes::{ProxySandbox, Sandboxes},
    upstreams::Upstreams,
};
use crate::{audit::AuditSink, creds::Broker, limits::Slot};

/// What every connection of one proxy thread shares: configuration, the sandbox directory, the
/// credential broker, the audit sink and the thread's upstream pools.
#[derive(Clone)]
pub(super) struct Ctx {
    pub(super) config: ProxyConfig,
    pub(super) sandboxes: Arc<dyn Sandboxes>,
    pub(super) broker: Arc<dyn Broker>,
    pub(super) audit: Arc<dyn AuditSink>,
    /// Where requests go upstream, by the guest's protocol.
    pub(super) upstream: Upstreams,
    pub(super) resolver: Arc<dyn Resolve>,
}

impl Ctx {
    /// The sandbox at `source` as it is now (after live changes) if it is still `sandbox`
    /// (the same creation: a destroyed sandbox's id and address go to the next one made),
    /// else `sandbox` as the connection found it: each request is decided by the policy of now
    /// (a live allowlist change applies from the next request on a kept-alive connection).
    pub(super) fn current(&self, source: IpAddr, sandbox: &Arc<ProxySandbox>) -> Arc<ProxySandbox> {
        self.sandboxes
            .sandbox_for(source)
            .filter(|s| s.id == sandbox.id && s.incarnation == sandbox.incarnation)
            .unwrap_or_else(|| sandbox.clone())
    }
}

/// A guest connection's slot under `limits.proxy_connections`, carried in each of its
/// requests' extensions so that a WebSocket relay keeps holding it after the upgrade (the
/// connection's own task has ended by then).
#[derive(Clone)]
pub(super) struct HeldSlot(pub(super) Arc<Slot>);

/// One guest connection, found to be a sandbox's and given a slot.
pub(super) struct Conn {
    pub(super) ctx: Arc<Ctx>,
    pub(super) sandbox: Arc<ProxySandbox>,
    /// The guest's address (canonical).
    pub(super) source: IpAddr,
    /// What cuts it when a live change takes its address or its host away.
    pub(super) cut: Cut,
    pub(super) slot: HeldSlot,
}

/// One request being answered: what every refusal and record of it names.
pub(super) struct Exchange<'a> {
    pub(super) ctx: &'a Ctx,
    pub(super) sandbox: &'a ProxySandbox,
    pub(super) method: http::Method,
    pub(super) started: Instant,
}
