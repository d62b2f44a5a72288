//! Where requests go upstream, by the guest's protocol: the proxy's pools and connectors.

use std::{sync::Arc, time::Duration};

use hyper_util::client::legacy::connect::HttpConnector;

use super::{
    config::ProxyConfig,
    dial::{Connectors, H2ByAddress},
    h1_pool::H1Pool,
    resolve::{DnsService, Resolve, Upstream},
};

/// Where a request goes upstream, by the guest's protocol (as nginx does for HTTP/1.1), always
/// to the address the guest dialled (`dial`), pooled per address and name:
/// - an HTTP/1.1 guest's request over an HTTP/1.1 connection (`h1`): one per guest request in
///   flight, so no more than the guest's own connections, kept alive and reused. An HTTP/1.1
///   request carried onto a shared HTTP/2 connection cost the upstream and the proxy more per
///   request (HPACK, stream state, the connection task between them) and bought nothing: an
///   HTTP/1.1 guest connection has one request in flight at a time anyway;
/// - an HTTP/2 guest's streams over HTTP/2 where the upstream offers it (`h2`: several pools
///   per address, spread by load, see `pools`), HTTP/1.1 where it does not;
/// - a WebSocket handshake over a fresh HTTP/1.1 connection (`dial::upgrade_client`: an upgrade
///   does not exist in HTTP/2, and the connection leaves with the upgrade).
#[derive(Clone)]
pub(super) struct Upstreams {
    pub(super) h1: H1Pool,
    pub(super) h2: H2ByAddress,
    pub(super) connectors: Connectors,
}

impl Upstreams {
    pub(super) fn new(config: &ProxyConfig, resolver: Arc<dyn Resolve>) -> Self {
        // The resolver only finds the operator's forward proxy: a guest's request is dialled
        // at its own address.
        let mut http = HttpConnector::new_with_resolver(DnsService::new(resolver));
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(10)));
        let http = Upstream::new(http, config.forward_proxy.clone());
        // The scheme of each upstream URI is the guest's (https for TLS, http for plain), built
        // by the proxy, never taken from the guest's request target.
        let connectors = Connectors::new(&config.upstream_tls, http);
        Self {
            h1: H1Pool::new(connectors.clone()),
            h2: H2ByAddress::new(connectors.clone()),
            connectors,
        }
    }
}
