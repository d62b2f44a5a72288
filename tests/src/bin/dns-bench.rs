//! `cargo xtask bench dns`: the DNS guard's cost, side by side in one run.
//!
//! 1. Latency of uncached questions (a fresh name each time), one at a time, p50 and p99:
//!    straight to the upstream (dnsmasq, authoritative), through the guard (policy, upstream,
//!    class filter, commit into the real eBPF allow map, answer), and through dnsmasq as a peer
//!    forwarder. The guard's added latency is its figure minus the direct one.
//! 2. Cached answers per second under dnsperf, the guard vs the dnsmasq forwarder.
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
    audit::{AuditError, AuditRecord, AuditSink},
    daemon::FenceCommit,
    dataplane::{Fence, SandboxLink},
    dns::{Directory, Guard, GuardConfig, SandboxDns, Upstream},
    policy::{
        destination::HostNetwork,
        host::{Allowlist, HostPattern},
        mode::EgressMode,
    },
};
use svc_tests::{PinDir, require_root};

const NAMES: usize = 4000;
const SAMPLES: usize = 1500;

fn main() {
    require_root();
    let dir = std::env::temp_dir().join(svc_tests::unique("svcdnsb"));
    std::fs::create_dir_all(&dir).unwrap();
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
            .args([
                "--no-daemon",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--listen-address=127.0.0.1",
                "--user=root",
                "--pid-file",
                "--local-ttl=300",
                "--cache-size=0",
            ])
            .arg(format!("--port={up_port}"))
            .arg(format!("--addn-hosts={}", hosts.display())),
    );
    let _forwarder = spawn(
        Command::new("dnsmasq")
            .args([
                "--no-daemon",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--listen-address=127.0.0.1",
                "--user=root",
                "--pid-file",
                "--cache-size=10000",
            ])
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
        Arc::new(NoAudit),
        HostNetwork::default(),
    ));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let guard_addr: SocketAddr = rt.block_on(async {
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = udp.local_addr().unwrap();
        tokio::spawn(guard.serve_udp(udp, std::future::pending()));
        addr
    });
    let up: SocketAddr = format!("127.0.0.1:{up_port}").parse().unwrap();
    let fwd: SocketAddr = format!("127.0.0.1:{fwd_port}").parse().unwrap();

    // 1. Latency, uncached: each target gets its own slice of fresh names, interleaved.
    let (mut direct, mut via_guard, mut via_fwd) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..SAMPLES {
        direct.push(time_query(up, &format!("n{}.bench.test", i % NAMES)));
        via_guard.push(time_query(
            guard_addr,
            &format!("n{}.bench.test", (i + SAMPLES) % NAMES),
        ));
        via_fwd.push(time_query(
            fwd,
            &format!("n{}.bench.test", (i + 2 * SAMPLES) % NAMES),
        ));
    }
    let (d50, d99) = pct(&mut direct);
    let (g50, g99) = pct(&mut via_guard);
    let (f50, f99) = pct(&mut via_fwd);

    // 2. Cached answers per second.
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
    let guard_qps = dnsperf(guard_addr, &data);
    let fwd_qps = dnsperf(fwd, &data);

    println!("\n| path | uncached p50 (µs) | uncached p99 (µs) | cached qps (dnsperf) |");
    println!("|---|---|---|---|");
    println!("| straight to the upstream (dnsmasq, authoritative) | {d50:.0} | {d99:.0} | — |");
    println!(
        "| through the guard (policy, upstream, class filter, eBPF map commit) | {g50:.0} | {g99:.0} | {guard_qps:.0} |"
    );
    println!("| through dnsmasq as a forwarder (peer) | {f50:.0} | {f99:.0} | {fwd_qps:.0} |");
    println!(
        "\nadded by the guard: p50 {:.0} µs, p99 {:.0} µs",
        g50 - d50,
        g99 - d99
    );
    let _ = std::fs::remove_dir_all(&dir);
}

struct Dir(HashMap<IpAddr, Arc<SandboxDns>>);
impl Directory for Dir {
    fn sandbox_for(&self, s: IpAddr) -> Option<Arc<SandboxDns>> {
        self.0.get(&s).cloned()
    }
}

struct NoAudit;
impl AuditSink for NoAudit {
    fn record(&self, _: &AuditRecord) -> Result<(), AuditError> {
        Ok(())
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
            "5",
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
