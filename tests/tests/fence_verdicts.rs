//! Every verdict of the fence on crafted frames, with `BPF_PROG_TEST_RUN` against the real
//! programs in the running kernel: the tc action and the counter of the reason both checked.

use std::net::{Ipv4Addr, Ipv6Addr};

use svc_control::{dataplane::Direction, policy::mode::EgressMode};
use svc_ebpf_common::reason::{self, *};
use svc_tests::{
    fixture::{self, TEST_RUN_IFINDEX},
    frames::{self, *},
    require_root,
};

const GUEST: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 2);
const GATEWAY: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);
const ALLOWED: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);
const UDP_HOST: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 30);
const OTHER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 20);
const IN_CIDR: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// A SYN from the guest to `dst` port 443.
fn syn_443(dst: Ipv4Addr) -> Vec<u8> {
    ipv4(GUEST, dst, TCP, &tcp(1, 443, SYN))
}

fn run_table(mode: EgressMode, direction: Direction, cases: &[(&str, Vec<u8>, u32)]) {
    let mut loaded = fixture::load(mode, TEST_RUN_IFINDEX);
    let mut failures = Vec::new();
    for (name, frame, want) in cases {
        let before = loaded.fence.counters().unwrap().packets(*want);
        let outcome = match loaded.fence.test_run_dir(direction, frame) {
            Ok(o) => o,
            Err(e) => {
                failures.push(format!("{name}: the kernel refused the test run: {e:?}"));
                continue;
            }
        };
        let after = loaded.fence.counters().unwrap().packets(*want);
        let action_ok = if reason::is_drop(*want) {
            outcome.dropped()
        } else {
            outcome.passed()
        };
        if !action_ok || after != before + 1 {
            let counters = loaded.fence.counters().unwrap();
            let moved: Vec<&str> = counters
                .reasons
                .iter()
                .filter(|r| r.packets > 0)
                .map(|r| r.reason)
                .collect();
            failures.push(format!("{name}: want {} (action ok: {action_ok}, counter +{}); reasons seen so far: {moved:?}", reason::name(*want).unwrap_or("?"), after - before));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn ingress_ipv4_curated() {
    require_root();
    let tcp_to = |dst, port, flags| ipv4(GUEST, dst, TCP, &tcp(40000, port, flags));
    let udp_to = |dst, port| ipv4(GUEST, dst, UDP, &udp(40000, port, b"x"));
    run_table(
        EgressMode::Curated,
        Direction::Ingress,
        &[
            ("arp_from_guest", arp(GUEST, GATEWAY), PASS_ARP),
            (
                "arp_spoofed_sender",
                arp(Ipv4Addr::new(10, 213, 0, 99), GATEWAY),
                DROP_SPOOFED,
            ),
            (
                "https_to_allowed_is_proxied",
                tcp_to(ALLOWED, 443, SYN),
                PASS_PROXY,
            ),
            (
                "http_to_allowed_is_proxied",
                tcp_to(ALLOWED, 80, SYN),
                PASS_PROXY,
            ),
            (
                "established_packet_to_allowed",
                tcp_to(ALLOWED, 443, ACK),
                PASS_PROXY,
            ),
            (
                "shared_address_other_port",
                tcp_to(ALLOWED, 22, SYN),
                DROP_TCP_NOT_ALLOWED,
            ),
            (
                "ip_literal_not_resolved",
                tcp_to(OTHER, 443, SYN),
                DROP_TCP_NOT_ALLOWED,
            ),
            (
                "non_syn_to_unknown_address",
                tcp_to(OTHER, 443, ACK),
                DROP_TCP_NOT_ALLOWED,
            ),
            (
                "cidr_entry_allows_web",
                tcp_to(IN_CIDR, 443, SYN),
                PASS_PROXY,
            ),
            (
                "cidr_entry_not_other_port",
                tcp_to(IN_CIDR, 8080, SYN),
                DROP_TCP_NOT_ALLOWED,
            ),
            ("explicit_udp_rule", udp_to(UDP_HOST, 4433), PASS_ALLOWED),
            (
                "quic_to_allowed_web_host",
                udp_to(ALLOWED, 443),
                DROP_UDP_NOT_ALLOWED,
            ),
            ("udp_to_unknown", udp_to(OTHER, 9999), DROP_UDP_NOT_ALLOWED),
            (
                "icmp_echo_to_allowed_web_host",
                ipv4(GUEST, ALLOWED, ICMP, &icmp(8)),
                DROP_ICMP,
            ),
            (
                "icmp_with_explicit_rule",
                ipv4(GUEST, UDP_HOST, ICMP, &icmp(8)),
                PASS_ALLOWED,
            ),
            (
                "icmp_to_unknown",
                ipv4(GUEST, OTHER, ICMP, &icmp(8)),
                DROP_ICMP,
            ),
            (
                "gre_protocol",
                ipv4(GUEST, ALLOWED, 47, &[0; 8]),
                DROP_PROTOCOL,
            ),
            ("dns_udp_to_gateway", udp_to(GATEWAY, 53), PASS_DNS),
            ("dns_tcp_to_gateway", tcp_to(GATEWAY, 53, SYN), PASS_DNS),
            (
                "dns_to_public_resolver_is_steered",
                udp_to(Ipv4Addr::new(8, 8, 8, 8), 53),
                PASS_DNS,
            ),
            (
                "dns_over_tcp_elsewhere_is_steered",
                tcp_to(Ipv4Addr::new(1, 1, 1, 1), 53, SYN),
                PASS_DNS,
            ),
            (
                "dns_on_other_port_to_allowed",
                udp_to(ALLOWED, 5353),
                DROP_UDP_NOT_ALLOWED,
            ),
            ("gateway_ssh", tcp_to(GATEWAY, 22, SYN), DROP_GATEWAY),
            ("gateway_https", tcp_to(GATEWAY, 443, SYN), DROP_GATEWAY),
            ("gateway_udp_other", udp_to(GATEWAY, 123), DROP_GATEWAY),
            (
                "other_sandbox",
                tcp_to(Ipv4Addr::new(10, 213, 9, 2), 443, SYN),
                DROP_DEST_CLASS,
            ),
            (
                "metadata",
                tcp_to(Ipv4Addr::new(169, 254, 169, 254), 80, SYN),
                DROP_DEST_CLASS,
            ),
            (
                "loopback",
                tcp_to(Ipv4Addr::new(127, 0, 0, 1), 443, SYN),
                DROP_DEST_CLASS,
            ),
            (
                "private_lan",
                tcp_to(Ipv4Addr::new(192, 168, 1, 1), 443, SYN),
                DROP_DEST_CLASS,
            ),
            (
                "broadcast",
                udp_to(Ipv4Addr::new(255, 255, 255, 255), 67),
                DROP_DEST_CLASS,
            ),
            (
                "spoofed_source_other_sandbox",
                ipv4(
                    Ipv4Addr::new(10, 213, 9, 2),
                    ALLOWED,
                    TCP,
                    &tcp(1, 443, SYN),
                ),
                DROP_SPOOFED,
            ),
            (
                "spoofed_source_host",
                ipv4(GATEWAY, ALLOWED, TCP, &tcp(1, 443, SYN)),
                DROP_SPOOFED,
            ),
            (
                "first_fragment",
                ipv4_with(
                    GUEST,
                    ALLOWED,
                    TCP,
                    &tcp(1, 443, SYN),
                    V4Opts {
                        frag: 0x2000,
                        ..V4Opts::default()
                    },
                ),
                DROP_FRAGMENT,
            ),
            (
                "later_fragment",
                ipv4_with(
                    GUEST,
                    ALLOWED,
                    TCP,
                    &[0; 16],
                    V4Opts {
                        frag: 0x0010,
                        ..V4Opts::default()
                    },
                ),
                DROP_FRAGMENT,
            ),
            (
                "ip_options",
                ipv4_with(
                    GUEST,
                    ALLOWED,
                    TCP,
                    &tcp(1, 443, SYN),
                    V4Opts {
                        option_words: 1,
                        ..V4Opts::default()
                    },
                ),
                DROP_IP_OPTIONS,
            ),
            (
                "truncated_tcp_header",
                ipv4(GUEST, ALLOWED, TCP, &[0x9c, 0x40]),
                DROP_MALFORMED,
            ),
            (
                "bad_ip_version",
                {
                    let mut f = tcp_to(ALLOWED, 443, SYN);
                    f[14] = 0x65;
                    f
                },
                DROP_MALFORMED,
            ),
            (
                "length_beyond_frame",
                {
                    let mut f = tcp_to(ALLOWED, 443, SYN);
                    f[16] = 0x05;
                    f
                },
                DROP_MALFORMED,
            ),
            (
                "vlan_tagged",
                vlan_tagged(&tcp_to(ALLOWED, 443, SYN)),
                DROP_ETHERTYPE,
            ),
            (
                "pppoe_session",
                frames::eth(0x8864).into_iter().chain([0; 40]).collect(),
                DROP_ETHERTYPE,
            ),
            (
                "raw_802_3_length_field",
                frames::eth(0x0040).into_iter().chain([0; 40]).collect(),
                DROP_ETHERTYPE,
            ),
        ],
    );
}

#[test]
fn ingress_ipv6_curated() {
    require_root();
    let guest = v6("fd53::2");
    let tcp_to = |dst: &str, port| ipv6(guest, v6(dst), TCP, 64, &tcp(40000, port, SYN));
    let udp_to = |dst: &str, port| ipv6(guest, v6(dst), UDP, 64, &udp(40000, port, b"x"));
    run_table(
        EgressMode::Curated,
        Direction::Ingress,
        &[
            ("https_to_allowed", tcp_to("2001:db8::10", 443), PASS_PROXY),
            (
                "other_port_on_allowed",
                tcp_to("2001:db8::10", 22),
                DROP_TCP_NOT_ALLOWED,
            ),
            (
                "not_resolved_address",
                tcp_to("2001:db8::20", 443),
                DROP_TCP_NOT_ALLOWED,
            ),
            ("quic", udp_to("2001:db8::10", 443), DROP_UDP_NOT_ALLOWED),
            (
                "dns_to_public_v6_resolver_is_steered",
                udp_to("2001:4860:4860::8888", 53),
                PASS_DNS,
            ),
            ("dns_tcp_v6", tcp_to("2001:4860:4860::8888", 53), PASS_DNS),
            ("gateway_other_port", tcp_to("fd53::1", 22), DROP_GATEWAY),
            (
                "v4_mapped_metadata",
                tcp_to("::ffff:169.254.169.254", 80),
                DROP_DEST_CLASS,
            ),
            (
                "v4_mapped_allowed_v4",
                tcp_to("::ffff:192.0.2.10", 443),
                DROP_DEST_CLASS,
            ),
            (
                "v4_compatible",
                tcp_to("::192.0.2.10", 443),
                DROP_DEST_CLASS,
            ),
            ("nat64", tcp_to("64:ff9b::c000:20a", 443), DROP_DEST_CLASS),
            (
                "nat64_local",
                tcp_to("64:ff9b:1::c000:20a", 443),
                DROP_DEST_CLASS,
            ),
            (
                "six_to_four",
                tcp_to("2002:c000:20a::1", 443),
                DROP_DEST_CLASS,
            ),
            (
                "teredo",
                tcp_to("2001:0:4136:e378:8000:63bf:3fff:fdd2", 443),
                DROP_DEST_CLASS,
            ),
            ("link_local_dest", tcp_to("fe80::1", 443), DROP_DEST_CLASS),
            ("metadata_v6", tcp_to("fd00:ec2::254", 80), DROP_DEST_CLASS),
            (
                "other_sandbox_v6",
                tcp_to("fd53:9::2", 443),
                DROP_DEST_CLASS,
            ),
            ("multicast", udp_to("ff02::1", 9), DROP_DEST_CLASS),
            (
                "spoofed_source",
                ipv6(
                    v6("fd53:9::2"),
                    v6("2001:db8::10"),
                    TCP,
                    64,
                    &tcp(1, 443, SYN),
                ),
                DROP_SPOOFED,
            ),
            (
                "link_local_source_for_data",
                ipv6(
                    v6("fe80::2"),
                    v6("2001:db8::10"),
                    TCP,
                    64,
                    &tcp(1, 443, SYN),
                ),
                DROP_SPOOFED,
            ),
            (
                "neighbour_solicitation",
                ipv6(v6("fe80::2"), v6("ff02::1:ff00:1"), ICMPV6, 255, &icmp(135)),
                PASS_ND,
            ),
            (
                "router_solicitation",
                ipv6(v6("fe80::2"), v6("ff02::2"), ICMPV6, 255, &icmp(133)),
                PASS_ND,
            ),
            (
                "dad_from_unspecified",
                ipv6(v6("::"), v6("ff02::1:ff00:2"), ICMPV6, 255, &icmp(135)),
                PASS_ND,
            ),
            (
                "nd_with_low_hop_limit",
                ipv6(v6("fe80::2"), v6("ff02::1:ff00:1"), ICMPV6, 64, &icmp(135)),
                DROP_SPOOFED,
            ),
            (
                "nd_from_foreign_link_local",
                ipv6(v6("fe80::99"), v6("ff02::1"), ICMPV6, 255, &icmp(136)),
                DROP_SPOOFED,
            ),
            (
                "echo_request",
                ipv6(guest, v6("2001:db8::10"), ICMPV6, 64, &icmp(128)),
                DROP_ICMP,
            ),
            (
                "fragment_header",
                ipv6(guest, v6("2001:db8::10"), 44, 64, &[6, 0, 0, 1, 0, 0, 0, 1]),
                DROP_FRAGMENT,
            ),
            (
                "hop_by_hop_header",
                ipv6(guest, v6("2001:db8::10"), 0, 64, &[6, 0, 0, 0, 0, 0, 0, 0]),
                DROP_IP_OPTIONS,
            ),
            (
                "routing_header",
                ipv6(guest, v6("2001:db8::10"), 43, 64, &[6, 0, 0, 0, 0, 0, 0, 0]),
                DROP_IP_OPTIONS,
            ),
            (
                "truncated_udp_header",
                ipv6(guest, v6("2001:db8::10"), UDP, 64, &[0, 53]),
                DROP_MALFORMED,
            ),
            (
                "payload_length_beyond_frame",
                {
                    let mut f = tcp_to("2001:db8::10", 443);
                    f[18] = 0x40;
                    f
                },
                DROP_MALFORMED,
            ),
        ],
    );
}

#[test]
fn ingress_allow_all() {
    require_root();
    let guest = Ipv4Addr::new(10, 213, 0, 2);
    let tcp_to = |dst, port| ipv4(guest, dst, TCP, &tcp(40000, port, SYN));
    run_table(
        EgressMode::AllowAll,
        Direction::Ingress,
        &[
            ("any_public_address", tcp_to(OTHER, 22), PASS_ALLOW_ALL),
            (
                "udp_any",
                ipv4(guest, OTHER, UDP, &udp(1, 443, b"q")),
                PASS_ALLOW_ALL,
            ),
            (
                "metadata_in_allow_all",
                tcp_to(Ipv4Addr::new(169, 254, 169, 254), 80),
                DROP_DEST_CLASS,
            ),
            (
                "private_in_allow_all",
                tcp_to(Ipv4Addr::new(10, 0, 0, 1), 80),
                DROP_DEST_CLASS,
            ),
            (
                "other_sandbox_in_allow_all",
                tcp_to(Ipv4Addr::new(10, 213, 5, 2), 80),
                DROP_DEST_CLASS,
            ),
            ("gateway_in_allow_all", tcp_to(GATEWAY, 22), DROP_GATEWAY),
            (
                "dns_still_steered",
                ipv4(guest, Ipv4Addr::new(8, 8, 8, 8), UDP, &udp(1, 53, b"q")),
                PASS_DNS,
            ),
            (
                "v6_embedding_in_allow_all",
                ipv6(
                    v6("fd53::2"),
                    v6("::ffff:169.254.169.254"),
                    TCP,
                    64,
                    &tcp(1, 80, SYN),
                ),
                DROP_DEST_CLASS,
            ),
            (
                "spoofing_in_allow_all",
                ipv4(Ipv4Addr::new(10, 213, 5, 2), OTHER, TCP, &tcp(1, 80, SYN)),
                DROP_SPOOFED,
            ),
        ],
    );
}

#[test]
fn egress_direction() {
    require_root();
    run_table(
        EgressMode::Curated,
        Direction::Egress,
        &[
            (
                "reply_to_guest",
                ipv4(ALLOWED, GUEST, TCP, &tcp(443, 40000, ACK)),
                PASS_EGRESS,
            ),
            ("arp_to_guest", arp(GATEWAY, GUEST), PASS_ARP),
            (
                "to_another_address",
                ipv4(
                    ALLOWED,
                    Ipv4Addr::new(10, 213, 0, 3),
                    TCP,
                    &tcp(443, 1, ACK),
                ),
                DROP_EGRESS_NOT_GUEST,
            ),
            (
                "v6_to_guest",
                ipv6(
                    v6("2001:db8::10"),
                    v6("fd53::2"),
                    TCP,
                    64,
                    &tcp(443, 1, ACK),
                ),
                PASS_EGRESS,
            ),
            (
                "v6_nd_to_guest",
                ipv6(v6("fe80::1"), v6("fe80::2"), ICMPV6, 255, &icmp(136)),
                PASS_ND,
            ),
            (
                "vlan_to_guest",
                vlan_tagged(&ipv4(ALLOWED, GUEST, TCP, &tcp(443, 1, ACK))),
                DROP_ETHERTYPE,
            ),
        ],
    );
}

#[test]
fn a_link_without_a_sandbox_record_drops_everything() {
    require_root();
    let mut loaded = fixture::load(EgressMode::Curated, 4242);
    for frame in [
        arp(GUEST, GATEWAY),
        ipv4(GUEST, ALLOWED, TCP, &tcp(1, 443, SYN)),
    ] {
        assert!(loaded.fence.test_run(&frame).unwrap().dropped());
    }
    assert_eq!(loaded.fence.counters().unwrap().packets(DROP_NO_SANDBOX), 2);
}

#[test]
fn a_policy_change_is_atomic_and_removes_the_old_generation() {
    use svc_control::dataplane::WEB;
    require_root();
    let mut loaded = fixture::load(EgressMode::Curated, TEST_RUN_IFINDEX);
    assert!(loaded.fence.test_run(&syn_443(ALLOWED)).unwrap().passed());
    assert!(loaded.fence.test_run(&syn_443(OTHER)).unwrap().dropped());
    let first = loaded
        .fence
        .sandbox_record(TEST_RUN_IFINDEX)
        .unwrap()
        .generation;

    let only_other = [fixture::allow(OTHER, &WEB, 9)];
    let second = loaded
        .fence
        .install_sandbox(
            &fixture::link(EgressMode::Curated, TEST_RUN_IFINDEX),
            &only_other,
            &[],
        )
        .unwrap();
    assert_eq!(second, first + 1);
    assert!(
        loaded.fence.test_run(&syn_443(OTHER)).unwrap().passed(),
        "the new policy is in force"
    );
    assert!(
        loaded.fence.test_run(&syn_443(ALLOWED)).unwrap().dropped(),
        "the old policy is gone"
    );
    assert!(
        loaded.fence.test_run(&syn_443(IN_CIDR)).unwrap().dropped(),
        "the old CIDRs are gone"
    );
    let entries = loaded.fence.allow_entries(fixture::SANDBOX);
    assert_eq!(
        entries.len(),
        1,
        "only the new generation's entries remain: {entries:?}"
    );
}

#[test]
fn an_expired_entry_stops_working_unless_traffic_keeps_it_alive() {
    use std::time::Duration;
    use svc_control::dataplane::{AllowEntry, WEB};
    require_root();
    let mut loaded = fixture::load(EgressMode::Curated, TEST_RUN_IFINDEX);
    let short = |addr: Ipv4Addr| AllowEntry {
        addr: addr.into(),
        rules: WEB.to_vec(),
        host_id: 5,
        ttl: Some(Duration::from_millis(300)),
        idle: Duration::from_millis(400),
    };
    let idle_one = Ipv4Addr::new(192, 0, 2, 40);
    let busy_one = Ipv4Addr::new(192, 0, 2, 41);
    loaded
        .fence
        .add_allow(TEST_RUN_IFINDEX, &short(idle_one))
        .unwrap();
    loaded
        .fence
        .add_allow(TEST_RUN_IFINDEX, &short(busy_one))
        .unwrap();
    assert!(loaded.fence.test_run(&syn_443(idle_one)).unwrap().passed());
    // Keep one entry busy past its TTL; leave the other idle.
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            loaded.fence.test_run(&syn_443(busy_one)).unwrap().passed(),
            "traffic keeps the entry alive"
        );
    }
    assert!(
        loaded.fence.test_run(&syn_443(idle_one)).unwrap().dropped(),
        "an idle entry dies after its TTL and idle grace"
    );
    std::thread::sleep(Duration::from_millis(900));
    assert!(
        loaded.fence.test_run(&syn_443(busy_one)).unwrap().dropped(),
        "once traffic stops it dies too"
    );
    assert!(loaded.fence.collect_expired().unwrap() >= 2);
}

#[test]
fn class_denied_addresses_never_enter_the_allow_maps() {
    use svc_control::dataplane::{CidrEntry, WEB};
    require_root();
    let mut loaded = fixture::load(EgressMode::Curated, TEST_RUN_IFINDEX);
    for addr in [
        "169.254.169.254",
        "10.213.5.2",
        "127.0.0.1",
        "::ffff:192.0.2.10",
        "fd00:ec2::254",
    ] {
        let e = fixture::allow(addr.parse::<std::net::IpAddr>().unwrap(), &WEB, 1);
        assert!(
            loaded.fence.add_allow(TEST_RUN_IFINDEX, &e).is_err(),
            "{addr} must be refused"
        );
    }
    let wide = CidrEntry {
        net: "10.0.0.0/8".parse().unwrap(),
        rules: WEB.to_vec(),
        host_id: 1,
    };
    assert!(
        loaded
            .fence
            .install_sandbox(
                &fixture::link(EgressMode::Curated, TEST_RUN_IFINDEX),
                &[],
                &[wide]
            )
            .is_err()
    );
    let public = fixture::allow(Ipv4Addr::new(192, 0, 2, 99), &WEB, 1);
    assert!(loaded.fence.add_allow(TEST_RUN_IFINDEX, &public).is_ok());
}

#[test]
fn an_answer_already_in_the_fence_is_not_written_again_and_anything_less_is() {
    use std::time::Duration;
    use svc_control::dataplane::{AllowEntry, Carry, PortRule, WEB};
    require_root();
    let mut loaded = fixture::load(EgressMode::Curated, TEST_RUN_IFINDEX);
    let addr = Ipv4Addr::new(192, 0, 2, 50);
    let entry = |ttl_ms: u64, rules: Vec<PortRule>| AllowEntry {
        addr: addr.into(),
        rules,
        host_id: 7,
        ttl: Some(Duration::from_millis(ttl_ms)),
        idle: Duration::from_millis(100),
    };
    let syn_to = |port| ipv4(GUEST, addr, TCP, &tcp(1, port, SYN));
    let mut add = |e: &AllowEntry| loaded.fence.add_allow(TEST_RUN_IFINDEX, e).unwrap();
    assert!(
        add(&entry(60_000, WEB.to_vec())),
        "the first answer is written"
    );
    assert!(
        !add(&entry(30_000, WEB.to_vec())),
        "a repeat needing less life is already in force"
    );
    assert!(
        add(&entry(120_000, WEB.to_vec())),
        "a repeat needing more life is written"
    );
    assert!(
        add(&entry(1_000, vec![PortRule::Tcp(8443)])),
        "another name's rules on the address are written, beside the first's"
    );
    assert!(loaded.fence.test_run(&syn_to(8443)).unwrap().passed());
    assert!(loaded.fence.test_run(&syn_to(443)).unwrap().passed());
    assert!(
        !loaded
            .fence
            .add_allow(TEST_RUN_IFINDEX, &entry(1_000, vec![PortRule::Tcp(80)]))
            .unwrap(),
        "rules already among the entry's are in force"
    );

    // A new generation that leaves the address behind: the next answer must write it again,
    // and it is in force again.
    loaded
        .fence
        .regenerate(TEST_RUN_IFINDEX, |_| Carry::Drop)
        .unwrap();
    assert!(loaded.fence.test_run(&syn_to(8443)).unwrap().dropped());
    assert!(
        loaded
            .fence
            .add_allow(TEST_RUN_IFINDEX, &entry(300, vec![PortRule::Tcp(8443)]))
            .unwrap(),
        "an entry the fence lost is written again"
    );
    assert!(loaded.fence.test_run(&syn_to(8443)).unwrap().passed());

    // Expired and collected: written again.
    std::thread::sleep(Duration::from_millis(500));
    assert!(loaded.fence.test_run(&syn_to(8443)).unwrap().dropped());
    assert!(loaded.fence.collect_expired().unwrap() >= 1);
    assert!(
        loaded
            .fence
            .add_allow(TEST_RUN_IFINDEX, &entry(300, vec![PortRule::Tcp(8443)]))
            .unwrap()
    );
    assert!(loaded.fence.test_run(&syn_to(8443)).unwrap().passed());

    // The sandbox removed and installed again: nothing is taken as already there.
    loaded.fence.remove_sandbox(TEST_RUN_IFINDEX).unwrap();
    loaded
        .fence
        .install_sandbox(
            &fixture::link(EgressMode::Curated, TEST_RUN_IFINDEX),
            &[],
            &[],
        )
        .unwrap();
    assert!(
        loaded
            .fence
            .add_allow(TEST_RUN_IFINDEX, &entry(60_000, WEB.to_vec()))
            .unwrap()
    );
    assert!(loaded.fence.test_run(&syn_to(443)).unwrap().passed());
}

#[test]
fn names_sharing_an_address_open_all_their_ports_and_a_policy_change_narrows_it() {
    use std::time::Duration;
    use svc_control::dataplane::{AllowEntry, Carry, PortRule, WEB};
    require_root();
    let mut loaded = fixture::load(EgressMode::Curated, TEST_RUN_IFINDEX);
    let shared = Ipv4Addr::new(192, 0, 2, 60);
    let alone = Ipv4Addr::new(192, 0, 2, 61);
    let answer = |addr: Ipv4Addr, ttl_ms: u64, idle_ms: u64, rules: Vec<PortRule>| AllowEntry {
        addr: addr.into(),
        rules,
        host_id: 8,
        ttl: Some(Duration::from_millis(ttl_ms)),
        idle: Duration::from_millis(idle_ms),
    };
    let db = |ttl_ms, idle_ms| answer(shared, ttl_ms, idle_ms, vec![PortRule::Tcp(5432)]);
    let opens = |loaded: &mut fixture::Loaded, addr: Ipv4Addr, port: u16| {
        loaded
            .fence
            .test_run(&ipv4(GUEST, addr, TCP, &tcp(1, port, SYN)))
            .unwrap()
            .passed()
    };
    let add = |loaded: &mut fixture::Loaded, e: &AllowEntry| {
        loaded.fence.add_allow(TEST_RUN_IFINDEX, e).unwrap()
    };

    // api (the web ports) and db (5432) answered with one address: both names' ports open.
    add(&mut loaded, &answer(shared, 60_000, 1_000, WEB.to_vec()));
    add(&mut loaded, &db(60_000, 1_000));
    add(&mut loaded, &answer(alone, 60_000, 1_000, WEB.to_vec()));
    for port in [443, 80, 5432] {
        assert!(opens(&mut loaded, shared, port), "port {port}");
    }
    assert!(!opens(&mut loaded, shared, 22), "no name opened 22");
    assert!(
        !add(&mut loaded, &answer(shared, 30_000, 1_000, WEB.to_vec())),
        "api's repeat is already in force"
    );

    // api removed from the allowlist: the shared address keeps only db's port; an address
    // nobody's names changed is carried as it is.
    let only_db = |a: std::net::IpAddr| {
        if a == std::net::IpAddr::from(shared) {
            Carry::Only(vec![PortRule::Tcp(5432)])
        } else {
            Carry::Keep
        }
    };
    loaded.fence.regenerate(TEST_RUN_IFINDEX, only_db).unwrap();
    assert!(opens(&mut loaded, shared, 5432));
    assert!(
        !opens(&mut loaded, shared, 443),
        "the removed name's port closed"
    );
    assert!(opens(&mut loaded, alone, 443), "the other address carried");

    // Nothing the entry holds is kept: it leaves.
    loaded
        .fence
        .regenerate(TEST_RUN_IFINDEX, |_| Carry::Only(vec![PortRule::Tcp(22)]))
        .unwrap();
    assert!(!opens(&mut loaded, shared, 5432));
    assert!(!opens(&mut loaded, alone, 443));

    // A dead entry is not merged: db's answer expired unused, api's does not bring it back.
    add(&mut loaded, &db(200, 100));
    std::thread::sleep(Duration::from_millis(400));
    add(&mut loaded, &answer(shared, 60_000, 1_000, WEB.to_vec()));
    assert!(opens(&mut loaded, shared, 443));
    assert!(
        !opens(&mut loaded, shared, 5432),
        "the expired name's port stayed shut"
    );

    // An entry past its expiry but kept alive by traffic keeps its rules under that traffic.
    loaded
        .fence
        .regenerate(TEST_RUN_IFINDEX, |_| Carry::Drop)
        .unwrap();
    add(&mut loaded, &db(200, 600));
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(100));
        assert!(opens(&mut loaded, shared, 5432), "traffic keeps it alive");
    }
    add(&mut loaded, &answer(shared, 60_000, 1_000, WEB.to_vec()));
    assert!(opens(&mut loaded, shared, 443));
    assert!(
        opens(&mut loaded, shared, 5432),
        "the busy name's port was cut by another name's answer"
    );
}

#[test]
fn rewriting_the_destination_classes_never_leaves_them_open() {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use svc_control::{dataplane::Fence, policy::destination};
    require_root();
    let mut loaded = fixture::load(EgressMode::AllowAll, TEST_RUN_IFINDEX);
    // svcd restarting: another handle on the same pinned maps writes the classes again while
    // an AllowAll guest keeps sending to the metadata address.
    let mut restarted = Fence::load(&loaded.pins.path).expect("the pinned fence, again");
    let (deny, allow) = destination::fence_cidrs(&fixture::host_network());
    let metadata = Ipv4Addr::new(169, 254, 169, 254);
    let to = |dst| ipv4(GUEST, dst, TCP, &tcp(1, 80, SYN));
    // The rewrites go on until the guest has sent 500 packets during them, however the two
    // threads are scheduled.
    let (done, sent) = (AtomicBool::new(false), AtomicU32::new(0));
    let passed = std::thread::scope(|s| {
        s.spawn(|| {
            let mut rewrites = 0;
            while rewrites < 300 || sent.load(Ordering::Acquire) < 500 {
                restarted.set_destination_classes(&deny, &allow).unwrap();
                rewrites += 1;
            }
            done.store(true, Ordering::Release);
        });
        let mut passed = 0u32;
        while !done.load(Ordering::Acquire) {
            passed += u32::from(loaded.fence.test_run(&to(metadata)).unwrap().passed());
            sent.fetch_add(1, Ordering::Release);
        }
        passed
    });
    let sent = sent.into_inner();
    assert_eq!(
        passed, 0,
        "{passed} of {sent} packets reached the metadata address"
    );

    // A class left out of the new list leaves the tries; a new one is in.
    let doc_net: ipnet::IpNet = "203.0.113.0/24".parse().unwrap();
    let mut fewer: Vec<ipnet::IpNet> = deny
        .iter()
        .filter(|n| !n.contains(&std::net::IpAddr::from(metadata)))
        .copied()
        .collect();
    fewer.push(doc_net);
    restarted.set_destination_classes(&fewer, &allow).unwrap();
    assert!(loaded.fence.test_run(&to(metadata)).unwrap().passed());
    assert!(
        loaded
            .fence
            .test_run(&to(Ipv4Addr::new(203, 0, 113, 5)))
            .unwrap()
            .dropped()
    );
    assert!(
        loaded
            .fence
            .test_run(&to(Ipv4Addr::new(10, 213, 9, 9)))
            .unwrap()
            .dropped(),
        "the classes still listed stay"
    );
}
