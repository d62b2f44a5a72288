//! The proxy's connection and request path.
//!
//! Connection: read the ClientHello (bounded, 10 s), find the sandbox by source address, refuse
//! no SNI, ECH, and a server name the sandbox may not reach, terminate TLS with the sandbox
//! CA's leaf for exactly that name, serve HTTP/1.1 and HTTP/2 (ALPN).
//! Request: read at most `body_prefix` bytes of the body, ask `policy::request::decide`, answer
//! a refusal with a JSON body, else forward to `https://<checked name>` over a connection to
//! the address and port the guest dialled (never a fresh resolution of the name, see `dial`;
//! certificate verified against the name with real roots) with the credential swapped or
//! stripped, and stream both ways. One audit record per request, with the address dialled.

use std::{
    convert::Infallible,
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant, SystemTime},
};

use bytes::Bytes;
use futures::StreamExt as _;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::{
    client::legacy::connect::HttpConnector,
    rt::{TokioExecutor, TokioIo, TokioTimer},
};
use serde::Serialize;
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
};

use super::{ca::SandboxCa, client_hello};
use crate::{
    audit::{AuditRecord, AuditSink, HttpEvent, rfc3339},
    limits::{Channel, Slot},
    policy::{
        credentials::Scheme,
        host::Authority,
        request::{self, CredentialAction, HttpRequest, Outcome, SandboxPolicy},
    },
};

pub(super) use super::body::{BoxError, ProxyBody};
pub(crate) use super::resolve::error_chain;
pub use super::{
    config::ProxyConfig,
    resolve::{DnsService, HostClient, Resolve, SystemResolver, Upstream, host_client},
};

/// One sandbox as the proxy sees it.
#[derive(Debug)]
pub struct ProxySandbox {
    pub id: u32,
    pub policy: SandboxPolicy,
    pub ca: Arc<SandboxCa>,
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

/// Until sandbox `id`'s allowlist no longer allows `host` (checked at each change of it).
async fn host_revoked(
    rx: tokio::sync::broadcast::Receiver<Revocation>,
    sandboxes: Arc<dyn Sandboxes>,
    id: u32,
    host: String,
) {
    served_host_revoked(rx, sandboxes, id, move || Some(host.clone())).await;
}

/// Until sandbox `id`'s allowlist no longer allows the host a connection serves (`host()` at
/// each change; `None`: none yet). A connection to an address shared with a host still allowed
/// is not revoked by address: this ends it by name (its open HTTP/2 streams, a response still
/// streaming).
async fn served_host_revoked(
    mut rx: tokio::sync::broadcast::Receiver<Revocation>,
    sandboxes: Arc<dyn Sandboxes>,
    id: u32,
    host: impl Fn() -> Option<String>,
) {
    loop {
        match rx.recv().await {
            Ok(r) if r.sandbox == id => {
                let Some(host) = host() else { continue };
                let kind = crate::policy::host::HostKind::Exact(host);
                let allowed = sandboxes
                    .policy_of(id)
                    .is_some_and(|p| p.policy.allowed.find_name(&kind).is_some());
                if !allowed {
                    return;
                }
            }
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                return std::future::pending().await;
            }
        }
    }
}

/// A sandbox's addresses that left its allowlist.
#[derive(Debug, Clone)]
pub struct Revocation {
    pub sandbox: u32,
    pub addrs: Arc<Vec<IpAddr>>,
}

/// Until `sandbox` loses `dialled` (never, for a connection without a dialled address).
async fn revoked(
    mut rx: tokio::sync::broadcast::Receiver<Revocation>,
    sandbox: u32,
    dialled: Option<IpAddr>,
) {
    let Some(dialled) = dialled else {
        return std::future::pending().await;
    };
    loop {
        match rx.recv().await {
            Ok(r) if r.sandbox == sandbox && r.addrs.contains(&dialled) => return,
            Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
            Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                return std::future::pending().await;
            }
        }
    }
}

/// Serve a guest connection until it ends or its address is revoked; then reset it (RST, so
/// the guest's client sees the cut at once) through `cut`, a duplicate of its socket.
async fn serve_until_revoked(
    serve: impl Future<Output = ()>,
    revoked: impl Future<Output = ()>,
    cut: Option<std::os::fd::OwnedFd>,
) -> bool {
    let was_cut = tokio::select! {
        () = serve => false,
        () = revoked => {
            if let Some(fd) = &cut {
                let _ = nix::sys::socket::setsockopt(
                    fd,
                    nix::sys::socket::sockopt::Linger,
                    &libc::linger { l_onoff: 1, l_linger: 0 },
                );
            }
            true
        }
    };
    // The serve future (and the connection's own descriptor) is gone; the duplicate goes last.
    drop(cut);
    was_cut
}

/// Until either revocation.
async fn either_revoked(a: impl Future<Output = ()>, b: impl Future<Output = ()>) {
    tokio::select! {
        () = a => {}
        () = b => {}
    }
}

/// The credential broker: the real bearer behind a placeholder.
pub use crate::creds::{Bearer, Broker};

/// The proxy. Share it with `Arc`.
#[derive(Clone)]
pub struct Proxy {
    config: ProxyConfig,
    sandboxes: Arc<dyn Sandboxes>,
    broker: Arc<dyn Broker>,
    audit: Arc<dyn AuditSink>,
    /// Where requests go upstream, by the guest's protocol.
    upstream: Upstreams,
    resolver: Arc<dyn Resolve>,
}

/// A guest connection's slot under `limits.proxy_connections`, carried in each of its
/// requests' extensions so that a WebSocket relay keeps holding it after the upgrade (the
/// connection's own task has ended by then).
#[derive(Clone)]
struct HeldSlot(#[expect(dead_code, reason = "held for its Drop")] Arc<Slot>);

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").finish_non_exhaustive()
    }
}

/// The JSON body of a refusal: enough for an agent to tell the fence from the server.
#[derive(Debug, Serialize)]
struct Refusal<'a> {
    perimeter: &'static str,
    status: u16,
    rule: String,
    reason: &'a str,
}

impl Proxy {
    pub fn new(
        config: ProxyConfig,
        sandboxes: Arc<dyn Sandboxes>,
        broker: Arc<dyn Broker>,
        resolver: Arc<dyn Resolve>,
        audit: Arc<dyn AuditSink>,
    ) -> Self {
        let upstream = Upstreams::new(&config, resolver.clone());
        Self {
            config,
            sandboxes,
            broker,
            audit,
            upstream,
            resolver,
        }
    }

    /// The same proxy (sandboxes, audit, connection counts) with upstream pools of its own, for
    /// a thread of its own: a pooled connection is driven by the runtime that opened it, so
    /// threads sharing one pool would wake each other for every request.
    fn with_own_pools(&self) -> Self {
        Self {
            upstream: Upstreams::new(&self.config, self.resolver.clone()),
            ..self.clone()
        }
    }

    /// Serve on `addr` from `threads` threads of their own (`per_core`): each accepts from its
    /// own listener in one `SO_REUSEPORT` group and runs its connections, from ClientHello to
    /// upstream and back, on its own single-threaded runtime with its own upstream pools — no
    /// request hands over between threads. Sandboxes, policy, audit and the per-sandbox
    /// connection cap are shared. The threads end when `shutdown` turns true (their open
    /// connections with them). Binding errors are returned here, before any thread starts.
    pub fn serve_threads(
        self: &Arc<Self>,
        addr: SocketAddr,
        threads: usize,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> io::Result<Vec<std::thread::JoinHandle<()>>> {
        let listeners = (0..threads.max(1))
            .map(|_| crate::per_core::tcp_listener(addr))
            .collect::<io::Result<Vec<_>>>()?;
        listeners
            .into_iter()
            .enumerate()
            .map(|(i, listener)| {
                let proxy = Arc::new(self.with_own_pools());
                let mut shutdown = shutdown.clone();
                // Each thread's audit records are written together at the end of each turn of
                // its loop (one write for the requests it finished then, not one each).
                crate::per_core::spawn_with_audit(
                    format!("proxy-{i}"),
                    &self.audit,
                    move || async move {
                        let Ok(listener) = TcpListener::from_std(listener) else {
                            return;
                        };
                        proxy
                            .serve(listener, async move {
                                let _ = shutdown.wait_for(|s| *s).await;
                            })
                            .await;
                    },
                )
            })
            .collect()
    }

    /// Accept connections until `shutdown` completes.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let heartbeat = tokio::time::sleep(HEARTBEAT);
        tokio::pin!(heartbeat);
        loop {
            let (conn, peer) = tokio::select! {
                () = &mut shutdown => return,
                () = &mut heartbeat => {
                    heartbeat.as_mut().reset(tokio::time::Instant::now() + HEARTBEAT);
                    continue;
                }
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of descriptors or memory: say so, and let the host breathe rather
                        // than spin on a listener that stays readable.
                        eprintln!("svc proxy: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            // Requests and answers are small writes: no Nagle delay on either leg.
            let _ = conn.set_nodelay(true);
            let proxy = self.clone();
            tokio::spawn(async move { proxy.connection(conn, peer).await });
        }
    }

    async fn connection(self: Arc<Self>, mut conn: TcpStream, peer: SocketAddr) {
        let source = peer.ip().to_canonical();
        let Some(sandbox) = self.sandboxes.sandbox_for(source) else {
            return;
        };
        // Subscribed before anything is decided: a change after this is not missed.
        let revocations = self.sandboxes.revocations();
        let host_revocations = self.sandboxes.revocations();
        let cut = std::os::fd::AsFd::as_fd(&conn).try_clone_to_owned().ok();
        let slot = match self.config.limits.acquire(sandbox.id, Channel::Proxy) {
            Ok(slot) => HeldSlot(Arc::new(slot)),
            Err(hit) => return self.audit_conn(sandbox.id, hit.to_string()),
        };
        // Read the ClientHello.
        let mut buf = Vec::with_capacity(2048);
        let hello = tokio::time::timeout(self.config.hello_timeout, async {
            loop {
                let mut chunk = [0u8; 4096];
                let n = conn
                    .read(&mut chunk)
                    .await
                    .map_err(|_| client_hello::HelloError::Incomplete)?;
                if n == 0 {
                    return Err(client_hello::HelloError::Incomplete);
                }
                buf.extend_from_slice(&chunk[..n]);
                // Not a TLS handshake record: a plain HTTP request (redirected port 80).
                if buf.first().is_some_and(u8::is_ascii_uppercase) {
                    return Ok(None);
                }
                match client_hello::parse(&buf) {
                    Err(client_hello::HelloError::Incomplete) => {}
                    other => return other.map(Some),
                }
            }
        })
        .await;
        let refuse = |why: String| self.audit_conn(sandbox.id, why);
        let hello = match hello {
            Ok(Ok(Some(h))) => h,
            Ok(Ok(None)) => {
                return self
                    .plain_http(
                        conn,
                        buf,
                        sandbox,
                        source,
                        (revocations, host_revocations),
                        (cut, slot),
                    )
                    .await;
            }
            Ok(Err(e)) => return refuse(format!("ClientHello refused: {e}")),
            Err(_) => return refuse("no ClientHello in time".into()),
        };
        if hello.ech {
            return refuse("ClientHello offers ECH: refused".into());
        }
        let Some(sni) = hello.server_name else {
            return refuse("ClientHello has no server name: refused".into());
        };
        let Ok(authority) = Authority::parse(&sni, 443) else {
            return refuse(format!("server name {sni:?} is not a host name"));
        };
        if sandbox.policy.allowed.find_name(&authority.host).is_none() {
            return refuse(format!(
                "server name {} is not allowed for this sandbox",
                authority.host_str()
            ));
        }
        let name = authority.host_str();
        // The name must be one the dialled address was resolved for (SNI/address binding):
        // a connection to one allowed host's address cannot present another allowed name.
        let dialled_to = self.sandboxes.original_destination(&conn);
        let dialled = dialled_to.map(|a| a.ip().to_canonical());
        if let Some(dialled) = dialled
            && !self.sandboxes.dialled_matches(sandbox.id, dialled, &name)
        {
            return refuse(format!(
                "server name {name} does not match the address dialled ({dialled}), which the \
                 DNS guard did not answer for it: refused"
            ));
        }
        let Ok(tls) = sandbox.ca.server_config(&name) else {
            return refuse(format!("could not mint a certificate for {name}"));
        };
        let Ok(stream) = tokio_rustls::TlsAcceptor::from(tls)
            .accept(Rewind {
                prefix: buf,
                pos: 0,
                inner: conn,
            })
            .await
        else {
            return;
        };
        let sni: Arc<str> = Arc::from(name.as_str());
        // HTTP/1.1: a witness of the framing, for the one smuggling shape hyper hides from us.
        let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
        let (tracker, verdicts) = super::h1_frames::Tracker::new(self.config.max_head);
        let stream = super::h1_frames::Watched {
            inner: stream,
            tracker: (!h2).then_some(tracker),
        };
        let verdicts = (!h2).then_some(verdicts);
        let proxy = self.clone();
        let id = sandbox.id;
        let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(slot.clone());
            // Each request is decided by the sandbox's policy as it is now (a live allowlist
            // change applies from the next request on a kept-alive connection).
            let sandbox = proxy
                .sandboxes
                .sandbox_for(source)
                .filter(|s| s.id == sandbox.id)
                .unwrap_or_else(|| sandbox.clone());
            let (proxy, sni) = (proxy.clone(), sni.clone());
            let both_lengths = verdicts
                .as_ref()
                .and_then(|v| v.lock().ok()?.pop_front())
                .unwrap_or(false);
            // Boxed: hyper moves a service's future several times on its way into the task
            // that runs it (HTTP/2: a task per stream), and a request's is kilobytes.
            Box::pin(async move {
                Ok::<_, Infallible>(
                    proxy
                        .request(&sandbox, Scheme::Https, &sni, dialled_to, req, both_lengths)
                        .await,
                )
            })
        });
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.config.header_timeout)
            .max_buf_size(self.config.max_head.max(8192));
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(self.config.header_timeout)
            .keep_alive_timeout(self.config.header_timeout)
            .max_header_list_size(u32::try_from(self.config.max_head).unwrap_or(u32::MAX));
        // With upgrades: a WebSocket handshake hands its connection over to the relay. Cut when
        // its address leaves the sandbox, or its name does (every stream on it is for the name).
        let sni_name = name.clone();
        let by_name =
            served_host_revoked(host_revocations, self.sandboxes.clone(), id, move || {
                Some(sni_name.clone())
            });
        let was_cut = serve_until_revoked(
            async {
                let _ = builder
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .await;
            },
            either_revoked(revoked(revocations, id, dialled), by_name),
            cut,
        )
        .await;
        if was_cut {
            self.audit_cut(id, "TLS", Some(name));
        }
    }

    /// Plain HTTP (the fence redirects TCP 80 to allowed addresses here too): HTTP/1.1 only,
    /// each request's Host bound to the address the guest dialled as the TLS path binds the
    /// server name, then the same per-request policy with the `http` scheme (which refuses any
    /// placeholder as a leak) and a plain HTTP upstream.
    async fn plain_http(
        self: Arc<Self>,
        conn: TcpStream,
        buf: Vec<u8>,
        sandbox: Arc<ProxySandbox>,
        source: IpAddr,
        (revocations, host_revocations): (
            tokio::sync::broadcast::Receiver<Revocation>,
            tokio::sync::broadcast::Receiver<Revocation>,
        ),
        (cut, slot): (Option<std::os::fd::OwnedFd>, HeldSlot),
    ) {
        let id = sandbox.id;
        let dialled_to = self.sandboxes.original_destination(&conn);
        let dialled = dialled_to.map(|a| a.ip().to_canonical());
        // The host of the request this connection serves now (Host varies per request).
        let serving: Arc<std::sync::Mutex<Option<String>>> = Arc::default();
        let serving_now = serving.clone();
        let (tracker, verdicts) = super::h1_frames::Tracker::new(self.config.max_head);
        let stream = super::h1_frames::Watched {
            inner: Rewind {
                prefix: buf,
                pos: 0,
                inner: conn,
            },
            tracker: Some(tracker),
        };
        let proxy = self.clone();
        let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(slot.clone());
            let sandbox = proxy
                .sandboxes
                .sandbox_for(source)
                .filter(|s| s.id == sandbox.id)
                .unwrap_or_else(|| sandbox.clone());
            let proxy = proxy.clone();
            let both_lengths = verdicts
                .lock()
                .ok()
                .and_then(|mut v| v.pop_front())
                .unwrap_or(false);
            if let Ok(mut s) = serving_now.lock() {
                *s = req
                    .headers()
                    .get(header::HOST)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|h| Authority::parse(h, 80).ok())
                    .map(|a| a.host_str());
            }
            async move {
                Ok::<_, Infallible>(
                    proxy
                        .plain_request(&sandbox, dialled_to, req, both_lengths)
                        .await,
                )
            }
        });
        let serve = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.config.header_timeout)
            .max_buf_size(self.config.max_head.max(8192))
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let serving_at_cut = serving.clone();
        let by_name =
            served_host_revoked(host_revocations, self.sandboxes.clone(), id, move || {
                serving.lock().ok()?.clone()
            });
        let was_cut = serve_until_revoked(
            async {
                let _ = serve.await;
            },
            either_revoked(revoked(revocations, id, dialled), by_name),
            cut,
        )
        .await;
        if was_cut {
            let host = serving_at_cut.lock().ok().and_then(|s| s.clone());
            self.audit_cut(id, "HTTP", host);
        }
    }

    /// One plain HTTP request: its Host must be a name the DNS guard answered the dialled
    /// address with, as a TLS server name must.
    async fn plain_request(
        &self,
        sandbox: &ProxySandbox,
        dialled_to: Option<SocketAddr>,
        req: Request<Incoming>,
        both_lengths: bool,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        let dialled = dialled_to.map(|a| a.ip().to_canonical());
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .and_then(|h| Authority::parse(h, 80).ok());
        // A missing or bad Host, or a name off the list, is the policy's to refuse below.
        if let (Some(authority), Some(dialled)) = (&host, dialled)
            && sandbox.policy.allowed.find_name(&authority.host).is_some()
            && !self
                .sandboxes
                .dialled_matches(sandbox.id, dialled, &authority.host_str())
        {
            return self.refuse(
                sandbox,
                req.method(),
                Some(authority.host_str()),
                None,
                421,
                "address-binding",
                &format!(
                    "Host {} does not match the address dialled ({dialled}), which the DNS guard \
                     did not answer for it",
                    authority.host_str()
                ),
                started,
            );
        }
        let bound = host.map(|a| a.host_str()).unwrap_or_default();
        self.request(sandbox, Scheme::Http, &bound, dialled_to, req, both_lengths)
            .await
    }

    async fn request(
        &self,
        sandbox: &ProxySandbox,
        scheme: Scheme,
        sni: &str,
        dialled_to: Option<SocketAddr>,
        mut req: Request<Incoming>,
        head_had_both_lengths: bool,
    ) -> Response<ProxyBody> {
        let started = Instant::now();
        // Its connection's slot: a WebSocket relay takes it along (below); nothing else does.
        let held = req.extensions_mut().remove::<HeldSlot>();
        // A protocol upgrade: WebSocket handshakes pass on (relayed once the upstream agrees),
        // every other upgrade is refused here, never dropped silently.
        let ask = {
            let headers: Vec<(&str, &[u8])> = req
                .headers()
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_bytes()))
                .collect();
            request::upgrade(
                req.method().as_str(),
                req.version() == http::Version::HTTP_11,
                &headers,
            )
        };
        if let request::UpgradeAsk::Refused(why) = &ask {
            let path = Some(req.uri().path().to_owned());
            return self.refuse(
                sandbox,
                req.method(),
                None,
                path,
                400,
                "upgrade-refused",
                why,
                started,
            );
        }
        let guest_upgrade =
            (ask == request::UpgradeAsk::WebSocket).then(|| hyper::upgrade::on(&mut req));
        let (mut parts, body) = req.into_parts();
        let h2 = parts.version == http::Version::HTTP_2;
        let host_header = parts
            .headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let (authority, alt) = if h2 {
            (
                parts
                    .uri
                    .authority()
                    .map(|a| a.as_str().to_owned())
                    .or_else(|| host_header.clone()),
                host_header
                    .clone()
                    .filter(|_| parts.uri.authority().is_some()),
            )
        } else {
            (host_header.clone(), None)
        };
        let target = if h2 {
            parts
                .uri
                .path_and_query()
                .map_or("/".to_owned(), |p| p.as_str().to_owned())
        } else {
            parts.uri.to_string()
        };
        // The body's prefix is read and decided on under one of the sandbox's
        // `limits.proxy_requests` (its memory is bounded by theirs), and within the head's time.
        let _reading = match self
            .config
            .limits
            .acquire(sandbox.id, Channel::ProxyRequests)
        {
            Ok(slot) => slot,
            Err(hit) => {
                return self.refuse(
                    sandbox,
                    &parts.method,
                    None,
                    None,
                    429,
                    "limit",
                    &hit.to_string(),
                    started,
                );
            }
        };
        let prefix_read = tokio::time::timeout(
            self.config.header_timeout,
            read_prefix(body, self.config.body_prefix),
        )
        .await;
        let Ok(prefix_read) = prefix_read else {
            return self.refuse(
                sandbox,
                &parts.method,
                None,
                None,
                408,
                "request-body",
                &format!(
                    "the request body's first {} bytes (or its end) did not come within {:?}",
                    self.config.body_prefix, self.config.header_timeout
                ),
                started,
            );
        };
        let (prefix, rest, complete) = match prefix_read {
            Ok(x) => x,
            Err(_) => {
                return self.refuse(
                    sandbox,
                    &parts.method,
                    None,
                    None,
                    400,
                    "request-body",
                    "the request body could not be read",
                    started,
                );
            }
        };
        let headers: Vec<(&str, &[u8])> = parts
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_bytes()))
            .collect();
        let decision = request::decide(
            &sandbox.policy,
            &HttpRequest {
                scheme,
                method: parts.method.as_str(),
                target: &target,
                authority: authority.as_deref(),
                sni: (scheme == Scheme::Https).then_some(sni),
                alt_authority: alt.as_deref(),
                headers: &headers,
                body_prefix: &prefix,
                body_complete: complete,
                head_had_both_lengths,
            },
        );
        let credential = match &decision.outcome {
            Outcome::Deny { status } if decision.rule == request::Rule::SmartHttpPushRefused => {
                return self.refuse_push(sandbox, &parts.method, &decision, *status, started);
            }
            Outcome::Deny { status } => {
                return self.refuse(
                    sandbox,
                    &parts.method,
                    decision.host.clone(),
                    decision.path.clone(),
                    *status,
                    &decision.rule.name(),
                    &decision.reason,
                    started,
                );
            }
            Outcome::Allow { credential } => credential.clone(),
        };
        // The record of an allowed request is written when its response body ends (or the guest
        // hangs up), with the bytes each way; the sink must be writable before anything is sent
        // upstream. No record, no request: the proxy refuses rather than go silent. The refusal's
        // own record is the probe that lets requests through again once the sink recovers.
        if let Err(e) = self.audit.ready() {
            eprintln!("svc proxy: audit log unavailable, refusing: {e}");
            return self.refuse(
                sandbox,
                &parts.method,
                decision.host.clone(),
                decision.path.clone(),
                503,
                "audit",
                "the audit log cannot be written; the perimeter refuses requests until it can",
                started,
            );
        }
        let host = decision.host.clone().unwrap_or_default();
        // The address the guest dialled, and only if its class may be dialled: never a fresh
        // resolution of the name.
        let dial_to = match super::dial::checked(dialled_to, &self.config.network) {
            Ok(t) => t,
            Err(e) => {
                let (status, rule, reason) = (e.status(), e.rule(), e.to_string());
                self.audit_request(
                    sandbox.id,
                    HttpEvent {
                        host: Some(host),
                        method: parts.method.to_string(),
                        path: decision.path,
                        status,
                        decision: "deny",
                        credential: "none",
                        bytes_up: 0,
                        bytes_down: refusal_body(status, &rule, &reason).len() as u64,
                        duration_ms: ms(started),
                        upgrade: None,
                        dialled: dialled_to.map(|a| a.to_string()),
                        rule,
                        refs: super::git_push::refs(decision.push.as_ref()),
                    },
                );
                return refusal(status, &e.rule(), &reason);
            }
        };
        // Through the operator's forward proxy the name goes to it (it resolves); otherwise
        // the connection goes to `dial_to`.
        let direct = !self
            .config
            .forward_proxy
            .as_ref()
            .is_some_and(|fp| fp.applies_to(&host));
        let (scheme_name, default_port) = match scheme {
            Scheme::Https => ("https", 443),
            Scheme::Http => ("http", 80),
        };
        let port = Authority::parse(authority.as_deref().unwrap_or(""), default_port)
            .map_or(default_port, |a| a.port);
        // Upstream request: the checked name, the original path, the credential as policy says.
        let uri = if port == default_port {
            format!("{scheme_name}://{host}{}", pq(&target, &parts.uri))
        } else {
            format!("{scheme_name}://{host}:{port}{}", pq(&target, &parts.uri))
        };
        let mut up = Request::builder().method(parts.method.clone()).uri(uri);
        // The guest's headers are not needed again: move them, no copy per request.
        drop(headers);
        let mut headers_out = std::mem::take(&mut parts.headers);
        strip_hop_by_hop(&mut headers_out);
        headers_out.remove(header::HOST);
        // Plain HTTP through the operator's proxy is an absolute-form request to it: its
        // credentials go with each request (an HTTPS tunnel carries them on its CONNECT).
        if scheme == Scheme::Http
            && let Some(fp) = &self.config.forward_proxy
            && fp.applies_to(&host)
            && let Some(auth) = &fp.auth
        {
            headers_out.insert(header::PROXY_AUTHORIZATION, auth.clone());
        }
        if guest_upgrade.is_some() {
            websocket_headers(&mut headers_out);
        }
        // Set when a credential is swapped in: its answer is scrubbed of it (`scrub`).
        let mut echo_guard: Option<Arc<crate::policy::credentials::EchoGuard>> = None;
        let credential_note = match &credential {
            CredentialAction::Passthrough => "none",
            CredentialAction::Strip => {
                headers_out.remove(header::AUTHORIZATION);
                "stripped"
            }
            CredentialAction::Swap { kind, placeholder } => {
                // One refusal for every way the swap cannot happen, naming which.
                let swap = match self.broker.bearer(sandbox.id, placeholder, *kind, &host) {
                    Some(Ok(token)) => HeaderValue::from_str(&format!("Bearer {}", token.expose()))
                        .map(|v| (v, token))
                        .map_err(|_| {
                            "the broker's credential is not a valid header value".to_owned()
                        }),
                    Some(Err(why)) => Err(why),
                    None => Err("no credential is brokered for this host".to_owned()),
                };
                let (mut v, token) = match swap {
                    Ok(swap) => swap,
                    Err(why) => {
                        return self.refuse(
                            sandbox,
                            &parts.method,
                            Some(host),
                            decision.path,
                            502,
                            "credential",
                            &why,
                            started,
                        );
                    }
                };
                v.set_sensitive(true);
                headers_out.insert(header::AUTHORIZATION, v);
                super::scrub::prepare_request(&mut headers_out);
                echo_guard = Some(Arc::new(crate::policy::credentials::EchoGuard::new(
                    token.expose(),
                    placeholder,
                )));
                "swapped"
            }
        };
        if let Some(h) = up.headers_mut() {
            *h = headers_out;
        }
        let bytes_up = Arc::new(AtomicU64::new(0));
        let up_count = bytes_up.clone();
        let body = match rest {
            // The whole body is in hand: send it with its length, so a GET goes out with no body
            // framing at all (END_STREAM on the HTTP/2 HEADERS, no chunked encoding on HTTP/1.1)
            // and the upstream never sees a stream the proxy abandons half-open.
            None => {
                up_count.fetch_add(prefix.len() as u64, Ordering::Relaxed);
                Full::new(prefix)
                    .map_err(|never| match never {})
                    .boxed_unsync()
            }
            Some(rest) => UnsyncBoxBody::new(StreamBody::new(
                futures::stream::once(async move { Ok::<_, BoxError>(Frame::data(prefix)) })
                    .chain(rest)
                    .inspect(move |f| {
                        if let Some(d) = f.as_ref().ok().and_then(Frame::data_ref) {
                            up_count.fetch_add(d.len() as u64, Ordering::Relaxed);
                        }
                    }),
            )),
        };
        let Ok(up) = up.body(body) else {
            return self.refuse(
                sandbox,
                &parts.method,
                Some(host),
                decision.path,
                400,
                "request",
                "the request could not be rebuilt",
                started,
            );
        };
        // An HTTP/2 guest's request is counted in flight on its pool until the response head
        // is here.
        let sent = async {
            let (client, _in_flight) = if guest_upgrade.is_some() {
                (
                    super::dial::upgrade_client(&self.upstream.connectors, dial_to),
                    None,
                )
            } else if h2 {
                let authority = up.uri().authority().map_or("", |a| a.as_str());
                let (client, slot) = self.upstream.h2.at(dial_to).take(authority);
                (client, Some(slot))
            } else {
                return self
                    .upstream
                    .h1
                    .request(up, dial_to)
                    .await
                    .map(|r| r.map(http_body_util::Either::Left))
                    .map_err(BoxError::from);
            };
            client
                .request(up)
                .await
                .map(|r| r.map(http_body_util::Either::Right))
                .map_err(BoxError::from)
        };
        let mut response = match tokio::time::timeout(self.config.request_timeout, sent).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                return self.refuse(
                    sandbox,
                    &parts.method,
                    Some(host),
                    decision.path,
                    502,
                    "upstream",
                    &format!("upstream failed: {}", error_chain(&*e)),
                    started,
                );
            }
            Err(_) => {
                return self.refuse(
                    sandbox,
                    &parts.method,
                    Some(host),
                    decision.path,
                    504,
                    "upstream",
                    "upstream timed out",
                    started,
                );
            }
        };
        let upgraded = match guest_upgrade {
            Some(guest) if response.status() == StatusCode::SWITCHING_PROTOCOLS => {
                Some((guest, hyper::upgrade::on(&mut response)))
            }
            _ => None,
        };
        let (mut rparts, rbody) = response.into_parts();
        // A real token must never reach the guest, even echoed by the upstream.
        let echoes = Arc::new(AtomicU64::new(0));
        if let Some(guard) = &echo_guard
            && let Err(why) = super::scrub::response_head(guard, &mut rparts.headers, &echoes)
        {
            return self.refuse(
                sandbox,
                &parts.method,
                Some(host),
                decision.path,
                502,
                "credential-echo",
                &why,
                started,
            );
        }
        strip_hop_by_hop(&mut rparts.headers);
        if upgraded.is_some() {
            websocket_headers(&mut rparts.headers);
        }
        let record = HttpEvent {
            host: Some(host),
            method: parts.method.to_string(),
            path: decision.path,
            status: rparts.status.as_u16(),
            decision: "allow",
            rule: decision.rule.name(),
            credential: credential_note,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            upgrade: None,
            dialled: direct.then(|| dial_to.to_string()),
            refs: super::git_push::refs(decision.push.as_ref()),
        };
        if let Some((guest, upstream)) = upgraded {
            // The handshake is audited now; the relay writes a second record when it closes.
            let mut opened = record.clone();
            opened.upgrade = Some("websocket");
            opened.duration_ms = ms(started);
            self.audit_request(sandbox.id, opened);
            let (audit, id) = (self.audit.clone(), sandbox.id);
            // A live change that removes the host ends the relayed connection too.
            let revoked = host_revoked(
                self.sandboxes.revocations(),
                self.sandboxes.clone(),
                id,
                record.host.clone().unwrap_or_default(),
            );
            tokio::spawn(async move {
                // The relayed connection holds its slot until it closes.
                let _held = held;
                let mut closed = record;
                closed.upgrade = Some("websocket-closed");
                if let (Ok(g), Ok(u)) = tokio::join!(guest, upstream) {
                    tokio::select! {
                        counted = relay(TokioIo::new(g), TokioIo::new(u)) => {
                            (closed.bytes_up, closed.bytes_down) = counted;
                        }
                        () = revoked => {
                            closed.upgrade = Some("websocket-cut");
                        }
                    }
                }
                closed.duration_ms = ms(started);
                let _ = crate::audit::record_here(
                    &audit,
                    AuditRecord {
                        time: rfc3339(SystemTime::now()),
                        sandbox_name: None,
                        sandbox: id,
                        event: crate::audit::AuditEvent::Http(closed),
                    },
                );
            });
            return Response::from_parts(
                rparts,
                http_body_util::Empty::new()
                    .map_err(|e: Infallible| match e {})
                    .boxed_unsync(),
            );
        }
        let mut pending = PendingRecord {
            audit: self.audit.clone(),
            sandbox: sandbox.id,
            record: Some(record),
            started,
            bytes_up,
            bytes_down: 0,
            echoes: echoes.clone(),
        };
        // A response that has no body by definition (to HEAD; 1xx, 204, 304) goes to the guest
        // as one that ends with its head: forwarding the upstream's (empty) stream under a
        // Content-Length makes HTTP/2 peers reset the stream as malformed.
        let status = rparts.status.as_u16();
        if parts.method == http::Method::HEAD || status == 204 || status == 304 || status < 200 {
            drop(rbody);
            drop(pending); // writes the record
            return Response::from_parts(
                rparts,
                http_body_util::Empty::new()
                    .map_err(|e: Infallible| match e {})
                    .boxed_unsync(),
            );
        }
        let body = rbody.map_frame(move |f| {
            // The whole record moves into the body (not just the counter field), so it is
            // written when the body is dropped.
            let pending = &mut pending;
            if let Some(d) = f.data_ref() {
                pending.bytes_down += d.len() as u64;
            }
            f
        });
        let Some(guard) = echo_guard else {
            return Response::from_parts(rparts, body.boxed_unsync());
        };
        // The scrubbed body's length is not the upstream's (bytes_down counts the upstream's).
        rparts.headers.remove(header::CONTENT_LENGTH);
        Response::from_parts(
            rparts,
            super::scrub::Scrubbed::new(body, guard, echoes).boxed_unsync(),
        )
    }

    #[allow(clippy::too_many_arguments, reason = "the parts of one refusal")]
    fn refuse(
        &self,
        sandbox: &ProxySandbox,
        method: &http::Method,
        host: Option<String>,
        path: Option<String>,
        status: u16,
        rule: &str,
        reason: &str,
        started: Instant,
    ) -> Response<ProxyBody> {
        self.audit_request(
            sandbox.id,
            HttpEvent {
                host,
                path,
                status,
                bytes_down: refusal_body(status, rule, reason).len() as u64,
                duration_ms: ms(started),
                ..HttpEvent::decided(method.to_string(), "deny", rule.to_owned())
            },
        );
        refusal(status, rule, reason)
    }

    /// A smart-HTTP push held to AllowedBranches and refused: the answer git shows
    /// (`git_push`), audited with the decision's status and every ref of the push.
    fn refuse_push(
        &self,
        sandbox: &ProxySandbox,
        method: &http::Method,
        decision: &request::Decision,
        status: u16,
        started: Instant,
    ) -> Response<ProxyBody> {
        let answer = super::git_push::refusal(decision.push.as_ref(), &decision.reason);
        self.audit_request(
            sandbox.id,
            HttpEvent {
                host: decision.host.clone(),
                path: decision.path.clone(),
                status,
                bytes_down: answer.len() as u64,
                duration_ms: ms(started),
                refs: super::git_push::refs(decision.push.as_ref()),
                ..HttpEvent::decided(method.to_string(), "deny", decision.rule.name())
            },
        );
        super::git_push::response(answer)
    }

    fn audit_request(&self, sandbox: u32, e: HttpEvent) {
        let _ = crate::audit::record_here(
            &self.audit,
            AuditRecord {
                time: rfc3339(SystemTime::now()),
                sandbox_name: None,
                sandbox,
                event: crate::audit::AuditEvent::Http(e),
            },
        );
    }

    /// A guest connection reset because a live change took its address or its host away.
    fn audit_cut(&self, sandbox: u32, protocol: &str, host: Option<String>) {
        self.audit_request(
            sandbox,
            HttpEvent {
                host,
                ..HttpEvent::decided(protocol.to_owned(), "cut", "allowlist-change".to_owned())
            },
        );
    }

    fn audit_conn(&self, sandbox: u32, reason: String) {
        self.audit_request(sandbox, HttpEvent::decided("TLS".into(), "deny", reason));
    }
}

/// A refusal from the perimeter: the status and a small JSON body naming the rule and reason.
fn refusal(status: u16, rule: &str, reason: &str) -> Response<ProxyBody> {
    let body = refusal_body(status, rule, reason);
    let mut r = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        HeaderName::from_static("x-svc-perimeter"),
        HeaderValue::from_static("refused"),
    );
    r
}

fn refusal_body(status: u16, rule: &str, reason: &str) -> Vec<u8> {
    serde_json::to_vec(&Refusal {
        perimeter: "svc egress perimeter",
        status,
        rule: rule.to_owned(),
        reason,
    })
    .unwrap_or_default()
}

/// The audit record of an allowed request, written once when the response body is done with:
/// ended, failed, or dropped because the guest went away.
struct PendingRecord {
    audit: Arc<dyn AuditSink>,
    sandbox: u32,
    record: Option<HttpEvent>,
    started: Instant,
    bytes_up: Arc<AtomicU64>,
    bytes_down: u64,
    /// Occurrences of a swapped credential replaced in the answer (`scrub`).
    echoes: Arc<AtomicU64>,
}

impl Drop for PendingRecord {
    fn drop(&mut self) {
        if let Some(mut record) = self.record.take() {
            record.bytes_up = self.bytes_up.load(Ordering::Relaxed);
            record.bytes_down = self.bytes_down;
            record.duration_ms = ms(self.started);
            let echo = (self.echoes.load(Ordering::Relaxed) > 0)
                .then(|| super::scrub::echo_record(&record));
            for record in std::iter::once(record).chain(echo) {
                self.write(record);
            }
        }
    }
}

impl PendingRecord {
    fn write(&self, record: HttpEvent) {
        if let Err(e) = crate::audit::record_here(
            &self.audit,
            AuditRecord {
                time: rfc3339(SystemTime::now()),
                sandbox_name: None,
                sandbox: self.sandbox,
                event: crate::audit::AuditEvent::Http(record),
            },
        ) {
            eprintln!("svc proxy: audit record lost: {e}");
        }
    }
}

fn ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn pq(target: &str, uri: &http::Uri) -> String {
    uri.path_and_query()
        .map_or_else(|| target.to_owned(), |p| p.as_str().to_owned())
}

/// Read up to `limit` bytes of a body: (prefix, the rest as a stream, whether the prefix is all).
async fn read_prefix(
    mut body: Incoming,
    limit: usize,
) -> Result<
    (
        Bytes,
        Option<Pin<Box<dyn futures::Stream<Item = Result<Frame<Bytes>, BoxError>> + Send>>>,
        bool,
    ),
    hyper::Error,
> {
    let mut prefix = Vec::new();
    let mut extra: Option<Frame<Bytes>> = None;
    loop {
        if prefix.len() >= limit {
            break;
        }
        match body.frame().await {
            None => {
                return Ok((Bytes::from(prefix), None, true));
            }
            Some(Err(e)) => return Err(e),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => prefix.extend_from_slice(&data),
                Err(trailers) => {
                    extra = Some(trailers);
                    break;
                }
            },
        }
    }
    let complete = extra.is_some() && body.is_end_stream();
    let rest = futures::stream::iter(extra.map(Ok)).chain(
        http_body_util::BodyStream::new(body).map(|r| r.map_err(|e| Box::new(e) as BoxError)),
    );
    Ok((Bytes::from(prefix), Some(Box::pin(rest)), complete))
}

use hyper::body::Body as _;

/// Headers of one hop, never forwarded (RFC 9110 §7.6.1, and the older ones still met).
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Copy both ways until both directions end (or either fails); the bytes each way, counted
/// even when a side drops its connection without a clean close.
async fn relay<G, U>(guest: G, upstream: U) -> (u64, u64)
where
    G: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt as _;
    async fn pump(mut from: impl AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin) -> u64 {
        let mut buf = vec![0u8; 16 * 1024];
        let mut total = 0u64;
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    total += n as u64;
                }
            }
        }
        let _ = to.shutdown().await;
        total
    }
    let (gr, gw) = tokio::io::split(guest);
    let (ur, uw) = tokio::io::split(upstream);
    tokio::join!(pump(gr, uw), pump(ur, gw))
}

/// The two hop-by-hop headers a WebSocket handshake (and its 101 answer) carries on.
fn websocket_headers(h: &mut HeaderMap) {
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
}

fn strip_hop_by_hop(h: &mut HeaderMap) {
    // The names `Connection` lists go too (read before it is removed).
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|s| HeaderName::from_bytes(s.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(&listed) {
        h.remove(name);
    }
}

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
struct Upstreams {
    h1: super::h1_pool::H1Pool,
    h2: super::dial::H2ByAddress,
    connectors: super::dial::Connectors,
}

impl Upstreams {
    fn new(config: &ProxyConfig, resolver: Arc<dyn Resolve>) -> Self {
        // The resolver only finds the operator's forward proxy: a guest's request is dialled
        // at its own address.
        let mut http = HttpConnector::new_with_resolver(DnsService::new(resolver));
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(10)));
        let http = Upstream::new(http, config.forward_proxy.clone());
        // The scheme of each upstream URI is the guest's (https for TLS, http for plain), built
        // by the proxy, never taken from the guest's request target.
        let connectors = super::dial::Connectors::new(&config.upstream_tls, http);
        Self {
            h1: super::h1_pool::H1Pool::new(connectors.clone()),
            h2: super::dial::H2ByAddress::new(connectors.clone()),
            connectors,
        }
    }
}

/// While the proxy serves, a timer due within this long stays in the runtime's timer wheel.
/// tokio wakes its I/O driver (an eventfd write, then an extra epoll turn) whenever a timer is
/// registered earlier than every timer already there (tokio-rs/tokio#5207): with an otherwise
/// empty wheel that is every per-request timeout, three system calls per request. With this
/// earlier deadline always present, a request's timeouts (all longer) wake nothing; the cost is
/// one timer firing per second.
const HEARTBEAT: Duration = Duration::from_secs(1);

/// A stream that replays the bytes already read (the ClientHello) before the socket's.
struct Rewind {
    prefix: Vec<u8>,
    pos: usize,
    inner: TcpStream,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.prefix.len() {
            let n = (self.prefix.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.prefix[start..start + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    // Vectored, as the socket is: TLS hands over each record as its own slice, and without
    // this every record (three in the server's first flight) would be its own send.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt as _;

    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_not_forwarded() {
        let mut h = HeaderMap::new();
        for (name, value) in [
            ("connection", "close, X-Private"),
            ("connection", "Keep-Alive"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authorization", "Basic eDp5"),
            ("te", "trailers"),
            ("trailer", "x-sum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("x-private", "secret"),
            ("accept", "*/*"),
            ("x-kept", "1"),
        ] {
            h.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "x-kept"]);
    }

    /// TLS hands the socket a flight of records as separate slices: all of them go in one
    /// write, not just the first (the default of `poll_write_vectored`).
    #[tokio::test]
    async fn rewind_writes_every_slice_of_a_vectored_write_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (mut client, (server, _)) = (client.unwrap(), accepted.unwrap());
        let mut rewind = Rewind {
            prefix: Vec::new(),
            pos: 0,
            inner: server,
        };
        assert!(rewind.is_write_vectored());
        let slices = [
            io::IoSlice::new(b"server hello;"),
            io::IoSlice::new(b"change cipher spec;"),
            io::IoSlice::new(b"finished"),
        ];
        let n = rewind.write_vectored(&slices).await.unwrap();
        assert_eq!(n, slices.iter().map(|s| s.len()).sum::<usize>());
        rewind.shutdown().await.unwrap();
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"server hello;change cipher spec;finished");
    }
}
