//! `cargo xtask bench fence`: the fence's cost, measured side by side in one run.
//!
//! 1. TCP throughput guest → outside with iperf3 over the same veth, without programs and with
//!    the fence attached (an allow entry for the server), as a ratio.
//! 2. Per-packet cost of each program from the kernel's BPF statistics
//!    (`kernel.bpf_stats_enabled=1`: run_time_ns / run_cnt), the median of several windows,
//!    and the programs' total run time as a share of one core over the run (what the fence can
//!    take from a CPU-bound transfer at most, free of the throughput's run-to-run noise).
//! 3. The same with 100 sandboxes × 1,000 allow entries each in the maps.
//!
//! Prints a Markdown table for docs/PERFORMANCE.md. `cargo xtask bench fence [ROUNDS]` (default
//! 5 alternating rounds per row).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark binary: fail loudly"
)]

use std::{
    net::{IpAddr, Ipv4Addr},
    process::{Child, Command},
    time::Duration,
};

use svc_control::{
    dataplane::{AllowEntry, Fence, PortRule, SandboxLink},
    policy::{destination, mode::EgressMode},
};
use svc_tests::{
    PinDir, require_root, run,
    topology::{ALLOWED_V4, Topology},
};

const SECONDS: &str = "4";
/// Alternating rounds per row unless given as the argument.
const ROUNDS: usize = 5;

fn rounds() -> usize {
    std::env::args()
        .nth(1)
        .map_or(ROUNDS, |a| {
            a.parse().unwrap_or_else(|_| panic!("{a:?}: rounds"))
        })
        .max(1)
}

fn main() {
    require_root();
    let t = Topology::new(200);
    let pins = PinDir::new();
    let mut rows = Vec::new();
    let mut fence = Fence::load(&pins.path).expect("load");
    let (deny, ok) = destination::fence_cidrs(&destination::HostNetwork {
        host_addresses: vec![t.gateway_v4.into()],
        sandbox_pools: vec![
            "10.213.0.0/16".parse().unwrap(),
            "fd53::/16".parse().unwrap(),
        ],
        allow_cidrs: vec![],
    });
    fence.set_destination_classes(&deny, &ok).unwrap();
    let link = SandboxLink {
        ifindex: t.host_ifindex(),
        sandbox: 1,
        mode: EgressMode::Curated,
        proxy: false,
        guest_v4: t.guest_v4,
        gateway_v4: t.gateway_v4,
        guest_v6: Some(t.guest_v6),
        guest_v6_link_local: Some(t.guest_v6_ll),
        gateway_v6: Some(t.gateway_v6),
    };
    let entry = AllowEntry {
        addr: ALLOWED_V4.into(),
        rules: vec![PortRule::Tcp(5201)],
        host_id: 1,
        ttl: None,
        idle: Duration::from_secs(30),
    };
    fence
        .install_sandbox(&link, std::slice::from_ref(&entry), &[])
        .unwrap();
    run("sysctl", &["-qw", "kernel.bpf_stats_enabled=1"]);
    rows.push(("1 sandbox, 1 entry", measure(&t, &pins, &mut fence)));

    // Scale: 100 sandboxes × 1,000 entries (the measured sandbox is one of them).
    for s in 2..=100u32 {
        let mut other = link.clone();
        other.ifindex = 10_000 + s;
        other.sandbox = s;
        let entries: Vec<AllowEntry> = (0..1000u32)
            .map(|i| AllowEntry {
                addr: IpAddr::V4(Ipv4Addr::from(0xc633_0000 | (s << 10) | i)),
                ..entry.clone()
            })
            .collect();
        fence.install_sandbox(&other, &entries, &[]).unwrap();
    }
    let mut mine: Vec<AllowEntry> = (0..999u32)
        .map(|i| AllowEntry {
            addr: IpAddr::V4(Ipv4Addr::from(0xcb00_7100 | i)),
            ..entry.clone()
        })
        .collect();
    mine.push(entry.clone());
    fence.install_sandbox(&link, &mine, &[]).unwrap();
    rows.push((
        "100 sandboxes × 1,000 entries",
        measure(&t, &pins, &mut fence),
    ));
    run("sysctl", &["-qw", "kernel.bpf_stats_enabled=0"]);

    println!(
        "\n| maps | without fence (Gbit/s, median) | with fence (Gbit/s, median) | ratio, median of {} alternating rounds [min, max] | ratio of bits per busy CPU second, same rounds [min, max] | ingress ns/packet, bpf_stats (median) | egress ns/packet, bpf_stats (median) | fence programs, % of one core during the run (median) | ingress ns/run, BPF_PROG_TEST_RUN | empty program ns/run, same |",
        rounds()
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (what, m) in rows {
        println!(
            "| {what} | {:.2} | {:.2} | {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} |",
            m.without / 1e9,
            m.with / 1e9,
            spread(&m.ratios),
            spread(&m.cpu_ratios),
            m.ingress_ns,
            m.egress_ns,
            m.cpu_share * 100.0,
            m.test_run_ns,
            m.empty_ns
        );
    }
}

struct Measured {
    without: f64,
    with: f64,
    /// with / without of each round (rounds alternate the two on the same link).
    ratios: Vec<f64>,
    /// The same for bits per busy CPU tick.
    cpu_ratios: Vec<f64>,
    ingress_ns: f64,
    egress_ns: f64,
    /// Both programs' run time per second of a run with the fence (fraction of one core).
    cpu_share: f64,
    test_run_ns: f64,
    /// The empty calibration program under the same BPF_PROG_TEST_RUN.
    empty_ns: f64,
}

/// Alternate rounds without and with the fence on the same link (so drift hits both alike);
/// the medians, and the per-packet cost of each direction from the kernel's BPF stats.
fn measure(t: &Topology, pins: &PinDir, fence: &mut Fence) -> Measured {
    let name = t.host_link.clone();
    let (mut without, mut with, mut ingress, mut egress, mut share) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut without_eff, mut with_eff) = (Vec::new(), Vec::new());
    for round in 0..rounds() {
        // Which goes first alternates too, so a machine speeding up or slowing down within a
        // round favours neither.
        if round % 2 == 0 {
            let (bps, per_tick) = iperf(t);
            without.push(bps);
            without_eff.push(per_tick);
        }
        t.host.run(|| fence.attach(&name)).unwrap();
        let (i0, e0) = (
            stats(pins, "prog_svc_tap_ingress"),
            stats(pins, "prog_svc_tap_egress"),
        );
        let started = std::time::Instant::now();
        let (bps, per_tick) = iperf(t);
        with.push(bps);
        with_eff.push(per_tick);
        let wall_ns = started.elapsed().as_nanos() as f64;
        let (i1, e1) = (
            stats(pins, "prog_svc_tap_ingress"),
            stats(pins, "prog_svc_tap_egress"),
        );
        t.host.run(|| fence.detach(&name)).unwrap();
        if round % 2 == 1 {
            let (bps, per_tick) = iperf(t);
            without.push(bps);
            without_eff.push(per_tick);
        }
        ingress.push((i1.0 - i0.0) as f64 / (i1.1 - i0.1).max(1) as f64);
        egress.push((e1.0 - e0.0) as f64 / (e1.1 - e0.1).max(1) as f64);
        // The programs' own run time over the run's wall time: the share of a core the fence
        // took (bpf_stats' own timing included, so an upper bound) — what it can take from a
        // CPU-bound transfer, without the run-to-run noise of the throughput itself.
        share.push(((i1.0 - i0.0) + (e1.0 - e0.0)) as f64 / wall_ns);
    }
    // The program alone, on a crafted packet of the same flow, on loopback (ifindex 1).
    let mut lo = SandboxLink {
        ifindex: 1,
        sandbox: 999,
        ..sandbox_like(t)
    };
    lo.sandbox = 999;
    fence
        .install_sandbox(
            &lo,
            &[AllowEntry {
                addr: ALLOWED_V4.into(),
                rules: vec![PortRule::Tcp(5201)],
                host_id: 1,
                ttl: None,
                idle: Duration::from_secs(30),
            }],
            &[],
        )
        .unwrap();
    let frame = svc_tests::frames::ipv4(
        t.guest_v4,
        ALLOWED_V4,
        svc_tests::frames::TCP,
        &svc_tests::frames::tcp(40000, 5201, svc_tests::frames::ACK),
    );
    let test_run_ns = fence
        .test_run_timed(
            svc_control::dataplane::Direction::Ingress,
            &frame,
            1_000_000,
        )
        .unwrap()
        .as_nanos() as f64;
    let empty_ns = fence
        .test_run_calibration(&frame, 1_000_000)
        .unwrap()
        .as_nanos() as f64;
    let ratios = with.iter().zip(&without).map(|(w, o)| w / o).collect();
    let cpu_ratios = with_eff
        .iter()
        .zip(&without_eff)
        .map(|(w, o)| w / o)
        .collect();
    Measured {
        without: median(without),
        with: median(with),
        ratios,
        cpu_ratios,
        ingress_ns: median(ingress),
        egress_ns: median(egress),
        cpu_share: median(share),
        test_run_ns,
        empty_ns,
    }
}

fn sandbox_like(t: &Topology) -> SandboxLink {
    SandboxLink {
        ifindex: 1,
        sandbox: 999,
        mode: EgressMode::Curated,
        proxy: false,
        guest_v4: t.guest_v4,
        gateway_v4: t.gateway_v4,
        guest_v6: None,
        guest_v6_link_local: None,
        gateway_v6: None,
    }
}

/// (run_time_ns, run_cnt) of a pinned program.
fn stats(pins: &PinDir, prog: &str) -> (u64, u64) {
    let out = run(
        "bpftool",
        &[
            "-j",
            "prog",
            "show",
            "pinned",
            pins.path.join(prog).to_str().unwrap(),
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (
        v["run_time_ns"].as_u64().unwrap_or(0),
        v["run_cnt"].as_u64().unwrap_or(0),
    )
}

/// The CPUs of the sender (and the whole path through the veth, which runs in its context)
/// and of the receiving server: pinned, so each run sees the same placement, not whatever the
/// scheduler chose for this run.
const CLIENT_CPU: &str = "0";
const SERVER_CPU: &str = "1";

fn iperf_server(t: &Topology) -> ChildGuard {
    ChildGuard(
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &t.outside.name,
                "taskset",
                "-c",
                SERVER_CPU,
                "iperf3",
                "-s",
                "-B",
                &ALLOWED_V4.to_string(),
                "-1",
            ])
            // The benchmark prints its own table, not the server's log.
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    )
}

/// Busy CPU time of the whole machine so far (user, nice, system, irq, softirq; not idle,
/// iowait or time stolen by the hypervisor), in clock ticks, from /proc/stat.
fn busy_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let cpu: Vec<u64> = stat
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect();
    cpu[0] + cpu[1] + cpu[2] + cpu[5] + cpu[6]
}

/// One iperf3 run, guest → outside: (bits per second, bits per busy CPU tick). The second
/// does not move with time the hypervisor gives to other machines, which the first does.
fn iperf(t: &Topology) -> (f64, f64) {
    let busy = busy_ticks();
    let bps = iperf_bps(t);
    let ticks = busy_ticks().saturating_sub(busy).max(1);
    (bps, bps * SECONDS.parse::<f64>().unwrap() / ticks as f64)
}

/// bits per second of one iperf3 run, guest → outside.
fn iperf_bps(t: &Topology) -> f64 {
    // -1 servers exit after one test: restart one for each run.
    let _server = iperf_server(t);
    std::thread::sleep(Duration::from_millis(200));
    let out = run(
        "ip",
        &[
            "netns",
            "exec",
            &t.guest.name,
            "taskset",
            "-c",
            CLIENT_CPU,
            "iperf3",
            "-c",
            &ALLOWED_V4.to_string(),
            "-t",
            SECONDS,
            // The first second (slow start) is left out of the figure.
            "-O",
            "1",
            "-J",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .unwrap()
}

/// "median [min, max]" of ratios.
fn spread(v: &[f64]) -> String {
    let mut r = v.to_vec();
    r.sort_by(f64::total_cmp);
    format!(
        "{:.3} [{:.3}, {:.3}]",
        median(r.clone()),
        r[0],
        r[r.len() - 1]
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
