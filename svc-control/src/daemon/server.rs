//! svcd's start-up, its API on a unix socket, its background work and its shutdown.
//!
//! Start-up order: the configuration was validated before this runs (bad config exits 78
//! without binding anything); then svcd takes its state directory's lock (one svcd per state
//! directory); then the fence is loaded (pinned maps and links are reused),
//! the nftables table is written, the DNS guard and the proxy bind, the sandboxes of the store
//! are re-adopted, and only then does the API socket accept calls. The API's routes are in
//! `routes`.

use std::{
    net::{IpAddr, SocketAddr},
    os::unix::fs::DirBuilderExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use anyhow::Context as _;
use ipnet::IpNet;
use nix::fcntl::{Flock, FlockArg};
use tokio::{net::TcpListener, sync::watch};
use tracing::{info, warn};

use super::{
    api_socket::Ended,
    named_audit::NamedAudit,
    supervisor::{Supervisor, SupervisorConfig},
    wiring::{FenceCommit, RecordingCommit, Registry, UpstreamResolver},
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
pub fn instance_lock(state_dir: &Path) -> anyhow::Result<Flock<std::fs::File>> {
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
    let fenced = fence_up(&host, &opts)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let perimeter = perimeter_up(&host, &fenced, &stop_rx).await?;
    let sup = supervisor_up(&host, fenced, &perimeter, started).await?;
    spawn_background(&sup, &perimeter, &host, &stop_rx);
    if let Some(addr) = host.metrics_listen {
        let listener = TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding metrics.listen {addr}"))?;
        info!(%addr, "serving /metrics");
        tokio::spawn(super::api_socket::serve_metrics(
            listener,
            sup.clone(),
            stopped(stop_rx.clone()),
        ));
    }
    sup.spawn_pool(stop_rx.clone());
    let pooled = sup.clone();
    let ended = super::api_socket::serve_api(&host, &opts.exe, opts.grace, sup).await?;
    let _ = stop_tx.send(true);
    // Pooled sandboxes are nobody's: none outlives this svcd.
    pooled.drain_pool().await;
    // The guard's and the proxy's threads close their sockets as they end (an upgrade binds
    // them again).
    let threads = perimeter.threads;
    let _ = tokio::task::spawn_blocking(move || {
        for t in threads {
            let _ = t.join();
        }
    })
    .await;
    Ok(ended)
}

/// Resolves when `rx` says stop.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The fence loaded (its pinned maps and links reused), the nftables table's configuration,
/// and the host's network as the destination rule sees it.
struct Fenced {
    fence: Arc<Mutex<Fence>>,
    nft: Nft,
    net: HostNetwork,
}

fn fence_up(host: &HostConfig, opts: &RunOptions) -> anyhow::Result<Fenced> {
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
        svcd_ports: svcd_ports(host),
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
    Ok(Fenced {
        fence: Arc::new(Mutex::new(fence)),
        nft,
        net,
    })
}

/// What guards the sandboxes' traffic, running: the audit log, the guest limits, the DNS
/// guard and the proxy (on threads of their own), and what the supervisor shares with them.
struct Perimeter {
    named_audit: Arc<NamedAudit>,
    audit: Arc<dyn AuditSink>,
    registry: Arc<Registry>,
    metrics: Arc<crate::metrics::Metrics>,
    limits: Arc<crate::limits::GuestLimits>,
    resolver: Arc<dyn crate::proxy::Resolve>,
    host_client: Arc<dyn crate::creds::oauth::FormPost>,
    guardian: Option<crate::creds::guardian::Guardian>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

async fn perimeter_up(
    host: &HostConfig,
    fenced: &Fenced,
    stop_rx: &watch::Receiver<bool>,
) -> anyhow::Result<Perimeter> {
    let audit: Arc<JsonlFile> = Arc::new(
        JsonlFile::open(host.audit_dir.join("audit.jsonl"), host.audit.max_bytes)
            .context("opening the audit log")?
            .keeping(host.audit.keep),
    );
    reopen_on_hangup(audit.clone())?;
    let upstream = Upstream::from_host(host).map_err(|e| anyhow::anyhow!("DNS upstreams: {e}"))?;
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
                fence: fenced.fence.clone(),
                ifindex: registry.ifindex_of(),
                idle: Duration::from_secs(300),
            },
            registry: registry.clone(),
        }),
        audit.clone(),
        fenced.net.clone(),
    ));
    let mut proxy_config = upstream_config(host)?;
    // Every address the proxy dials for a guest passes the destination classes.
    proxy_config.network = fenced.net.clone();
    proxy_config.limits = limits.clone();
    let resolver: Arc<dyn crate::proxy::Resolve> = Arc::new(UpstreamResolver(upstream));
    // One client for svcd's own token-endpoint requests (the guardian's and OAuth secrets').
    let host_client: Arc<dyn crate::creds::oauth::FormPost> = Arc::new(super::wiring::HostForms(
        crate::proxy::server::host_client(&proxy_config, resolver.clone()),
    ));
    let guardian = guardian(host, host_client.clone())?;
    let proxy = Arc::new(Proxy::new(
        proxy_config,
        registry.clone(),
        registry.clone(),
        resolver.clone(),
        audit.clone(),
    ));
    let threads = serve_perimeter(host, &guard, &proxy, stop_rx).await?;
    Ok(Perimeter {
        named_audit,
        audit,
        registry,
        metrics,
        limits,
        resolver,
        host_client,
        guardian,
        threads,
    })
}

/// The guard's TCP side on svcd's runtime; its UDP side and the proxy on threads of their own,
/// one per core (see `per_core`): a question or a request runs start to end on one thread.
async fn serve_perimeter(
    host: &HostConfig,
    guard: &Arc<Guard>,
    proxy: &Arc<Proxy>,
    stop_rx: &watch::Receiver<bool>,
) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
    let any = |port| SocketAddr::new(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED), port);
    let guard_tcp = TcpListener::bind(any(host.guard_port))
        .await
        .with_context(|| format!("binding the DNS guard to tcp port {}", host.guard_port))?;
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
    tokio::spawn(guard.clone().serve_tcp(guard_tcp, stopped(stop_rx.clone())));
    Ok(threads)
}

/// SIGHUP reopens the audit log: after logrotate renamed it (`create`), the next record lands
/// in a new file at its path.
fn reopen_on_hangup(audit: Arc<JsonlFile>) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hangups = signal(SignalKind::hangup()).context("listening for SIGHUP")?;
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            match audit.reopen() {
                Ok(()) => info!(path = %audit.path().display(), "SIGHUP: reopened the audit log"),
                Err(e) => warn!(error = %e, "SIGHUP: reopening the audit log"),
            }
        }
    });
    Ok(())
}

/// The backends: the container backend (always) and the microvm backend (offered when its
/// images are configured).
async fn backends_up(host: &HostConfig) -> anyhow::Result<Backends> {
    let backend = {
        let (config, state_dir) = (host.container.clone(), host.state_dir.clone());
        tokio::task::spawn_blocking(move || Container::new(&config, &state_dir))
            .await
            .context("preparing the container backend")??
    };
    match backend.slices() {
        None => info!(
            uid = backend.ids().uid,
            gid = backend.ids().gid,
            "container backend ready: guest root is host uid {}",
            backend.ids().uid
        ),
        Some(r) => info!(
            uid = r.start.uid,
            gid = r.start.gid,
            slices = r.slices,
            "container backend ready: sandbox id N's guest root is host uid {} + N x {}",
            r.start.uid,
            crate::runtime::ids::ID_COUNT
        ),
    }
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
    Ok(Backends::new(registry::container(Arc::new(backend))).with(registry::microvm(microvm)))
}

/// The supervisor over the store, the fence and the backends, with the store's sandboxes
/// re-adopted.
async fn supervisor_up(
    host: &HostConfig,
    fenced: Fenced,
    perimeter: &Perimeter,
    started: SystemTime,
) -> anyhow::Result<Arc<Supervisor>> {
    let store = crate::store::Store::open(&host.state_dir)?;
    let links = Links::connect()?;
    let backends = backends_up(host).await?;
    let key = Arc::new(
        crate::creds::HostKey::load_or_create(&host.key_file)
            .map_err(|e| anyhow::anyhow!("{e}"))?,
    );
    let sup = Arc::new(Supervisor::new(
        SupervisorConfig {
            host: host.clone(),
            metrics: perimeter.metrics.clone(),
            audit: perimeter.audit.clone(),
            key,
            guardian: perimeter.guardian.clone(),
            host_client: Some(perimeter.host_client.clone()),
            // The relay's servers are resolved by svcd and each address checked.
            resolver: perimeter.resolver.clone(),
            network: fenced.net,
            limits: perimeter.limits.clone(),
        },
        store,
        fenced.fence,
        fenced.nft,
        links,
        backends,
        perimeter.registry.clone(),
        started,
    ));
    sup.reconcile()
        .await
        .map_err(|f| anyhow::anyhow!("re-adopting sandboxes: {}", f.message))?;
    Ok(sup)
}

/// Background work: drop events to the audit log, windows and expired entries, each
/// sandbox's suppressed audit records, brokered OAuth secrets refreshed before they expire.
fn spawn_background(
    sup: &Arc<Supervisor>,
    perimeter: &Perimeter,
    host: &HostConfig,
    stop_rx: &watch::Receiver<bool>,
) {
    let (sup2, audit) = (sup.clone(), perimeter.audit.clone());
    let named_audit = perimeter.named_audit.clone();
    let mut stop = stop_rx.clone();
    tokio::spawn(async move {
        let mut drops = tokio::time::interval(Duration::from_millis(100));
        let mut ticks = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = drops.tick() => audit_drops(&sup2, audit.as_ref()),
                _ = ticks.tick() => {
                    sup2.tick();
                    named_audit.write_suppressed();
                }
                _ = stop.wait_for(|s| *s) => break,
            }
        }
    });
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

/// The fence's drop events since the last call, as packet audit records.
fn audit_drops(sup: &Supervisor, audit: &dyn AuditSink) {
    let events = sup.drain_drops();
    if events.is_empty() {
        return;
    }
    let (mono, wall) = (clock::monotonic_ns(), SystemTime::now());
    for e in &events {
        if let Err(err) = audit.record(&AuditRecord::from_drop(e, mono, wall)) {
            warn!(error = %err, "writing a packet audit record");
        }
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
