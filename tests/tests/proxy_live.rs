//! The proxy live on loopback: curl (HTTP/1.1 and HTTP/2) as the guest, a real HTTPS upstream
//! (hyper + rustls, certificate from a test CA given to the proxy as an extra root) that echoes
//! what it received.

use std::{
    net::IpAddr,
    path::Path,
    process::Command,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, body::Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use svc_control::{
    audit::{AuditError, AuditEvent, AuditRecord, AuditSink},
    config::{egress, host::HostConfig, limits::LimitsConfig},
    hosts::HostPattern,
    limits::{GuestLimits, Unreported},
    policy::{credentials::CredentialKind, request::SandboxPolicy},
    proxy::{
        Broker, HttpEvent, Proxy, ProxyConfig, ProxySandbox, Resolve, Sandboxes, ca::SandboxCa,
    },
};

/// The one sandbox (loopback is its address); a test may change its policy live. Its
/// connections were all dialled to the upstream (as the fence's `SO_ORIGINAL_DST` would say;
/// a connection straight to the proxy has none).
struct One {
    current: std::sync::RwLock<Arc<ProxySandbox>>,
    revocations: tokio::sync::broadcast::Sender<svc_control::proxy::Revocation>,
    upstream: std::net::SocketAddr,
}
impl One {
    fn new(s: Arc<ProxySandbox>, upstream: std::net::SocketAddr) -> Self {
        Self {
            current: std::sync::RwLock::new(s),
            revocations: tokio::sync::broadcast::channel(8).0,
            upstream,
        }
    }
    fn get(&self) -> Arc<ProxySandbox> {
        self.current.read().unwrap().clone()
    }
}
impl Sandboxes for One {
    fn sandbox_for(&self, s: IpAddr) -> Option<Arc<ProxySandbox>> {
        s.is_loopback().then(|| self.get())
    }
    fn revocations(&self) -> tokio::sync::broadcast::Receiver<svc_control::proxy::Revocation> {
        self.revocations.subscribe()
    }
    fn policy_of(&self, id: u32) -> Option<Arc<ProxySandbox>> {
        Some(self.get()).filter(|s| s.id == id)
    }
    fn original_destination(&self, _: &tokio::net::TcpStream) -> Option<std::net::SocketAddr> {
        Some(self.upstream)
    }
}

struct RealTokens;
impl Broker for RealTokens {
    fn bearer(
        &self,
        _: u32,
        _: &svc_control::policy::credentials::Placeholder,
        kind: CredentialKind,
        host: &str,
    ) -> Option<Result<svc_control::creds::Bearer, String>> {
        Some(Ok(svc_control::creds::Bearer::new(format!(
            "REAL-{}-{host}",
            kind.name()
        ))))
    }
}

struct Loopback;
impl Resolve for Loopback {
    fn resolve(
        &self,
        _host: &str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>
    {
        Box::pin(async { Ok(vec!["127.0.0.1".parse().unwrap()]) })
    }
}

#[derive(Default)]
struct Audit(Mutex<Vec<AuditRecord>>, std::sync::atomic::AtomicBool);
impl AuditSink for Audit {
    fn record(&self, r: &AuditRecord) -> Result<(), AuditError> {
        self.ready()?;
        self.0.lock().unwrap().push(r.clone());
        Ok(())
    }

    /// Failing (the test's "disk full") while the switch is on.
    fn ready(&self) -> Result<(), AuditError> {
        if self.1.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(AuditError::Write {
                path: "audit.jsonl".into(),
                source: std::io::Error::other("disk full"),
            });
        }
        Ok(())
    }
}

impl Audit {
    /// The HTTP records so far; an allowed request's record lands when its response body is done
    /// with, a moment after the client has read the last byte, so wait for `until` (≤ 5 s).
    fn http_until(&self, until: impl Fn(&[HttpEvent]) -> bool) -> Vec<HttpEvent> {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let records: Vec<HttpEvent> = self
                .0
                .lock()
                .unwrap()
                .iter()
                .filter_map(|r| match &r.event {
                    AuditEvent::Http(h) => Some(h.clone()),
                    _ => None,
                })
                .collect();
            if until(&records) || std::time::Instant::now() > deadline {
                return records;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// An HTTPS upstream that answers with what it received, and echoes Authorization in a header.
async fn upstream(ca: &SandboxCa, seen: Arc<Mutex<Vec<String>>>) -> u16 {
    // The upstream presents a leaf of the test root exactly as the proxy presents its own.
    let acceptor = tokio_rustls::TlsAcceptor::from(ca.server_config("api.example.test").unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        // Each accepted connection's number, echoed in `x-upstream-conn`.
        let mut accepted = 0u32;
        loop {
            let Ok((c, _)) = listener.accept().await else {
                continue;
            };
            accepted += 1;
            let (acceptor, seen, conn) = (acceptor.clone(), seen.clone(), accepted);
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(c).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let seen = seen.clone();
                    async move {
                        use http_body_util::BodyExt as _;
                        if req.uri().path() == "/ws" {
                            return Ok::<_, std::convert::Infallible>(
                                websocket_echo(req, &seen).map(http_body_util::Either::Left),
                            );
                        }
                        if req.uri().path() == "/count" {
                            let mut body = req.into_body();
                            let mut n = 0usize;
                            while let Some(Ok(f)) = body.frame().await {
                                n += f.data_ref().map_or(0, |d| d.len());
                            }
                            return Ok::<_, std::convert::Infallible>(Response::new(
                                http_body_util::Either::Left(Full::new(Bytes::from(format!(
                                    "bytes={n}"
                                )))),
                            ));
                        }
                        if req.uri().path() == "/big" {
                            let chunk = Bytes::from(vec![b'x'; 64 * 1024]);
                            let chunks = futures::stream::iter(
                                (0..1024)
                                    .map(|_| {
                                        Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(
                                            chunk.clone(),
                                        ))
                                    })
                                    .collect::<Vec<_>>(),
                            );
                            return Ok(Response::new(http_body_util::Either::Right(
                                http_body_util::StreamBody::new(chunks),
                            )));
                        }
                        if let Some(echo) = echo_headers(&req) {
                            return Ok(echo);
                        }
                        let auth = req
                            .headers()
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        seen.lock().unwrap().push(format!(
                            "{} {} auth={auth}",
                            req.method(),
                            req.uri()
                        ));
                        let host = req
                            .uri()
                            .authority()
                            .map(|a| a.as_str().to_owned())
                            .or_else(|| {
                                req.headers()
                                    .get("host")
                                    .and_then(|v| v.to_str().ok())
                                    .map(str::to_owned)
                            })
                            .unwrap_or_default();
                        let body = format!("path={} host={host}", req.uri().path());
                        let version = format!("{:?}", req.version());
                        Ok(Response::builder()
                            .header("x-echo-auth", auth)
                            .header("x-ok", "1")
                            .header("x-upstream-version", version)
                            .header("x-upstream-conn", conn)
                            .body(http_body_util::Either::Left(Full::new(Bytes::from(body))))
                            .unwrap())
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    port
}

/// The frames of a body the test upstream sends in pieces.
type Pieces = http_body_util::StreamBody<
    futures::stream::Iter<
        std::vec::IntoIter<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>,
    >,
>;
type EchoBody = http_body_util::Either<Full<Bytes>, Pieces>;

/// The upstream's httpbin-style echo of the request headers in the body (and the Authorization
/// in a header): `/echo/length` with a Content-Length, `/echo/chunked` in 5-byte pieces with
/// none (HTTP/1.1: chunked; every credential straddles pieces), `/echo/gzip` labelled
/// `Content-Encoding: gzip` (its bytes are the plain echo: what a scan could not read).
fn echo_headers(req: &Request<Incoming>) -> Option<Response<EchoBody>> {
    let kind = req.uri().path().strip_prefix("/echo/")?;
    let mut body = String::from("{\"headers\": {\n");
    for (name, value) in req.headers() {
        body.push_str(&format!(
            "  \"{name}\": \"{}\",\n",
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    body.push_str("}}\n");
    let auth = req
        .headers()
        .get("authorization")
        .cloned()
        .unwrap_or(hyper::header::HeaderValue::from_static(""));
    let response = Response::builder().header("x-echo-auth", auth);
    let body = match kind {
        "length" => http_body_util::Either::Left(Full::new(Bytes::from(body))),
        "gzip" => {
            return Some(
                response
                    .header("content-encoding", "gzip")
                    .body(http_body_util::Either::Left(Full::new(Bytes::from(body))))
                    .unwrap(),
            );
        }
        _ => http_body_util::Either::Right(http_body_util::StreamBody::new(futures::stream::iter(
            body.as_bytes()
                .chunks(5)
                .map(|c| Ok(hyper::body::Frame::data(Bytes::copy_from_slice(c))))
                .collect::<Vec<_>>(),
        ))),
    };
    Some(response.body(body).unwrap())
}

/// The upstream's WebSocket endpoint: answer the handshake (noting its Authorization), then
/// echo every message back with `echo:` before it.
fn websocket_echo(
    mut req: Request<Incoming>,
    seen: &Arc<Mutex<Vec<String>>>,
) -> Response<Full<Bytes>> {
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    seen.lock()
        .unwrap()
        .push(format!("WS {} auth={auth}", req.uri()));
    let key = req
        .headers()
        .get("sec-websocket-key")
        .map(|k| tokio_tungstenite::tungstenite::handshake::derive_accept_key(k.as_bytes()))
        .unwrap_or_default();
    let on = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        use futures::{SinkExt as _, StreamExt as _};
        let Ok(io) = on.await else { return };
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(io),
            tokio_tungstenite::tungstenite::protocol::Role::Server,
            None,
        )
        .await;
        while let Some(Ok(m)) = ws.next().await {
            if m.is_text() {
                let text = format!("echo:{}", m.into_text().unwrap_or_default());
                if ws
                    .send(tokio_tungstenite::tungstenite::Message::text(text))
                    .await
                    .is_err()
                {
                    return;
                }
            } else if m.is_close() {
                return;
            }
        }
    });
    Response::builder()
        .status(101)
        .header("connection", "upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-accept", key)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

struct World {
    proxy_port: u16,
    port: u16,
    ca_pem: std::path::PathBuf,
    placeholder: String,
    seen: Arc<Mutex<Vec<String>>>,
    audit: Arc<Audit>,
    sandboxes: Arc<One>,
    _rt: tokio::runtime::Runtime,
    dir: std::path::PathBuf,
}

fn world() -> World {
    world_with(|_| {})
}

fn world_with(tune: impl FnOnce(&mut ProxyConfig)) -> World {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let upstream_ca = SandboxCa::generate("test-upstream-root").unwrap();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let port = rt.block_on(upstream(&upstream_ca, seen.clone()));
    let config_yaml =
        format!("egress:\n  policy:\n    gated.example.test:{port}:\n      paths: [\"/v1/**\"]\n");
    let egress = egress::parse(Path::new("config.yaml"), &config_yaml).unwrap();
    let extra = [
        HostPattern::parse(&format!("api.example.test:{port}")).unwrap(),
        HostPattern::parse(&format!("other.example.test:{port}")).unwrap(),
    ];
    let policy = SandboxPolicy::for_sandbox(&HostConfig::default(), &extra, None, egress).unwrap();
    let placeholder = policy
        .placeholders
        .entries()
        .iter()
        .find(|e| {
            e.hosts
                .iter()
                .any(|h| h.to_string().starts_with("api.example.test"))
        })
        .unwrap()
        .placeholder
        .expose()
        .to_owned();
    let ca = Arc::new(SandboxCa::generate("proxy-test").unwrap());
    let dir = svc_tests::fresh_dir("svcpx");
    let ca_pem = dir.join("ca.pem");
    std::fs::write(&ca_pem, ca.ca_pem()).unwrap();
    let sandbox = Arc::new(ProxySandbox {
        id: 5,
        policy,
        ca,
        incarnation: Default::default(),
    });
    let audit = Arc::new(Audit::default());
    let mut config = ProxyConfig::with_roots(&[upstream_ca.ca_der()]).unwrap();
    // The upstream is on loopback: the operator's exception opens that class for these tests.
    config.network.allow_cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    tune(&mut config);
    let sandboxes = Arc::new(One::new(
        sandbox,
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
    ));
    let proxy = Arc::new(Proxy::new(
        config,
        sandboxes.clone(),
        Arc::new(RealTokens),
        Arc::new(Loopback),
        audit.clone(),
    ));
    let proxy_port = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let p = l.local_addr().unwrap().port();
        tokio::spawn(proxy.serve(l, std::future::pending()));
        p
    });
    World {
        proxy_port,
        port,
        ca_pem,
        placeholder,
        seen,
        audit,
        sandboxes,
        _rt: rt,
        dir,
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// curl as the guest: it believes it talks to `name:port`; the connection goes to the proxy.
fn curl(w: &World, name: &str, path: &str, extra: &[&str]) -> (u16, String, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "5", "-D", "-", "--cacert"])
        .arg(&w.ca_pem)
        .arg("--connect-to")
        .arg(format!("{name}:{}:127.0.0.1:{}", w.port, w.proxy_port))
        .args(extra)
        .arg(format!("https://{name}:{}{path}", w.port))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // The last status line: an interim `100 Continue` comes first for large uploads.
    let status = text
        .lines()
        .rev()
        .find(|l| l.starts_with("HTTP/"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (
        status,
        text,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// curl asking `path` of api.example.test `count` times on one guest connection (curl keeps it
/// alive) with `version` (`--http1.1`, `--http2`), bodies dropped, `write_out` after each.
fn curl_repeated(
    w: &World,
    version: &str,
    path: &str,
    count: usize,
    write_out: &str,
) -> std::process::Output {
    let url = format!("https://api.example.test:{}{path}", w.port);
    Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            version,
            "-w",
            write_out,
            "--cacert",
        ])
        .arg(&w.ca_pem)
        .arg("--connect-to")
        .arg(format!(
            "api.example.test:{}:127.0.0.1:{}",
            w.port, w.proxy_port
        ))
        .args((0..count).flat_map(|_| ["-o", "/dev/null", url.as_str()]))
        .output()
        .unwrap()
}

#[test]
fn head_requests_are_answered_on_both_protocols() {
    // Found end to end: over HTTP/2 a HEAD answer went out as an empty stream under the
    // upstream's Content-Length, and curl saw the stream reset (PROTOCOL_ERROR).
    let w = world();
    for version in ["--http1.1", "--http2"] {
        let (status, text, err) = curl(&w, "api.example.test", "/head", &["-I", version]);
        assert_eq!(status, 200, "{version}: {text}{err}");
        assert!(err.is_empty(), "{version}: {err}");
    }
}

#[test]
fn allowed_request_reaches_the_upstream_with_the_real_token_and_never_shows_it() {
    let w = world();
    let auth = format!("Authorization: Bearer {}", w.placeholder);
    for version in ["--http1.1", "--http2"] {
        let (status, text, err) = curl(
            &w,
            "api.example.test",
            "/hello?x=1",
            &[version, "-H", &auth],
        );
        assert_eq!(status, 200, "{version}: {text}{err}");
        assert!(
            text.contains(&format!("path=/hello host=api.example.test:{}", w.port)),
            "{text}"
        );
        assert!(
            !text.contains("REAL-"),
            "{version}: a real token reached the guest: {text}"
        );
        assert!(
            text.to_ascii_lowercase()
                .contains(&format!("x-echo-auth: bearer {}", w.placeholder)),
            "the echoing header shows the placeholder: {text}"
        );
    }
    let seen = w.seen.lock().unwrap().clone();
    assert!(
        seen.iter()
            .all(|s| s.contains("auth=Bearer REAL-host-api.example.test")),
        "the upstream saw the real token: {seen:?}"
    );
    assert!(
        !seen.iter().any(|s| s.contains(&w.placeholder)),
        "the upstream never saw the placeholder"
    );
    let wanted = |a: &HttpEvent| {
        a.decision == "allow" && a.credential == "swapped" && a.path.as_deref() == Some("/hello")
    };
    let audits = w.audit.http_until(|r| r.iter().any(wanted));
    assert!(audits.iter().any(wanted), "{audits:?}");
    assert!(
        !format!("{audits:?}").contains("REAL-") && !format!("{audits:?}").contains(&w.placeholder),
        "no token in audit records"
    );
}

/// The address the guest dialled is the one the proxy connects to, and only if its destination
/// class may be dialled: here the upstream is on loopback and no operator CIDR opens it, so
/// every request is refused with 403 naming the class, audited with the address, and the
/// upstream sees nothing (on either protocol).
#[test]
fn a_dialled_address_of_a_refused_class_is_refused_naming_its_class() {
    let w = world_with(|c| c.network.allow_cidrs.clear());
    for version in ["--http1.1", "--http2"] {
        let (status, text, _) = curl(&w, "api.example.test", "/hello", &[version]);
        assert_eq!(status, 403, "{version}: {text}");
        assert!(
            text.contains("\"perimeter\":\"svc egress perimeter\"")
                && text.contains("\"rule\":\"destination-class:loopback\"")
                && text.contains(&format!("127.0.0.1:{}", w.port)),
            "{version}: {text}"
        );
    }
    assert!(
        w.seen.lock().unwrap().is_empty(),
        "the upstream saw {:?}",
        w.seen.lock().unwrap()
    );
    let dialled = Some(format!("127.0.0.1:{}", w.port));
    let records = w.audit.http_until(|r| r.len() >= 2);
    assert!(
        records.len() == 2
            && records.iter().all(|r| r.decision == "deny"
                && r.rule == "destination-class:loopback"
                && r.dialled == dialled),
        "{records:?}"
    );
}

#[test]
fn allowed_requests_are_audited_with_the_address_dialled() {
    let w = world();
    let (status, text, _) = curl(&w, "api.example.test", "/hello", &["--http2"]);
    assert_eq!(status, 200, "{text}");
    let dialled = Some(format!("127.0.0.1:{}", w.port));
    let records = w
        .audit
        .http_until(|r| r.iter().any(|r| r.decision == "allow"));
    assert!(
        records
            .iter()
            .any(|r| r.decision == "allow" && r.dialled == dialled),
        "{records:?}"
    );
}

#[test]
fn refusals_are_json_from_the_perimeter() {
    let w = world();
    // Domain fronting: SNI api.example.test, Host other.example.test.
    let (status, text, _) = curl(
        &w,
        "api.example.test",
        "/",
        &[
            "--http1.1",
            "-H",
            &format!("Host: other.example.test:{}", w.port),
        ],
    );
    assert_eq!(status, 421, "{text}");
    assert!(
        text.contains("\"perimeter\":\"svc egress perimeter\"")
            && text.contains("authority-mismatch"),
        "{text}"
    );
    // A path outside egress.policy on a gated host.
    let (status, text, _) = curl(&w, "gated.example.test", "/admin", &["--http2"]);
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("policy-default-deny"), "{text}");
    // A placeholder in the query string.
    let (status, text, _) = curl(
        &w,
        "api.example.test",
        &format!("/x?key={}", w.placeholder),
        &[],
    );
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("credential-leak"), "{text}");
    // TRACE.
    let (status, _, _) = curl(&w, "api.example.test", "/", &["-X", "TRACE"]);
    assert_eq!(status, 403);
    assert!(
        w.seen.lock().unwrap().is_empty(),
        "none of these reached the upstream"
    );
}

#[test]
fn server_names_off_the_list_get_no_tls_at_all() {
    let w = world();
    let (status, _, err) = curl(&w, "evil.example.org", "/", &[]);
    assert_eq!(status, 0, "no HTTP answer: {err}");
    let audits = w.audit.0.lock().unwrap().clone();
    assert!(audits.iter().any(|r| matches!(&r.event, AuditEvent::Http(h) if h.rule.contains("evil.example.org is not allowed"))), "{audits:?}");
}

/// A raw TLS client: connect to the proxy with `sni` (None: no SNI), trusting the sandbox CA,
/// send `raw` and return the status code of the first response (0 when there is none).
fn raw(w: &World, sni: Option<&str>, raw: &[u8]) -> u16 {
    let ca_pem = std::fs::read(&w.ca_pem).unwrap();
    let port = w.proxy_port;
    let raw = raw.to_vec();
    let sni = sni.map(str::to_owned);
    w._rt.block_on(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut cfg = guest_tls(&ca_pem, None);
        cfg.enable_sni = sni.is_some();
        let name = rustls::pki_types::ServerName::try_from(
            sni.clone().unwrap_or_else(|| "api.example.test".into()),
        )
        .unwrap();
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let Ok(mut tls) = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(name, tcp)
            .await
        else {
            return 0;
        };
        if tls.write_all(&raw).await.is_err() {
            return 0;
        }
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(std::time::Duration::from_secs(3), tls.read(&mut buf))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(0);
        String::from_utf8_lossy(&buf[..n])
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0)
    })
}

/// A guest's TLS client: trusts the sandbox CA (PEM) only, offers `alpn` if given.
fn guest_tls(ca_pem: &[u8], alpn: Option<&[u8]>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile_free(ca_pem) {
        roots.add(c).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = alpn.map(|a| vec![a.to_vec()]).unwrap_or_default();
    cfg
}

/// DER certificates from a PEM file (one certificate here).
fn rustls_pemfile_free(pem: &[u8]) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject as _;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem)
        .map(Result::unwrap)
        .collect()
}

#[test]
fn sni_forms() {
    let w = world();
    let ok = |host: &str| {
        format!(
            "GET / HTTP/1.1\r\nHost: {host}:{}\r\nConnection: close\r\n\r\n",
            w.port
        )
        .into_bytes()
    };
    assert_eq!(
        raw(&w, Some("api.example.test"), &ok("api.example.test")),
        200,
        "the plain case works"
    );
    assert_eq!(raw(&w, None, &ok("api.example.test")), 0, "no SNI: no TLS");
    assert_eq!(
        raw(&w, Some("API.Example.TEST"), &ok("api.example.test")),
        200,
        "SNI in another case is the same name"
    );
    assert_eq!(
        raw(&w, Some("api.example.test"), &ok("API.EXAMPLE.test.")),
        200,
        "Host with a trailing dot and another case is the same name"
    );
    assert_eq!(
        raw(&w, Some("other.example.test"), &ok("api.example.test")),
        421,
        "Host of another allowed name on this connection"
    );
}

#[test]
fn request_smuggling_is_refused_before_the_upstream() {
    let w = world();
    let p = w.port;
    let cases: Vec<(&str, String)> = vec![
        (
            "duplicate_content_length",
            format!(
                "POST / HTTP/1.1\r\nHost: api.example.test:{p}\r\nContent-Length: 4\r\nContent-Length: 40\r\n\r\nabcd"
            ),
        ),
        (
            "bad_chunk_size",
            format!(
                "POST / HTTP/1.1\r\nHost: api.example.test:{p}\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
            ),
        ),
        (
            "obs_fold",
            format!("GET / HTTP/1.1\r\nHost: api.example.test:{p}\r\nX-A: one\r\n two\r\n\r\n"),
        ),
        (
            "space_in_header_name",
            format!("GET / HTTP/1.1\r\nHost: api.example.test:{p}\r\nX A: b\r\n\r\n"),
        ),
        (
            "bare_cr_in_value",
            format!("GET / HTTP/1.1\r\nHost: api.example.test:{p}\r\nX-A: a\rInjected: 1\r\n\r\n"),
        ),
        (
            "absolute_form_other_host",
            format!("GET https://evil.example.org/ HTTP/1.1\r\nHost: api.example.test:{p}\r\n\r\n"),
        ),
        (
            "connect",
            "CONNECT evil.example.org:443 HTTP/1.1\r\nHost: evil.example.org:443\r\n\r\n"
                .to_string(),
        ),
        (
            "two_hosts",
            format!(
                "GET / HTTP/1.1\r\nHost: api.example.test:{p}\r\nHost: other.example.test:{p}\r\n\r\n"
            ),
        ),
    ];
    let mut failures = Vec::new();
    for (name, req) in &cases {
        let status = raw(&w, Some("api.example.test"), req.as_bytes());
        if status != 0 && !(400..500).contains(&status) {
            failures.push(format!("{name}: got {status}"));
        }
    }
    let seen = w.seen.lock().unwrap().clone();
    assert!(failures.is_empty(), "{failures:?}");
    assert!(
        !seen.iter().any(|s| s.contains("smuggled")),
        "nothing smuggled reached the upstream: {seen:?}"
    );
    assert!(
        seen.is_empty(),
        "no malformed request reached the upstream: {seen:?}"
    );
}

#[test]
fn content_length_with_transfer_encoding_is_refused_and_never_reaches_the_upstream() {
    // hyper would decode by Transfer-Encoding and drop Content-Length before the proxy sees
    // the request (RFC 9112 6.1); the proxy's framing witness (proxy::h1_frames) sees the raw
    // head and the request is refused: 400, nothing upstream. Both header orders, and as the
    // second request of a kept-alive connection after a clean one.
    let w = world();
    let p = w.port;
    let cases = [
        format!(
            "POST /cl-te HTTP/1.1\r\nHost: api.example.test:{p}\r\nContent-Length: 40\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n"
        ),
        format!(
            "POST /te-cl HTTP/1.1\r\nHost: api.example.test:{p}\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\nConnection: close\r\n\r\n0\r\n\r\n"
        ),
    ];
    for req in &cases {
        assert_eq!(
            raw(&w, Some("api.example.test"), req.as_bytes()),
            400,
            "{req}"
        );
    }
    assert!(
        w.seen.lock().unwrap().is_empty(),
        "nothing reached the upstream: {:?}",
        w.seen.lock().unwrap()
    );
    // A clean request, then the smuggling shape on the same connection: the first is served,
    // the second never leaves the proxy.
    let pipelined = format!(
        "GET /clean HTTP/1.1\r\nHost: api.example.test:{p}\r\n\r\nPOST /second HTTP/1.1\r\nHost: api.example.test:{p}\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    );
    assert_eq!(raw(&w, Some("api.example.test"), pipelined.as_bytes()), 200);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let seen = w.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert!(seen[0].contains("/clean"), "{seen:?}");
    let (status, text, _) = curl(&w, "api.example.test", "/after", &[]);
    assert_eq!(status, 200, "{text}");
}

#[test]
fn losing_the_audit_log_makes_the_proxy_refuse() {
    let w = world();
    assert_eq!(curl(&w, "api.example.test", "/", &[]).0, 200);
    let reached = w.seen.lock().unwrap().len();
    w.audit.1.store(true, std::sync::atomic::Ordering::Relaxed);
    let (status, text, _) = curl(&w, "api.example.test", "/", &[]);
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("\"rule\":\"audit\""), "{text}");
    assert_eq!(
        w.seen.lock().unwrap().len(),
        reached,
        "an unrecordable request never reaches the upstream"
    );
    // The sink recovers: requests flow again.
    w.audit.1.store(false, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(curl(&w, "api.example.test", "/", &[]).0, 200);
}

#[test]
fn large_bodies_stream_both_ways() {
    let w = world();
    let file = w.dir.join("upload.bin");
    std::fs::write(&file, vec![7u8; 64 * 1024 * 1024]).unwrap();
    for version in ["--http1.1", "--http2"] {
        let (status, text, err) = curl(
            &w,
            "api.example.test",
            "/count",
            &[version, "--data-binary", &format!("@{}", file.display())],
        );
        assert_eq!(status, 200, "{version}: {err}");
        assert!(
            text.contains(&format!("bytes={}", 64 * 1024 * 1024)),
            "{version}: the upstream received every byte: {text}"
        );
        let out = curl_repeated(&w, version, "/big", 1, "%{size_download}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            (64 * 1024 * 1024).to_string(),
            "{version}: the whole download"
        );
    }
    // The audit log has the bytes each way, per request.
    const MIB64: u64 = 64 * 1024 * 1024;
    let up = |a: &HttpEvent| a.path.as_deref() == Some("/count") && a.bytes_up == MIB64;
    let down = |a: &HttpEvent| a.path.as_deref() == Some("/big") && a.bytes_down == MIB64;
    let audits = w.audit.http_until(|r| {
        r.iter().filter(|a| up(a)).count() == 2 && r.iter().filter(|a| down(a)).count() == 2
    });
    assert_eq!(audits.iter().filter(|a| up(a)).count(), 2, "{audits:?}");
    assert_eq!(audits.iter().filter(|a| down(a)).count(), 2, "{audits:?}");
}

/// Regression: bodiless requests once went upstream as open-ended streams the proxy then reset;
/// the upstream's HTTP/2 reset-flood guard closed the pooled connection after a few dozen.
/// A hundred GETs on one kept-alive guest connection must all pass, on both guest protocols.
#[test]
fn a_hundred_gets_on_one_connection_all_pass() {
    let w = world();
    for version in ["--http1.1", "--http2"] {
        let out = curl_repeated(&w, version, "/n", 100, "%{http_code} %{num_connects}\\n");
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 100, "{version}: {text}");
        assert!(
            lines.iter().all(|l| l.starts_with("200 ")),
            "{version}: {text}"
        );
        let connects: u32 = lines.iter().map(|l| l[4..].parse::<u32>().unwrap()).sum();
        assert_eq!(
            connects, 1,
            "{version}: one guest connection for all: {text}"
        );
    }
}

#[test]
fn an_http1_guest_goes_upstream_over_kept_alive_http1_and_an_http2_guest_over_http2() {
    // The upstream offers h2 and http/1.1. An HTTP/1.1 guest's requests travel upstream over
    // HTTP/1.1 (as nginx sends them), one connection reused for all of them; an HTTP/2 guest's
    // over HTTP/2.
    let w = world();
    for (version, upstream_version) in [("--http1.1", "HTTP/1.1"), ("--http2", "HTTP/2.0")] {
        let out = curl_repeated(
            &w,
            version,
            "/v",
            20,
            "%{http_code} %header{x-upstream-version} %header{x-upstream-conn}\\n",
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split(' ').collect()).collect();
        assert_eq!(
            lines.len(),
            20,
            "{version}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        for l in &lines {
            assert_eq!(l[..2], ["200", upstream_version], "{version}: {text}");
        }
        assert!(
            lines.iter().all(|l| l[2] == lines[0][2]),
            "{version}: one upstream connection for all twenty: {text}"
        );
    }
}

/// The sandbox CA installed into a guest root (system roots kept), and the guest's variables:
/// curl with nothing but the environment trusts the proxy; the plain system bundle does not.
#[test]
fn the_guest_trust_store_and_variables_make_curl_trust_the_proxy() {
    use svc_control::proxy::guest_trust;
    let w = world();
    let root = w.dir.join("guest-root");
    let bundle = root.join(guest_trust::GUEST_BUNDLE.trim_start_matches('/'));
    std::fs::create_dir_all(bundle.parent().unwrap()).unwrap();
    std::fs::copy("/etc/ssl/certs/ca-certificates.crt", &bundle).unwrap();
    let run = |bundle: &Path| {
        let mut cmd = Command::new("curl");
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .args([
                "-sS",
                "--max-time",
                "5",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .arg("--connect-to")
            .arg(format!(
                "api.example.test:{}:127.0.0.1:{}",
                w.port, w.proxy_port
            ))
            .arg(format!("https://api.example.test:{}/", w.port));
        // The guest's CURL_CA_BUNDLE, resolved under the test's guest root.
        cmd.env("CURL_CA_BUNDLE", bundle);
        cmd.output().unwrap()
    };
    let before = run(&bundle);
    assert_ne!(
        String::from_utf8_lossy(&before.stdout),
        "200",
        "the system roots alone must not trust the sandbox CA"
    );
    let system = std::fs::read_to_string(&bundle).unwrap();
    let trust =
        guest_trust::trust_files(&system, &std::fs::read_to_string(&w.ca_pem).unwrap()).unwrap();
    std::fs::write(&bundle, trust.bundle).unwrap();
    let after = run(&bundle);
    assert_eq!(
        String::from_utf8_lossy(&after.stdout),
        "200",
        "{}",
        String::from_utf8_lossy(&after.stderr)
    );
    let text = std::fs::read_to_string(&bundle).unwrap();
    let system = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap();
    assert!(
        text.starts_with(&system),
        "the system roots are kept byte for byte"
    );
    assert!(
        guest_trust::guest_env().contains(&("CURL_CA_BUNDLE", guest_trust::GUEST_BUNDLE)),
        "the guest's curl reads the bundle the CA went into"
    );
    let vars: Vec<&str> = guest_trust::guest_env().iter().map(|(n, _)| *n).collect();
    assert_eq!(
        vars,
        [
            "SSL_CERT_FILE",
            "NODE_EXTRA_CA_CERTS",
            "REQUESTS_CA_BUNDLE",
            "CURL_CA_BUNDLE",
            "GIT_SSL_CAINFO"
        ]
    );
}

/// A raw TLS connection to the proxy for `api.example.test`, from the test runtime.
/// A WebSocket handshake to api.example.test's `/ws` through the proxy (TLS trusting
/// `ca_pem`): the stream and the handshake's response.
async fn websocket_to_api(
    w: &World,
    ca_pem: &[u8],
) -> (
    tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>,
    tokio_tungstenite::tungstenite::handshake::client::Response,
) {
    let tls = tls_to_proxy(ca_pem, w.proxy_port)
        .await
        .expect("TLS to the proxy");
    let request = hyper::Request::builder()
        .uri(format!("wss://api.example.test:{}/ws", w.port))
        .header("host", format!("api.example.test:{}", w.port))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header(
            "sec-websocket-key",
            tokio_tungstenite::tungstenite::handshake::client::generate_key(),
        )
        .body(())
        .unwrap();
    tokio_tungstenite::client_async(request, tls)
        .await
        .expect("the handshake through the proxy")
}

async fn tls_to_proxy(
    ca_pem: &[u8],
    port: u16,
) -> Option<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    tls_to_proxy_alpn(ca_pem, port, b"http/1.1").await
}

async fn tls_to_proxy_alpn(
    ca_pem: &[u8],
    port: u16,
    alpn: &[u8],
) -> Option<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let cfg = guest_tls(ca_pem, Some(alpn));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(
            rustls::pki_types::ServerName::try_from("api.example.test").unwrap(),
            tcp,
        )
        .await
        .ok()
}

/// Very large heads get 431 from the perimeter and never reach the upstream.
#[test]
fn very_large_headers_are_refused() {
    let w = world();
    let big = "a".repeat(100 * 1024);
    for version in ["--http1.1", "--http2"] {
        let before = w.seen.lock().unwrap().len();
        let (status, text, err) = curl(
            &w,
            "api.example.test",
            "/big-head",
            &[version, "-H", &format!("X-Big: {big}")],
        );
        assert!(
            status == 431 || (version == "--http2" && status == 0),
            "{version}: a 100 KiB header must be refused (431, or the HTTP/2 stream reset): \
             {status} {text}{err}"
        );
        assert_eq!(
            w.seen.lock().unwrap().len(),
            before,
            "{version}: never upstream"
        );
    }
    // A large head well under the cap passes (12 KiB: the test upstream's own HTTP/2 limit is
    // 16 KiB).
    let (status, text, _) = curl(
        &w,
        "api.example.test",
        "/",
        &[
            "--http1.1",
            "-H",
            &format!("X-Big: {}", "a".repeat(12 * 1024)),
        ],
    );
    assert_eq!(status, 200, "{text}");
}

/// Slowloris: a request head trickled in and never finished is dropped at the header timeout;
/// the proxy keeps serving others meanwhile.
#[test]
fn a_trickled_request_head_is_dropped_at_the_header_timeout() {
    let w = world_with(|c| c.header_timeout = std::time::Duration::from_secs(1));
    let ca_pem = std::fs::read(&w.ca_pem).unwrap();
    let port = w.proxy_port;
    let closed = w._rt.block_on(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tls = tls_to_proxy(&ca_pem, port).await.expect("TLS to the proxy");
        tls.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        // One header byte a quarter second; the head is never finished.
        let trickle = async {
            for b in b"X-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                .iter()
                .cycle()
            {
                if tls.write_all(&[*b]).await.is_err() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                let mut buf = [0u8; 512];
                if let Ok(r) =
                    tokio::time::timeout(std::time::Duration::from_millis(1), tls.read(&mut buf))
                        .await
                {
                    // Closed (0), an error, or hyper's 408 before the close: all a drop.
                    return Some(r.map_or(0, |n| n));
                }
            }
            None
        };
        tokio::time::timeout(std::time::Duration::from_secs(15), trickle)
            .await
            .ok()
            .flatten()
    });
    assert!(
        closed.is_some(),
        "the proxy must drop a head that never ends"
    );
    assert_eq!(
        curl(&w, "api.example.test", "/", &[]).0,
        200,
        "others are served"
    );
}

/// One sandbox may not hold more than its cap of open connections; the next is closed and
/// audited, and a slot frees when a connection closes.
#[test]
fn connections_over_the_per_sandbox_cap_are_refused() {
    let w = world_with(|c| {
        c.limits = Arc::new(GuestLimits::new(
            LimitsConfig {
                proxy_connections: 8,
                ..LimitsConfig::default()
            },
            Arc::new(Unreported),
        ));
    });
    let ca_pem = std::fs::read(&w.ca_pem).unwrap();
    let port = w.proxy_port;
    let (held, extra) = w._rt.block_on(async move {
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(tls_to_proxy(&ca_pem, port).await);
        }
        let extra = tls_to_proxy(&ca_pem, port).await;
        (held, extra.is_some())
    });
    assert!(
        held.iter().all(Option::is_some),
        "eight connections are within the cap"
    );
    assert!(!extra, "the ninth gets no TLS");
    let audits = w.audit.0.lock().unwrap().clone();
    assert!(
        audits.iter().any(|r| matches!(&r.event, AuditEvent::Http(h)
            if h.rule.contains("already holds 8 proxy connections (limits.proxy_connections)"))),
        "{audits:?}"
    );
    drop(held);
    // The slots free as the held connections close.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (status, _, _) = curl(&w, "api.example.test", "/", &[]);
        if status == 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "slots never freed");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// HTTP/2 connection coalescing: on a connection opened for api.example.test, a stream for
/// another allowed name gets 421 and never reaches the upstream; the connection stays usable for
/// its own name. HTTP/1.1 keep-alive: the second request naming another host, likewise.
#[test]
fn a_connection_serves_only_the_name_it_was_opened_for() {
    let w = world();
    let ca_pem = std::fs::read(&w.ca_pem).unwrap();
    let (port, upstream_port) = (w.proxy_port, w.port);
    let before = w.seen.lock().unwrap().len();
    let statuses = w._rt.block_on(async move {
        let mut out = Vec::new();
        for alpn in [&b"h2"[..], &b"http/1.1"[..]] {
            let tls = tls_to_proxy_alpn(&ca_pem, port, alpn).await.unwrap();
            let io = TokioIo::new(tls);
            let names = ["api.example.test", "other.example.test", "api.example.test"];
            if alpn == b"h2" {
                let (mut send, conn) =
                    hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                        .await
                        .unwrap();
                tokio::spawn(conn);
                for name in names {
                    let req = Request::get(format!("https://{name}:{upstream_port}/c"))
                        .body(http_body_util::Empty::<Bytes>::new())
                        .unwrap();
                    out.push(
                        send.send_request(req)
                            .await
                            .map_or(0, |r| r.status().as_u16()),
                    );
                }
            } else {
                let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
                tokio::spawn(conn);
                for name in names {
                    let req = Request::get("/c")
                        .header("host", format!("{name}:{upstream_port}"))
                        .body(http_body_util::Empty::<Bytes>::new())
                        .unwrap();
                    send.ready().await.ok();
                    out.push(
                        send.send_request(req)
                            .await
                            .map_or(0, |r| r.status().as_u16()),
                    );
                }
            }
        }
        out
    });
    assert_eq!(statuses, [200, 421, 200, 200, 421, 200], "h2 then HTTP/1.1");
    let seen = w.seen.lock().unwrap();
    assert_eq!(
        seen.len() - before,
        4,
        "only the requests for the connection's own name: {seen:?}"
    );
    assert!(
        !seen.iter().any(|s| s.contains("other.example.test")),
        "{seen:?}"
    );
}

/// A reconnecting guest resumes its TLS session (one server configuration per name, kept), and
/// the resumed connection is still bound to its name.
#[test]
fn a_reconnecting_guest_resumes_its_tls_session() {
    let w = world();
    let ca_pem = std::fs::read(&w.ca_pem).unwrap();
    let port = w.proxy_port;
    let kinds = w._rt.block_on(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let connector =
            tokio_rustls::TlsConnector::from(Arc::new(guest_tls(&ca_pem, Some(b"http/1.1"))));
        let mut kinds = Vec::new();
        for _ in 0..2 {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .unwrap();
            let mut tls = connector
                .connect(
                    rustls::pki_types::ServerName::try_from("api.example.test").unwrap(),
                    tcp,
                )
                .await
                .unwrap();
            tls.write_all(
                b"GET / HTTP/1.1\r\nHost: other.example.test\r\nConnection: close\r\n\r\n",
            )
            .await
            .unwrap();
            let mut out = Vec::new();
            let _ = tls.read_to_end(&mut out).await;
            kinds.push((
                tls.get_ref().1.handshake_kind(),
                String::from_utf8_lossy(&out)
                    .split_whitespace()
                    .nth(1)
                    .map(str::to_owned),
            ));
        }
        kinds
    });
    assert_eq!(kinds[0].0, Some(rustls::HandshakeKind::Full), "{kinds:?}");
    assert_eq!(
        kinds[1].0,
        Some(rustls::HandshakeKind::Resumed),
        "{kinds:?}"
    );
    assert!(
        kinds.iter().all(|(_, s)| s.as_deref() == Some("421")),
        "a resumed connection is bound to its name as much as a new one: {kinds:?}"
    );
}

/// A WebSocket through the proxy: the handshake passes the same checks, the upgraded stream is
/// relayed both ways, and the handshake and the close are audited with the bytes each way. A
/// handshake carrying a placeholder is refused (403 `upgrade-credential`): the upgraded stream
/// cannot be scrubbed of the real token. Other upgrades (h2c) are refused with a reason.
#[test]
fn websockets_are_relayed_after_the_same_checks_and_other_upgrades_refused() {
    use futures::{SinkExt as _, StreamExt as _};
    let w = world();
    let ca = std::fs::read(&w.ca_pem).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (mut ws, resp) = websocket_to_api(&w, &ca).await;
        assert_eq!(resp.status(), 101);
        for text in ["hello", "again"] {
            ws.send(tokio_tungstenite::tungstenite::Message::text(text))
                .await
                .unwrap();
            let got = ws.next().await.expect("an answer").unwrap();
            assert_eq!(got.into_text().unwrap().as_str(), format!("echo:{text}"));
        }
        ws.close(None).await.unwrap();
        while ws.next().await.is_some() {}
    });
    // Audited: the handshake at once, the close with bytes each way.
    let records = w
        .audit
        .http_until(|r| r.iter().any(|e| e.upgrade == Some("websocket-closed")));
    let opened = records
        .iter()
        .find(|e| e.upgrade == Some("websocket"))
        .expect("handshake record");
    assert_eq!(opened.status, 101);
    assert_eq!(opened.credential, "none");
    let closed = records
        .iter()
        .find(|e| e.upgrade == Some("websocket-closed"))
        .expect("close record");
    assert!(closed.bytes_up > 10 && closed.bytes_down > 10, "{closed:?}");

    // A handshake with the placeholder: refused, nothing upstream, no token anywhere.
    let handshakes = || {
        let seen = w.seen.lock().unwrap();
        seen.iter().filter(|l| l.starts_with("WS ")).count()
    };
    let before = handshakes();
    let bearer = format!("Authorization: Bearer {}", w.placeholder);
    let (code, body, _) = curl(
        &w,
        "api.example.test",
        "/ws",
        &[
            "--http1.1",
            "-H",
            &bearer,
            "-H",
            "Connection: Upgrade",
            "-H",
            "Upgrade: websocket",
            "-H",
            "Sec-WebSocket-Version: 13",
            "-H",
            "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        ],
    );
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("upgrade-credential"), "{body}");
    assert!(body.contains("not swapped on protocol upgrades"), "{body}");
    assert_eq!(
        handshakes(),
        before,
        "the refused handshake reached the upstream"
    );

    // h2c and other upgrades: 400 with the rule, nothing upstream.
    let (code, body, _) = curl(
        &w,
        "api.example.test",
        "/h2c",
        &[
            "--http1.1",
            "-H",
            "Connection: Upgrade, HTTP2-Settings",
            "-H",
            "Upgrade: h2c",
            "-H",
            "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA",
        ],
    );
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("upgrade-refused"), "{body}");
    assert!(!w.seen.lock().unwrap().iter().any(|l| l.contains("/h2c")));
}

#[test]
fn a_websocket_is_cut_when_a_live_change_removes_its_host() {
    use futures::{SinkExt as _, StreamExt as _};
    let w = world();
    let ca = std::fs::read(&w.ca_pem).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (mut ws, resp) = websocket_to_api(&w, &ca).await;
        assert_eq!(resp.status(), 101);
        ws.send(tokio_tungstenite::tungstenite::Message::text("one"))
            .await
            .unwrap();
        let got = ws.next().await.expect("an answer").unwrap();
        assert_eq!(got.into_text().unwrap().as_str(), "echo:one");

        // The allowlist changes: api.example.test leaves, other.example.test stays.
        let old = w.sandboxes.get();
        let keep = [HostPattern::parse(&format!("other.example.test:{}", w.port)).unwrap()];
        let policy = SandboxPolicy::for_sandbox(
            &HostConfig::default(),
            &keep,
            None,
            egress::EgressConfig::default(),
        )
        .unwrap();
        *w.sandboxes.current.write().unwrap() = Arc::new(ProxySandbox {
            id: old.id,
            policy,
            ca: old.ca.clone(),
            incarnation: old.incarnation.clone(),
        });
        w.sandboxes
            .revocations
            .send(svc_control::proxy::Revocation {
                sandbox: old.id,
                addrs: Arc::new(Vec::new()),
            })
            .unwrap();
        // The relay ends: the next read sees the connection go, not an echo.
        let _ = ws
            .send(tokio_tungstenite::tungstenite::Message::text("two"))
            .await;
        let next = tokio::time::timeout(std::time::Duration::from_secs(5), ws.next())
            .await
            .expect("the connection ended in time");
        assert!(
            !matches!(&next, Some(Ok(m)) if m.to_text().unwrap_or("") == "echo:two"),
            "a message reached the removed host: {next:?}"
        );
    });
    let records = w
        .audit
        .http_until(|r| r.iter().any(|e| e.upgrade == Some("websocket-cut")));
    assert!(records.iter().any(|e| e.upgrade == Some("websocket-cut")));
}

/// An upstream that echoes the request's headers (an httpbin-style `/headers`, a debug page)
/// hands back the credential the proxy swapped in: the guest sees its placeholder instead, in
/// the body (with a length, and chunked with the credential straddling chunks) and in the
/// headers, over HTTP/1.1 and HTTP/2; the upstream was asked for an identity encoding and no
/// range, and each scrubbed answer is audited as `credential-echo`.
#[test]
fn an_echoed_credential_reaches_the_guest_as_its_placeholder() {
    let w = world();
    let auth = format!("Authorization: Bearer {}", w.placeholder);
    for version in ["--http1.1", "--http2"] {
        for path in ["/echo/length", "/echo/chunked"] {
            let (status, text, err) = curl(
                &w,
                "api.example.test",
                path,
                &[
                    version,
                    "-H",
                    &auth,
                    "-H",
                    "Accept-Encoding: gzip, br",
                    "-H",
                    "Range: bytes=0-9",
                ],
            );
            assert_eq!(status, 200, "{version} {path}: {text}{err}");
            assert!(
                !text.contains("REAL-"),
                "{version} {path}: the real token reached the guest: {text}"
            );
            let lower = text.to_ascii_lowercase();
            assert!(
                lower.contains(&format!("\"authorization\": \"bearer {}\"", w.placeholder)),
                "{version} {path}: the echo shows the placeholder: {text}"
            );
            assert!(
                lower.contains(&format!("x-echo-auth: bearer {}", w.placeholder)),
                "{version} {path}: {text}"
            );
            assert!(
                lower.contains("\"accept-encoding\": \"identity\"") && !lower.contains("\"range\""),
                "{version} {path}: the upstream was asked for identity and no range: {text}"
            );
        }
    }
    let echoes = |r: &[HttpEvent]| {
        r.iter()
            .filter(|e| e.rule == "credential-echo" && e.decision == "scrubbed")
            .count()
    };
    let records = w.audit.http_until(|r| echoes(r) >= 4);
    assert_eq!(echoes(&records), 4, "{records:?}");
    assert!(!format!("{records:?}").contains("REAL-"));
}

/// An upstream that compresses its answer to a swapped request although asked for identity
/// cannot be scanned: the guest gets a refusal, never the body, and the refusal is audited.
#[test]
fn a_compressed_answer_to_a_swapped_request_is_refused() {
    let w = world();
    let auth = format!("Authorization: Bearer {}", w.placeholder);
    for version in ["--http1.1", "--http2"] {
        let (status, text, err) = curl(
            &w,
            "api.example.test",
            "/echo/gzip",
            &[version, "-H", &auth],
        );
        assert_eq!(status, 502, "{version}: {text}{err}");
        assert!(!text.contains("REAL-"), "{version}: {text}");
        assert!(text.contains("credential-echo"), "{version}: {text}");
    }
    // Without a swapped credential there is nothing to scan for: the answer passes as it is.
    let (status, text, err) = curl(&w, "api.example.test", "/echo/gzip", &["--http1.1"]);
    assert_eq!(status, 200, "{text}{err}");
    let refused = |r: &[HttpEvent]| {
        r.iter()
            .filter(|e| e.rule == "credential-echo" && e.decision == "deny" && e.status == 502)
            .count()
    };
    let records = w.audit.http_until(|r| refused(r) >= 2);
    assert_eq!(refused(&records), 2, "{records:?}");
}
