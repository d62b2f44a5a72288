//! Where the proxy connects for a guest's request: the address and port the guest itself
//! dialled (its original destination, `SO_ORIGINAL_DST`), which the fence let through only
//! because the DNS guard answered it for an allowed name, and which the SNI / Host binding
//! check tied to the name — never a fresh resolution of the name, which a hostile or rebinding
//! DNS could point at the host's loopback, a metadata service, another sandbox or svcd itself.
//! The address passes `policy::destination::classify_dial` first; TLS still runs with the
//! name (SNI and certificate verification), only the TCP connection uses the address.
//!
//! Connections are pooled per (address, name): a connection opened for one dialled address is
//! never lent to a request whose guest dialled another.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use tokio::net::TcpStream;

use super::{body::ProxyBody, pools::Pools, resolve::Upstream};
use crate::policy::destination::{HostNetwork, classify_dial};

/// Why the proxy will not dial for a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialRefused {
    #[error(
        "the connection has no original destination (it was not redirected by the fence): \
         there is no address the guest dialled to connect to"
    )]
    NoDestination,
    #[error(
        "the address dialled ({addr}) is in the {class} class, which svc never dials for a guest"
    )]
    Class {
        addr: SocketAddr,
        class: &'static str,
    },
}

impl DialRefused {
    /// The rule a refusal names (the audit's `rule`, the JSON body's `rule`).
    pub fn rule(&self) -> String {
        match self {
            Self::NoDestination => "destination".to_owned(),
            Self::Class { class, .. } => format!("destination-class:{class}"),
        }
    }

    /// The HTTP status of the refusal.
    pub const fn status(&self) -> u16 {
        match self {
            Self::NoDestination => 502,
            Self::Class { .. } => 403,
        }
    }
}

/// The address to dial for a guest's request: the one it dialled, if its class allows it.
pub fn checked(dialled: Option<SocketAddr>, net: &HostNetwork) -> Result<SocketAddr, DialRefused> {
    let addr = dialled.ok_or(DialRefused::NoDestination)?;
    let verdict = classify_dial(addr, net);
    if verdict.reachable() {
        Ok(addr)
    } else {
        Err(DialRefused::Class {
            addr,
            class: verdict.class.name(),
        })
    }
}

/// The address a redirected connection was sent to (`SO_ORIGINAL_DST`), if it was redirected;
/// an IPv4-mapped address comes back as the IPv4 address.
pub fn so_original_dst(conn: &TcpStream) -> Option<SocketAddr> {
    use nix::sys::socket::{getsockopt, sockopt};
    let addr = if let Ok(v4) = getsockopt(conn, sockopt::OriginalDst) {
        SocketAddr::new(
            std::net::Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr)).into(),
            u16::from_be(v4.sin_port),
        )
    } else {
        let v6 = getsockopt(conn, sockopt::Ip6tOriginalDst).ok()?;
        SocketAddr::new(
            std::net::Ipv6Addr::from(v6.sin6_addr.s6_addr).into(),
            u16::from_be(v6.sin6_port),
        )
    };
    Some(SocketAddr::new(addr.ip().to_canonical(), addr.port()))
}

/// The proxy's TLS connectors, made per dialled address: `h1` offers no ALPN (HTTP/1.1 only),
/// `h2` offers h2 and http/1.1.
#[derive(Clone)]
pub struct Connectors {
    base: Upstream,
    h1: Arc<rustls::ClientConfig>,
    h2: Arc<rustls::ClientConfig>,
}

pub type HttpsUpstream = hyper_rustls::HttpsConnector<Upstream>;

impl Connectors {
    pub fn new(tls: &rustls::ClientConfig, base: Upstream) -> Self {
        let mut h1 = tls.clone();
        h1.alpn_protocols.clear();
        let mut h2 = tls.clone();
        h2.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Self {
            base,
            h1: Arc::new(h1),
            h2: Arc::new(h2),
        }
    }

    /// A connector whose direct connections all go to `target` (TLS verified against the URI's
    /// host, which is the checked name).
    pub fn to(&self, target: SocketAddr, h2: bool) -> HttpsUpstream {
        let tls = if h2 { &self.h2 } else { &self.h1 };
        hyper_rustls::HttpsConnector::from((self.base.to_address(target), tls.clone()))
    }
}

pub type UpstreamClient = Client<HttpsUpstream, ProxyBody>;

/// Addresses whose HTTP/2 pools are kept before idle ones are dropped.
const MAX_ADDRESSES: usize = 1024;

/// HTTP/2 upstream pools, one set per dialled address.
#[derive(Clone)]
pub struct H2ByAddress {
    connectors: Connectors,
    pools: Arc<Mutex<HashMap<SocketAddr, Pools<UpstreamClient>>>>,
}

impl H2ByAddress {
    pub fn new(connectors: Connectors) -> Self {
        Self {
            connectors,
            pools: Arc::default(),
        }
    }

    /// The pools for requests dialled to `target` (made on first use; past
    /// [`MAX_ADDRESSES`], addresses with nothing in flight are forgotten first).
    pub fn at(&self, target: SocketAddr) -> Pools<UpstreamClient> {
        let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = pools.get(&target) {
            return p.clone();
        }
        if pools.len() >= MAX_ADDRESSES {
            pools.retain(|_, p| !p.idle());
        }
        let connectors = self.connectors.clone();
        let made = Pools::new(|| {
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(90))
                .build(connectors.to(target, true))
        });
        pools.insert(target, made.clone());
        made
    }
}

/// A client for one WebSocket handshake to `target` (its connection leaves with the upgrade:
/// nothing is pooled).
pub fn upgrade_client(connectors: &Connectors, target: SocketAddr) -> UpstreamClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(0)
        .build(connectors.to(target, false))
}

#[cfg(test)]
pub(super) mod tests {
    use std::{future::Future, pin::Pin};

    use hyper_util::client::legacy::connect::HttpConnector;
    use tower_service::Service as _;

    use super::*;
    use crate::proxy::resolve::{DnsService, Resolve};

    /// A resolver that fails the test if anything asks it (the pools' tests use it too).
    pub(in crate::proxy) struct Nowhere;
    impl Resolve for Nowhere {
        fn resolve(
            &self,
            host: &str,
        ) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<std::net::IpAddr>>> + Send>> {
            let host = host.to_owned();
            Box::pin(async move {
                panic!("{host} was resolved: a guest's request must dial its address")
            })
        }
    }

    /// Every upstream connection of a guest's request (HTTP/1.1, HTTP/2, a WebSocket's) comes
    /// from `Connectors::to`: it connects to the address it was made for, whatever the URI
    /// names, and never asks the resolver.
    #[tokio::test]
    async fn a_connector_dials_its_address_and_never_resolves_the_name() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let at = listener.local_addr().expect("addr");
        let mut http = HttpConnector::new_with_resolver(DnsService::new(Arc::new(Nowhere)));
        http.enforce_http(false);
        let tls = rustls::ClientConfig::builder_with_provider(crate::proxy::crypto_provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let connectors = Connectors::new(&tls, Upstream::new(http, None));
        for h2 in [false, true] {
            let uri: http::Uri = "http://elsewhere.example.test:1/".parse().expect("uri");
            let (connected, accepted) =
                tokio::join!(connectors.to(at, h2).call(uri), listener.accept());
            assert!(connected.is_ok(), "h2={h2}: {:?}", connected.err());
            assert!(
                accepted.is_ok(),
                "h2={h2}: the listener at {at} accepted nothing"
            );
        }
    }

    #[test]
    fn only_a_dialled_address_of_a_reachable_class_is_dialled() {
        let net = HostNetwork {
            host_addresses: vec!["198.51.100.7".parse().unwrap()],
            sandbox_pools: vec!["10.203.0.0/16".parse().unwrap()],
            allow_cidrs: Vec::new(),
            svcd_ports: vec![15380],
        };
        let ok: SocketAddr = "192.0.2.21:443".parse().unwrap();
        assert_eq!(checked(Some(ok), &net), Ok(ok));
        assert_eq!(checked(None, &net), Err(DialRefused::NoDestination));
        let cases = [
            ("127.0.0.1:80", "destination-class:loopback"),
            ("169.254.169.254:80", "destination-class:cloud-metadata"),
            (
                "[::ffff:169.254.169.254]:80",
                "destination-class:cloud-metadata",
            ),
            ("198.51.100.7:443", "destination-class:host"),
            ("10.203.7.2:80", "destination-class:sandbox"),
            ("127.0.0.1:15380", "destination-class:svcd"),
        ];
        for (addr, rule) in cases {
            let e = checked(Some(addr.parse().unwrap()), &net).expect_err(addr);
            assert_eq!(e.rule(), rule, "{addr}");
            assert_eq!(e.status(), 403);
            assert!(e.to_string().contains("never dials"), "{e}");
        }
    }
}
