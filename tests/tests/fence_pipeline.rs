//! The eBPF pipeline end to end: the embedded object loads, pins, classifies crafted frames with
//! `BPF_PROG_TEST_RUN`, and fences a real veth in a real network namespace.

use std::process::Command;

use svc_control::dataplane::Fence;
use svc_ebpf_common::{map, reason};
use svc_tests::{GuestLink, NetNs, PinDir, frames, require_root, run};

#[test]
fn prog_test_run_passes_arp_and_drops_ipv4_counting_the_reason() {
    require_root();
    let pins = PinDir::new();
    let mut fence = Fence::load(&pins.path).expect("load fence");
    let before = fence.counters().expect("counters");

    let arp = fence
        .test_run(&frames::arp_request())
        .expect("test run arp");
    assert!(arp.passed(), "ARP must pass, got action {}", arp.action);

    let ipv4 = fence
        .test_run(&frames::ipv4_icmp_echo())
        .expect("test run ipv4");
    assert!(ipv4.dropped(), "IPv4 must drop, got action {}", ipv4.action);

    let after = fence.counters().expect("counters");
    assert_eq!(
        after.packets(reason::PASS_ARP),
        before.packets(reason::PASS_ARP) + 1
    );
    assert_eq!(
        after.packets(reason::DROP_IPV4_DEFAULT),
        before.packets(reason::DROP_IPV4_DEFAULT) + 1
    );
    assert_eq!(after.dropped(), before.dropped() + 1);
}

#[test]
fn prog_test_run_drops_ipv6_and_unusual_ethertypes_by_reason() {
    require_root();
    let pins = PinDir::new();
    let mut fence = Fence::load(&pins.path).expect("load fence");

    let cases: [(&str, Vec<u8>, u32); 4] = [
        ("ipv6", frames::ipv6_udp(), reason::DROP_IPV6_DEFAULT),
        ("vlan_tagged", frames::vlan_tagged(), reason::DROP_ETHERTYPE),
        ("pppoe_session", frames::eth(0x8864), reason::DROP_ETHERTYPE),
        (
            "raw_802_3_length",
            frames::eth(0x0040),
            reason::DROP_ETHERTYPE,
        ),
    ];
    for (name, frame, expected) in cases {
        let before = fence.counters().expect("counters").packets(expected);
        let outcome = fence.test_run(&frame).expect(name);
        assert!(
            outcome.dropped(),
            "{name}: must drop, got {}",
            outcome.action
        );
        let after = fence.counters().expect("counters").packets(expected);
        assert_eq!(after, before + 1, "{name}: counter for reason {expected}");
    }
}

#[test]
fn veth_fence_blocks_ping_counts_it_and_detach_restores_it() {
    require_root();
    let ns = NetNs::new();
    let link = GuestLink::new(&ns, 1);
    let pins = PinDir::new();
    let ping = |ns: &NetNs| {
        ns.exec(
            "ping",
            &["-c", "2", "-i", "0.2", "-W", "1", &link.host_addr],
        )
        .status
        .success()
    };
    assert!(ping(&ns), "ping must work before the fence is attached");

    let mut fence = Fence::load(&pins.path).expect("load fence");
    fence.attach(&link.host).expect("attach");
    let before = fence.counters().expect("counters");
    assert!(!ping(&ns), "ping must fail with the fence attached");
    let after = fence.counters().expect("counters");
    let dropped =
        after.packets(reason::DROP_IPV4_DEFAULT) - before.packets(reason::DROP_IPV4_DEFAULT);
    assert!(
        dropped >= 2,
        "the echo requests must be counted as IPv4 drops, saw {dropped}"
    );

    // An operator reading the pinned counter map with bpftool sees the same numbers.
    let map_path = pins.path.join(map::COUNTERS);
    let dump = run(
        "bpftool",
        &[
            "-j",
            "map",
            "dump",
            "pinned",
            map_path.to_str().expect("utf-8 path"),
        ],
    );
    let entries: serde_json::Value = serde_json::from_slice(&dump.stdout).expect("bpftool json");
    let seen = bpftool_packets(&entries, reason::DROP_IPV4_DEFAULT);
    assert!(
        seen >= after.packets(reason::DROP_IPV4_DEFAULT),
        "bpftool shows {seen} IPv4 drops, the fence counted {}",
        after.packets(reason::DROP_IPV4_DEFAULT)
    );

    fence.detach(&link.host).expect("detach");
    assert!(ping(&ns), "ping must work again after detach");
}

#[test]
fn pinned_fence_outlives_its_loader_and_stays_closed() {
    require_root();
    let ns = NetNs::new();
    let link = GuestLink::new(&ns, 2);
    let pins = PinDir::new();
    {
        let mut fence = Fence::load(&pins.path).expect("load fence");
        fence.attach(&link.host).expect("attach");
        // The Fence (and its fds) goes away here, as when svcd crashes.
    }
    let blocked = !ns
        .exec("ping", &["-c", "1", "-W", "1", &link.host_addr])
        .status
        .success();
    assert!(
        blocked,
        "the pinned fence must keep dropping after its loader is gone"
    );
    let counters =
        svc_control::dataplane::read_pinned_counters(&pins.path).expect("pinned counters");
    assert!(counters.packets(reason::DROP_IPV4_DEFAULT) >= 1);

    // A new loader re-adopts the pinned maps and link, then detaches.
    let mut fence = Fence::load(&pins.path).expect("reload fence");
    assert!(
        fence
            .counters()
            .expect("counters")
            .packets(reason::DROP_IPV4_DEFAULT)
            >= 1,
        "the reloaded fence must see the pinned counters, not fresh ones"
    );
    fence.attach(&link.host).expect("re-attach");
    fence.detach(&link.host).expect("detach");
    let status = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.name,
            "ping",
            "-c",
            "1",
            "-W",
            "1",
            &link.host_addr,
        ])
        .status()
        .expect("ping");
    assert!(status.success(), "ping must work after detach");
}

/// Sum of packets over CPUs for one reason in bpftool's JSON dump of the per-CPU counter array.
/// The map has no BTF, so bpftool prints raw little-endian bytes: key = u32, value = two u64s
/// (packets, then bytes).
fn bpftool_packets(entries: &serde_json::Value, code: u32) -> u64 {
    let entries = entries.as_array().expect("bpftool dump is an array");
    let entry = entries
        .iter()
        .find(|e| le_bytes(&e["key"]) == u64::from(code))
        .unwrap_or_else(|| panic!("no entry for key {code} in bpftool's dump"));
    entry["values"]
        .as_array()
        .expect("per-cpu values")
        .iter()
        .map(|v| le_bytes(&v["value"].as_array().expect("value bytes")[..8].into()))
        .sum()
}

/// A little-endian integer from bpftool's `["0x03", "0x00", ...]` byte list.
fn le_bytes(bytes: &serde_json::Value) -> u64 {
    let bytes = bytes.as_array().expect("byte list");
    bytes.iter().rev().fold(0u64, |acc, b| {
        let b = b.as_str().expect("hex byte").trim_start_matches("0x");
        (acc << 8) | u64::from_str_radix(b, 16).expect("hex byte")
    })
}
