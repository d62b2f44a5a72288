//! The proxy's settings.

use std::{sync::Arc, time::Duration};

use crate::{limits::GuestLimits, policy::destination::HostNetwork};

/// Settings of the proxy.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// TLS toward upstreams: real roots (webpki-roots), plus whatever tests add.
    pub upstream_tls: rustls::ClientConfig,
    /// Bytes of a request body read before the decision (placeholders are looked for in them;
    /// GraphQL bodies must fit).
    pub body_prefix: usize,
    pub hello_timeout: Duration,
    /// Time allowed for a request head to arrive once its connection is waiting for one (HTTP/1.1:
    /// slowloris, and idle kept-alive connections); HTTP/2 connections are pinged at this
    /// interval and closed when a ping goes unanswered for as long.
    pub header_timeout: Duration,
    /// Time allowed for the upstream's response head.
    pub request_timeout: Duration,
    /// Largest HTTP/1.1 request head (bytes); larger heads get 431. HTTP/2 header lists are capped
    /// at the same size.
    pub max_head: usize,
    /// Per-sandbox caps (`[limits]`): guest connections one sandbox may hold open at once,
    /// upgraded WebSockets included until they close; the next one is closed unanswered (and
    /// audited).
    pub limits: Arc<GuestLimits>,
    /// The operator's forward proxy upstream connections go through (`[upstream] proxy`).
    pub forward_proxy: Option<Arc<super::upstream::ForwardProxy>>,
    /// The host's addresses, the sandbox pools, the operator's CIDRs and svcd's ports: every
    /// address the proxy dials for a guest passes `policy::destination::classify_dial` with it.
    pub network: HostNetwork,
}

impl ProxyConfig {
    /// Upstream TLS with the webpki roots and `extra_roots` (a test CA, an operator's private
    /// CA); verification is never turned off.
    pub fn with_roots(
        extra_roots: &[rustls::pki_types::CertificateDer<'static>],
    ) -> Result<Self, rustls::Error> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        for r in extra_roots {
            roots.add(r.clone())?;
        }
        // ALPN (h2, http/1.1) is set by the connector.
        let tls = rustls::ClientConfig::builder_with_provider(super::crypto_provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Self {
            upstream_tls: tls,
            body_prefix: 64 * 1024,
            hello_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(300),
            max_head: 64 * 1024,
            limits: Arc::default(),
            forward_proxy: None,
            network: HostNetwork::default(),
        })
    }
}
