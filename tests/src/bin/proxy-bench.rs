//! The HTTPS proxy benchmark: the same requests to the same upstream, direct TLS and through the
//! proxy, side by side in one run, so the comparison survives the drift of shared machines.
//!
//! The upstream (hyper + rustls, a test CA) listens on 127.0.0.2:P, the proxy on 127.0.0.1:P.
//! The client is hyper over tokio-rustls trusting both CAs; it dials one address or the other
//! with SNI and Host `api.example.test:P`. Variants: HTTP/1.1 and HTTP/2, keep-alive (one
//! connection, requests one after another: latency; 16 in flight: rate) and a new TLS connection
//! per request. Also: minting a leaf for a host not seen yet.
//!
//! The comparisons with nginx run in rounds (`--rounds N`, default 5): each round measures
//! direct, svc and nginx, svc first in odd rounds and nginx first in even ones, and the ratio is
//! the median of the rounds' own ratios with their min and max; each round's ratio is printed.
//!
//! `cargo xtask bench proxy [-- ARGS]` (release build). `--quick` runs short (one round), for
//! a smoke check. `--own-core` runs only the own-core rows (under `taskset -c 0`, `SVC_NGINX`
//! set); `--own-core --only HTTP/1.1|HTTP/2|new N` only one of them, N requests, one round
//! unless `--rounds` says otherwise, to profile or A/B it; `--shared --only HTTP/1.1|HTTP/2|new N`
//! likewise one shared-core row against nginx.

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Full};
use hyper::{Request, Response, body::Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use svc_control::{
    audit::JsonlFile,
    config::{egress, host::HostConfig},
    hosts::HostPattern,
    policy::{credentials::CredentialKind, request::SandboxPolicy},
    proxy::{Broker, Proxy, ProxyConfig, ProxySandbox, Resolve, Sandboxes, ca::SandboxCa},
};

const NAME: &str = "api.example.test";
const IN_FLIGHT: usize = 16;
/// Rounds of each comparison with nginx (`--rounds N`), and the requests of each round:
/// keep-alive (one at a time for latency, then this many per connection × 16 in flight for the
/// rate) and new connections.
const ROUNDS: usize = 5;
const ROUND_KEEP_ALIVE: usize = 2000;
const ROUND_NEW: usize = 200;

/// The one sandbox; its connections were all dialled to the upstream (127.0.0.2, the port of
/// the request), as the fence's `SO_ORIGINAL_DST` would say.
struct One(Arc<ProxySandbox>, u16);
impl Sandboxes for One {
    fn sandbox_for(&self, _: IpAddr) -> Option<Arc<ProxySandbox>> {
        Some(self.0.clone())
    }
    fn original_destination(&self, _: &tokio::net::TcpStream) -> Option<std::net::SocketAddr> {
        Some(std::net::SocketAddr::from(([127, 0, 0, 2], self.1)))
    }
}

struct NoTokens;
impl Broker for NoTokens {
    fn bearer(
        &self,
        _: u32,
        _: &svc_control::policy::credentials::Placeholder,
        _: CredentialKind,
        _: &str,
    ) -> Option<Result<svc_control::creds::Bearer, String>> {
        None
    }
}

struct Second;
impl Resolve for Second {
    fn resolve(
        &self,
        _: &str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Vec<IpAddr>>> + Send>>
    {
        Box::pin(async { Ok(vec![IpAddr::from([127, 0, 0, 2])]) })
    }
}

/// Where a proxy of the benchmark writes its audit records: a JSON-lines file, as svcd's proxy
/// writes them (one write per request), in a scratch directory removed when this is dropped.
struct AuditDir(std::path::PathBuf);

impl AuditDir {
    fn new() -> Self {
        let dir = svc_tests::fresh_dir("svcaud");
        Self(dir)
    }
}

impl Drop for AuditDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The upstream: answers every request with 64 bytes.
async fn upstream(ca: &SandboxCa, listener: tokio::net::TcpListener) {
    let acceptor = tokio_rustls::TlsAcceptor::from(ca.server_config(NAME).unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((c, _)) = listener.accept().await else {
                continue;
            };
            c.set_nodelay(true).unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(c).await else {
                    return;
                };
                let svc = hyper::service::service_fn(|_req: Request<Incoming>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(
                        vec![b'x'; 64],
                    ))))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Version {
    H1,
    H2,
}

impl Version {
    fn name(self) -> &'static str {
        match self {
            Self::H1 => "HTTP/1.1",
            Self::H2 => "HTTP/2",
        }
    }
}

#[derive(Clone)]
struct Client {
    tls: tokio_rustls::TlsConnector,
    port: u16,
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

impl Sender {
    async fn get(&mut self, port: u16) {
        // HTTP/1.1 in origin form with Host, as clients send it; HTTP/2 with :authority only
        // (as curl and browsers send it; nginx refuses both at once).
        let req = match self {
            Self::H1(_) => Request::get("/item")
                .header(hyper::header::HOST, format!("{NAME}:{port}"))
                .body(Empty::new()),
            Self::H2(_) => Request::get(format!("https://{NAME}:{port}/item")).body(Empty::new()),
        }
        .unwrap();
        let resp = match self {
            Self::H1(s) => {
                s.ready().await.unwrap();
                s.send_request(req).await.unwrap()
            }
            Self::H2(s) => {
                s.ready().await.unwrap();
                s.send_request(req).await.unwrap()
            }
        };
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(
            (status.as_u16(), body.len()),
            (200, 64),
            "the benchmark request must succeed: {}",
            String::from_utf8_lossy(&body)
        );
    }
}

impl Client {
    fn new(roots: &[rustls::pki_types::CertificateDer<'static>]) -> Self {
        let mut store = rustls::RootCertStore::empty();
        for ca in roots {
            store.add(ca.clone()).unwrap();
        }
        let cfg = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(store)
            .with_no_client_auth();
        Self {
            tls: tokio_rustls::TlsConnector::from(Arc::new(cfg)),
            port: 0,
        }
    }

    async fn connect(&self, addr: SocketAddr, v: Version) -> Sender {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let mut cfg = (*self.tls.config().clone()).clone();
        cfg.alpn_protocols = vec![match v {
            Version::H1 => b"http/1.1".to_vec(),
            Version::H2 => b"h2".to_vec(),
        }];
        let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect(ServerName::try_from(NAME).unwrap(), tcp)
            .await
            .unwrap();
        let io = TokioIo::new(tls);
        match v {
            Version::H1 => {
                let (s, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
                tokio::spawn(conn);
                Sender::H1(s)
            }
            Version::H2 => {
                let (s, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                Sender::H2(s)
            }
        }
    }
}

struct Figures {
    p50_us: f64,
    p99_us: f64,
    rate: f64,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e6
}

/// Keep-alive: latency one at a time over one connection, then the rate with 16 in flight
/// (HTTP/1.1: 16 connections; HTTP/2: 16 streams on one connection).
async fn keep_alive(c: &Client, addr: SocketAddr, v: Version, n: usize) -> Figures {
    let mut s = c.connect(addr, v).await;
    for _ in 0..50 {
        s.get(c.port).await;
    }
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        s.get(c.port).await;
        lat.push(t.elapsed());
    }
    lat.sort();
    let per_task = n;
    let started = Instant::now();
    let mut tasks = Vec::new();
    let shared = match v {
        Version::H2 => Some(c.connect(addr, v).await),
        Version::H1 => None,
    };
    for _ in 0..IN_FLIGHT {
        let mut s = match &shared {
            Some(Sender::H2(s)) => Sender::H2(s.clone()),
            _ => c.connect(addr, v).await,
        };
        let port = c.port;
        tasks.push(tokio::spawn(async move {
            for _ in 0..per_task {
                s.get(port).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let rate = (per_task * IN_FLIGHT) as f64 / started.elapsed().as_secs_f64();
    Figures {
        p50_us: percentile(&lat, 0.5),
        p99_us: percentile(&lat, 0.99),
        rate,
    }
}

/// A new TCP + TLS connection for every request, one at a time.
async fn new_connection(c: &Client, addr: SocketAddr, v: Version, n: usize) -> Figures {
    let mut lat = Vec::with_capacity(n);
    let started = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        let mut s = c.connect(addr, v).await;
        s.get(c.port).await;
        lat.push(t.elapsed());
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    lat.sort();
    Figures {
        p50_us: percentile(&lat, 0.5),
        p99_us: percentile(&lat, 0.99),
        rate,
    }
}

fn row(name: &str, direct: &Figures, proxied: &Figures) {
    println!(
        "{name:<28} {:>9.0} {:>9.0} {:>9.0} {:>9.0} {:>10.0} {:>10.0} {:>6.2}x  {:+.0}",
        direct.p50_us,
        proxied.p50_us,
        direct.p99_us,
        proxied.p99_us,
        direct.rate,
        proxied.rate,
        proxied.rate / direct.rate,
        proxied.p99_us - direct.p99_us,
    );
}

/// The proxy as svcd makes it for one sandbox allowed `NAME:port`, its audit records written to
/// `audit_dir/audit.jsonl` by svcd's own sink.
fn make_proxy(
    port: u16,
    upstream_root: rustls::pki_types::CertificateDer<'static>,
    ca: Arc<SandboxCa>,
    audit_dir: &Path,
) -> Arc<Proxy> {
    let egress = egress::parse(Path::new("config.yaml"), "").unwrap();
    let extra = [HostPattern::parse(&format!("{NAME}:{port}")).unwrap()];
    let policy = SandboxPolicy::for_sandbox(&HostConfig::default(), &extra, None, egress).unwrap();
    let mut config = ProxyConfig::with_roots(&[upstream_root]).unwrap();
    // The upstream is on loopback: the operator's exception opens that class here.
    config.network.allow_cidrs = vec!["127.0.0.0/8".parse().unwrap()];
    Arc::new(Proxy::new(
        config,
        Arc::new(One(
            Arc::new(ProxySandbox {
                id: 1,
                policy,
                ca,
                incarnation: Default::default(),
            }),
            port,
        )),
        Arc::new(NoTokens),
        Arc::new(Second),
        Arc::new(JsonlFile::open(audit_dir.join("audit.jsonl"), 1 << 30).unwrap()),
    ))
}

/// `--proxy-child PORT DIR`: a proxy alone in its own process on 127.0.0.3:PORT (upstream root
/// from DIR/upstream.der, its CA written to DIR/sandbox.der), so its memory can be read.
fn proxy_child(port: u16, dir: &Path) {
    let upstream_root =
        rustls::pki_types::CertificateDer::from(std::fs::read(dir.join("upstream.der")).unwrap());
    let ca = Arc::new(SandboxCa::generate("bench-child").unwrap());
    std::fs::write(dir.join("sandbox.der"), ca.ca_der().as_ref()).unwrap();
    let proxy = make_proxy(port, upstream_root, ca, dir);
    // As svcd serves it: one thread per CPU it may run on (one when pinned).
    let (_stop, stop) = tokio::sync::watch::channel(false);
    let threads = proxy
        .serve_threads(
            ([127, 0, 0, 3], port).into(),
            svc_control::per_core::threads(4),
            stop,
        )
        .unwrap();
    println!("ready");
    for t in threads {
        t.join().unwrap();
    }
}

/// RSS of a proxy process holding `n` idle guest connections (each served one request, then
/// kept alive), against the same process before.
/// The proxy in a process of its own on 127.0.0.3:`port` (optionally pinned to one CPU with
/// `taskset`): the child, a client that trusts its sandbox CA (and `also`), its address, and
/// its scratch directory.
fn spawn_proxy_child(
    port: u16,
    upstream_root: &rustls::pki_types::CertificateDer<'static>,
    cpu: Option<u32>,
    also: &[rustls::pki_types::CertificateDer<'static>],
) -> (std::process::Child, Client, SocketAddr, std::path::PathBuf) {
    use std::io::BufRead as _;
    let dir = svc_tests::fresh_dir("svcpxb");
    std::fs::write(dir.join("upstream.der"), upstream_root.as_ref()).unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match cpu {
        Some(c) => {
            let mut t = std::process::Command::new("taskset");
            t.args(["-c", &c.to_string()]).arg(&exe);
            t
        }
        None => std::process::Command::new(&exe),
    };
    let mut child = cmd
        .arg("--proxy-child")
        .arg(port.to_string())
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "the proxy child must start");
    let sandbox_root =
        rustls::pki_types::CertificateDer::from(std::fs::read(dir.join("sandbox.der")).unwrap());
    let mut roots = vec![sandbox_root];
    roots.extend(also.iter().cloned());
    let mut client = Client::new(&roots);
    client.port = port;
    (child, client, ([127, 0, 0, 3], port).into(), dir)
}

fn idle_rss(
    rt: &tokio::runtime::Runtime,
    port: u16,
    upstream_root: &SandboxCa,
    n: usize,
) -> (u64, u64) {
    let (mut child, client, addr, dir) =
        spawn_proxy_child(port, &upstream_root.ca_der(), None, &[]);
    let before = svc_tests::rss_kib(child.id());
    let held = rt.block_on(async {
        let mut held = Vec::with_capacity(n);
        for _ in 0..n {
            let mut s = client.connect(addr, Version::H1).await;
            s.get(port).await;
            held.push(s);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        held
    });
    let after = svc_tests::rss_kib(child.id());
    drop(held);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    (before, after)
}

/// The peer: mitmproxy's `mitmdump` in reverse mode on 127.0.0.4:PORT toward the same upstream.
/// It does not verify the upstream here (`ssl_insecure`: the upstream's certificate names
/// api.example.test and mitmdump dials 127.0.0.2), which only spares it work. Returns its
/// keep-alive figures, or why it could not run.
fn mitm_keep_alive(
    rt: &tokio::runtime::Runtime,
    port: u16,
    n: usize,
) -> Result<(Figures, Figures), String> {
    let mitmdump = std::env::var_os("SVC_MITMDUMP")
        .ok_or("SVC_MITMDUMP is not set (`cargo xtask bench proxy` installs mitmproxy)")?;
    let dir = svc_tests::fresh_dir("svcmitm");
    let mut child = std::process::Command::new(mitmdump)
        .args(["--quiet", "--set", "ssl_insecure=true", "--set"])
        .arg(format!("confdir={}", dir.display()))
        .args([
            "--listen-host",
            "127.0.0.4",
            "--listen-port",
            &port.to_string(),
        ])
        .args(["--mode", &format!("reverse:https://127.0.0.2:{port}")])
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("starting mitmdump: {e}"))?;
    let addr: SocketAddr = ([127, 0, 0, 4], port).into();
    let started = Instant::now();
    let ca = dir.join("mitmproxy-ca-cert.pem");
    while std::net::TcpStream::connect(addr).is_err() || !ca.exists() {
        if started.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            return Err("mitmdump did not listen within 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    use rustls::pki_types::pem::PemObject as _;
    let root = rustls::pki_types::CertificateDer::from_pem_file(&ca).map_err(|e| e.to_string())?;
    let mut client = Client::new(&[root]);
    client.port = port;
    let figures = rt.block_on(async {
        (
            keep_alive(&client, addr, Version::H1, n).await,
            keep_alive(&client, addr, Version::H2, n).await,
        )
    });
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(figures)
}

/// The honest peer: nginx as a TLS-terminating reverse proxy to the same upstream, re-encrypting
/// with keep-alive upstream connections (verified against the upstream's CA, SNI
/// api.example.test) — no policy, no audit. Its certificate is a self-signed one for
/// api.example.test that the client is given as a root.
struct Nginx {
    child: std::process::Child,
    dir: std::path::PathBuf,
    addr: SocketAddr,
    root: rustls::pki_types::CertificateDer<'static>,
}

impl Nginx {
    /// nginx on 127.0.0.5:`port` toward 127.0.0.2:`port`. `cpu`: pinned to that CPU with one
    /// process (the own-core variant); otherwise a master and one worker per CPU.
    fn start(port: u16, upstream_ca: &SandboxCa, cpu: Option<u32>) -> Result<Self, String> {
        let nginx = std::env::var_os("SVC_NGINX")
            .ok_or("SVC_NGINX is not set (`cargo xtask bench proxy` installs nginx)")?;
        let dir = svc_tests::fresh_dir("svcngx");
        std::fs::create_dir_all(dir.join("tmp")).map_err(|e| e.to_string())?;
        let leaf =
            rcgen::generate_simple_self_signed(vec![NAME.to_owned()]).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("leaf.pem"), leaf.cert.pem()).map_err(|e| e.to_string())?;
        std::fs::write(dir.join("leaf.key"), leaf.signing_key.serialize_pem())
            .map_err(|e| e.to_string())?;
        std::fs::write(dir.join("upstream-ca.pem"), upstream_ca.ca_pem())
            .map_err(|e| e.to_string())?;
        let d = dir.display();
        let conf = format!(
            "pid {d}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    keepalive_requests 10000000;
    upstream up {{ server 127.0.0.2:{port}; keepalive 64; keepalive_requests 10000000; }}
    server {{
        listen 127.0.0.5:{port} ssl http2;
        # TLS 1.3 on both legs, as svc speaks it (nginx 1.22's default stops at TLS 1.2, whose
        # session resumption skips the key exchange that TLS 1.3's does on every connection).
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_certificate {d}/leaf.pem;
        ssl_certificate_key {d}/leaf.key;
        location / {{
            proxy_pass https://up;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header Host $http_host;
            proxy_ssl_server_name on;
            proxy_ssl_name {NAME};
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {d}/upstream-ca.pem;
            proxy_ssl_session_reuse on;
            proxy_ssl_protocols TLSv1.2 TLSv1.3;
        }}
    }}
}}
"
        );
        std::fs::write(dir.join("nginx.conf"), conf).map_err(|e| e.to_string())?;
        let globals = match cpu {
            Some(_) => "daemon off; master_process off; worker_processes 1;",
            None => "daemon off; worker_processes auto;",
        };
        let mut cmd = match cpu {
            Some(c) => {
                let mut t = std::process::Command::new("taskset");
                t.args(["-c", &c.to_string()]).arg(&nginx);
                t
            }
            None => std::process::Command::new(&nginx),
        };
        let mut child = cmd
            .arg("-p")
            .arg(&dir)
            .arg("-c")
            .arg(dir.join("nginx.conf"))
            .args(["-e", "stderr", "-g", globals])
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("starting nginx: {e}"))?;
        let addr: SocketAddr = ([127, 0, 0, 5], port).into();
        let started = Instant::now();
        while std::net::TcpStream::connect(addr).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("nginx exited: {status}"));
            }
            if started.elapsed() > Duration::from_secs(10) {
                let _ = child.kill();
                return Err("nginx did not listen within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self {
            child,
            dir,
            addr,
            root: leaf.cert.der().clone(),
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: a master ends its workers before it exits (SIGKILL would orphan them).
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(0));
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let started = Instant::now();
        while !matches!(self.child.try_wait(), Ok(Some(_))) {
            if started.elapsed() > Duration::from_secs(5) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// CPU time (user + system) of a process and all its descendants so far, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let ticks = |p: u32| -> (u64, Vec<u32>) {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        // Fields after the command name (which may hold spaces): utime is the 12th, stime 13th.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<&str> = rest.split_whitespace().collect();
        let t = f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
            + f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let mut children = Vec::new();
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                    children.extend(c.split_whitespace().filter_map(|v| v.parse::<u32>().ok()));
                }
            }
        }
        (t, children)
    };
    let mut total = 0;
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        let (t, children) = ticks(p);
        total += t;
        todo.extend(children);
    }
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100)
        .max(1);
    total as f64 / hz as f64
}

/// `--own-core` (run under `taskset -c 0` by the main run): client and upstream share CPU 0,
/// the proxy runs in its own process on CPU 1 — the shape of a real host, where the guest's
/// client runs on the guest's vCPUs and the upstream is elsewhere. Keep-alive rate and
/// latency direct vs through that proxy.
fn own_core(n: usize, n_new: usize, rows: &[&str], rounds: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let upstream_ca = SandboxCa::generate("bench-upstream-root").unwrap();
    let (port, up_l) = rt.block_on(async {
        loop {
            let up = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
            let port = up.local_addr().unwrap().port();
            if std::net::TcpListener::bind(("127.0.0.3", port)).is_ok()
                && std::net::TcpListener::bind(("127.0.0.5", port)).is_ok()
            {
                return (port, up);
            }
        }
    });
    rt.block_on(upstream(&upstream_ca, up_l));
    let (mut child, client, proxied, dir) = spawn_proxy_child(
        port,
        &upstream_ca.ca_der(),
        Some(1),
        &[upstream_ca.ca_der()],
    );
    let direct: SocketAddr = ([127, 0, 0, 2], port).into();
    let peer = Nginx::start(port, &upstream_ca, Some(1));
    let peer_client = peer.as_ref().ok().map(|p| {
        let mut c = Client::new(&[p.root.clone(), upstream_ca.ca_der()]);
        c.port = port;
        c
    });
    if let Err(why) = &peer {
        println!("PEER NOT MEASURED: nginx: {why}");
    }
    header3(rounds);
    let (rt, measured_child) = (&rt, child.id());
    let keep_alive_requests = (50 + n + n * IN_FLIGHT) as f64;
    // One arm: the figures and the CPU seconds per request the process `pid` spent on them.
    let measured = |pid: u32, requests: f64, run: &mut dyn FnMut() -> Figures| {
        let cpu = cpu_seconds(pid);
        let f = run();
        (f, (cpu_seconds(pid) - cpu) / requests)
    };
    // One row's comparison: `run` (a workload against a client and address) direct, through
    // svc's proxy and through nginx, with the CPU per request of each proxy's process.
    let row = |requests: f64, run: &dyn Fn(&Client, SocketAddr) -> Figures| {
        compare(
            rounds,
            || run(&client, direct),
            || measured(measured_child, requests, &mut || run(&client, proxied)),
            peer.as_ref()
                .ok()
                .zip(peer_client.as_ref())
                .map(|(p, c)| move || measured(p.pid(), requests, &mut || run(c, p.addr))),
        )
    };
    for v in [Version::H1, Version::H2]
        .into_iter()
        .filter(|v| rows.contains(&v.name()))
    {
        let c = row(keep_alive_requests, &|c, a| {
            rt.block_on(keep_alive(c, a, v, n))
        });
        row3(&format!("{} keep-alive, own core", v.name()), &c);
    }
    if rows.contains(&"new") {
        let c = row(n_new as f64, &|c, a| {
            rt.block_on(new_connection(c, a, Version::H1, n_new))
        });
        row3("HTTP/1.1 new conn., own core", &c);
    }
    drop(peer);
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// One arm of a comparison over the rounds: its figures and CPU seconds per request (NaN where
/// not measured).
type Arm = Vec<(Figures, f64)>;

/// A comparison of svc's proxy with nginx over several rounds, each round measuring direct, svc
/// and nginx; svc goes first in even rounds and nginx in odd ones, so the drift of a shared
/// machine falls on both alike and the ratio is read as the median of the rounds' own ratios.
struct Compared {
    direct: Vec<Figures>,
    ours: Arm,
    peer: Arm,
}

fn compare(
    rounds: usize,
    mut direct: impl FnMut() -> Figures,
    mut ours: impl FnMut() -> (Figures, f64),
    mut peer: Option<impl FnMut() -> (Figures, f64)>,
) -> Compared {
    let mut c = Compared {
        direct: Vec::new(),
        ours: Vec::new(),
        peer: Vec::new(),
    };
    for round in 0..rounds {
        c.direct.push(direct());
        match (&mut peer, round % 2) {
            (Some(peer), 1) => {
                c.peer.push(peer());
                c.ours.push(ours());
            }
            (Some(peer), _) => {
                c.ours.push(ours());
                c.peer.push(peer());
            }
            (None, _) => c.ours.push(ours()),
        }
    }
    c
}

/// The median of some figures (the mean of the middle two for an even count), NaN for none.
fn median(values: impl IntoIterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.into_iter().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn header3(rounds: usize) {
    println!(
        "{:<30} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>9} {:>9} {:>9} {:>23} {:>13}",
        "variant",
        "p50 dir",
        "p50 svc",
        "p50 ngx",
        "p99 dir",
        "p99 svc",
        "p99 ngx",
        "req/s dir",
        "req/s svc",
        "req/s ngx",
        format!("svc/nginx [min, max] ×{rounds}"),
        "CPU µs/req svc·ngx",
    );
}

/// Microseconds of CPU per request, or a dash where not measured.
fn cpu_cell(seconds: f64) -> String {
    if seconds.is_finite() && seconds > 0.0 {
        format!("{:.1}", seconds * 1e6)
    } else {
        "—".to_owned()
    }
}

/// One line of medians over the rounds — direct, ours and the peer, the ratio of rates as the
/// median of each round's ratio with its min and max — then each round's ratio, for pooling.
fn row3(name: &str, c: &Compared) {
    let of = |arm: &Arm, f: fn(&Figures) -> f64| median(arm.iter().map(|(x, _)| f(x)));
    let cell = |v: f64| {
        if v.is_nan() {
            "—".to_owned()
        } else {
            format!("{v:.0}")
        }
    };
    let ratios: Vec<f64> = c
        .ours
        .iter()
        .zip(&c.peer)
        .map(|((o, _), (p, _))| o.rate / p.rate)
        .collect();
    let ratio = if ratios.is_empty() {
        "—".to_owned()
    } else {
        let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        format!("{:.2}x [{lo:.2}, {hi:.2}]", median(ratios.iter().copied()))
    };
    println!(
        "{name:<30} {:>7.0} {:>7.0} {:>7} {:>7.0} {:>7.0} {:>7} {:>9.0} {:>9.0} {:>9} {:>23} {:>13}",
        median(c.direct.iter().map(|f| f.p50_us)),
        of(&c.ours, |f| f.p50_us),
        cell(of(&c.peer, |f| f.p50_us)),
        median(c.direct.iter().map(|f| f.p99_us)),
        of(&c.ours, |f| f.p99_us),
        cell(of(&c.peer, |f| f.p99_us)),
        median(c.direct.iter().map(|f| f.rate)),
        of(&c.ours, |f| f.rate),
        cell(of(&c.peer, |f| f.rate)),
        ratio,
        format!(
            "{}·{}",
            cpu_cell(median(c.ours.iter().map(|(_, cpu)| *cpu))),
            cpu_cell(median(c.peer.iter().map(|(_, cpu)| *cpu)))
        )
    );
    if ratios.len() > 1 {
        let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "{:<30} svc/nginx by round (svc first in odd rounds): {}",
            "",
            each.join(" ")
        );
    }
}

/// The comparisons with nginx on the shared cores (the proxy in this process, nginx with a
/// worker per CPU): `rows` of HTTP/1.1 and HTTP/2 keep-alive and new connections, with
/// (keep-alive, new) requests per arm and round.
fn shared_cores(
    rt: &tokio::runtime::Runtime,
    upstream_ca: &SandboxCa,
    client: &Client,
    rows: &[&str],
    (round_keep, round_new): (usize, usize),
    rounds: usize,
) {
    let port = client.port;
    let direct: SocketAddr = ([127, 0, 0, 2], port).into();
    let proxied: SocketAddr = ([127, 0, 0, 1], port).into();
    println!("nginx (TLS-terminating reverse proxy, keep-alive upstream) vs svc, shared cores");
    let peer = match Nginx::start(port, upstream_ca, None) {
        Ok(peer) => peer,
        Err(why) => return println!("PEER NOT MEASURED: nginx: {why}"),
    };
    let mut pc = Client::new(&[peer.root.clone(), upstream_ca.ca_der()]);
    pc.port = port;
    header3(rounds);
    // One row's comparison: `run` direct, through svc's proxy and through nginx.
    let row = |run: &dyn Fn(&Client, SocketAddr) -> Figures| {
        compare(
            rounds,
            || run(client, direct),
            || (run(client, proxied), f64::NAN),
            Some(|| (run(&pc, peer.addr), f64::NAN)),
        )
    };
    for v in [Version::H1, Version::H2]
        .into_iter()
        .filter(|v| rows.contains(&v.name()))
    {
        let c = row(&|c, a| rt.block_on(keep_alive(c, a, v, round_keep)));
        row3(&format!("{} keep-alive", v.name()), &c);
    }
    if rows.contains(&"new") {
        let c = row(&|c, a| rt.block_on(new_connection(c, a, Version::H1, round_new)));
        row3("HTTP/1.1 new connection", &c);
    }
}

fn only_usage() -> ! {
    eprintln!(
        "usage: proxy-bench --own-core|--shared --only HTTP/1.1|HTTP/2|new COUNT [--rounds N]"
    );
    std::process::exit(2);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--proxy-child") {
        proxy_child(args[i + 1].parse().unwrap(), Path::new(&args[i + 2]));
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    // `--rounds N`: how many rounds each comparison with nginx runs (5; 1 with --quick or --only).
    let rounds = match args.iter().position(|a| a == "--rounds") {
        Some(i) => match args.get(i + 1).and_then(|n| n.parse::<usize>().ok()) {
            Some(n) if n > 0 => Some(n),
            _ => {
                eprintln!("proxy-bench: --rounds takes a count of at least 1");
                std::process::exit(2);
            }
        },
        None => None,
    };
    if args.iter().any(|a| a == "--own-core") {
        // `--only ROW N`: one row (HTTP/1.1, HTTP/2 or new) with N requests, to profile it.
        match args.iter().position(|a| a == "--only") {
            Some(i) => {
                let (row, count) = (
                    args.get(i + 1),
                    args.get(i + 2).and_then(|n| n.parse().ok()),
                );
                let (Some(row), Some(count)) = (row, count) else {
                    only_usage()
                };
                own_core(count, count, &[row.as_str()], rounds.unwrap_or(1));
            }
            None => own_core(
                if quick { 200 } else { ROUND_KEEP_ALIVE },
                if quick { 50 } else { ROUND_NEW },
                &["HTTP/1.1", "HTTP/2", "new"],
                rounds.unwrap_or(if quick { 1 } else { ROUNDS }),
            ),
        }
        return;
    }
    // `--shared --only ROW N`: one row of the shared-core comparison with nginx, N requests.
    let shared_only = match (
        args.iter().any(|a| a == "--shared"),
        args.iter().position(|a| a == "--only"),
    ) {
        (false, _) => None,
        (true, Some(i)) => match (
            args.get(i + 1),
            args.get(i + 2).and_then(|n| n.parse::<usize>().ok()),
        ) {
            (Some(row), Some(count)) => Some((row.clone(), count)),
            _ => only_usage(),
        },
        (true, None) => only_usage(),
    };
    let rounds = rounds.unwrap_or(if quick || shared_only.is_some() {
        1
    } else {
        ROUNDS
    });
    let (n_keep, n_new) = if quick { (200, 50) } else { (4000, 400) };
    let (round_keep, round_new) = if quick {
        (200, 50)
    } else {
        (ROUND_KEEP_ALIVE, ROUND_NEW)
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let upstream_ca = SandboxCa::generate("bench-upstream-root").unwrap();
    let sandbox_ca = Arc::new(SandboxCa::generate("bench-sandbox").unwrap());
    // The same port on both loopback addresses: the guest's Host names the upstream's port.
    // The proxy served as svcd serves it (one thread per core, see `per_core`).
    let (_stop, stop) = tokio::sync::watch::channel(false);
    let audit = AuditDir::new();
    let (port, up_l) = rt.block_on(async {
        loop {
            let up = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
            let port = up.local_addr().unwrap().port();
            let proxy = make_proxy(port, upstream_ca.ca_der(), sandbox_ca.clone(), &audit.0);
            if proxy
                .serve_threads(
                    ([127, 0, 0, 1], port).into(),
                    svc_control::per_core::threads(4),
                    stop.clone(),
                )
                .is_ok()
            {
                return (port, up);
            }
        }
    });
    rt.block_on(upstream(&upstream_ca, up_l));
    let mut client = Client::new(&[upstream_ca.ca_der(), sandbox_ca.ca_der()]);
    client.port = port;
    let direct: SocketAddr = ([127, 0, 0, 2], port).into();
    let proxied: SocketAddr = ([127, 0, 0, 1], port).into();
    if shared_only.is_some() {
        // `--shared --only ROW N`: one shared-core row against nginx (to A/B two builds).
        let (row, count) = shared_only.unwrap_or_default();
        return shared_cores(
            &rt,
            &upstream_ca,
            &client,
            &[row.as_str()],
            (count, count),
            rounds,
        );
    }

    // The first request to a host the proxy has not minted a leaf for yet, then a minted one.
    let first = rt.block_on(async {
        let t = Instant::now();
        let mut s = client.connect(proxied, Version::H1).await;
        s.get(port).await;
        t.elapsed()
    });
    let second = rt.block_on(async {
        let t = Instant::now();
        let mut s = client.connect(proxied, Version::H1).await;
        s.get(port).await;
        t.elapsed()
    });
    let mut mint: Vec<Duration> = (0..if quick { 10 } else { 100 })
        .map(|i| {
            let t = Instant::now();
            sandbox_ca.leaf_for(&format!("h{i}.mint.test")).unwrap();
            t.elapsed()
        })
        .collect();
    mint.sort();

    println!(
        "proxy benchmark: upstream 127.0.0.2:{port}, proxy 127.0.0.1:{port}; {n_keep} keep-alive \
         requests (x{IN_FLIGHT} in flight for the rate), {n_new} new-connection requests"
    );
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>7}  added p99 (us)",
        "variant", "p50 dir", "p50 prx", "p99 dir", "p99 prx", "req/s dir", "req/s prx", "ratio",
    );
    for v in [Version::H1, Version::H2] {
        let (d, p) = rt.block_on(async {
            (
                keep_alive(&client, direct, v, n_keep).await,
                keep_alive(&client, proxied, v, n_keep).await,
            )
        });
        row(&format!("{} keep-alive", v.name()), &d, &p);
        let (d, p) = rt.block_on(async {
            (
                new_connection(&client, direct, v, n_new).await,
                new_connection(&client, proxied, v, n_new).await,
            )
        });
        row(&format!("{} new connection", v.name()), &d, &p);
    }
    println!(
        "first request to an unminted host (new connection): {:.2} ms; the next new connection: \
         {:.2} ms",
        first.as_secs_f64() * 1e3,
        second.as_secs_f64() * 1e3
    );
    println!(
        "leaf minting alone: p50 {:.2} ms, p99 {:.2} ms",
        percentile(&mint, 0.5) / 1e3,
        percentile(&mint, 0.99) / 1e3
    );
    // The peer, same workload (fewer requests: it is much slower), beside the proxy again.
    let n_peer = if quick { 100 } else { 500 };
    match mitm_keep_alive(&rt, port, n_peer) {
        Ok((h1, h2)) => {
            let (ours1, ours2) = rt.block_on(async {
                (
                    keep_alive(&client, proxied, Version::H1, n_peer).await,
                    keep_alive(&client, proxied, Version::H2, n_peer).await,
                )
            });
            println!(
                "{:<28} {:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>7}",
                "peer (keep-alive)",
                "p50 mitm",
                "p50 svc",
                "p99 mitm",
                "p99 svc",
                "req/s mitm",
                "req/s svc",
                "svc/mitm",
            );
            row("HTTP/1.1 mitmproxy vs svc", &h1, &ours1);
            row("HTTP/2 mitmproxy vs svc", &h2, &ours2);
        }
        Err(why) => println!("PEER NOT MEASURED: mitmproxy: {why}"),
    }
    // The honest peer, nginx, on the same shared cores, same workload, beside the proxy again.
    shared_cores(
        &rt,
        &upstream_ca,
        &client,
        &["HTTP/1.1", "HTTP/2", "new"],
        (round_keep, round_new),
        rounds,
    );
    // The proxy on a core of its own (client and upstream pinned to the other).
    println!(
        "proxy (svc's, then nginx) in its own process on CPU 1, client and upstream on CPU 0 \
         (req/s with 16 in flight; CPU per request from the proxy process's own accounting)"
    );
    let mut own = std::process::Command::new("taskset");
    own.args(["-c", "0"])
        .arg(std::env::current_exe().unwrap())
        .arg("--own-core");
    if quick {
        own.arg("--quick");
    }
    own.args(["--rounds", &rounds.to_string()]);
    match own.status() {
        Ok(s) if s.success() => {}
        other => println!("OWN-CORE VARIANT NOT MEASURED: {other:?}"),
    }
    let idle = if quick { 100 } else { 1000 };
    let (before, after) = idle_rss(&rt, port, &upstream_ca, idle);
    println!(
        "proxy process RSS: {:.1} MiB started, {:.1} MiB holding {idle} idle guest connections \
         (HTTP/1.1, one request each): {:.1} MiB per 1,000",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        (after.saturating_sub(before)) as f64 / 1024.0 * 1000.0 / idle as f64
    );
}
