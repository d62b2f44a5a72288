//! The guard's request path: one query in, one answer out (or none for garbage).

use std::{
    collections::HashMap,
    future::Future,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use hickory_proto::{
    op::{Message, MessageType, OpCode, Query, ResponseCode},
    rr::{DNSClass, Name, RData, Record, RecordType},
};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream, UdpSocket},
};

use super::{Commit, CommitEntry, Directory, Upstream};
use crate::{
    audit::{AuditEvent, AuditRecord, AuditSink, DnsEvent, rfc3339},
    limits::{Channel, GuestLimits},
    policy::{
        destination::{self, HostNetwork},
        dns::{self, DnsDecision},
    },
};

/// How the query arrived (UDP answers are size-limited and may be truncated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// Settings of the guard.
#[derive(Debug, Clone)]
pub struct GuardConfig {
    pub upstream: Upstream,
    /// TTLs in answers and fence entries are clamped to this range.
    pub ttl_min: Duration,
    pub ttl_max: Duration,
    /// Queries per second per sandbox (token bucket), and the bucket's size.
    pub rate_per_second: u32,
    pub burst: u32,
    /// Longest CNAME chain followed.
    pub max_cname_hops: usize,
    /// Per-sandbox caps: DNS-over-TCP connections held at once (`[limits]`).
    pub limits: Arc<GuestLimits>,
}

impl GuardConfig {
    /// The documented defaults: TTLs clamped to 30 s – 1 h, 200 queries a second per sandbox
    /// with a burst of 400, CNAME chains of up to 8 hops.
    pub fn with_upstream(upstream: Upstream) -> Self {
        Self {
            upstream,
            ttl_min: Duration::from_secs(30),
            ttl_max: Duration::from_secs(3600),
            rate_per_second: 200,
            burst: 400,
            max_cname_hops: 8,
            limits: Arc::default(),
        }
    }
}

/// Questions one UDP receiver keeps waiting for the upstream at once.
const MAX_WAITING: usize = 1024;
/// Largest query accepted over UDP.
const MAX_UDP_QUERY: usize = 4096;
/// The UDP answer size when the client says nothing (RFC 1035).
const DEFAULT_UDP_PAYLOAD: usize = 512;
/// Largest UDP answer we send whatever the client offers (DNS flag day 2020).
const MAX_UDP_PAYLOAD: usize = 1232;

struct Cached {
    records: Vec<Record>,
    stored: Instant,
    lifetime: Duration,
    rcode: ResponseCode,
}

struct Bucket {
    tokens: f64,
    last: Instant,
    limited_since_report: u64,
}

/// The DNS guard. Cheap to share (`Arc`); every method takes `&self`.
pub struct Guard {
    config: GuardConfig,
    directory: Arc<dyn Directory>,
    commit: Arc<dyn Commit>,
    audit: Arc<dyn AuditSink>,
    network: HostNetwork,
    cache: Mutex<HashMap<(String, u16), Cached>>,
    buckets: Mutex<HashMap<u32, Bucket>>,
    sockets: super::upstream::Sockets,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Guard {
    pub fn new(
        config: GuardConfig,
        directory: Arc<dyn Directory>,
        commit: Arc<dyn Commit>,
        audit: Arc<dyn AuditSink>,
        network: HostNetwork,
    ) -> Self {
        Self {
            config,
            directory,
            commit,
            audit,
            network,
            cache: Mutex::default(),
            buckets: Mutex::default(),
            sockets: super::upstream::Sockets::default(),
        }
    }

    /// Answer one query from `source`. `None`: not even a DNS header; nothing is sent back.
    pub async fn handle(
        &self,
        source: IpAddr,
        query: &[u8],
        transport: Transport,
    ) -> Option<Vec<u8>> {
        if query.len() < 12 {
            return None;
        }
        let id = u16::from_be_bytes([query[0], query[1]]);
        let Ok(msg) = Message::from_vec(query) else {
            return encode(&Message::error_msg(
                id,
                OpCode::Query,
                ResponseCode::FormErr,
            ));
        };
        if msg.metadata.message_type != MessageType::Query {
            return None; // a response sent to us: never answer it (no reflection loops)
        }
        if msg.metadata.op_code != OpCode::Query {
            return encode(&Message::error_msg(
                id,
                msg.metadata.op_code,
                ResponseCode::NotImp,
            ));
        }
        let [question] = msg.queries.as_slice() else {
            return encode(&Message::error_msg(
                id,
                OpCode::Query,
                ResponseCode::FormErr,
            ));
        };
        let mut reply = Message::response(id, OpCode::Query);
        reply.metadata.recursion_desired = msg.metadata.recursion_desired;
        reply.metadata.recursion_available = true;
        reply.add_query(question.clone());
        let name = question.name().to_ascii();
        let qtype = u16::from(question.query_type());
        let mut event = DnsEvent {
            name: name.clone(),
            qtype: question.query_type().to_string(),
            decision: "refused",
            reason: None,
            answers: vec![],
            removed: vec![],
            upstream_ms: None,
            cached: false,
        };

        // A dual-stack socket reports IPv4 clients as ::ffff:a.b.c.d.
        let source = source.to_canonical();
        let Some(sandbox) = self.directory.sandbox_for(source) else {
            event.reason = Some(format!("{source} is not a sandbox"));
            self.record(0, event);
            return finish(reply, ResponseCode::Refused, &msg, transport);
        };
        if question.query_class() != DNSClass::IN {
            event.reason = Some("only class IN is answered".into());
            self.record(sandbox.id, event);
            return finish(reply, ResponseCode::Refused, &msg, transport);
        }
        if !self.take_token(sandbox.id) {
            event.decision = "rate-limited";
            event.reason = Some(format!(
                "more than {} queries a second",
                self.config.rate_per_second
            ));
            if self.should_report_limit(sandbox.id) {
                self.record(sandbox.id, event);
            }
            return finish(reply, ResponseCode::Refused, &msg, transport);
        }

        let decision = if sandbox.allow_all {
            dns::decide_allow_all(&name, qtype)
        } else {
            dns::decide(&sandbox.allowed, &name, qtype)
        };
        match decision {
            DnsDecision::Refuse { reason } => {
                event.reason = Some(reason.into());
                self.record(sandbox.id, event);
                finish(reply, ResponseCode::Refused, &msg, transport)
            }
            DnsDecision::Empty { reason } => {
                event.decision = "empty";
                event.reason = Some(reason.into());
                self.record(sandbox.id, event);
                finish(reply, ResponseCode::NoError, &msg, transport)
            }
            DnsDecision::Resolve { ports } => {
                let (rcode, records) = match self.resolve(question, &mut event).await {
                    Ok(r) => r,
                    Err(why) => {
                        event.decision = "servfail";
                        event.reason = Some(why);
                        self.record(sandbox.id, event);
                        return finish(reply, ResponseCode::ServFail, &msg, transport);
                    }
                };
                let (kept, removed) = self.filter(records);
                event.removed = removed;
                let entries: Vec<CommitEntry> = kept
                    .iter()
                    .filter_map(|r| {
                        address(r).map(|addr| CommitEntry {
                            name: crate::policy::host::normalize_name(&name).unwrap_or_else(|_| {
                                name.trim_end_matches('.').to_ascii_lowercase()
                            }),
                            addr,
                            tcp_ports: ports.clone(),
                            ttl: Duration::from_secs(u64::from(r.ttl)),
                        })
                    })
                    .collect();
                event.answers = entries.iter().map(|e| e.addr).collect();
                if !entries.is_empty()
                    && let Err(why) = self.commit.commit(&sandbox, &entries)
                {
                    event.decision = "servfail";
                    event.reason = Some(format!("the fence did not take the addresses: {why}"));
                    self.record(sandbox.id, event);
                    return finish(reply, ResponseCode::ServFail, &msg, transport);
                }
                event.decision = "answered";
                self.record(sandbox.id, event);
                reply.add_answers(kept);
                finish(reply, rcode, &msg, transport)
            }
        }
    }

    /// The answer records for an allowed question: cache, else upstream (following CNAMEs),
    /// with TTLs clamped.
    async fn resolve(
        &self,
        question: &Query,
        event: &mut DnsEvent,
    ) -> Result<(ResponseCode, Vec<Record>), String> {
        let key = (
            question.name().to_lowercase().to_ascii(),
            u16::from(question.query_type()),
        );
        if let Some((rcode, records)) = self.cached(&key) {
            event.cached = true;
            return Ok((rcode, records));
        }
        let started = Instant::now();
        let mut records: Vec<Record> = Vec::new();
        let mut target = question.name().clone();
        let mut rcode = ResponseCode::NoError;
        for _ in 0..=self.config.max_cname_hops {
            let (code, answers) = self.ask(&target, question.query_type()).await?;
            rcode = code;
            let before = records.len();
            records.extend(
                answers
                    .into_iter()
                    .filter(|r| matches!(r.data, RData::A(_) | RData::AAAA(_) | RData::CNAME(_))),
            );
            // Follow the chain only if it ends in a CNAME with no address for its target.
            let tail = chain_tail(&records[before..], &target);
            let has_final = records[before..]
                .iter()
                .any(|r| r.name == tail && address(r).is_some());
            if tail == target
                || has_final
                || rcode != ResponseCode::NoError
                || question.query_type() == RecordType::CNAME
            {
                break;
            }
            target = tail;
        }
        event.upstream_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        let (min, max) = (self.config.ttl_min.as_secs(), self.config.ttl_max.as_secs());
        for r in &mut records {
            r.ttl = u32::try_from(u64::from(r.ttl).clamp(min, max)).unwrap_or(u32::MAX);
        }
        let lifetime = records
            .iter()
            .map(|r| r.ttl)
            .min()
            .map_or(self.config.ttl_min, |t| Duration::from_secs(u64::from(t)));
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() > 100_000 {
                cache.retain(|_, c| c.stored.elapsed() < c.lifetime);
            }
            cache.insert(
                key,
                Cached {
                    records: records.clone(),
                    stored: Instant::now(),
                    lifetime,
                    rcode,
                },
            );
        }
        Ok((rcode, records))
    }

    async fn ask(
        &self,
        name: &Name,
        rtype: RecordType,
    ) -> Result<(ResponseCode, Vec<Record>), String> {
        let mut q = Message::query();
        q.metadata.recursion_desired = true;
        q.add_query(Query::query(name.clone(), rtype));
        let bytes = q
            .to_vec()
            .map_err(|e| format!("encoding the upstream query: {e}"))?;
        let answer = self
            .config
            .upstream
            .ask_pooled(&self.sockets, &bytes, q.metadata.id)
            .await
            .map_err(|e| format!("upstream: {e}"))?;
        let answer = Message::from_vec(&answer)
            .map_err(|e| format!("upstream answer does not parse: {e}"))?;
        if answer.metadata.message_type != MessageType::Response
            || answer.queries.first() != q.queries.first()
        {
            return Err("upstream answered another question".into());
        }
        Ok((answer.metadata.response_code, answer.answers))
    }

    fn cached(&self, key: &(String, u16)) -> Option<(ResponseCode, Vec<Record>)> {
        let cache = self.cache.lock().ok()?;
        let c = cache.get(key)?;
        let age = c.stored.elapsed();
        if age >= c.lifetime {
            return None;
        }
        // Whole seconds rounded up: an answer never promises more life than its fence entry
        // was given (which lets `Fence::add_allow` skip rewriting an entry that covers it).
        let elapsed =
            u32::try_from(age.as_secs() + u64::from(age.subsec_nanos() > 0)).unwrap_or(u32::MAX);
        let floor = u32::try_from(self.config.ttl_min.as_secs()).unwrap_or(30);
        let records = c
            .records
            .iter()
            .map(|r| {
                let mut r = r.clone();
                r.ttl = r.ttl.saturating_sub(elapsed).max(floor.min(r.ttl));
                r
            })
            .collect();
        Some((c.rcode, records))
    }

    /// Remove address records in refused destination classes.
    fn filter(&self, records: Vec<Record>) -> (Vec<Record>, Vec<IpAddr>) {
        let mut removed = Vec::new();
        let kept = records
            .into_iter()
            .filter(|r| match address(r) {
                Some(a) if !destination::classify(a, &self.network).reachable() => {
                    removed.push(a);
                    false
                }
                _ => true,
            })
            .collect();
        (kept, removed)
    }

    fn take_token(&self, sandbox: u32) -> bool {
        let Ok(mut buckets) = self.buckets.lock() else {
            return false;
        };
        let now = Instant::now();
        let b = buckets.entry(sandbox).or_insert(Bucket {
            tokens: f64::from(self.config.burst),
            last: now,
            limited_since_report: 0,
        });
        let refill =
            now.duration_since(b.last).as_secs_f64() * f64::from(self.config.rate_per_second);
        b.tokens = (b.tokens + refill).min(f64::from(self.config.burst));
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            b.limited_since_report += 1;
            false
        }
    }

    /// Report the first refusal of a burst and then one in a hundred, so a flood cannot flood
    /// the audit log either.
    fn should_report_limit(&self, sandbox: u32) -> bool {
        self.buckets
            .lock()
            .ok()
            .and_then(|b| b.get(&sandbox).map(|b| b.limited_since_report % 100 == 1))
            .unwrap_or(true)
    }

    fn record(&self, sandbox: u32, event: DnsEvent) {
        // On a serving thread, gathered with the rest of its turn (see `serve_udp_threads`).
        let _ = crate::audit::record_here(
            &self.audit,
            AuditRecord {
                time: rfc3339(SystemTime::now()),
                sandbox_name: None,
                sandbox,
                event: AuditEvent::Dns(event),
            },
        );
    }

    /// Serve UDP until `shutdown` completes.
    pub async fn serve_udp(self: Arc<Self>, socket: UdpSocket, shutdown: impl Future<Output = ()>) {
        // One receiver per core: each answers what it can where it runs (see `receive_udp`).
        let receivers = crate::per_core::threads(4);
        self.serve_udp_on(socket, receivers, shutdown).await;
    }

    async fn serve_udp_on(
        self: Arc<Self>,
        socket: UdpSocket,
        receivers: usize,
        shutdown: impl Future<Output = ()>,
    ) {
        let socket = Arc::new(socket);
        let receivers: Vec<_> = (0..receivers)
            .map(|_| tokio::spawn(self.clone().receive_udp(socket.clone())))
            .collect();
        shutdown.await;
        for r in receivers {
            r.abort();
        }
    }

    /// Serve UDP on `addr` from `threads` threads of their own, each with its own socket
    /// (`SO_REUSEPORT`: the kernel spreads the sandboxes' questions over them) and its own
    /// single-threaded runtime, so a question is received, answered (or forwarded and answered)
    /// and sent back on one thread, without hand-offs between workers: measured, that takes
    /// ~35 µs off a forwarded question on this kind of machine, and the threads together answer
    /// more cached questions than one. They end when `shutdown` turns true. Binding errors are
    /// returned here, before any thread starts.
    pub fn serve_udp_threads(
        self: &Arc<Self>,
        addr: SocketAddr,
        threads: usize,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
        let sockets = (0..threads.max(1))
            .map(|_| crate::per_core::udp(addr))
            .collect::<std::io::Result<Vec<_>>>()?;
        sockets
            .into_iter()
            .enumerate()
            .map(|(i, socket)| {
                let (guard, mut shutdown) = (self.clone(), shutdown.clone());
                // The thread's audit records (one per question) are written together at the
                // end of each turn of its loop, as the proxy's are: one write for a batch of
                // questions read with one `recvmmsg`, not one each.
                crate::per_core::spawn_with_audit(
                    format!("dns-guard-{i}"),
                    &self.audit,
                    move || async move {
                        let Ok(socket) = UdpSocket::from_std(socket) else {
                            return;
                        };
                        guard
                            .serve_udp_on(socket, 1, async move {
                                let _ = shutdown.wait_for(|s| *s).await;
                            })
                            .await;
                    },
                )
            })
            .collect()
    }

    /// One receiver: reads the questions waiting in batches (`udp_batch`), answers what is
    /// ready at once (the cache, refusals) right here, sending the batch's answers together,
    /// and drives
    /// the questions that wait for the upstream itself, as futures of its own (at most
    /// [`MAX_WAITING`] at a time; more are dropped, as a full socket buffer would): no task is
    /// spawned and no other thread woken for any question (a spawned task cost ~10 µs more
    /// per forwarded question, measured).
    async fn receive_udp(self: Arc<Self>, socket: Arc<UdpSocket>) {
        use std::os::fd::AsFd as _;

        use futures::StreamExt as _;
        let mut inbox = super::udp_batch::Inbox::new(MAX_UDP_QUERY);
        let mut waiting = futures::stream::FuturesUnordered::new();
        loop {
            tokio::select! {
                biased;
                Some((answer, peer)) = waiting.next(), if !waiting.is_empty() => {
                    if let Some(answer) = answer {
                        send_udp(&socket, answer, peer);
                    }
                    continue;
                }
                r = socket.readable() => if r.is_err() {
                    continue;
                },
            }
            // Everything waiting, up to a batch, in one call (`WouldBlock` clears the
            // readiness and the loop waits again).
            let Ok(received) = socket.try_io(tokio::io::Interest::READABLE, || {
                inbox.receive(socket.as_fd())
            }) else {
                continue;
            };
            let mut ready = Vec::new();
            for (query, peer) in received {
                let query = query.to_vec();
                let guard = self.clone();
                let mut answer = Box::pin(async move {
                    (guard.handle(peer.ip(), &query, Transport::Udp).await, peer)
                });
                let first = answer
                    .as_mut()
                    .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
                match first {
                    std::task::Poll::Ready((Some(answer), peer)) => ready.push((answer, peer)),
                    std::task::Poll::Ready((None, _)) => {}
                    // `waiting` polls it again with its real waker.
                    std::task::Poll::Pending if waiting.len() < MAX_WAITING => {
                        waiting.push(answer);
                    }
                    std::task::Poll::Pending => {}
                }
            }
            send_batch(&socket, ready);
        }
    }

    /// Serve DNS over TCP until `shutdown` completes. A sandbox holds at most
    /// `limits.dns_tcp_connections` connections at once: the next is accepted and closed at
    /// once, unread (no task, no buffer), and the hit reported.
    pub async fn serve_tcp(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        loop {
            let (conn, peer) = tokio::select! {
                () = &mut shutdown => return,
                r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
            };
            let slot = match self.directory.sandbox_for(peer.ip().to_canonical()) {
                Some(sandbox) => match self.config.limits.acquire(sandbox.id, Channel::DnsTcp) {
                    Ok(slot) => Some(slot),
                    Err(_) => {
                        drop(conn);
                        continue;
                    }
                },
                // Not a sandbox: answered REFUSED by `handle`, as over UDP.
                None => None,
            };
            let guard = self.clone();
            tokio::spawn(async move {
                guard.tcp_connection(conn, peer).await;
                drop(slot);
            });
        }
    }

    async fn tcp_connection(&self, mut conn: TcpStream, peer: SocketAddr) {
        for _ in 0..100 {
            let mut len = [0u8; 2];
            let read =
                tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut len)).await;
            if !matches!(read, Ok(Ok(_))) {
                return;
            }
            let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
            if !matches!(
                tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut query)).await,
                Ok(Ok(_))
            ) {
                return;
            }
            let Some(answer) = self.handle(peer.ip(), &query, Transport::Tcp).await else {
                return;
            };
            let Ok(alen) = u16::try_from(answer.len()) else {
                return;
            };
            if conn.write_all(&alen.to_be_bytes()).await.is_err()
                || conn.write_all(&answer).await.is_err()
            {
                return;
            }
        }
    }
}

/// Send answers in as few calls as the socket takes now; any it does not take go one by one
/// (from a task if the socket is full).
fn send_batch(socket: &Arc<UdpSocket>, answers: Vec<(Vec<u8>, SocketAddr)>) {
    use std::os::fd::AsFd as _;
    if answers.is_empty() {
        return;
    }
    let sent = socket
        .try_io(tokio::io::Interest::WRITABLE, || {
            super::udp_batch::send(socket.as_fd(), &answers)
        })
        .unwrap_or(0);
    for (answer, peer) in answers.into_iter().skip(sent) {
        send_udp(socket, answer, peer);
    }
}

/// Send a UDP answer now if the socket takes it, else from a task once it can.
fn send_udp(socket: &Arc<UdpSocket>, answer: Vec<u8>, peer: SocketAddr) {
    match socket.try_send_to(&answer, peer) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            let socket = socket.clone();
            tokio::spawn(async move {
                let _ = socket.send_to(&answer, peer).await;
            });
        }
        _ => {}
    }
}

/// The address of an A or AAAA record.
fn address(r: &Record) -> Option<IpAddr> {
    match &r.data {
        RData::A(a) => Some(IpAddr::V4(a.0)),
        RData::AAAA(a) => Some(IpAddr::V6(a.0)),
        _ => None,
    }
}

/// Follow CNAMEs from `start` through `records`; the last name reached.
fn chain_tail(records: &[Record], start: &Name) -> Name {
    let mut name = start.clone();
    for _ in 0..16 {
        let next = records.iter().find_map(|r| match &r.data {
            RData::CNAME(c) if r.name == name => Some(c.0.clone()),
            _ => None,
        });
        match next {
            Some(n) => name = n,
            None => break,
        }
    }
    name
}

/// Set the code, fit the answer to the transport (truncate for UDP), encode.
fn finish(
    mut reply: Message,
    rcode: ResponseCode,
    query: &Message,
    transport: Transport,
) -> Option<Vec<u8>> {
    reply.metadata.response_code = rcode;
    let bytes = reply.to_vec().ok()?;
    if transport == Transport::Udp {
        let limit = query.edns.as_ref().map_or(DEFAULT_UDP_PAYLOAD, |e| {
            usize::from(e.max_payload()).clamp(DEFAULT_UDP_PAYLOAD, MAX_UDP_PAYLOAD)
        });
        if bytes.len() > limit {
            let mut small = Message::response(reply.metadata.id, OpCode::Query);
            small.metadata = reply.metadata;
            small.metadata.truncation = true;
            small.add_queries(reply.queries.iter().cloned());
            return small.to_vec().ok();
        }
    }
    Some(bytes)
}

fn encode(m: &Message) -> Option<Vec<u8>> {
    m.to_vec().ok()
}
