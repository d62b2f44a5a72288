//! How the proxy and svcd's own HTTPS requests reach upstreams: name resolution (the host's
//! resolver in production) under hyper-util's connector, the operator's forward proxy, and
//! svcd's client for token endpoints.

use std::{
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::{
    client::legacy::{
        Client,
        connect::{HttpConnector, dns::Name},
    },
    rt::TokioExecutor,
};

use super::config::ProxyConfig;
use crate::hosts::normalize_name;

/// Name resolution for upstream connections (the host's resolver in production).
pub trait Resolve: Send + Sync {
    fn resolve(&self, host: &str) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;
}

/// The host's resolver.
#[derive(Debug, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(&self, host: &str) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>> {
        let host = host.to_owned();
        Box::pin(async move {
            Ok(tokio::net::lookup_host((host.as_str(), 0))
                .await?
                .map(|a| a.ip())
                .collect())
        })
    }
}

/// hyper-util's resolver interface over [`Resolve`].
#[derive(Clone)]
pub struct DnsService(Arc<dyn Resolve>);

impl DnsService {
    pub fn new(resolver: Arc<dyn Resolve>) -> Self {
        Self(resolver)
    }
}

/// The proxy's upstream connector: direct, or through the operator's forward proxy.
pub type Upstream = super::upstream::UpstreamConnector<DnsService>;

impl tower_service::Service<Name> for DnsService {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let resolver = self.0.clone();
        let host = normalize_name(name.as_str()).unwrap_or_else(|_| name.as_str().to_owned());
        Box::pin(async move {
            let addrs = resolver.resolve(&host).await?;
            Ok(addrs
                .into_iter()
                .map(|ip| SocketAddr::new(ip, 0))
                .collect::<Vec<_>>()
                .into_iter())
        })
    }
}

/// svcd's own HTTPS requests (token endpoints): the proxy's upstream roots, resolver and
/// forward proxy, HTTPS only.
pub type HostClient = Client<hyper_rustls::HttpsConnector<Upstream>, Full<Bytes>>;

/// A [`HostClient`] over `config`'s upstream TLS and forward proxy.
pub fn host_client(config: &ProxyConfig, resolver: Arc<dyn Resolve>) -> HostClient {
    let mut http = HttpConnector::new_with_resolver(DnsService(resolver));
    http.enforce_http(false);
    http.set_connect_timeout(Some(Duration::from_secs(10)));
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.upstream_tls.clone())
        .https_only()
        .enable_http1()
        .enable_http2()
        .wrap_connector(Upstream::new(http, config.forward_proxy.clone()));
    Client::builder(TokioExecutor::new()).build(https)
}

/// An error and its sources, `outer: inner: innermost`, for a reason an operator can act on.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
