//! `cargo xtask bench dns`: the DNS guard's cost beside dnsmasq, side by side in one run, in
//! several rounds (the median and the spread are the result; one round is not).
//!
//! Each round:
//! 1. Latency of uncached questions (a fresh name each time), one at a time, interleaved, p50
//!    and p99: straight to the upstream (dnsmasq, authoritative), through the guard as svcd
//!    runs it (its threads and sockets; policy, upstream, class filter, commit into the real
//!    eBPF allow map, answer), and through dnsmasq as a peer forwarder.
//! 2. Stage timings in-process: the upstream exchange alone, and the guard's whole handling of
//!    a question (so the rest of the end-to-end figure is receiving and sending).
//! 3. Cached answers per second under dnsperf, the guard vs the dnsmasq forwarder (which goes
//!    first alternates between rounds).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a benchmark binary: fail loudly"
)]

use std::{
    collections::HashMap,
    io::Write as _,
    net::{IpAddr, SocketAddr, UdpSocket},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use hickory_proto::{
    op::{Message, Query},
    rr::{Name, RecordType},
};
use svc_control::{
    audit::JsonlFile,
    daemon::FenceCommit,
    dataplane::{Fence, SandboxLink},
    dns::{Directory, Guard, GuardConfig, SandboxDns, Transport, Upstream},
    hosts::{Allowlist, HostPattern},
    policy::{destination::HostNetwork, mode::EgressMode},
};
use svc_tests::{PinDir, dns::DNSMASQ_ON_LOOPBACK, require_root};

const ROUNDS: usize = 5;
const SAMPLES: usize = 600;
const DNSPERF_SECS: u32 = 3;
const NAMES: usize = ROUNDS * SAMPLES * 4 + 1000;

fn main() {
    require_root();
    let dir = svc_tests::fresh_dir("svcdnsb");
    let hosts = dir.join("hosts");
    let mut f = std::fs::File::create(&hosts).unwrap();
    for i in 0..NAMES {
        writeln!(
            f,
            "198.51.{}.{} n{i}.bench.test",
            (i / 250) % 250,
            i % 250 + 1
        )
        .unwrap();
    }
    drop(f);
    let up_port = free_port();
    let fwd_port = free_port();
    let _upstream = spawn(
        Command::new("dnsmasq")
            .args(DNSMASQ_ON_LOOPBACK)
            .args(["--local-ttl=300", "--cache-size=0"])
            .arg(format!("--port={up_port}"))
            .arg(format!("--addn-hosts={}", hosts.display())),
    );
    let _forwarder = spawn(
        Command::new("dnsmasq")
            .args(DNSMASQ_ON_LOOPBACK)
            .args(["--cache-size=10000"])
            .arg(format!("--port={fwd_port}"))
            .arg(format!("--server=127.0.0.1#{up_port}")),
    );
    std::thread::sleep(Duration::from_millis(500));

    // The guard with the real fence behind it.
    let pins = PinDir::new();
    let mut fence = Fence::load(&pins.path).unwrap();
    let link = SandboxLink {
        ifindex: 1,
        sandbox: 9,
        mode: EgressMode::Curated,
        proxy: true,
        guest_v4: "127.0.0.1".parse().unwrap(),
        gateway_v4: "127.0.0.1".parse().unwrap(),
        guest_v6: None,
        guest_v6_link_local: None,
        gateway_v6: None,
    };
    fence.install_sandbox(&link, &[], &[]).unwrap();
    let commit = FenceCommit {
        fence: Arc::new(Mutex::new(fence)),
        ifindex: Arc::new(|_| Some(1)),
        idle: Duration::from_secs(30),
    };
    let allowed = Allowlist(vec![HostPattern::parse("*.bench.test").unwrap()]);
    let directory = Dir(HashMap::from([(
        "127.0.0.1".parse().unwrap(),
        Arc::new(SandboxDns::curated(9, allowed)),
    )]));
    let mut config = GuardConfig::with_upstream(Upstream {
        servers: vec![format!("127.0.0.1:{up_port}").parse().unwrap()],
        timeout: Duration::from_secs(2),
    });
    config.rate_per_second = 10_000_000;
    config.burst = 10_000_000;
    let guard = Arc::new(Guard::new(
        config,
        Arc::new(directory),
        Arc::new(commit),
        // svcd's own sink: one record per question, in a JSON-lines file.
        Arc::new(JsonlFile::open(dir.join("audit.jsonl"), 1 << 30).unwrap()),
        HostNetwork::default(),
    ));
    // The guard as svcd runs it: one thread per core, each with its own socket on the port.
    let guard_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let (_stop, stop_rx) = tokio::sync::watch::channel(false);
    let _threads = guard
        .serve_udp_threads(guard_addr, svc_control::per_core::threads(4), stop_rx)
        .unwrap();
    // A runtime of the same kind for the in-process stage timings below.
    let rt: &'static tokio::runtime::Runtime = Box::leak(Box::new(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
    ));
    std::thread::spawn(|| rt.block_on(std::future::pending::<()>()));
    let up: SocketAddr = format!("127.0.0.1:{up_port}").parse().unwrap();
    let fwd: SocketAddr = format!("127.0.0.1:{fwd_port}").parse().unwrap();

    let data = dir.join("queries");
    std::fs::write(
        &data,
        (0..50)
            .map(|i| format!("n{i}.bench.test A\n"))
            .collect::<String>(),
    )
    .unwrap();
    for i in 0..50 {
        let _ = time_query(guard_addr, &format!("n{i}.bench.test"));
        let _ = time_query(fwd, &format!("n{i}.bench.test"));
    }
    let upstream = Upstream {
        servers: vec![up],
        timeout: Duration::from_secs(2),
    };
    // Fresh names: never asked before in this run (nothing cached anywhere).
    let mut next_name = 50usize;
    let mut fresh = || {
        next_name += 1;
        assert!(next_name < NAMES, "out of fresh names");
        format!("n{next_name}.bench.test")
    };
    println!(
        "DNS guard vs dnsmasq, {ROUNDS} rounds; each: {SAMPLES} uncached questions per path \
         (interleaved), in-process stage timings, then {DNSPERF_SECS} s of dnsperf per server \
         (order alternating)\n"
    );
    println!(
        "| round | direct p50/p99 (µs) | guard p50/p99 | dnsmasq fwd p50/p99 | guard − dnsmasq p50 | stages: upstream alone / guard's handling | cached qps guard / dnsmasq (ratio) |"
    );
    println!("|---|---|---|---|---|---|---|");
    let (mut extra, mut ratios, mut added_g, mut added_f) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        // 1. Latency, uncached: each path gets its own fresh names, interleaved.
        let (mut direct, mut via_guard, mut via_fwd) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..SAMPLES {
            direct.push(time_query(up, &fresh()));
            via_guard.push(time_query(guard_addr, &fresh()));
            via_fwd.push(time_query(fwd, &fresh()));
        }
        // Stages, in-process on a runtime like the guard's (fresh names again): the upstream
        // exchange alone (a socket of its own), then the guard's whole handling of a question.
        let (mut stage_up, mut stage_handle) = (Vec::new(), Vec::new());
        for _ in 0..SAMPLES / 3 {
            let (g, upstream) = (guard.clone(), upstream.clone());
            let (a, b) = (fresh(), fresh());
            // Spawned, so it runs on that runtime's own thread.
            let (a, b) = rt
                .block_on(rt.spawn(async move {
                    let q = |name: String| {
                        let mut m = Message::query();
                        m.metadata.recursion_desired = true;
                        m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
                        (m.to_vec().unwrap(), m.metadata.id)
                    };
                    let (bytes, id) = q(a);
                    let t = Instant::now();
                    upstream.ask(&bytes, id).await.unwrap();
                    let a = t.elapsed().as_secs_f64() * 1e6;
                    let (bytes, _) = q(b);
                    let t = Instant::now();
                    g.handle("127.0.0.1".parse().unwrap(), &bytes, Transport::Udp)
                        .await
                        .unwrap();
                    (a, t.elapsed().as_secs_f64() * 1e6)
                }))
                .unwrap();
            stage_up.push(a);
            stage_handle.push(b);
        }
        let (d50, d99) = pct(&mut direct);
        let (g50, g99) = pct(&mut via_guard);
        let (f50, f99) = pct(&mut via_fwd);
        // 2. Cached answers per second, the order alternating between rounds.
        let (guard_qps, fwd_qps) = if round % 2 == 1 {
            let g = dnsperf(guard_addr, &data);
            (g, dnsperf(fwd, &data))
        } else {
            let f = dnsperf(fwd, &data);
            (dnsperf(guard_addr, &data), f)
        };
        println!(
            "| {round} | {d50:.0} / {d99:.0} | {g50:.0} / {g99:.0} | {f50:.0} / {f99:.0} | {:+.0} | {:.0} / {:.0} | {guard_qps:.0} / {fwd_qps:.0} ({:.2}×) |",
            g50 - f50,
            pct(&mut stage_up).0,
            pct(&mut stage_handle).0,
            guard_qps / fwd_qps
        );
        extra.push(g50 - f50);
        ratios.push(guard_qps / fwd_qps);
        added_g.push(g50 - d50);
        added_f.push(f50 - d50);
    }
    let spread = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let (e, e_lo, e_hi) = spread(&mut extra);
    let (r, r_lo, r_hi) = spread(&mut ratios);
    let (ag, ag_lo, ag_hi) = spread(&mut added_g);
    let (af, af_lo, af_hi) = spread(&mut added_f);
    println!(
        "\nmedian of {ROUNDS} rounds [min, max]:\n  cached rate, guard / dnsmasq forwarder: {r:.2}× [{r_lo:.2}, {r_hi:.2}]\n  \
         uncached p50 added over straight to the upstream: guard {ag:.0} µs [{ag_lo:.0}, {ag_hi:.0}], \
         dnsmasq forwarder {af:.0} µs [{af_lo:.0}, {af_hi:.0}]\n  guard − dnsmasq forwarder, uncached p50: {e:+.0} µs [{e_lo:+.0}, {e_hi:+.0}]"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

struct Dir(HashMap<IpAddr, Arc<SandboxDns>>);
impl Directory for Dir {
    fn sandbox_for(&self, s: IpAddr) -> Option<Arc<SandboxDns>> {
        self.0.get(&s).cloned()
    }
}

/// Microseconds for one question and its answer.
fn time_query(to: SocketAddr, name: &str) -> f64 {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut m = Message::query();
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    let bytes = m.to_vec().unwrap();
    let mut buf = [0u8; 1500];
    let start = Instant::now();
    sock.send_to(&bytes, to).unwrap();
    let n = sock.recv(&mut buf).expect("an answer");
    let t = start.elapsed().as_secs_f64() * 1e6;
    assert!(
        Message::from_vec(&buf[..n]).unwrap().answers.len() == 1,
        "{name} via {to} was not answered"
    );
    t
}

fn pct(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[v.len() * 99 / 100])
}

fn dnsperf(to: SocketAddr, data: &std::path::Path) -> f64 {
    let out = Command::new("dnsperf")
        .args([
            "-s",
            &to.ip().to_string(),
            "-p",
            &to.port().to_string(),
            "-d",
            data.to_str().unwrap(),
            "-l",
            &DNSPERF_SECS.to_string(),
            "-c",
            "8",
            "-T",
            "2",
            "-Q",
            "1000000",
            "-q",
            "500",
        ])
        .output()
        .expect("dnsperf (Debian package dnsperf; `cargo xtask setup` installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains("Queries per second"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("dnsperf output without a rate:\n{text}"))
}

fn spawn(cmd: &mut Command) -> ChildGuard {
    ChildGuard(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dnsmasq"),
    )
}

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct ChildGuard(Child);
impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
