//! The nftables half of the fence, live: DNS to any resolver ends at the guard, web traffic to
//! allowed addresses ends at the proxy, input from guests reaches nothing else, the forward
//! layer refuses the destination classes on its own, and traffic out is masqueraded.

use std::{net::SocketAddr, sync::atomic::Ordering};

use svc_control::{
    dataplane::{AllowEntry, Fence, Nft, NftConfig, WEB},
    policy::{destination, mode::EgressMode},
};
use svc_ebpf_common::reason;
use svc_tests::{
    PinDir, require_root, run,
    servers::{TcpServer, UdpEcho, tcp_fetch, udp_roundtrip},
    topology::{ALLOWED_V4, ALLOWED_V6, OTHER_V4, Topology},
    unique,
};

const GUARD: u16 = 15353;
const PROXY: u16 = 15443;

fn sa(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse().unwrap(), port)
}

/// The table for a topology, applied in its host namespace. Removed on drop.
struct Table {
    nft: Nft,
    host: String,
}

impl Table {
    fn up(t: &Topology) -> Self {
        let net = t.host_network();
        let (deny, operator_allow) = destination::fence_cidrs(&net);
        let mut never = net.sandbox_pools.clone();
        never.extend(net.host_addresses.iter().map(|a| ipnet::IpNet::from(*a)));
        let nft = Nft::new(NftConfig {
            table: unique("svct"),
            guard_port: GUARD,
            proxy_port: PROXY,
            never,
            deny,
            operator_allow,
        });
        let links = vec![t.host_link.clone()];
        t.host.run(|| nft.apply(&links)).expect("apply nft");
        Self {
            nft,
            host: t.host.name.clone(),
        }
    }
}

impl Drop for Table {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.host,
                "nft",
                "delete",
                "table",
                "inet",
                self.nft.table(),
            ])
            // A test that removed the table itself leaves nothing to delete: no noise.
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn fence_up(t: &Topology, pins: &PinDir, entries: &[AllowEntry]) -> Fence {
    t.fence_up(
        pins,
        &t.sandbox_link(21, EgressMode::Curated, true),
        entries,
    )
}

fn web(addr: impl Into<std::net::IpAddr>) -> AllowEntry {
    svc_tests::fixture::allow(addr, &WEB, 1)
}

#[test]
fn dns_to_any_resolver_ends_at_the_guard() {
    require_root();
    let t = Topology::new(41);
    let pins = PinDir::new();
    let _table = Table::up(&t);
    // One dual-stack socket answers IPv4 and IPv6, as the guard will.
    let guard = UdpEcho::start(&t.host, sa("::", GUARD));
    let guard_tcp = TcpServer::start(&t.host, sa("::", GUARD), b"guard");
    let fence = fence_up(&t, &pins, &[]);

    assert!(
        udp_roundtrip(&t.guest, sa("8.8.8.8", 53)),
        "DNS to 8.8.8.8 is answered (by the guard)"
    );
    assert!(
        udp_roundtrip(&t.guest, sa(&t.gateway_v4.to_string(), 53)),
        "DNS to the gateway"
    );
    assert_eq!(
        guard.received.load(Ordering::Relaxed),
        2,
        "both queries ended at the guard"
    );
    assert!(
        udp_roundtrip(&t.guest, sa("2001:4860:4860::8888", 53)),
        "DNS to a public IPv6 resolver"
    );
    assert_eq!(
        guard.received.load(Ordering::Relaxed),
        3,
        "the IPv6 query ended at the guard"
    );
    assert_eq!(
        tcp_fetch(&t.guest, sa("1.1.1.1", 53)).as_deref(),
        Ok(&b"guard"[..]),
        "DNS over TCP ends at the guard"
    );
    assert_eq!(guard_tcp.count(), 1);
    assert!(
        !udp_roundtrip(&t.guest, sa("8.8.8.8", 5353)),
        "DNS on another port is just traffic, and not allowed"
    );
    assert!(fence.counters().unwrap().packets(reason::PASS_DNS) >= 4);
}

#[test]
fn web_traffic_to_allowed_addresses_ends_at_the_proxy() {
    require_root();
    let t = Topology::new(42);
    let pins = PinDir::new();
    let _table = Table::up(&t);
    let origin4 = TcpServer::start(
        &t.outside,
        SocketAddr::new(ALLOWED_V4.into(), 443),
        b"origin",
    );
    let origin6 = TcpServer::start(
        &t.outside,
        SocketAddr::new(ALLOWED_V6.into(), 443),
        b"origin6",
    );
    let proxy = TcpServer::start(&t.host, sa("::", PROXY), b"proxy");
    let _fence = fence_up(&t, &pins, &[web(ALLOWED_V4), web(ALLOWED_V6)]);

    assert_eq!(
        tcp_fetch(&t.guest, SocketAddr::new(ALLOWED_V4.into(), 443)).as_deref(),
        Ok(&b"proxy"[..])
    );
    assert_eq!(
        tcp_fetch(&t.guest, SocketAddr::new(ALLOWED_V6.into(), 443)).as_deref(),
        Ok(&b"proxy"[..])
    );
    assert_eq!(
        tcp_fetch(&t.guest, SocketAddr::new(ALLOWED_V4.into(), 80)).as_deref(),
        Ok(&b"proxy"[..]),
        "HTTP too"
    );
    assert_eq!(proxy.count(), 3);
    assert_eq!(
        origin4.count() + origin6.count(),
        0,
        "the origin is only ever reached by the proxy"
    );
}

#[test]
fn input_from_guests_reaches_only_the_guard_and_the_proxy() {
    require_root();
    let t = Topology::new(43);
    let _table = Table::up(&t);
    // No eBPF here: this is the nftables layer on its own.
    let ssh = TcpServer::start(&t.host, sa("0.0.0.0", 22), b"ssh");
    let guard = TcpServer::start(&t.host, sa("0.0.0.0", GUARD), b"guard");
    let proxy = TcpServer::start(&t.host, sa("0.0.0.0", PROXY), b"proxy");
    let gw = t.gateway_v4.to_string();
    assert!(tcp_fetch(&t.guest, sa(&gw, 22)).is_err(), "a host service");
    assert!(
        tcp_fetch(&t.guest, sa("192.0.2.1", 22)).is_err(),
        "the host's other address"
    );
    assert_eq!(
        tcp_fetch(&t.guest, sa(&gw, GUARD)).as_deref(),
        Ok(&b"guard"[..])
    );
    assert_eq!(
        tcp_fetch(&t.guest, sa(&gw, PROXY)).as_deref(),
        Ok(&b"proxy"[..])
    );
    assert_eq!((ssh.count(), guard.count(), proxy.count()), (0, 1, 1));
}

#[test]
fn forward_layer_refuses_destination_classes_and_masquerades() {
    require_root();
    let t = Topology::new(44);
    // A private address reachable through the host before the table exists.
    t.outside.ip(&["addr", "add", "172.16.5.5/32", "dev", "oh"]);
    t.host
        .ip(&["route", "add", "172.16.5.5/32", "via", "192.0.2.10"]);
    let private = TcpServer::start(&t.outside, sa("172.16.5.5", 8080), b"private");
    let public = TcpServer::start(
        &t.outside,
        SocketAddr::new(OTHER_V4.into(), 8080),
        b"public",
    );
    assert!(
        tcp_fetch(&t.guest, sa("172.16.5.5", 8080)).is_ok(),
        "reachable without the table"
    );

    let table = Table::up(&t);
    assert!(
        tcp_fetch(&t.guest, sa("172.16.5.5", 8080)).is_err(),
        "a private destination, refused by nftables alone"
    );
    assert_eq!(
        tcp_fetch(&t.guest, SocketAddr::new(OTHER_V4.into(), 8080)).as_deref(),
        Ok(&b"public"[..])
    );
    assert_eq!(
        private.count(),
        1,
        "only the connection made before the table"
    );
    let peers = public.peers.lock().unwrap().clone();
    assert_eq!(
        peers.last().map(SocketAddr::ip),
        Some("192.0.2.1".parse().unwrap()),
        "masqueraded behind the host"
    );

    t.host.run(|| table.nft.teardown()).expect("teardown");
    let listed = run(
        "ip",
        &["netns", "exec", &t.host.name, "nft", "list", "tables"],
    );
    assert!(
        !String::from_utf8_lossy(&listed.stdout).contains(table.nft.table()),
        "teardown removes the table"
    );
}

#[test]
fn the_link_set_changes_one_element_at_a_time() {
    require_root();
    let t = Topology::new(45);
    let table = Table::up(&t);
    let nft = &table.nft;
    let mut want = vec![t.host_link.clone(), "svcx1".to_owned(), "svcx2".to_owned()];
    want.sort();
    let got = t.host.run(|| {
        nft.change_link("svcx1", true)?;
        nft.change_link("svcx2", true)?;
        nft.links()
    });
    assert_eq!(got.expect("add"), want);
    let got = t.host.run(|| {
        nft.change_link(&t.host_link, false)?;
        nft.links()
    });
    assert_eq!(got.expect("remove"), ["svcx1", "svcx2"]);
    // Taking a link that is not there is an error (svcd then writes the whole set).
    assert!(t.host.run(|| nft.change_link("svcx9", false)).is_err());
    // The whole-set rewrite gives the same answer.
    let got = t.host.run(|| {
        nft.set_links(&["svcx2".to_owned()])?;
        nft.links()
    });
    assert_eq!(got.expect("rewrite"), ["svcx2"]);
}
