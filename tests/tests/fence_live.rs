//! The fence on a real veth, with real traffic between network namespaces: what the sandbox's
//! map allows connects, everything else is dropped and counted and reported.

use std::{net::SocketAddr, time::Duration};

use svc_control::{
    dataplane::{AllowEntry, Fence, PortRule, SandboxLink, WEB},
    policy::mode::EgressMode,
};
use svc_ebpf_common::reason;
use svc_tests::{
    PinDir, require_root, run,
    servers::{TcpServer, UdpEcho, pings, tcp_fetch, tcp_fetch_within, udp_roundtrip},
    topology::{ALLOWED_V4, ALLOWED_V6, OTHER_V4, OTHER_V6, Topology},
};

fn sa(ip: impl Into<std::net::IpAddr>, port: u16) -> SocketAddr {
    SocketAddr::new(ip.into(), port)
}

fn sandbox_link(t: &Topology, mode: EgressMode) -> SandboxLink {
    t.sandbox_link(11, mode, false)
}

fn allow(addr: impl Into<std::net::IpAddr>, rules: &[PortRule]) -> AllowEntry {
    svc_tests::fixture::allow(addr, rules, 1)
}

/// Load, set classes (the test pools are sandbox pools), install, attach in the host netns.
fn fence_up(t: &Topology, pins: &PinDir, mode: EgressMode, entries: &[AllowEntry]) -> Fence {
    t.fence_up(pins, &sandbox_link(t, mode), entries)
}

#[test]
fn curated_guest_reaches_exactly_what_its_map_holds() {
    require_root();
    let t = Topology::new(31);
    let pins = PinDir::new();
    let _web4 = TcpServer::start(&t.outside, sa(ALLOWED_V4, 443), b"allowed-v4");
    let _ssh4 = TcpServer::start(&t.outside, sa(ALLOWED_V4, 22), b"ssh");
    let other4 = TcpServer::start(&t.outside, sa(OTHER_V4, 443), b"other-v4");
    let _web6 = TcpServer::start(&t.outside, sa(ALLOWED_V6, 443), b"allowed-v6");
    let other6 = TcpServer::start(&t.outside, sa(OTHER_V6, 443), b"other-v6");
    let quic = UdpEcho::start(&t.outside, sa(ALLOWED_V4, 443));
    let _udp = UdpEcho::start(&t.outside, sa(ALLOWED_V4, 4433));

    // Without the fence everything is reachable: the world works.
    assert_eq!(
        tcp_fetch(&t.guest, sa(OTHER_V4, 443)).as_deref(),
        Ok(&b"other-v4"[..])
    );
    assert!(udp_roundtrip(&t.guest, sa(ALLOWED_V4, 443)));
    assert!(pings(&t.guest, "192.0.2.10"));

    let entries = [
        allow(ALLOWED_V4, &[WEB[0], WEB[1], PortRule::Udp(4433)]),
        allow(ALLOWED_V6, &WEB),
    ];
    let mut fence = fence_up(&t, &pins, EgressMode::Curated, &entries);
    let before = fence.counters().unwrap();

    assert_eq!(
        tcp_fetch(&t.guest, sa(ALLOWED_V4, 443)).as_deref(),
        Ok(&b"allowed-v4"[..]),
        "allowed v4 https"
    );
    assert_eq!(
        tcp_fetch(&t.guest, sa(ALLOWED_V6, 443)).as_deref(),
        Ok(&b"allowed-v6"[..]),
        "allowed v6 https"
    );
    assert!(
        udp_roundtrip(&t.guest, sa(ALLOWED_V4, 4433)),
        "explicit UDP rule"
    );

    let other_before = other4.count() + other6.count();
    assert!(
        tcp_fetch(&t.guest, sa(OTHER_V4, 443)).is_err(),
        "ip literal not in the map (v4)"
    );
    assert!(
        tcp_fetch(&t.guest, sa(OTHER_V6, 443)).is_err(),
        "ip literal not in the map (v6)"
    );
    assert!(
        tcp_fetch(&t.guest, sa(ALLOWED_V4, 22)).is_err(),
        "shared address, other port"
    );
    assert_eq!(
        other4.count() + other6.count(),
        other_before,
        "the outside never saw the denied connections"
    );
    let quic_before = quic.received.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        !udp_roundtrip(&t.guest, sa(ALLOWED_V4, 443)),
        "QUIC to an allowed host"
    );
    assert_eq!(
        quic.received.load(std::sync::atomic::Ordering::Relaxed),
        quic_before,
        "QUIC never left"
    );
    assert!(!pings(&t.guest, "192.0.2.10"), "ICMP echo");
    assert!(
        !pings(&t.guest, &t.gateway_v4.to_string()),
        "ICMP to the gateway"
    );
    assert!(
        tcp_fetch(&t.guest, sa(t.gateway_v4, 22)).is_err(),
        "host service on the gateway"
    );
    assert!(
        tcp_fetch(
            &t.guest,
            sa("192.0.2.1".parse::<std::net::IpAddr>().unwrap(), 443)
        )
        .is_err(),
        "the host's other address"
    );

    let after = fence.counters().unwrap();
    let rose = |code| after.packets(code) > before.packets(code);
    for code in [
        reason::PASS_ALLOWED,
        reason::DROP_TCP_NOT_ALLOWED,
        reason::DROP_UDP_NOT_ALLOWED,
        reason::DROP_ICMP,
        reason::DROP_GATEWAY,
        reason::DROP_DEST_CLASS,
        reason::PASS_EGRESS,
    ] {
        assert!(
            rose(code),
            "counter {} did not rise",
            reason::name(code).unwrap_or("?")
        );
    }
    let events = fence.drain_events();
    let saw = |code, dst: std::net::IpAddr| {
        events.iter().any(|e| {
            let d = if e.family == 4 {
                std::net::IpAddr::from([e.dst[0], e.dst[1], e.dst[2], e.dst[3]])
            } else {
                std::net::IpAddr::from(e.dst)
            };
            e.reason == code && d == dst && e.sandbox == 11
        })
    };
    assert!(
        saw(reason::DROP_TCP_NOT_ALLOWED, OTHER_V4.into()),
        "a drop event for the v4 literal"
    );
    assert!(
        saw(reason::DROP_TCP_NOT_ALLOWED, OTHER_V6.into()),
        "a drop event for the v6 literal"
    );
    assert!(
        saw(reason::DROP_UDP_NOT_ALLOWED, ALLOWED_V4.into()),
        "a drop event for QUIC"
    );
}

#[test]
fn allow_all_reaches_the_world_but_never_the_host_or_metadata() {
    require_root();
    let t = Topology::new(32);
    let pins = PinDir::new();
    let _other = TcpServer::start(&t.outside, sa(OTHER_V4, 8080), b"any");
    // A "metadata service" on the host namespace.
    run(
        "ip",
        &[
            "-n",
            &t.host.name,
            "addr",
            "add",
            "169.254.169.254/32",
            "dev",
            "lo",
        ],
    );
    let _meta = TcpServer::start(
        &t.host,
        sa("169.254.169.254".parse::<std::net::IpAddr>().unwrap(), 80),
        b"secrets",
    );
    assert!(
        tcp_fetch(
            &t.guest,
            sa("169.254.169.254".parse::<std::net::IpAddr>().unwrap(), 80)
        )
        .is_ok(),
        "reachable without the fence"
    );

    let fence = fence_up(&t, &pins, EgressMode::AllowAll, &[]);
    assert_eq!(
        tcp_fetch(&t.guest, sa(OTHER_V4, 8080)).as_deref(),
        Ok(&b"any"[..])
    );
    assert!(
        tcp_fetch(
            &t.guest,
            sa("169.254.169.254".parse::<std::net::IpAddr>().unwrap(), 80)
        )
        .is_err(),
        "metadata in AllowAll"
    );
    assert!(
        tcp_fetch(&t.guest, sa(t.gateway_v4, 22)).is_err(),
        "host services in AllowAll"
    );
    assert!(fence.counters().unwrap().packets(reason::PASS_ALLOW_ALL) > 0);
}

#[test]
fn spoofed_source_is_dropped_on_the_wire() {
    require_root();
    let t = Topology::new(33);
    let pins = PinDir::new();
    let server = TcpServer::start(&t.outside, sa(ALLOWED_V4, 443), b"x");
    let fence = fence_up(&t, &pins, EgressMode::Curated, &[allow(ALLOWED_V4, &WEB)]);
    assert!(
        tcp_fetch(&t.guest, sa(ALLOWED_V4, 443)).is_ok(),
        "from its own address the guest connects"
    );
    // Give the guest another sandbox's address and connect from it.
    run(
        "ip",
        &[
            "-n",
            &t.guest.name,
            "addr",
            "add",
            "10.213.99.9/32",
            "dev",
            "g0",
        ],
    );
    let before = server.count();
    let spoofed = t
        .guest
        .run(|| tcp_connect_from("10.213.99.9:0".parse().unwrap(), sa(ALLOWED_V4, 443)));
    assert!(!spoofed, "a connection from a spoofed source must fail");
    assert_eq!(server.count(), before, "the server never saw it");
    assert!(fence.counters().unwrap().packets(reason::DROP_SPOOFED) > 0);
}

/// A TCP connect from a chosen local address (std cannot bind before connect; bash can't
/// either, so use a tiny Python client, which every machine of this kind has).
fn tcp_connect_from(from: SocketAddr, to: SocketAddr) -> bool {
    let script = format!(
        "import socket; s=socket.socket(); s.settimeout(1); s.bind(('{}',0)); s.connect(('{}',{}))",
        from.ip(),
        to.ip(),
        to.port()
    );
    std::process::Command::new("timeout")
        .args(["3", "python3", "-c", &script])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn pinned_fence_outlives_its_loader_and_is_readopted() {
    require_root();
    let t = Topology::new(34);
    let pins = PinDir::new();
    let _web = TcpServer::start(&t.outside, sa(ALLOWED_V4, 443), b"ok");
    let _other = TcpServer::start(&t.outside, sa(OTHER_V4, 443), b"no");
    {
        let _fence = fence_up(&t, &pins, EgressMode::Curated, &[allow(ALLOWED_V4, &WEB)]);
        // The Fence and every fd it held go away here, as when svcd crashes.
    }
    assert!(
        tcp_fetch(&t.guest, sa(OTHER_V4, 443)).is_err(),
        "denied stays denied with no loader"
    );
    assert!(
        tcp_fetch(&t.guest, sa(ALLOWED_V4, 443)).is_ok(),
        "allowed keeps working from the pinned maps"
    );

    // A new loader re-adopts the pinned maps and links without a gap.
    let mut fence = Fence::load(&pins.path).expect("reload");
    assert!(
        fence
            .counters()
            .unwrap()
            .packets(reason::DROP_TCP_NOT_ALLOWED)
            > 0,
        "the pinned counters, not fresh ones"
    );
    let link = t.host_link.clone();
    t.host.run(|| fence.attach(&link)).expect("re-attach");
    assert!(tcp_fetch(&t.guest, sa(OTHER_V4, 443)).is_err());
    assert!(tcp_fetch(&t.guest, sa(ALLOWED_V4, 443)).is_ok());

    // bpftool shows the allow entry and the counters to an operator.
    let dump = run(
        "bpftool",
        &[
            "-j",
            "map",
            "dump",
            "pinned",
            pins.path.join("SVC_ALLOW4").to_str().unwrap(),
        ],
    );
    // The maps are BTF-defined: bpftool prints the fields by name.
    let entries: serde_json::Value = serde_json::from_slice(&dump.stdout).expect("bpftool -j");
    let entry = entries
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| &e["formatted"])
        .find(|f| f["key"]["addr"] == serde_json::json!([192, 0, 2, 10]))
        .unwrap_or_else(|| panic!("192.0.2.10 by field name in the allow map dump: {entries}"));
    assert!(
        entry["key"]["sandbox"].as_u64().is_some_and(|s| s > 0)
            && entry["key"]["generation"].is_u64(),
        "{entry}"
    );
    for field in ["host_id", "rules", "expiry_ns", "idle_ns", "last_seen_ns"] {
        assert!(entry["value"].get(field).is_some(), "{field} in {entry}");
    }
    let counters = run(
        "bpftool",
        &[
            "-j",
            "map",
            "dump",
            "pinned",
            pins.path.join("SVC_COUNTERS").to_str().unwrap(),
        ],
    );
    let counters: serde_json::Value = serde_json::from_slice(&counters.stdout).expect("json");
    let refused = &counters
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["formatted"]["key"] == reason::DROP_TCP_NOT_ALLOWED)
        .expect("the refused reason's slot")["formatted"]["values"];
    let packets: u64 = refused
        .as_array()
        .expect("per cpu")
        .iter()
        .map(|c| c["value"]["packets"].as_u64().expect("packets by name"))
        .sum();
    assert!(packets > 0, "{refused}");

    t.host.run(|| fence.detach(&link)).expect("detach");
    assert!(
        tcp_fetch(&t.guest, sa(OTHER_V4, 443)).is_ok(),
        "open again without the fence"
    );
}

/// Records the fence's diagnostics as they are read.
#[derive(Clone, Default)]
struct Capture(std::sync::Arc<std::sync::Mutex<Vec<(log::Level, String)>>>);

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        self.0
            .lock()
            .unwrap()
            .push((r.level(), r.args().to_string()));
    }
    fn flush(&self) {}
}

/// The programs' diagnostics (aya-log): a packet on a fenced link with no sandbox record is
/// written to the log ring at `warn`, read by svcd's logger; at `off` the programs write
/// nothing.
#[test]
fn the_programs_diagnostics_reach_the_logger_and_the_level_silences_them() {
    use svc_control::dataplane::LogLevel;
    require_root();
    let t = Topology::new(35);
    let link = t.host_link.clone();
    let expected = format!(
        "packet on ifindex {} that has no sandbox record (a fenced link svcd does not know)",
        t.host_ifindex()
    );
    for (level, heard) in [(LogLevel::Warn, true), (LogLevel::Off, false)] {
        let pins = PinDir::new();
        let mut fence = Fence::load_with_log(&pins.path, level).expect("load");
        let capture = Capture::default();
        let mut logger = fence.take_logger(capture.clone()).expect("the log ring");
        // No install_sandbox: the link has no record, so every packet is dropped as such.
        t.host.run(|| fence.attach(&link)).expect("attach");
        assert!(tcp_fetch_within(&t.guest, sa(OTHER_V4, 443), Duration::from_millis(500)).is_err());
        logger.flush();
        let lines = capture.0.lock().unwrap().clone();
        if heard {
            assert!(
                lines
                    .iter()
                    .any(|(l, m)| *l == log::Level::Warn && m.contains(&expected)),
                "{lines:?}"
            );
        } else {
            assert!(lines.is_empty(), "{lines:?}");
        }
        assert!(fence.counters().unwrap().packets(reason::DROP_NO_SANDBOX) > 0);
        t.host.run(|| fence.detach(&link)).expect("detach");
    }
}

/// A sandbox id reused after its earlier sandbox's link went away without `remove_sandbox`
/// (its guest stopped while svcd was down, the link gone with it): the new sandbox's first
/// policy starts from nothing, never from the earlier one's allowed addresses.
#[test]
fn a_reused_sandbox_id_inherits_no_allowed_address() {
    require_root();
    let t = Topology::new(35);
    let pins = PinDir::new();
    let _allowed = TcpServer::start(&t.outside, sa(ALLOWED_V4, 443), b"allowed-v4");
    let other = TcpServer::start(&t.outside, sa(OTHER_V4, 443), b"other-v4");
    let link = sandbox_link(&t, EgressMode::Curated);
    // The earlier sandbox of the same id, on a link that is gone: its record and entries stay.
    let gone = SandboxLink {
        ifindex: link.ifindex + 100_000,
        ..link
    };
    let mut fence = t.fence_up(&pins, &gone, &[allow(OTHER_V4, &WEB)]);
    fence
        .install_sandbox(&link, &[allow(ALLOWED_V4, &WEB)], &[])
        .expect("install the new sandbox");
    assert_eq!(
        tcp_fetch(&t.guest, sa(ALLOWED_V4, 443)).as_deref(),
        Ok(&b"allowed-v4"[..]),
        "its own allowed address"
    );
    let before = other.count();
    assert!(
        tcp_fetch(&t.guest, sa(OTHER_V4, 443)).is_err(),
        "the earlier sandbox's address"
    );
    assert_eq!(other.count(), before, "never reached");
}
