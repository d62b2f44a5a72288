//! Kept-alive HTTP/1.1 connections to upstreams, for HTTP/1.1 guests' requests.
//!
//! One request at a time per connection (HTTP/1.1 has no more), so a connection is lent to one
//! request and comes back when that request's response body has ended: the body returns it
//! (see [`PooledBody`]), where hyper-util's general pool spawned a task per request to wait for
//! the connection to come free, and built a pool key, locked and hashed twice per request. The
//! proxy runs a pool per thread (see `Proxy::serve_threads`), so the lock here is uncontended.
//!
//! A lent connection that fails before the request was written (the upstream closed it while it
//! sat idle) is retried once on a new connection, as hyper-util's pool does; nothing else is
//! retried. An idle connection is dropped after [`IDLE_TIMEOUT`], or when its upstream closes
//! it; at most [`MAX_IDLE_PER_ORIGIN`] wait per origin.
//!
//! An origin here is the URI's scheme and authority *and* the address dialled (see `dial`): a
//! connection opened to one address is never lent to a request for another.

use std::{
    collections::HashMap,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, Uri, header};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1;
use hyper_util::client::legacy::connect::Connection as _;
use tower_service::Service as _;

use super::{
    body::{BoxError, ProxyBody},
    dial::Connectors,
};

/// How long a connection may wait idle before it is closed (as hyper-util's pool was set).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// Idle connections kept per origin; one more is closed instead of kept.
pub const MAX_IDLE_PER_ORIGIN: usize = 64;

/// How often the whole pool is swept of closed and expired connections (each origin's own list
/// is swept whenever a request takes from it).
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// Why an upstream request failed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("the upstream URI {0} has no scheme or host")]
    NoOrigin(Uri),
    #[error("connecting to {origin}")]
    Connect {
        origin: String,
        #[source]
        source: BoxError,
    },
    #[error("HTTP/1.1 handshake with {origin}")]
    Handshake {
        origin: String,
        #[source]
        source: hyper::Error,
    },
    #[error("request to {origin}")]
    Send {
        origin: String,
        #[source]
        source: hyper::Error,
    },
}

/// An origin's idle connections.
type Idle = HashMap<Arc<str>, Vec<IdleConnection>>;

struct IdleConnection {
    sender: http1::SendRequest<ProxyBody>,
    absolute: bool,
    since: Instant,
}

impl IdleConnection {
    fn usable(&self, now: Instant) -> bool {
        !self.sender.is_closed() && now.duration_since(self.since) < IDLE_TIMEOUT
    }
}

struct Shared {
    idle: Idle,
    swept: Instant,
}

/// The pool: a connector for new connections and the idle ones by origin.
#[derive(Clone)]
pub struct H1Pool {
    connectors: Connectors,
    shared: Arc<Mutex<Shared>>,
}

/// A connection lent to one request, given back by its response body.
struct Lease {
    shared: Arc<Mutex<Shared>>,
    origin: Arc<str>,
    sender: http1::SendRequest<ProxyBody>,
    /// Requests on this connection go to a forward proxy, in absolute form.
    absolute: bool,
}

impl Lease {
    /// Back to the pool, unless its connection is closed or the origin has enough idle ones.
    fn give_back(self) {
        if self.sender.is_closed() {
            return;
        }
        let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        let list = shared.idle.entry(self.origin).or_default();
        if list.len() < MAX_IDLE_PER_ORIGIN {
            list.push(IdleConnection {
                sender: self.sender,
                absolute: self.absolute,
                since: Instant::now(),
            });
        }
    }
}

impl H1Pool {
    /// A pool over `connectors`' HTTP/1.1 connectors.
    pub fn new(connectors: Connectors) -> Self {
        Self {
            connectors,
            shared: Arc::new(Mutex::new(Shared {
                idle: HashMap::new(),
                swept: Instant::now(),
            })),
        }
    }

    /// Send `req`, whose URI is absolute (`scheme://host[:port]/path`), over an idle connection
    /// to its origin at `target` or a new one to `target`. The response's body gives the
    /// connection back when it ends.
    pub async fn request(
        &self,
        mut req: Request<ProxyBody>,
        target: std::net::SocketAddr,
    ) -> Result<Response<PooledBody>, PoolError> {
        let uri = req.uri().clone();
        let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
            return Err(PoolError::NoOrigin(uri));
        };
        let origin = format!("{scheme}://{} at {target}", authority.as_str());
        set_host(&mut req, &uri);
        let mut retried = false;
        loop {
            let (mut lease, reused) = match self.checkout(&origin) {
                Some(lease) => (lease, true),
                // Boxed: a connection's set-up (TLS state included) is kilobytes of future that
                // every request's future would otherwise carry and copy, for the few that connect.
                None => (Box::pin(self.connect(&origin, &uri, target)).await?, false),
            };
            *req.uri_mut() = if lease.absolute {
                uri.clone()
            } else {
                origin_form(&uri)
            };
            match lease.sender.try_send_request(req).await {
                Ok(response) => {
                    let (parts, body) = response.into_parts();
                    return Ok(Response::from_parts(
                        parts,
                        PooledBody {
                            inner: body,
                            lease: Some(lease),
                        },
                    ));
                }
                Err(mut e) => match e.take_message() {
                    // Not written: the idle connection was closed under us. Once, anew.
                    Some(back) if reused && !retried => {
                        retried = true;
                        req = back;
                    }
                    _ => {
                        return Err(PoolError::Send {
                            origin,
                            source: e.into_error(),
                        });
                    }
                },
            }
        }
    }

    /// An idle, ready connection to `origin`, if there is one; closed and expired ones on the
    /// way are dropped (and the whole pool swept now and then).
    fn checkout(&self, origin: &str) -> Option<Lease> {
        let now = Instant::now();
        let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        if now.duration_since(shared.swept) >= SWEEP_EVERY {
            shared.swept = now;
            shared.idle.retain(|_, list| {
                list.retain(|c| c.usable(now));
                !list.is_empty()
            });
        }
        let key = shared.idle.get_key_value(origin)?.0.clone();
        let list = shared.idle.get_mut(origin)?;
        list.retain(|c| c.usable(now));
        // The newest first: the one most likely still open at the upstream. A connection whose
        // last response was just read may not be ready yet; it stays for a later request.
        let i = list.iter().rposition(|c| c.sender.is_ready())?;
        let idle = list.swap_remove(i);
        Some(Lease {
            shared: self.shared.clone(),
            origin: key,
            sender: idle.sender,
            absolute: idle.absolute,
        })
    }

    /// A new connection to `origin` (TCP, or the operator's proxy; TLS verified), its driving
    /// task spawned on this thread's runtime.
    async fn connect(
        &self,
        origin: &str,
        uri: &Uri,
        target: std::net::SocketAddr,
    ) -> Result<Lease, PoolError> {
        let io = self
            .connectors
            .to(target, false)
            .call(uri.clone())
            .await
            .map_err(|source| PoolError::Connect {
                origin: origin.to_owned(),
                source,
            })?;
        // Plain HTTP through the operator's forward proxy: requests in absolute form.
        let absolute = io.connected().is_proxied();
        let (sender, connection) =
            http1::handshake(io)
                .await
                .map_err(|source| PoolError::Handshake {
                    origin: origin.to_owned(),
                    source,
                })?;
        // The connection ends when its upstream closes it or every handle to it is dropped; its
        // errors reach the request that meets them.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Lease {
            shared: self.shared.clone(),
            origin: Arc::from(origin),
            sender,
            absolute,
        })
    }
}

/// `Host` from the URI (the guest's own was removed), and the target in origin form.
fn set_host(req: &mut Request<ProxyBody>, uri: &Uri) {
    let host = uri.host().unwrap_or("");
    let value = match uri.port_u16() {
        Some(port) if Some(port) != default_port(uri) => format!("{host}:{port}"),
        _ => host.to_owned(),
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        req.headers_mut().insert(header::HOST, v);
    }
}

/// `/path?query` of an absolute URI (`/` when it has none).
fn origin_form(uri: &Uri) -> Uri {
    uri.path_and_query()
        .map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()))
}

fn default_port(uri: &Uri) -> Option<u16> {
    match uri.scheme_str() {
        Some("https") => Some(443),
        Some("http") => Some(80),
        _ => None,
    }
}

/// An upstream response body that gives its connection back to the pool once it has ended
/// (or, dropped, if it had already ended: a HEAD or 204 answer's empty body). A body dropped
/// before its end takes the connection with it: hyper closes an HTTP/1.1 connection whose
/// response was not read to the end.
pub struct PooledBody {
    inner: Incoming,
    lease: Option<Lease>,
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => {
                if let Some(lease) = self.lease.take() {
                    lease.give_back();
                }
            }
            Poll::Ready(Some(Err(_))) => self.lease = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        if self.inner.is_end_stream()
            && let Some(lease) = self.lease.take()
        {
            lease.give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use http_body_util::BodyExt as _;
    use hyper_util::{client::legacy::connect::HttpConnector, rt::TokioIo};

    use super::*;
    use crate::proxy::{
        dial::tests::Nowhere,
        resolve::{DnsService, Upstream},
    };

    fn pool() -> H1Pool {
        let mut http = HttpConnector::new_with_resolver(DnsService::new(Arc::new(Nowhere)));
        http.enforce_http(false);
        let tls = rustls::ClientConfig::builder_with_provider(crate::proxy::crypto_provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        H1Pool::new(Connectors::new(&tls, Upstream::new(http, None)))
    }

    fn at(port: u16) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], port))
    }

    /// A plain HTTP/1.1 upstream on loopback: answers `<conn> <target> host=<Host>` (`/big`: a
    /// megabyte), counting the connections it accepted.
    async fn upstream() -> (u16, Arc<AtomicU32>) {
        upstream_on("127.0.0.1:0").await
    }

    async fn upstream_on(addr: &str) -> (u16, Arc<AtomicU32>) {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let accepted = Arc::new(AtomicU32::new(0));
        let counter = accepted.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| async move {
                    let host = req
                        .headers()
                        .get(header::HOST)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_owned();
                    let body = if req.uri().path() == "/big" {
                        Bytes::from(vec![b'x'; 1 << 20])
                    } else {
                        Bytes::from(format!("{n} {} host={host}", req.uri()))
                    };
                    Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
                        body,
                    )))
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(conn), svc),
                );
            }
        });
        (port, accepted)
    }

    fn get(method: &str, port: u16, path: &str) -> Request<ProxyBody> {
        Request::builder()
            .method(method)
            .uri(format!("http://up.test:{port}{path}"))
            .body(
                http_body_util::Empty::new()
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
            .expect("request")
    }

    async fn text(pool: &H1Pool, method: &str, port: u16, path: &str) -> String {
        let response = pool
            .request(get(method, port, path), at(port))
            .await
            .expect("answered");
        let body = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        String::from_utf8_lossy(&body).into_owned()
    }

    #[tokio::test]
    async fn requests_one_after_another_share_one_connection_in_origin_form_with_host() {
        let (port, accepted) = upstream().await;
        let pool = pool();
        for i in 0..5 {
            let got = text(&pool, "GET", port, &format!("/n/{i}?q=1")).await;
            assert_eq!(got, format!("1 /n/{i}?q=1 host=up.test:{port}"));
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answer_without_a_body_gives_its_connection_back() {
        let (port, accepted) = upstream().await;
        let pool = pool();
        for _ in 0..3 {
            let response = pool
                .request(get("HEAD", port, "/"), at(port))
                .await
                .expect("answered");
            drop(response);
        }
        assert!(text(&pool, "GET", port, "/after").await.starts_with("1 "));
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_takes_its_connection_with_it() {
        let (port, accepted) = upstream().await;
        let pool = pool();
        let mut body = pool
            .request(get("GET", port, "/big"), at(port))
            .await
            .expect("answered")
            .into_body();
        let first = body.frame().await.expect("a frame").expect("data");
        assert!(first.data_ref().is_some_and(|d| !d.is_empty()));
        drop(body);
        // Reading the rest of that response is what a reuse would have cost: a new connection.
        assert!(
            text(&pool, "GET", port, "/next")
                .await
                .starts_with("2 /next")
        );
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn requests_at_once_each_get_a_connection_and_all_come_back() {
        let (port, accepted) = upstream().await;
        let pool = pool();
        let answers = futures::future::join_all((0..4).map(|i| {
            let pool = pool.clone();
            async move {
                let response = pool
                    .request(get("GET", port, &format!("/{i}")), at(port))
                    .await
                    .expect("answered");
                // Held until all four have their heads: four connections at once.
                tokio::time::sleep(Duration::from_millis(50)).await;
                response
                    .into_body()
                    .collect()
                    .await
                    .expect("body")
                    .to_bytes()
            }
        }))
        .await;
        assert_eq!(answers.len(), 4);
        assert_eq!(accepted.load(Ordering::SeqCst), 4);
        for i in 0..8 {
            text(&pool, "GET", port, &format!("/again/{i}")).await;
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            4,
            "the idle ones were reused"
        );
    }

    #[tokio::test]
    async fn a_closed_port_is_an_error_naming_the_origin() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let e = pool()
            .request(get("GET", port, "/"), at(port))
            .await
            .err()
            .expect("refused");
        assert!(
            e.to_string() == format!("connecting to http://up.test:{port} at 127.0.0.1:{port}"),
            "{e}"
        );
    }

    /// Two guests dialled two addresses for one name: each request goes to its own address, and
    /// the connection kept alive for one is never lent to the other.
    #[tokio::test]
    async fn a_connection_to_one_address_is_never_lent_for_another() {
        let (port, first) = upstream_on("127.0.0.1:0").await;
        let (_, second) = upstream_on(&format!("127.0.0.2:{port}")).await;
        let pool = pool();
        let other = std::net::SocketAddr::from(([127, 0, 0, 2], port));
        for _ in 0..3 {
            text(&pool, "GET", port, "/a").await;
            let body = pool
                .request(get("GET", port, "/b"), other)
                .await
                .expect("answered")
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            assert!(body.starts_with(b"1 /b"), "{body:?}");
        }
        assert_eq!(
            first.load(Ordering::SeqCst),
            1,
            "one kept-alive connection each"
        );
        assert_eq!(
            second.load(Ordering::SeqCst),
            1,
            "one kept-alive connection each"
        );
    }
}
