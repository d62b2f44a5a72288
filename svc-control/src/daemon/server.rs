//! svcd's start-up, its API on a unix socket, its background work and its shutdown.
//!
//! Start-up order: the configuration was validated before this runs (bad config exits 64
//! without binding anything); then svcd takes its state directory's lock (one svcd per state
//! directory); then the fence is loaded (pinned maps and links are reused),
//! the nftables table is written, the DNS guard and the proxy bind, the sandboxes of the store
//! are re-adopted, and only then does the API socket accept calls. The API's routes are in
//! `routes`.

use std::{
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    os::unix::fs::{DirBuilderExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use ipnet::IpNet;
use nix::fcntl::{Flock, FlockArg};
use tokio::{
    net::{TcpListener, UnixListener, UnixStream},
    sync::watch,
};
use tracing::{info, warn};

use super::{
    routes::{self, Ctx},
    supervisor::{Failure, Supervisor, SupervisorConfig},
    wiring::{FenceCommit, NamedAudit, RecordingCommit, Registry, UpstreamResolver},
};
use crate::{
    audit::{AuditRecord, AuditSink, JsonlFile},
    config::host::HostConfig,
    dataplane::{self, Fence, Links, Nft, NftConfig, clock},
    dns::{Guard, GuardConfig, Upstream},
    policy::destination::{HostNetwork, fence_cidrs},
    proxy::{Proxy, ProxyConfig},
    runtime::{Backends, Container, Microvm, registry},
};

/// How svcd was started, for the parts that are not configuration.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The nftables table (`svc`).
    pub nft_table: String,
    /// svcd's own binary: what `supervisor-upgrade` re-executes.
    pub exe: PathBuf,
    /// Time in-flight API calls get at shutdown.
    pub grace: Duration,
}

/// How `run` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// SIGTERM or SIGINT.
    Stopped,
    /// `supervisor-upgrade --force`: the caller re-executes the binary.
    Upgrade,
}

/// The addresses of this host's interfaces (never reachable from a sandbox).
fn host_addresses() -> Vec<IpAddr> {
    nix::ifaddrs::getifaddrs()
        .map(|addrs| {
            addrs
                .filter_map(|a| {
                    let s = a.address?;
                    s.as_sockaddr_in()
                        .map(|v4| IpAddr::V4(v4.ip()))
                        .or_else(|| s.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The TCP ports svcd itself listens on (the DNS guard, the proxy, metrics): never dialled for
/// a guest on an address of this host.
fn svcd_ports(host: &HostConfig) -> Vec<u16> {
    let mut ports = vec![host.guard_port, host.proxy_port];
    ports.extend(host.metrics_listen.map(|a| a.port()));
    ports
}

/// One svcd per state directory: an exclusive `flock` on `state_dir/svcd.lock`, held while
/// `run` runs (the kernel lets it go however svcd ends). A second svcd would rewrite the
/// fence's tries, share the guard's and the proxy's ports and re-adopt the same sandboxes; it
/// stops here instead, before touching any of them, naming the svcd that holds the lock.
fn instance_lock(state_dir: &Path) -> anyhow::Result<Flock<std::fs::File>> {
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state_dir)
        .with_context(|| format!("creating the state directory {}", state_dir.display()))?;
    let path = state_dir.join("svcd.lock");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(held) => {
            held.set_len(0)
                .and_then(|()| writeln!(&*held, "{}", std::process::id()))
                .with_context(|| format!("writing svcd's pid to {}", path.display()))?;
            Ok(held)
        }
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
            let pid = std::fs::read_to_string(&path).unwrap_or_default();
            let pid = pid.trim();
            let who = if pid.is_empty() {
                String::new()
            } else {
                format!(" (pid {pid})")
            };
            anyhow::bail!(
                "another svcd{who} is running with the state directory {}: stop it first \
                 (systemctl stop svcd), or give this one a state_dir of its own in svcd.toml",
                state_dir.display()
            )
        }
        Err((_, e)) => Err(anyhow::anyhow!("locking {}: {e}", path.display())),
    }
}

/// Run svcd until SIGTERM/SIGINT or an upgrade.
pub async fn run(host: HostConfig, opts: RunOptions) -> anyhow::Result<Ended> {
    anyhow::ensure!(
        nix::unistd::geteuid().is_root(),
        "svcd must run as root (it loads eBPF programs and manages network namespaces)"
    );
    let started = SystemTime::now();
    let _one_svcd = instance_lock(&host.state_dir)?;

    // The fence.
    dataplane::ensure_bpffs(std::path::Path::new("/sys/fs/bpf"))?;
    let mut fence = Fence::load_with_log(&host.pin_dir, host.fence_log_level)
        .with_context(|| format!("loading the fence under {}", host.pin_dir.display()))?;
    if let Some(logger) = fence.take_logger(dataplane::TracingLog) {
        tokio::spawn(dataplane::tracing_log(logger));
    }
    let mut host_addrs = host_addresses();
    host_addrs.sort();
    host_addrs.dedup();
    let net = HostNetwork {
        host_addresses: host_addrs.clone(),
        sandbox_pools: vec![host.ipv4_pool.into(), host.ipv6_pool.into()],
        allow_cidrs: host.allow_cidrs.clone(),
        svcd_ports: svcd_ports(&host),
    };
    let (deny, operator_allow) = fence_cidrs(&net);
    fence.set_destination_classes(&deny, &operator_allow)?;
    let mut never: Vec<IpNet> = net.sandbox_pools.clone();
    never.extend(host_addrs.iter().map(|a| IpNet::from(*a)));
    let nft = Nft::new(NftConfig {
        table: opts.nft_table.clone(),
        guard_port: host.guard_port,
        proxy_port: host.proxy_port,
        never,
        deny,
        operator_allow,
    });
    if std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
        .map(|s| s.trim() != "1")
        .unwrap_or(true)
    {
        std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
            .context("enabling IPv4 forwarding (net.ipv4.ip_forward)")?;
        info!("enabled net.ipv4.ip_forward; the nftables table fences what sandboxes forward");
    }
    let fence = Arc::new(Mutex::new(fence));

    // Audit, the guard, the proxy.
    let audit: Arc<JsonlFile> = Arc::new(
        JsonlFile::open(host.audit_dir.join("audit.jsonl"), 256 * 1024 * 1024)
            .context("opening the audit log")?,
    );
    let upstream = Upstream::from_host(&host).map_err(|e| anyhow::anyhow!("DNS upstreams: {e}"))?;
    let registry = Arc::new(Registry::default());
    let metrics = Arc::new(crate::metrics::Metrics::new());
    // Per-guest caps on every channel a guest can open, shared by the guard, the proxy and the
    // supervisor (exec, Spotlight, the relay), and each sandbox's share of the audit log.
    let limits = Arc::new(crate::limits::GuestLimits::new(
        host.limits.clone(),
        Arc::new(super::wiring::LimitHits {
            registry: registry.clone(),
            metrics: metrics.clone(),
        }),
    ));
    let named_audit = Arc::new(NamedAudit {
        inner: audit,
        registry: registry.clone(),
        metrics: metrics.clone(),
        limits: limits.clone(),
    });
    let audit: Arc<dyn AuditSink> = named_audit.clone();
    let guard = Arc::new(Guard::new(
        GuardConfig {
            limits: limits.clone(),
            ..GuardConfig::with_upstream(upstream.clone())
        },
        registry.clone(),
        Arc::new(RecordingCommit {
            inner: FenceCommit {
                fence: fence.clone(),
                ifindex: registry.ifindex_of(),
                idle: Duration::from_secs(300),
            },
            registry: registry.clone(),
        }),
        audit.clone(),
        net.clone(),
    ));
    let mut proxy_config = upstream_config(&host)?;
    // Every address the proxy dials for a guest passes the destination classes.
    proxy_config.network = net.clone();
    proxy_config.limits = limits.clone();
    let resolver: Arc<dyn crate::proxy::Resolve> = Arc::new(UpstreamResolver(upstream));
    // One client for svcd's own token-endpoint requests (the guardian's and OAuth secrets').
    let host_client: Arc<dyn crate::creds::oauth::FormPost> = Arc::new(super::wiring::HostForms(
        crate::proxy::server::host_client(&proxy_config, resolver.clone()),
    ));
    let guardian = guardian(&host, host_client.clone())?;
    let proxy = Arc::new(Proxy::new(
        proxy_config,
        registry.clone(),
        registry.clone(),
        resolver.clone(),
        audit.clone(),
    ));
    let any = |port| SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), port);
    let guard_tcp = TcpListener::bind(any(host.guard_port))
        .await
        .with_context(|| format!("binding the DNS guard to tcp port {}", host.guard_port))?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    // The guard's UDP side and the proxy on threads of their own, one per core (see
    // `per_core`): a question or a request runs start to end on one thread.
    let mut threads = guard
        .serve_udp_threads(
            any(host.guard_port),
            crate::per_core::threads(4),
            stop_rx.clone(),
        )
        .with_context(|| format!("binding the DNS guard to udp port {}", host.guard_port))?;
    threads.extend(
        proxy
            .serve_threads(
                any(host.proxy_port),
                crate::per_core::threads(4),
                stop_rx.clone(),
            )
            .with_context(|| format!("binding the proxy to tcp port {}", host.proxy_port))?,
    );
    tokio::spawn(guard.serve_tcp(guard_tcp, stopped(stop_rx.clone())));

    // The sandboxes.
    let store = crate::store::Store::open(&host.state_dir)?;
    let links = Links::connect()?;
    let backend = {
        let (config, state_dir) = (host.container.clone(), host.state_dir.clone());
        tokio::task::spawn_blocking(move || Container::new(&config, &state_dir))
            .await
            .context("preparing the container backend")??
    };
    info!(
        uid = backend.ids().uid,
        gid = backend.ids().gid,
        "container backend ready: guest root is host uid {}",
        backend.ids().uid
    );
    let microvm = Arc::new(Microvm::new(
        &host.microvm,
        &host.state_dir,
        &host.container.cgroup_parent,
        |v| std::env::var_os(v),
    ));
    let (accel, why) = microvm.accel();
    match microvm.unavailable() {
        None => info!(
            accel,
            why, "microvm backend ready: guests run under {accel} ({why})"
        ),
        Some(reason) => info!("microvm backend not offered: {reason}"),
    }
    let key = Arc::new(
        crate::creds::HostKey::load_or_create(&host.key_file)
            .map_err(|e| anyhow::anyhow!("{e}"))?,
    );
    let sup = Arc::new(Supervisor::new(
        SupervisorConfig {
            host: host.clone(),
            metrics: metrics.clone(),
            audit: audit.clone(),
            key,
            guardian,
            host_client: Some(host_client),
            // The relay's servers are resolved by svcd and each address checked.
            resolver,
            network: net,
            limits,
        },
        store,
        fence,
        nft,
        links,
        Backends::new(registry::container(Arc::new(backend))).with(registry::microvm(microvm)),
        registry,
        started,
    ));
    sup.reconcile()
        .await
        .map_err(|f| anyhow::anyhow!("re-adopting sandboxes: {}", f.message))?;

    // Background work: drop events to the audit log, windows, expired entries.
    {
        let sup = sup.clone();
        let audit = audit.clone();
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let mut drops = tokio::time::interval(Duration::from_millis(100));
            let mut ticks = tokio::time::interval(Duration::from_secs(5));
            loop {
                tokio::select! {
                    _ = drops.tick() => {
                        let events = sup.drain_drops();
                        if !events.is_empty() {
                            let (mono, wall) = (clock::monotonic_ns(), SystemTime::now());
                            for e in &events {
                                if let Err(err) = audit.record(&AuditRecord::from_drop(e, mono, wall)) {
                                    warn!(error = %err, "writing a packet audit record");
                                }
                            }
                        }
                    }
                    _ = ticks.tick() => {
                        sup.tick();
                        named_audit.write_suppressed();
                    }
                    _ = stop.wait_for(|s| *s) => break,
                }
            }
        });
    }

    // Brokered OAuth secrets: refreshed before they expire.
    {
        let sup = sup.clone();
        let mut stop = stop_rx.clone();
        let mut polls = tokio::time::interval(host.refresh_poll);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = polls.tick() => {}
                    _ = stop.wait_for(|s| *s) => break,
                }
                sup.refresh_grants().await;
            }
        });
    }

    // Metrics, when asked for.
    if let Some(addr) = host.metrics_listen {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding metrics.listen {addr}"))?;
        info!(%addr, "serving /metrics");
        tokio::spawn(serve_metrics(
            listener,
            sup.clone(),
            stopped(stop_rx.clone()),
        ));
    }

    // The API socket.
    let listener = bind_socket(&host).await?;
    let api_gid = nix::unistd::Group::from_name(&host.api_group)
        .ok()
        .flatten()
        .map(|g| g.gid.as_raw());
    if let Some(gid) = api_gid {
        let _ = nix::unistd::chown(&host.socket, None, Some(nix::unistd::Gid::from_raw(gid)));
    }
    let (upgrade_tx, mut upgrade_rx) = watch::channel(false);
    let ctx = Arc::new(Ctx {
        sup: sup.clone(),
        api_gid,
        upgrade: upgrade_tx,
        exe: opts.exe.clone(),
        callers: Arc::default(),
    });
    sup.event(
        "supervisor.started",
        None,
        serde_json::json!({"pid": std::process::id(), "sandboxes": sup.count()}),
    );
    info!(
        socket = %host.socket.display(),
        sandboxes = sup.count(),
        guard_port = host.guard_port,
        proxy_port = host.proxy_port,
        "svcd ready"
    );

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    // Each API connection holds a clone: the strong count is the number in flight.
    let connections = Arc::new(());
    let ended = loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let ctx = ctx.clone();
                    let token = connections.clone();
                    tokio::spawn(async move {
                        let _token = token;
                        serve_connection(ctx, stream).await;
                    });
                }
                Err(e) => {
                    warn!(error = %e, "accepting an API connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = term.recv() => break Ended::Stopped,
            _ = int.recv() => break Ended::Stopped,
            _ = upgrade_rx.wait_for(|u| *u) => break Ended::Upgrade,
        }
    };
    info!(
        ?ended,
        "svcd stopping; sandboxes keep running and their fence stays pinned"
    );
    drop(listener);
    let _ = std::fs::remove_file(&host.socket);
    // Grace: wait for in-flight API calls (each holds a clone of `connections`).
    let deadline = tokio::time::Instant::now() + opts.grace;
    while Arc::strong_count(&connections) > 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = stop_tx.send(true);
    // The guard's and the proxy's threads close their sockets as they end (an upgrade binds
    // them again).
    let _ = tokio::task::spawn_blocking(move || {
        for t in threads {
            let _ = t.join();
        }
    })
    .await;
    Ok(ended)
}

async fn bind_socket(host: &HostConfig) -> anyhow::Result<UnixListener> {
    let path = &host.socket;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            anyhow::bail!(
                "another svcd is already serving {} (stop it first, or use \
                 `svc supervisor-upgrade --force` to replace it)",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(listener)
}

/// Whether the peer may call the API: root, or a member of the API group.
fn authorised(stream: &UnixStream, api_gid: Option<u32>) -> Result<(), String> {
    let cred = stream
        .peer_cred()
        .map_err(|e| format!("cannot read the caller's credentials: {e}"))?;
    if cred.uid() == 0 {
        return Ok(());
    }
    let Some(gid) = api_gid else {
        return Err(format!(
            "uid {} may not use svcd: only root may (the API group does not exist on this host)",
            cred.uid()
        ));
    };
    if peer_groups(&cred).contains(&gid) {
        Ok(())
    } else {
        Err(format!(
            "uid {} may not use svcd: only root and members of the API group (gid {gid}) may",
            cred.uid()
        ))
    }
}

/// The peer's groups: its primary group and its supplementary groups (as its process has them).
fn peer_groups(cred: &tokio::net::unix::UCred) -> Vec<u32> {
    let mut groups = vec![cred.gid()];
    if let Some(pid) = cred.pid() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if let Some(g) = status.lines().find_map(|l| l.strip_prefix("Groups:")) {
            groups.extend(g.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
        }
    }
    groups
}

async fn serve_connection(ctx: Arc<Ctx>, stream: UnixStream) {
    let denied = authorised(&stream, ctx.api_gid).err();
    if let Some(reason) = &denied {
        warn!(%reason, "refused an API caller");
    }
    let cred = stream.peer_cred().ok();
    // A caller at its cap of connections is answered 429 at once and the connection closed.
    let _slot = match cred.map(|c| ctx.hold_connection(c.uid())) {
        Some(Some(slot)) => slot,
        Some(None) => {
            let uid = cred.map_or(0, |c| c.uid());
            let body = serde_json::json!({
                "code": "limit",
                "error": format!(
                    "uid {uid} already holds {} API connections to svcd: refused (close some)",
                    routes::API_CONNECTIONS_PER_CALLER
                ),
            })
            .to_string();
            let answer = format!(
                "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let mut stream = stream;
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                tokio::io::AsyncWriteExt::write_all(&mut stream, answer.as_bytes()),
            )
            .await;
            return;
        }
        None => None,
    };
    let caller = cred.map(|c| routes::Caller(c.uid()));
    let groups = routes::CallerGroups(cred.as_ref().map(peer_groups).unwrap_or_default());
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let ctx = ctx.clone();
        let denied = denied.clone();
        if let Some(c) = caller {
            req.extensions_mut().insert(c);
        }
        req.extensions_mut().insert(groups.clone());
        async move {
            Ok::<_, Infallible>(match denied {
                Some(reason) => routes::failure(&Failure {
                    status: 403,
                    code: "forbidden",
                    message: reason,
                }),
                None => routes::route(ctx, req).await,
            })
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
}

/// `GET /metrics` (OpenMetrics text) on `metrics.listen`; anything else is 404.
async fn serve_metrics(
    listener: TcpListener,
    sup: Arc<Supervisor>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(_) => continue,
            },
            () = &mut shutdown => return,
        };
        let sup = sup.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let sup = sup.clone();
                async move {
                    let ok = req.method() == http::Method::GET && req.uri().path() == "/metrics";
                    let (status, ctype, body) = if ok {
                        (
                            http::StatusCode::OK,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            sup.metrics_text(),
                        )
                    } else {
                        (
                            http::StatusCode::NOT_FOUND,
                            "text/plain",
                            "svcd serves GET /metrics here\n".to_owned(),
                        )
                    };
                    Ok::<_, Infallible>(
                        http::Response::builder()
                            .status(status)
                            .header("content-type", ctype)
                            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                            .unwrap_or_default(),
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The coding agent's credential guardian, if `credentials.agent_home` and
/// `credentials.agent_token_endpoint` turn it on: the token endpoint is asked through the same
/// roots, resolver and forward proxy as the proxy's upstreams.
pub fn guardian(
    host: &HostConfig,
    client: Arc<dyn crate::creds::oauth::FormPost>,
) -> anyhow::Result<Option<crate::creds::guardian::Guardian>> {
    let (Some(g), Some((home, _))) = (&host.guardian, &host.agent_home) else {
        if host.agent_home.is_some() {
            info!(
                "the coding agent's credential guardian is off: credentials.agent_token_endpoint is not set"
            );
        }
        return Ok(None);
    };
    let url = crate::creds::oauth::parse_url(&g.token_endpoint).map_err(|e| anyhow::anyhow!(e))?;
    info!(home = %home.display(), endpoint = %url, poll_s = g.poll.as_secs(), lead_s = g.lead.as_secs(),
        "the coding agent's credential guardian is on");
    Ok(Some(crate::creds::guardian::Guardian {
        home: home.clone(),
        entry: g.entry.clone(),
        lead: g.lead,
        refresher: Arc::new(crate::creds::oauth::TokenEndpoint {
            url,
            client_id: g.client_id.clone(),
            client,
        }),
        clock: Arc::new(crate::creds::guardian::SystemClock),
    }))
}

/// The upstream side of the proxy (and of svcd's own requests): the public roots plus
/// `proxy.extra_roots`, and the operator's forward proxy if `[upstream]` names one.
pub fn upstream_config(host: &HostConfig) -> anyhow::Result<ProxyConfig> {
    let mut roots = Vec::new();
    for path in &host.proxy_extra_roots {
        let pem = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        for cert in <rustls::pki_types::CertificateDer<'static> as rustls::pki_types::pem::PemObject>::pem_slice_iter(&pem) {
            roots.push(cert.with_context(|| format!("parsing {}", path.display()))?);
        }
    }
    let mut proxy_config = ProxyConfig::with_roots(&roots).context("the proxy's upstream roots")?;
    if let Some(up) = &host.upstream_proxy {
        let fp = crate::proxy::upstream::ForwardProxy::from_config(up)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        info!(proxy = %up.url, credentials = fp.auth.is_some(), no_proxy = ?up.no_proxy,
            "upstream connections go through the operator's forward proxy");
        proxy_config.forward_proxy = Some(Arc::new(fp));
    }
    Ok(proxy_config)
}

/// `svcd guardian`: one check of the coding agent's credentials, as a running svcd's guardian
/// does it, at `now` (the system clock when `None`).
pub async fn guardian_once(
    host: &HostConfig,
    now: Option<std::time::SystemTime>,
) -> anyhow::Result<crate::creds::guardian::Outcome> {
    let upstream = Upstream::from_host(host).map_err(|e| anyhow::anyhow!("DNS upstreams: {e}"))?;
    let proxy = upstream_config(host)?;
    let client = Arc::new(super::wiring::HostForms(crate::proxy::server::host_client(
        &proxy,
        Arc::new(UpstreamResolver(upstream)),
    )));
    let Some(mut g) = guardian(host, client)? else {
        anyhow::bail!(
            "the credential guardian is off: set credentials.agent_home and credentials.agent_token_endpoint in svcd.toml"
        );
    };
    if let Some(t) = now {
        g.clock = Arc::new(crate::creds::guardian::FixedClock(t));
    }
    Ok(g.check().await)
}
