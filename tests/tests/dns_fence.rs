//! The DNS guard with the real fence: a guest asks any resolver, the fence steers it to the
//! guard, the guard resolves upstream, writes the addresses into the eBPF allow map, and only
//! then answers; the guest connects at once and its very first SYN passes, every time.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use hickory_proto::{
    op::{Message, Query, ResponseCode},
    rr::{Name, RData, RecordType},
};
use svc_control::{
    audit::{AuditError, AuditRecord, AuditSink},
    daemon::FenceCommit,
    dataplane::{Fence, Nft, NftConfig},
    dns::{Directory, Guard, GuardConfig, SandboxDns, Upstream},
    hosts::{Allowlist, HostPattern},
    policy::{destination, mode::EgressMode},
};
use svc_ebpf_common::reason;
use svc_tests::{
    PinDir, dns::Dnsmasq, require_root, run, servers::TcpServer, topology::Topology, unique,
};

const GUARD: u16 = 15353;
const NAMES: usize = 30;

struct Dir(HashMap<IpAddr, Arc<SandboxDns>>);
impl Directory for Dir {
    fn sandbox_for(&self, source: IpAddr) -> Option<Arc<SandboxDns>> {
        self.0.get(&source).cloned()
    }
}

struct NoAudit;
impl AuditSink for NoAudit {
    fn record(&self, _: &AuditRecord) -> Result<(), AuditError> {
        Ok(())
    }
}

fn ask(to: SocketAddr, name: &str) -> Result<Message, String> {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(
        Name::from_ascii(name).map_err(|e| e.to_string())?,
        RecordType::A,
    ));
    sock.send_to(&m.to_vec().map_err(|e| e.to_string())?, to)
        .map_err(|e| e.to_string())?;
    let mut buf = [0u8; 4096];
    let (n, _) = sock.recv_from(&mut buf).map_err(|e| e.to_string())?;
    Message::from_vec(&buf[..n]).map_err(|e| e.to_string())
}

#[test]
fn the_first_syn_after_an_answer_always_passes() {
    require_root();
    let t = Topology::new(61);
    let pins = PinDir::new();
    // The outside world: NAMES servers on their own addresses.
    let addrs: Vec<String> = (0..NAMES).map(|i| format!("192.0.2.{}", 100 + i)).collect();
    for a in &addrs {
        t.outside
            .ip(&["addr", "add", &format!("{a}/32"), "dev", "oh"]);
    }
    let _servers: Vec<TcpServer> = addrs
        .iter()
        .map(|a| TcpServer::start(&t.outside, format!("{a}:8443").parse().unwrap(), b"hello"))
        .collect();
    let _evil = TcpServer::start(&t.outside, "192.0.2.20:8443".parse().unwrap(), b"evil");
    // The upstream resolver, in the host namespace.
    let names: Vec<String> = (0..NAMES).map(|i| format!("n{i}.example.test")).collect();
    let mut records: Vec<(&str, &str)> = names
        .iter()
        .map(String::as_str)
        .zip(addrs.iter().map(String::as_str))
        .collect();
    records.push(("evil.other.test", "192.0.2.20"));
    let upstream = Dnsmasq::start_in(Some(&t.host), &records, &[], 300);

    // The fence and its nftables table (DNS to any resolver → the guard).
    let net = t.host_network();
    let (deny, allow) = destination::fence_cidrs(&net);
    let mut fence = Fence::load(&pins.path).expect("load");
    fence.set_destination_classes(&deny, &allow).unwrap();
    let ifindex = t.host_ifindex();
    let link = t.sandbox_link(61, EgressMode::Curated, false);
    fence.install_sandbox(&link, &[], &[]).unwrap();
    let hl = t.host_link.clone();
    t.host.run(|| fence.attach(&hl)).unwrap();
    let mut never = net.sandbox_pools.clone();
    never.extend(net.host_addresses.iter().map(|a| ipnet::IpNet::from(*a)));
    let nft = Nft::new(NftConfig {
        table: unique("svct"),
        guard_port: GUARD,
        proxy_port: 15443,
        never,
        deny,
        operator_allow: allow,
    });
    t.host
        .run(|| nft.apply(std::slice::from_ref(&t.host_link)))
        .unwrap();
    let fence = Arc::new(Mutex::new(fence));

    // The guard, in the host namespace.
    let allowed = Allowlist(vec![HostPattern::parse("*.example.test:8443").unwrap()]);
    let dir = Dir(HashMap::from([(
        IpAddr::from(t.guest_v4),
        Arc::new(SandboxDns::curated(61, allowed)),
    )]));
    let commit = FenceCommit {
        fence: fence.clone(),
        ifindex: std::sync::Arc::new(move |_| Some(ifindex)),
        idle: Duration::from_secs(30),
    };
    let config = GuardConfig::with_upstream(Upstream {
        servers: vec![upstream.addr],
        timeout: Duration::from_secs(1),
    });
    let guard = Arc::new(Guard::new(
        config,
        Arc::new(dir),
        Arc::new(commit),
        Arc::new(NoAudit),
        net,
    ));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let host_ns = format!("/run/netns/{}", t.host.name);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let server = std::thread::spawn(move || {
        let f = std::fs::File::open(&host_ns).unwrap();
        nix::sched::setns(&f, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let udp = tokio::net::UdpSocket::bind(("::", GUARD)).await.unwrap();
            let _ = ready_tx.send(());
            guard
                .serve_udp(udp, async move {
                    let _ = stop_rx.await;
                })
                .await;
        });
    });
    ready_rx.recv_timeout(Duration::from_secs(5)).unwrap();

    let before = fence.lock().unwrap().counters().unwrap();
    let results: Vec<Result<Vec<u8>, String>> = t.guest.run(|| {
        let gw = SocketAddr::new(t.gateway_v4.into(), 53);
        names
            .iter()
            .map(|name| {
                let answer = ask(gw, name)?;
                let addr = answer
                    .answers
                    .iter()
                    .find_map(|r| match &r.data {
                        RData::A(a) => Some(a.0),
                        _ => None,
                    })
                    .ok_or_else(|| {
                        format!("{name}: no address ({:?})", answer.metadata.response_code)
                    })?;
                // Connect at once: the first SYN must pass.
                let mut c = std::net::TcpStream::connect_timeout(
                    &SocketAddr::new(addr.into(), 8443),
                    Duration::from_millis(500),
                )
                .map_err(|e| format!("{name} → {addr}: {e}"))?;
                let mut buf = Vec::new();
                let _ = c.set_read_timeout(Some(Duration::from_millis(500)));
                let _ = std::io::Read::read_to_end(&mut c, &mut buf);
                Ok(buf)
            })
            .collect()
    });
    let after = fence.lock().unwrap().counters().unwrap();
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {NAMES} resolve-then-connect rounds failed: {failures:?}",
        failures.len()
    );
    assert_eq!(
        after.packets(reason::DROP_TCP_NOT_ALLOWED),
        before.packets(reason::DROP_TCP_NOT_ALLOWED),
        "no first SYN was dropped"
    );
    assert!(after.packets(reason::PASS_DNS) >= before.packets(reason::PASS_DNS) + NAMES as u64);

    // A name off the list: REFUSED at the guard, never asked upstream, and its address stays
    // closed even when the guest knows it. Asking another resolver changes nothing.
    let (refused, via_other, literal) = t.guest.run(|| {
        let a = ask(SocketAddr::new(t.gateway_v4.into(), 53), "evil.other.test")
            .map(|m| m.metadata.response_code);
        let b =
            ask("8.8.8.8:53".parse().unwrap(), "evil.other.test").map(|m| m.metadata.response_code);
        let c = std::net::TcpStream::connect_timeout(
            &"192.0.2.20:8443".parse().unwrap(),
            Duration::from_millis(400),
        )
        .is_ok();
        (a, b, c)
    });
    assert_eq!(refused, Ok(ResponseCode::Refused));
    assert_eq!(
        via_other,
        Ok(ResponseCode::Refused),
        "8.8.8.8 is the guard too"
    );
    assert!(!literal);
    assert!(
        !upstream.queried_names().iter().any(|n| n.contains("evil")),
        "the upstream never saw the refused name"
    );

    let _ = stop_tx.send(());
    server.join().unwrap();
    let _ = run(
        "ip",
        &[
            "netns",
            "exec",
            &t.host.name,
            "nft",
            "delete",
            "table",
            "inet",
            nft.table(),
        ],
    );
}
