//! Real implementations of the traits the modules declare.

use std::{
    collections::HashMap,
    future::Future,
    io,
    net::IpAddr,
    pin::Pin,
    sync::{Arc, Mutex, RwLock},
    time::{Duration, SystemTime},
};

use hickory_proto::{
    op::{Message, Query},
    rr::{Name, RData, RecordType},
};

use crate::{
    audit::Incarnation,
    dataplane::{AllowEntry, Fence, PortRule},
    dns::{self, Commit, CommitEntry, SandboxDns, Upstream},
    policy::{
        credentials::CredentialKind,
        dns::{self as dns_policy, Binding},
    },
    proxy::{Broker, ProxySandbox, Resolve, Revocation, Sandboxes},
};

/// Finds the host end of a sandbox's link by sandbox id.
pub type IfindexOf = Arc<dyn Fn(u32) -> Option<u32> + Send + Sync>;

/// The DNS guard's commits, written into the fence's allow map of the sandbox's link.
#[derive(Clone)]
pub struct FenceCommit {
    pub fence: Arc<Mutex<Fence>>,
    /// The host end of the sandbox's link, by sandbox id.
    pub ifindex: IfindexOf,
    /// How long traffic keeps an entry alive past its TTL.
    pub idle: Duration,
}

impl std::fmt::Debug for FenceCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceCommit")
            .field("idle", &self.idle)
            .finish_non_exhaustive()
    }
}

impl Commit for FenceCommit {
    fn commit(&self, sandbox: &SandboxDns, entries: &[CommitEntry]) -> Result<(), String> {
        let ifindex = (self.ifindex)(sandbox.id)
            .ok_or_else(|| format!("sandbox {} has no link", sandbox.id))?;
        let mut fence = self
            .fence
            .lock()
            .map_err(|_| "the fence lock is poisoned".to_owned())?;
        for e in entries {
            let entry = AllowEntry {
                addr: e.addr,
                rules: e.tcp_ports.iter().map(|p| PortRule::Tcp(*p)).collect(),
                host_id: sandbox.id,
                ttl: Some(e.ttl),
                idle: self.idle,
            };
            fence
                .add_allow(ifindex, &entry)
                .map_err(|err| err.to_string())?;
        }
        Ok(())
    }
}

/// One sandbox as the guard, the proxy and the broker see it.
#[derive(Debug)]
pub struct Registered {
    pub id: u32,
    pub name: String,
    /// Which creation of the sandbox this is (the audit records' `incarnation`).
    pub incarnation: Incarnation,
    /// When it was created (a record stamped earlier is an earlier sandbox's).
    pub created: SystemTime,
    /// The Kubernetes pod it was made for: every audit record of it carries it.
    pub pod: Option<crate::api::PodRef>,
    pub ifindex: u32,
    pub guest: IpAddr,
    pub dns: Arc<SandboxDns>,
    /// `None` while the sandbox is in AllowAll (no proxy).
    pub proxy: Option<Arc<ProxySandbox>>,
    /// Real credentials by placeholder (`creds::broker`).
    pub bearers: HashMap<String, crate::creds::broker::BearerSource>,
}

/// Every running sandbox, by guest address and by id, and the names the DNS guard answered
/// with each address, per sandbox (the proxy's SNI/address binding).
#[derive(Debug, Default)]
pub struct Registry {
    by_addr: RwLock<HashMap<IpAddr, Arc<Registered>>>,
    by_id: RwLock<HashMap<u32, Arc<Registered>>>,
    /// Per sandbox: what the guard answered each address with.
    bindings: Mutex<HashMap<u32, HashMap<IpAddr, Binding>>>,
    /// Addresses sandboxes lost (live allowlist changes), for the proxy to cut.
    revocations: Revocations,
}

/// The channel of [`Revocation`]s.
#[derive(Debug)]
struct Revocations(tokio::sync::broadcast::Sender<Revocation>);

impl Default for Revocations {
    fn default() -> Self {
        Self(tokio::sync::broadcast::channel(64).0)
    }
}

/// Bindings kept per sandbox before the oldest are forgotten wholesale (a sandbox resolving
/// this many distinct addresses is not a normal workload; forgetting only refuses connections
/// whose names it must then resolve again).
const MAX_BINDINGS_PER_SANDBOX: usize = 65_536;

/// A [`Commit`] that records which name each address answered for, then commits.
#[derive(Debug, Clone)]
pub struct RecordingCommit<C> {
    pub inner: C,
    pub registry: Arc<Registry>,
}

impl<C: Commit> Commit for RecordingCommit<C> {
    /// An answer that arrives after its sandbox was destroyed opens nothing: not on the link
    /// of a later sandbox given the same id.
    fn commit(&self, sandbox: &SandboxDns, entries: &[CommitEntry]) -> Result<(), String> {
        let current = self.registry.by_id(sandbox.id);
        if !current.is_some_and(|r| r.incarnation == sandbox.incarnation) {
            return Err(format!("sandbox {} was destroyed", sandbox.id));
        }
        self.registry.bind(sandbox.id, entries);
        self.inner.commit(sandbox, entries)
    }
}

impl Registry {
    pub fn insert(&self, r: Registered) {
        let r = Arc::new(r);
        if let Ok(mut m) = self.by_addr.write() {
            m.insert(r.guest, r.clone());
        }
        if let Ok(mut m) = self.by_id.write() {
            m.insert(r.id, r);
        }
    }

    pub fn remove(&self, id: u32) {
        let gone = self.by_id.write().ok().and_then(|mut m| m.remove(&id));
        if let (Some(r), Ok(mut m)) = (gone, self.by_addr.write()) {
            m.remove(&r.guest);
        }
    }

    /// Forget the DNS bindings of a sandbox (it was destroyed).
    pub fn unbind(&self, id: u32) {
        if let Ok(mut b) = self.bindings.lock() {
            b.remove(&id);
        }
    }

    /// Addresses a sandbox's fence already held when svcd (re)started: which names they were
    /// answered for died with the previous process (see `policy::dns::dialled_matches`).
    pub fn bind_unknown(&self, id: u32, addrs: impl IntoIterator<Item = IpAddr>) {
        if let Ok(mut b) = self.bindings.lock() {
            let mine = b.entry(id).or_default();
            for a in addrs {
                mine.entry(a).or_default().unknown = true;
            }
        }
    }

    fn bind(&self, id: u32, entries: &[CommitEntry]) {
        let Ok(mut b) = self.bindings.lock() else {
            return;
        };
        let mine = b.entry(id).or_default();
        if mine.len() >= MAX_BINDINGS_PER_SANDBOX
            && entries.iter().any(|e| !mine.contains_key(&e.addr))
        {
            mine.clear();
        }
        for e in entries {
            mine.entry(e.addr).or_default().names.insert(e.name.clone());
        }
    }

    /// What a change of sandbox `id`'s allowlist leaves open of each address the guard
    /// answered it with: the ports `ports_of` gives the address's names together (empty for a
    /// name no longer allowed). An address whose names all left, or whose names died with a
    /// previous svcd (bound before it restarted), gets none: it leaves the fence.
    pub fn still_open(
        &self,
        id: u32,
        ports_of: impl Fn(&str) -> Vec<u16>,
    ) -> HashMap<IpAddr, Vec<u16>> {
        let Ok(b) = self.bindings.lock() else {
            return HashMap::new();
        };
        let Some(mine) = b.get(&id) else {
            return HashMap::new();
        };
        mine.iter()
            .map(|(addr, binding)| {
                let mut open: Vec<u16> = Vec::new();
                if !binding.unknown {
                    for port in binding.names.iter().flat_map(|n| ports_of(n)) {
                        if !open.contains(&port) {
                            open.push(port);
                        }
                    }
                }
                (*addr, open)
            })
            .collect()
    }

    /// Forget `addrs` of sandbox `id` and tell the proxy to cut its connections to them.
    pub fn revoke(&self, id: u32, addrs: Vec<IpAddr>) {
        if let Ok(mut b) = self.bindings.lock()
            && let Some(m) = b.get_mut(&id)
        {
            for a in &addrs {
                m.remove(a);
            }
        }
        let _ = self.revocations.0.send(Revocation {
            sandbox: id,
            addrs: Arc::new(addrs),
        });
    }

    pub fn by_id(&self, id: u32) -> Option<Arc<Registered>> {
        self.by_id.read().ok()?.get(&id).cloned()
    }

    fn by_addr(&self, addr: IpAddr) -> Option<Arc<Registered>> {
        let addr = addr.to_canonical();
        self.by_addr.read().ok()?.get(&addr).cloned()
    }

    /// A commit function for the guard: the sandbox's link by id.
    pub fn ifindex_of(self: &Arc<Self>) -> IfindexOf {
        let me = self.clone();
        Arc::new(move |id| me.by_id(id).map(|r| r.ifindex))
    }
}

impl dns::Directory for Registry {
    fn sandbox_for(&self, source: IpAddr) -> Option<Arc<SandboxDns>> {
        self.by_addr(source).map(|r| r.dns.clone())
    }
}

impl Sandboxes for Registry {
    fn sandbox_for(&self, source: IpAddr) -> Option<Arc<ProxySandbox>> {
        self.by_addr(source).and_then(|r| r.proxy.clone())
    }

    fn revocations(&self) -> tokio::sync::broadcast::Receiver<Revocation> {
        self.revocations.0.subscribe()
    }

    fn policy_of(&self, id: u32) -> Option<Arc<ProxySandbox>> {
        self.by_id(id)?.proxy.clone()
    }

    fn dialled_matches(&self, sandbox: u32, dialled: IpAddr, name: &str) -> bool {
        self.bindings.lock().is_ok_and(|b| {
            dns_policy::dialled_matches(
                name,
                dialled,
                b.get(&sandbox).and_then(|m| m.get(&dialled)),
            )
        })
    }
}

impl Broker for Registry {
    fn bearer(
        &self,
        sandbox: u32,
        placeholder: &crate::policy::credentials::Placeholder,
        _kind: CredentialKind,
        _host: &str,
    ) -> Option<Result<crate::creds::Bearer, String>> {
        let source = self
            .by_id(sandbox)?
            .bearers
            .get(placeholder.expose())?
            .clone();
        Some(source.current())
    }
}

/// Per-guest limit hits (`limits::Report`): each counted in `svc_guest_limit_hits_total`
/// under the sandbox's name (its id, when that id is now another creation's), the first of each
/// (sandbox, limit) in an interval logged.
pub struct LimitHits {
    pub registry: Arc<Registry>,
    pub metrics: Arc<crate::metrics::Metrics>,
}

impl crate::limits::Report for LimitHits {
    fn limit_hit(
        &self,
        sandbox: &crate::limits::Guest,
        limit: crate::limits::Channel,
        max: u32,
        log: bool,
    ) {
        let found = self
            .registry
            .by_id(sandbox.id)
            .filter(|s| sandbox.key.is_empty() || s.incarnation.key == sandbox.key);
        let name = found
            .as_ref()
            .map_or_else(|| sandbox.id.to_string(), |s| s.name.clone());
        let pod = found.and_then(|s| s.pod.clone());
        self.metrics.limit_hit(&name, pod, limit.key());
        if log && limit == crate::limits::Channel::AuditRecords {
            tracing::warn!(
                sandbox = %name,
                limit = limit.key(),
                max,
                "sandbox {name} went past limits.audit_records_per_sec ({max}): its further \
                 records are counted, not written, until it is within it again (a `suppressed` \
                 audit record gives the counts every 5 s)"
            );
        } else if log {
            tracing::warn!(
                sandbox = %name,
                limit = limit.key(),
                max,
                "sandbox {name} reached limits.{} ({max}): refused on that channel (further hits \
                 in this interval are only counted)",
                limit.key()
            );
        }
    }
}

/// The proxy's upstream names, resolved through the same upstream servers as the DNS guard,
/// so the proxy and the fence agree on what a name is.
#[derive(Debug, Clone)]
pub struct UpstreamResolver(pub Upstream);

impl UpstreamResolver {
    async fn ask(&self, name: &Name, qtype: RecordType) -> io::Result<Vec<IpAddr>> {
        let mut m = Message::query();
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(name.clone(), qtype));
        let id = u16::from_ne_bytes(rand_id());
        m.metadata.id = id;
        let bytes = m.to_vec().map_err(io::Error::other)?;
        let answer = self.0.ask(&bytes, id).await.map_err(io::Error::other)?;
        let answer = Message::from_vec(&answer).map_err(io::Error::other)?;
        Ok(answer
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                _ => None,
            })
            .collect())
    }
}

fn rand_id() -> [u8; 2] {
    let mut b = [0u8; 2];
    let _ = getrandom::fill(&mut b);
    b
}

impl Resolve for UpstreamResolver {
    fn resolve(&self, host: &str) -> Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>> {
        let me = self.clone();
        let host = host.to_owned();
        Box::pin(async move {
            if let Ok(ip) = host.parse::<IpAddr>() {
                return Ok(vec![ip]);
            }
            let name = Name::from_ascii(format!("{host}.")).map_err(io::Error::other)?;
            let (v4, v6) = tokio::join!(
                me.ask(&name, RecordType::A),
                me.ask(&name, RecordType::AAAA)
            );
            let mut all = v4.unwrap_or_default();
            all.extend(v6.unwrap_or_default());
            if all.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{host}: no address from the upstream resolvers"),
                ));
            }
            Ok(all)
        })
    }
}

/// Token-endpoint forms posted through svcd's host client (the proxy's roots, resolver and
/// forward proxy; HTTPS only).
pub struct HostForms(pub crate::proxy::resolve::HostClient);

impl crate::creds::oauth::FormPost for HostForms {
    fn post_form<'a>(
        &'a self,
        url: &'a http::Uri,
        form: zeroize::Zeroizing<Vec<u8>>,
        max: usize,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = crate::creds::oauth::FormAnswer> + Send + 'a>,
    > {
        use http_body_util::BodyExt as _;
        Box::pin(async move {
            let req = http::Request::builder()
                .method(http::Method::POST)
                .uri(url.clone())
                .header("content-type", "application/x-www-form-urlencoded")
                .header("accept", "application/json")
                .header("user-agent", concat!("svcd/", env!("CARGO_PKG_VERSION")))
                .body(http_body_util::Full::new(bytes::Bytes::from(form.to_vec())))
                .map_err(|e| format!("token request: {e}"))?;
            let resp = self.0.request(req).await.map_err(|e| {
                format!(
                    "token endpoint {url}: {}",
                    crate::proxy::resolve::error_chain(&e)
                )
            })?;
            let status = resp.status().as_u16();
            let body = http_body_util::Limited::new(resp.into_body(), max)
                .collect()
                .await
                .map_err(|e| format!("token endpoint {url}: reading the answer: {e}"))?
                .to_bytes();
            Ok((status, zeroize::Zeroizing::new(body.to_vec())))
        })
    }
}
