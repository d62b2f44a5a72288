//! `cargo xtask bench fence`: the fence's cost, measured side by side in one run.
//!
//! 1. TCP throughput guest → outside with iperf3 over the same veth: bare, with an empty tc
//!    program attached (the hook's own cost) and with the fence attached (an allow entry for
//!    the server), in rounds that rotate the order; the ratios of each round, their median.
//! 2. Per-packet cost of each program from the kernel's BPF statistics
//!    (`kernel.bpf_stats_enabled=1`: run_time_ns / run_cnt), in separate runs so the
//!    statistics' own clock reads are not in the throughput figures; the median of the runs,
//!    and the programs' total run time as a share of one core over the run (what the fence can
//!    take from a CPU-bound transfer at most, free of the throughput's run-to-run noise).
//! 3. The same with 100 sandboxes × 1,000 allow entries each in the maps.
//!
//! Prints a Markdown table for docs/PERFORMANCE.md. `cargo xtask bench fence [ROUNDS]` (default
//! 5 rounds per row).
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
        svcd_ports: vec![],
    });
    fence.set_destination_classes(&deny, &ok).unwrap();
    let link = t.sandbox_link(1, EgressMode::Curated, false);
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

    println!(
        "\n| maps | bare link (Gbit/s, median) | with fence (Gbit/s, median) | fence / bare, median of {} rounds [min, max] | empty tc program / bare, same rounds | fence / empty tc program, same rounds | bits per busy CPU second, fence / bare | ingress ns/packet, bpf_stats (median) | egress ns/packet, bpf_stats (median) | fence programs, % of one core (median) | ingress ns/run, BPF_PROG_TEST_RUN | empty program ns/run, same |",
        rounds()
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (what, m) in &rows {
        println!(
            "| {what} | {:.2} | {:.2} | {} | {} | {} | {} | {:.0} | {:.0} | {:.2} | {:.0} | {:.0} |",
            m.bare / 1e9,
            m.fence / 1e9,
            spread(&m.fence_ratios),
            spread(&m.empty_ratios),
            spread(&m.fence_over_empty),
            spread(&m.cpu_ratios),
            m.ingress_ns,
            m.egress_ns,
            m.cpu_share * 100.0,
            m.test_run_ns,
            m.empty_ns
        );
    }
    // Every round's ratio, so runs can be pooled.
    for (what, m) in rows {
        let each: Vec<String> = m.fence_ratios.iter().map(|r| format!("{r:.3}")).collect();
        println!("\nfence / bare, each round ({what}): {}", each.join(" "));
    }
}

struct Measured {
    bare: f64,
    fence: f64,
    /// fence / bare of each round (every round runs all three arms on the same link).
    fence_ratios: Vec<f64>,
    /// The empty calibration program attached instead / bare: what any tc program costs.
    empty_ratios: Vec<f64>,
    /// fence / empty program: what the fence's own work costs over the hook itself.
    fence_over_empty: Vec<f64>,
    /// fence / bare for bits per busy CPU tick.
    cpu_ratios: Vec<f64>,
    ingress_ns: f64,
    egress_ns: f64,
    /// Both programs' run time per second of a run with the fence (fraction of one core).
    cpu_share: f64,
    test_run_ns: f64,
    /// The empty calibration program under the same BPF_PROG_TEST_RUN.
    empty_ns: f64,
}

/// What a throughput run has on the link.
#[derive(Clone, Copy)]
enum Arm {
    Bare,
    EmptyProgram,
    Fence,
}

/// Runs with the fence and `kernel.bpf_stats_enabled=1` for the per-packet figures.
const STATS_RUNS: usize = 3;

/// Rounds of three throughput runs on the same link — bare, the empty calibration program
/// attached, the fence attached — in an order rotating from round to round, so drift hits all
/// alike; bpf_stats stays off for these (it adds two clock reads to every program run, which
/// svcd's fence does not pay). Then a few runs with the fence and bpf_stats on for the
/// per-packet cost of each direction and the programs' share of a core.
fn measure(t: &Topology, pins: &PinDir, fence: &mut Fence) -> Measured {
    let name = t.host_link.clone();
    let arms = [Arm::Bare, Arm::EmptyProgram, Arm::Fence];
    let mut runs: [Vec<(f64, f64)>; 3] = Default::default();
    for round in 0..rounds() {
        for k in 0..arms.len() {
            let arm = arms[(round + k) % arms.len()];
            match arm {
                Arm::Bare => {}
                Arm::EmptyProgram => t.host.run(|| fence.attach_calibration(&name)).unwrap(),
                Arm::Fence => t.host.run(|| fence.attach(&name)).unwrap(),
            }
            runs[arm as usize].push(iperf(t));
            match arm {
                Arm::Bare => {}
                Arm::EmptyProgram => fence.detach_calibration().unwrap(),
                Arm::Fence => t.host.run(|| fence.detach(&name)).unwrap(),
            }
        }
    }
    let (mut ingress, mut egress, mut share) = (Vec::new(), Vec::new(), Vec::new());
    run("sysctl", &["-qw", "kernel.bpf_stats_enabled=1"]);
    for _ in 0..STATS_RUNS {
        t.host.run(|| fence.attach(&name)).unwrap();
        let (i0, e0) = (
            stats(pins, "prog_svc_tap_ingress"),
            stats(pins, "prog_svc_tap_egress"),
        );
        let started = std::time::Instant::now();
        iperf(t);
        let wall_ns = started.elapsed().as_nanos() as f64;
        let (i1, e1) = (
            stats(pins, "prog_svc_tap_ingress"),
            stats(pins, "prog_svc_tap_egress"),
        );
        t.host.run(|| fence.detach(&name)).unwrap();
        ingress.push((i1.0 - i0.0) as f64 / (i1.1 - i0.1).max(1) as f64);
        egress.push((e1.0 - e0.0) as f64 / (e1.1 - e0.1).max(1) as f64);
        // The programs' own run time over the run's wall time: the share of a core the fence
        // took (bpf_stats' own timing included, so an upper bound) — what it can take from a
        // CPU-bound transfer, without the run-to-run noise of the throughput itself.
        share.push(((i1.0 - i0.0) + (e1.0 - e0.0)) as f64 / wall_ns);
    }
    run("sysctl", &["-qw", "kernel.bpf_stats_enabled=0"]);
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
    let [bare, empty, with_fence] = runs;
    let ratio = |a: &[(f64, f64)], b: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| {
        a.iter()
            .zip(b)
            .map(|(x, y)| pick(x) / pick(y))
            .collect::<Vec<_>>()
    };
    Measured {
        bare: median(bare.iter().map(|r| r.0).collect()),
        fence: median(with_fence.iter().map(|r| r.0).collect()),
        fence_ratios: ratio(&with_fence, &bare, |r| r.0),
        empty_ratios: ratio(&empty, &bare, |r| r.0),
        fence_over_empty: ratio(&with_fence, &empty, |r| r.0),
        cpu_ratios: ratio(&with_fence, &bare, |r| r.1),
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
