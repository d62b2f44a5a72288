//! The DNS guard over real sockets against a real upstream (dnsmasq on loopback): what it
//! answers, what it refuses without ever asking upstream, what it commits to the fence before
//! answering, and how it copes with bad input, truncation, timeouts and floods.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use hickory_proto::{
    op::{Message, MessageType, OpCode, Query, ResponseCode},
    rr::{DNSClass, Name, RData, RecordType},
};
use svc_control::{
    audit::{AuditError, AuditEvent, AuditRecord, AuditSink},
    dns::{Commit, CommitEntry, Directory, Guard, GuardConfig, SandboxDns, Sockets, Upstream},
    hosts::{Allowlist, HostPattern},
    policy::destination::HostNetwork,
};
use svc_tests::dns::Dnsmasq;
use tokio::net::{TcpListener, UdpSocket};

struct Dir(HashMap<IpAddr, Arc<SandboxDns>>);
impl Directory for Dir {
    fn sandbox_for(&self, source: IpAddr) -> Option<Arc<SandboxDns>> {
        self.0.get(&source).cloned()
    }
}

/// Records what the guard committed and when, relative to the answers the client saw.
#[derive(Default)]
struct Recorder {
    commits: Mutex<Vec<(u32, Vec<CommitEntry>)>>,
    fail: std::sync::atomic::AtomicBool,
}
impl Commit for Recorder {
    fn commit(&self, sandbox: &SandboxDns, entries: &[CommitEntry]) -> Result<(), String> {
        if self.fail.load(std::sync::atomic::Ordering::Relaxed) {
            return Err("map full".into());
        }
        self.commits
            .lock()
            .unwrap()
            .push((sandbox.id, entries.to_vec()));
        Ok(())
    }
}

#[derive(Default)]
struct Audit(Mutex<Vec<AuditRecord>>);
impl AuditSink for Audit {
    fn record(&self, r: &AuditRecord) -> Result<(), AuditError> {
        self.0.lock().unwrap().push(r.clone());
        Ok(())
    }
}

struct World {
    upstream: Dnsmasq,
    guard_udp: SocketAddr,
    guard_tcp: SocketAddr,
    commits: Arc<Recorder>,
    audit: Arc<Audit>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// The one upstream `server`, waited for `timeout`.
fn one_upstream(server: SocketAddr, timeout: Duration) -> Upstream {
    Upstream {
        servers: vec![server],
        timeout,
    }
}

/// A guard configuration asking `server`, waiting `timeout` for it.
fn upstream(server: SocketAddr, timeout: Duration) -> GuardConfig {
    GuardConfig::with_upstream(one_upstream(server, timeout))
}

/// `guard`'s answer over UDP to the question `q` from `source`.
async fn handle_udp(guard: &Guard, source: &str, q: &[u8]) -> Vec<u8> {
    let source: IpAddr = source.parse().unwrap();
    guard
        .handle(source, q, svc_control::dns::Transport::Udp)
        .await
        .unwrap()
}

/// A fresh guard with `config` for one sandbox at 127.0.0.1 allowed `api.example.test`,
/// committing and auditing into `w`'s recorders.
fn one_sandbox_guard(w: &World, config: GuardConfig) -> Guard {
    Guard::new(
        config,
        Arc::new(Dir(HashMap::from([(
            "127.0.0.1".parse().unwrap(),
            Arc::new(SandboxDns::curated(
                1,
                Allowlist(vec![HostPattern::parse("api.example.test").unwrap()]),
            )),
        )]))),
        w.commits.clone(),
        w.audit.clone(),
        HostNetwork::default(),
    )
}

async fn world(ttl: u32, rate: u32) -> World {
    let mut records: Vec<(String, String)> = vec![
        ("api.example.test".into(), "192.0.2.10".into()),
        ("api.example.test".into(), "2001:db8::10".into()),
        ("edge.cdn.test".into(), "192.0.2.50".into()),
        ("mixed.example.test".into(), "10.0.0.5".into()),
        ("mixed.example.test".into(), "192.0.2.11".into()),
        ("meta.example.test".into(), "169.254.169.254".into()),
        ("evil.example.org".into(), "198.51.100.66".into()),
    ];
    for i in 0..60 {
        records.push(("big.example.test".into(), format!("192.0.2.{}", 100 + i)));
    }
    let refs: Vec<(&str, &str)> = records
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let upstream = Dnsmasq::start(&refs, &[("alias.example.test", "edge.cdn.test")], ttl);
    let allowed = Allowlist(
        [
            "api.example.test",
            "alias.example.test",
            "mixed.example.test",
            "meta.example.test",
            "big.example.test",
            "git.example.test:8443",
        ]
        .iter()
        .map(|h| HostPattern::parse(h).unwrap())
        .collect(),
    );
    let dir = Dir(HashMap::from([
        (
            "127.0.0.1".parse().unwrap(),
            Arc::new(SandboxDns::curated(1, allowed.clone())),
        ),
        (
            "127.0.0.2".parse().unwrap(),
            Arc::new(SandboxDns::curated(2, allowed)),
        ),
    ]));
    let mut config = self::upstream(upstream.addr, Duration::from_millis(800));
    config.rate_per_second = rate;
    config.burst = rate;
    let commits = Arc::new(Recorder::default());
    let audit = Arc::new(Audit::default());
    let guard = Arc::new(Guard::new(
        config,
        Arc::new(dir),
        commits.clone(),
        audit.clone(),
        HostNetwork::default(),
    ));
    let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (guard_udp, guard_tcp) = (udp.local_addr().unwrap(), tcp.local_addr().unwrap());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let shared = futures::FutureExt::shared(async move {
        let _ = rx.await;
    });
    tokio::spawn(guard.clone().serve_udp(udp, shared.clone()));
    tokio::spawn(guard.serve_tcp(tcp, shared));
    World {
        upstream,
        guard_udp,
        guard_tcp,
        commits,
        audit,
        _stop: tx,
    }
}

fn query(name: &str, t: RecordType) -> Message {
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
    m
}

async fn ask_from(from: &str, to: SocketAddr, bytes: &[u8]) -> Option<Message> {
    let sock = UdpSocket::bind(format!("{from}:0")).await.unwrap();
    sock.send_to(bytes, to).await.unwrap();
    let mut buf = vec![0u8; 65535];
    match tokio::time::timeout(Duration::from_secs(2), sock.recv_from(&mut buf)).await {
        Ok(Ok((n, _))) => Some(Message::from_vec(&buf[..n]).expect("the guard answers parse")),
        _ => None,
    }
}

async fn ask(w: &World, name: &str, t: RecordType) -> Message {
    ask_from("127.0.0.1", w.guard_udp, &query(name, t).to_vec().unwrap())
        .await
        .expect("an answer")
}

async fn ask_tcp(to: SocketAddr, m: &Message) -> Message {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let bytes = m.to_vec().unwrap();
    let mut s = tokio::net::TcpStream::connect(to).await.unwrap();
    s.write_all(&(bytes.len() as u16).to_be_bytes())
        .await
        .unwrap();
    s.write_all(&bytes).await.unwrap();
    let mut len = [0u8; 2];
    s.read_exact(&mut len).await.unwrap();
    let mut buf = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut buf).await.unwrap();
    Message::from_vec(&buf).unwrap()
}

fn addrs(m: &Message) -> Vec<IpAddr> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

fn dns_events(w: &World) -> Vec<svc_control::audit::DnsEvent> {
    w.audit
        .0
        .lock()
        .unwrap()
        .iter()
        .filter_map(|r| match &r.event {
            AuditEvent::Dns(d) => Some(d.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn allowed_names_are_committed_then_answered() {
    let w = world(300, 1000).await;
    let a = ask(&w, "api.example.test", RecordType::A).await;
    assert_eq!(a.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addrs(&a), ["192.0.2.10".parse::<IpAddr>().unwrap()]);
    let commits = w.commits.commits.lock().unwrap().clone();
    assert_eq!(
        commits.len(),
        1,
        "committed once, before the answer came back"
    );
    assert_eq!(commits[0].0, 1, "for the sandbox that asked");
    assert_eq!(
        commits[0].1[0].addr,
        "192.0.2.10".parse::<IpAddr>().unwrap()
    );
    assert_eq!(
        commits[0].1[0].tcp_ports,
        [443, 80],
        "a name without a port opens the web ports"
    );
    let aaaa = ask(&w, "API.Example.Test.", RecordType::AAAA).await;
    assert_eq!(
        addrs(&aaaa),
        ["2001:db8::10".parse::<IpAddr>().unwrap()],
        "AAAA, any case, trailing dot"
    );
    let ev = dns_events(&w);
    assert_eq!(ev[0].decision, "answered");
    assert!(ev[0].upstream_ms.is_some());
}

#[tokio::test]
async fn refused_names_never_reach_the_upstream() {
    let w = world(300, 1000).await;
    for name in [
        "evil.example.org",
        "c2VjcmV0LWRhdGE.evil.example.org",
        "x.api.example.test",
        "api.example.test.evil.org",
    ] {
        let r = ask(&w, name, RecordType::A).await;
        assert_eq!(r.metadata.response_code, ResponseCode::Refused, "{name}");
        assert!(r.answers.is_empty());
    }
    let _ = ask(&w, "api.example.test", RecordType::A).await;
    let seen = w.upstream.queried_names();
    assert!(
        seen.iter().all(|n| n == "api.example.test"),
        "the upstream saw only the allowed name: {seen:?}"
    );
    assert!(w.commits.commits.lock().unwrap().len() == 1);
    assert!(
        dns_events(&w)
            .iter()
            .filter(|e| e.decision == "refused")
            .count()
            >= 4,
        "refusals are audited"
    );
}

#[tokio::test]
async fn cname_chains_destination_classes_and_ttl_clamps() {
    let w = world(5, 1000).await;
    let a = ask(&w, "alias.example.test", RecordType::A).await;
    assert_eq!(
        addrs(&a),
        ["192.0.2.50".parse::<IpAddr>().unwrap()],
        "a CNAME to a name not on the list is followed: the asked name was allowed"
    );
    assert!(
        a.answers.iter().all(|r| r.ttl == 30),
        "TTLs are clamped up to 30 s: {:?}",
        a.answers.iter().map(|r| r.ttl).collect::<Vec<_>>()
    );
    let m = ask(&w, "mixed.example.test", RecordType::A).await;
    assert_eq!(
        addrs(&m),
        ["192.0.2.11".parse::<IpAddr>().unwrap()],
        "a private address is removed from the answer"
    );
    let meta = ask(&w, "meta.example.test", RecordType::A).await;
    assert!(
        addrs(&meta).is_empty(),
        "the metadata address is never answered"
    );
    let committed: Vec<IpAddr> = w
        .commits
        .commits
        .lock()
        .unwrap()
        .iter()
        .flat_map(|(_, e)| e.iter().map(|c| c.addr))
        .collect();
    assert!(
        !committed
            .iter()
            .any(|a| ["10.0.0.5", "169.254.169.254"].contains(&a.to_string().as_str())),
        "{committed:?}"
    );
    let ev = dns_events(&w);
    assert!(
        ev.iter()
            .any(|e| e.removed.contains(&"169.254.169.254".parse().unwrap()))
    );
}

#[tokio::test]
async fn record_types_that_route_around_the_guard() {
    let w = world(300, 1000).await;
    let https = ask(&w, "api.example.test", RecordType::HTTPS).await;
    assert_eq!(
        (https.metadata.response_code, https.answers.len()),
        (ResponseCode::NoError, 0),
        "HTTPS records are withheld"
    );
    let svcb = ask(&w, "api.example.test", RecordType::SVCB).await;
    assert_eq!(
        (svcb.metadata.response_code, svcb.answers.len()),
        (ResponseCode::NoError, 0)
    );
    assert_eq!(
        ask(&w, "api.example.test", RecordType::ANY)
            .await
            .metadata
            .response_code,
        ResponseCode::Refused
    );
    assert_eq!(
        ask(&w, "api.example.test", RecordType::AXFR)
            .await
            .metadata
            .response_code,
        ResponseCode::Refused
    );
    let txt = ask(&w, "api.example.test", RecordType::TXT).await;
    assert_eq!(
        (txt.metadata.response_code, txt.answers.len()),
        (ResponseCode::NoError, 0)
    );
    assert!(
        w.upstream.queried_names().is_empty(),
        "none of these went upstream"
    );
}

#[tokio::test]
async fn a_failed_commit_is_servfail_never_the_answer() {
    let w = world(300, 1000).await;
    w.commits
        .fail
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let r = ask(&w, "api.example.test", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::ServFail);
    assert!(r.answers.is_empty());
    assert_eq!(dns_events(&w)[0].decision, "servfail");
}

#[tokio::test]
async fn upstream_timeout_is_servfail() {
    let w = world(300, 1000).await;
    // Point a fresh guard at a port where nobody answers.
    let dead = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    let guard = one_sandbox_guard(&w, upstream(dead_addr, Duration::from_millis(300)));
    let started = std::time::Instant::now();
    let q = query("api.example.test", RecordType::A).to_vec().unwrap();
    let bytes = handle_udp(&guard, "127.0.0.1", &q).await;
    assert_eq!(
        Message::from_vec(&bytes).unwrap().metadata.response_code,
        ResponseCode::ServFail
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    drop(dead);
}

#[tokio::test]
async fn large_answers_truncate_over_udp_and_arrive_over_tcp() {
    let w = world(300, 1000).await;
    let udp = ask(&w, "big.example.test", RecordType::A).await;
    assert!(udp.metadata.truncation, "60 addresses do not fit 512 bytes");
    assert!(udp.answers.is_empty());
    let tcp = ask_tcp(w.guard_tcp, &query("big.example.test", RecordType::A)).await;
    assert_eq!(addrs(&tcp).len(), 60, "the whole answer over TCP");
    assert!(!tcp.metadata.truncation);
}

#[tokio::test]
async fn malformed_and_hostile_messages() {
    let w = world(300, 1000).await;
    // Not even a header: no answer at all.
    assert!(
        ask_from("127.0.0.1", w.guard_udp, &[1, 2, 3])
            .await
            .is_none()
    );
    // A header and garbage: FORMERR.
    let mut garbage = vec![0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    garbage.extend_from_slice(&[0xff; 40]);
    let r = ask_from("127.0.0.1", w.guard_udp, &garbage)
        .await
        .expect("formerr");
    assert_eq!(
        (r.metadata.id, r.metadata.response_code),
        (0xabcd, ResponseCode::FormErr)
    );
    // A response sent to the guard: never answered (no reflection loops).
    let mut resp = query("api.example.test", RecordType::A);
    resp.metadata.message_type = MessageType::Response;
    assert!(
        ask_from("127.0.0.1", w.guard_udp, &resp.to_vec().unwrap())
            .await
            .is_none()
    );
    // Two questions: FORMERR.
    let mut two = query("api.example.test", RecordType::A);
    two.add_query(Query::query(
        Name::from_ascii("evil.example.org").unwrap(),
        RecordType::A,
    ));
    assert_eq!(
        ask_from("127.0.0.1", w.guard_udp, &two.to_vec().unwrap())
            .await
            .unwrap()
            .metadata
            .response_code,
        ResponseCode::FormErr
    );
    // NOTIFY: NOTIMP.
    let mut notify = query("api.example.test", RecordType::A);
    notify.metadata.op_code = OpCode::Notify;
    assert_eq!(
        ask_from("127.0.0.1", w.guard_udp, &notify.to_vec().unwrap())
            .await
            .unwrap()
            .metadata
            .response_code,
        ResponseCode::NotImp
    );
    // Class CHAOS: REFUSED.
    let mut chaos = Message::query();
    let mut q = Query::query(Name::from_ascii("version.bind").unwrap(), RecordType::TXT);
    q.set_query_class(DNSClass::CH);
    chaos.add_query(q);
    assert_eq!(
        ask_from("127.0.0.1", w.guard_udp, &chaos.to_vec().unwrap())
            .await
            .unwrap()
            .metadata
            .response_code,
        ResponseCode::Refused
    );
    // A huge datagram: handled without trouble.
    let mut huge = query("api.example.test", RecordType::A).to_vec().unwrap();
    huge.resize(4000, 0x41);
    let _ = ask_from("127.0.0.1", w.guard_udp, &huge).await;
    // An unknown source: REFUSED, nothing upstream.
    let r = ask_from(
        "127.0.0.3",
        w.guard_udp,
        &query("api.example.test", RecordType::A).to_vec().unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(r.metadata.response_code, ResponseCode::Refused);
    // The guard still answers normally.
    assert_eq!(
        addrs(&ask(&w, "api.example.test", RecordType::A).await).len(),
        1
    );
    assert!(
        w.upstream
            .queried_names()
            .iter()
            .all(|n| n == "api.example.test")
    );
}

#[tokio::test]
async fn a_flood_is_rate_limited_per_sandbox_and_audited() {
    let w = world(300, 50).await;
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    // Room for every answer: the refusals (most of the 400) come back at once, before the
    // answers that wait on dnsmasq, and would fill a default receive buffer (~320 datagrams),
    // so the kernel dropped the answers that came last — the very ones this test looks for.
    nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::RcvBufForce, &(4 << 20))
        .expect("SO_RCVBUFFORCE");
    let q = query("api.example.test", RecordType::A).to_vec().unwrap();
    for _ in 0..400 {
        sock.send_to(&q, w.guard_udp).await.unwrap();
    }
    let (mut refused, mut ok, mut other) = (0, 0, Vec::new());
    let mut buf = vec![0u8; 4096];
    // Until every query has its answer, or none came for longer than the guard's upstream
    // timeout (800 ms): the answers let through wait on dnsmasq, the refusals do not.
    while refused + ok + other.len() < 400
        && let Ok(Ok((n, _))) =
            tokio::time::timeout(Duration::from_secs(2), sock.recv_from(&mut buf)).await
    {
        match Message::from_vec(&buf[..n]).unwrap().metadata.response_code {
            ResponseCode::Refused => refused += 1,
            ResponseCode::NoError => ok += 1,
            code => other.push(code),
        }
    }
    assert!(
        refused > 0 && ok > 0,
        "ok {ok}, refused {refused}, other {other:?}; dnsmasq was asked {} times",
        w.upstream.queried_names().len()
    );
    assert!(dns_events(&w).iter().any(|e| e.decision == "rate-limited"));
    // Another sandbox is not affected by the first one's flood.
    let other = ask_from("127.0.0.2", w.guard_udp, &q).await.unwrap();
    assert_eq!(other.metadata.response_code, ResponseCode::NoError);
    let audited = dns_events(&w)
        .iter()
        .filter(|e| e.decision == "rate-limited")
        .count();
    assert!(
        audited < refused,
        "the audit log is not flooded: {audited} records for {refused} refusals"
    );
}

#[tokio::test]
async fn the_cache_answers_repeats_without_the_upstream() {
    let w = world(300, 1000).await;
    for _ in 0..5 {
        assert_eq!(
            addrs(&ask(&w, "api.example.test", RecordType::A).await).len(),
            1
        );
    }
    assert_eq!(
        w.upstream.queried_names().len(),
        1,
        "one upstream query for five answers"
    );
    assert_eq!(
        w.commits.commits.lock().unwrap().len(),
        5,
        "but every answer is committed"
    );
    assert!(dns_events(&w).iter().filter(|e| e.cached).count() == 4);
}

#[tokio::test]
async fn ipv4_clients_on_a_dual_stack_socket_are_recognised() {
    let w = world(300, 1000).await;
    let guard = one_sandbox_guard(&w, upstream(w.upstream.addr, Duration::from_secs(1)));
    let q = query("api.example.test", RecordType::A).to_vec().unwrap();
    let bytes = handle_udp(&guard, "::ffff:127.0.0.1", &q).await;
    assert_eq!(
        addrs(&Message::from_vec(&bytes).unwrap()).len(),
        1,
        "::ffff:127.0.0.1 is the sandbox at 127.0.0.1"
    );
}

#[tokio::test]
async fn the_cache_honours_the_clamped_ttl() {
    let w = world(1, 1000).await;
    let mut config = upstream(w.upstream.addr, Duration::from_secs(1));
    config.ttl_min = Duration::from_secs(1);
    config.ttl_max = Duration::from_secs(1);
    let guard = one_sandbox_guard(&w, config);
    let q = query("api.example.test", RecordType::A).to_vec().unwrap();
    handle_udp(&guard, "127.0.0.1", &q).await;
    handle_udp(&guard, "127.0.0.1", &q).await;
    assert_eq!(
        w.upstream.queried_names().len(),
        1,
        "the second answer came from the cache"
    );
    tokio::time::sleep(Duration::from_millis(1300)).await;
    handle_udp(&guard, "127.0.0.1", &q).await;
    assert_eq!(
        w.upstream.queried_names().len(),
        2,
        "after its TTL the entry is asked again"
    );
}

#[test]
fn upstreams_come_from_resolv_conf_when_none_are_configured() {
    let dir = svc_tests::fresh_dir("svcrc");
    let rc = dir.join("resolv.conf");
    std::fs::write(&rc, "nameserver 127.0.0.53\nnameserver ::1\n").unwrap();
    let host = svc_control::config::host::parse(
        std::path::Path::new("svcd.toml"),
        &format!("[dns]\nresolv_conf = \"{}\"\n", rc.display()),
    )
    .unwrap();
    let up = Upstream::from_host(&host).unwrap();
    assert_eq!(
        up.servers,
        [
            "127.0.0.53:53".parse::<SocketAddr>().unwrap(),
            "[::1]:53".parse().unwrap()
        ]
    );
    std::fs::write(&rc, "search example\n").unwrap();
    assert!(
        Upstream::from_host(&host)
            .unwrap_err()
            .contains("names no nameserver")
    );
    let configured = svc_control::config::host::parse(
        std::path::Path::new("svcd.toml"),
        "[dns]\nupstreams = [\"192.0.2.53\"]\n",
    )
    .unwrap();
    assert_eq!(
        Upstream::from_host(&configured).unwrap().servers,
        ["192.0.2.53:53".parse::<SocketAddr>().unwrap()]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A bare responder on loopback: answers each question (the query echoed back as a response)
/// after `delay_first` for the first one, and records every source port it heard from.
async fn responder(delay_first: Duration) -> (SocketAddr, Arc<Mutex<Vec<u16>>>) {
    let sock = UdpSocket::bind("127.0.0.1:0").await.expect("bind");
    let addr = sock.local_addr().expect("addr");
    let ports: Arc<Mutex<Vec<u16>>> = Arc::default();
    let seen = ports.clone();
    tokio::spawn(async move {
        let sock = Arc::new(sock);
        let mut buf = [0u8; 512];
        let mut first = true;
        loop {
            let Ok((n, peer)) = sock.recv_from(&mut buf).await else {
                return;
            };
            seen.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(peer.port());
            let mut answer = buf[..n].to_vec();
            answer[2] |= 0x80; // QR: a response
            let (sock, delay) = (
                sock.clone(),
                if first { delay_first } else { Duration::ZERO },
            );
            first = false;
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = sock.send_to(&answer, peer).await;
            });
        }
    });
    (addr, ports)
}

fn question(id: u16) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = id;
    m.add_query(Query::query(
        Name::from_ascii("pool.test.").expect("name"),
        RecordType::A,
    ));
    m.to_vec().expect("encode")
}

#[tokio::test]
async fn pooled_upstream_sockets_are_reused_then_retired_so_the_source_port_keeps_changing() {
    let (server, ports) = responder(Duration::ZERO).await;
    let upstream = one_upstream(server, Duration::from_secs(2));
    let pool = svc_control::dns::Sockets::default();
    let n = Sockets::MAX_USES as usize * 3;
    for id in 0..n {
        let id = u16::try_from(id).expect("id");
        let answer = upstream
            .ask_pooled(&pool, &question(id), id)
            .await
            .expect("answered");
        assert_eq!(u16::from_be_bytes([answer[0], answer[1]]), id);
    }
    let ports = ports.lock().expect("ports").clone();
    let mut per_port: HashMap<u16, usize> = HashMap::new();
    for p in &ports {
        *per_port.entry(*p).or_default() += 1;
    }
    assert!(
        per_port.values().all(|&c| c <= Sockets::MAX_USES as usize),
        "no source port carries more than {} questions: {per_port:?}",
        Sockets::MAX_USES
    );
    assert!(
        per_port.len() >= 3 && per_port.len() < n / 2,
        "sockets are reused, and retired: {} ports for {n} questions",
        per_port.len()
    );
}

#[tokio::test]
async fn a_pooled_socket_that_timed_out_never_carries_the_next_question() {
    let (server, ports) = responder(Duration::from_millis(600)).await;
    let upstream = one_upstream(server, Duration::from_millis(300));
    let pool = svc_control::dns::Sockets::default();
    let err = upstream
        .ask_pooled(&pool, &question(1), 1)
        .await
        .expect_err("the first question times out");
    assert!(err.contains("timed out"), "{err}");
    // The late answer to question 1 arrives meanwhile; question 2 gets its own.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let answer = upstream
        .ask_pooled(&pool, &question(2), 2)
        .await
        .expect("answered");
    assert_eq!(u16::from_be_bytes([answer[0], answer[1]]), 2);
    let ports = ports.lock().expect("ports").clone();
    assert_eq!(ports.len(), 2);
    assert_ne!(ports[0], ports[1], "a new socket for the next question");
}

#[tokio::test]
async fn a_burst_read_and_answered_in_batches_gets_each_question_its_own_answer() {
    let w = world(300, 10_000).await;
    // Warm the cache for one name; the burst mixes cached, refused and AAAA questions.
    ask(&w, "api.example.test", RecordType::A).await;
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut expected = HashMap::new();
    for id in 0..100u16 {
        let (name, t) = match id % 4 {
            0 | 1 => ("api.example.test.", RecordType::A),
            2 => ("refused.example.invalid.", RecordType::A),
            _ => ("api.example.test.", RecordType::AAAA),
        };
        let mut m = query(name, t);
        m.metadata.id = id;
        sock.send_to(&m.to_vec().unwrap(), w.guard_udp)
            .await
            .unwrap();
        expected.insert(id, (name, t));
    }
    let mut seen = HashMap::new();
    let mut buf = vec![0u8; 65535];
    while seen.len() < expected.len() {
        let Ok(Ok((n, _))) =
            tokio::time::timeout(Duration::from_secs(3), sock.recv_from(&mut buf)).await
        else {
            break;
        };
        let m = Message::from_vec(&buf[..n]).expect("answers parse");
        let q = m.queries.first().expect("the question is echoed");
        *seen.entry(m.metadata.id).or_insert(0) += 1;
        let (name, t) = expected[&m.metadata.id];
        assert_eq!(
            (q.name().to_ascii(), q.query_type()),
            (name.to_owned(), t),
            "answer {} carries its own question",
            m.metadata.id
        );
        if name.starts_with("refused") {
            assert_eq!(m.metadata.response_code, ResponseCode::Refused);
        } else if t == RecordType::A {
            assert_eq!(addrs(&m).len(), 1, "{m:?}");
        }
    }
    assert_eq!(seen.len(), 100, "every question answered: {seen:?}");
    assert!(seen.values().all(|&c| c == 1), "each once: {seen:?}");
}
