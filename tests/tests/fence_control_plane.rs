//! The process that owns the fence (`svcd fence run`) killed with SIGKILL mid-traffic: denied
//! traffic stays denied the whole time, allowed flows keep working, and a restart re-adopts the
//! pinned fence without a gap. Drop events reach the audit log as JSON lines.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use svc_tests::{
    PinDir, require_root,
    servers::{TcpServer, tcp_fetch_within},
    topology::{ALLOWED_V4, OTHER_V4, Topology},
};

fn svcd() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("svcd");
    assert!(
        bin.exists(),
        "{} is missing: `cargo test --workspace` builds it (or `cargo build -p svc-control --bin svcd`)",
        bin.display()
    );
    bin
}

fn start(t: &Topology, spec: &std::path::Path, pins: &PinDir, audit: &std::path::Path) -> Child {
    // nsenter --net, not `ip netns exec`: the latter also remounts /sys, which would give the
    // child a private bpffs and pins that vanish with it.
    let child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", t.host.name))
        .arg(svcd())
        .args(["fence", "run", "--spec"])
        .arg(spec)
        .arg("--pin-dir")
        .arg(&pins.path)
        .arg("--audit")
        .arg(audit)
        .spawn()
        .expect("spawn svcd fence run");
    let link_pin = pins
        .path
        .join("links")
        .join(format!("{}_ingress", t.host_link));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !link_pin.exists() {
        assert!(
            Instant::now() < deadline,
            "svcd fence run did not attach within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

#[test]
fn sigkill_mid_traffic_never_opens_the_fence() {
    require_root();
    let t = Topology::new(51);
    let pins = PinDir::new();
    let dir = svc_tests::fresh_dir("svcfr");
    let audit = dir.join("fence.jsonl");
    let spec = dir.join("spec.json");
    std::fs::write(
        &spec,
        serde_json::json!({
            "link": t.host_link, "sandbox": 51, "mode": "curated",
            "guest_v4": t.guest_v4, "gateway_v4": t.gateway_v4,
            "guest_v6": t.guest_v6, "guest_v6_link_local": t.guest_v6_ll, "gateway_v6": t.gateway_v6,
            "allow": [{ "addr": ALLOWED_V4, "tcp": [443] }],
            "sandbox_pools": ["10.213.0.0/16", "fd53::/16"],
        })
        .to_string(),
    )
    .unwrap();
    let _allowed = TcpServer::start(&t.outside, SocketAddr::new(ALLOWED_V4.into(), 443), b"ok");
    let denied = TcpServer::start(&t.outside, SocketAddr::new(OTHER_V4.into(), 443), b"leak");

    let mut svcd = start(&t, &spec, &pins, &audit);

    // Traffic all along: one allowed and one denied connection attempt every 50 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let log: Arc<Mutex<Vec<(Instant, bool, bool)>>> = Arc::default();
    let traffic = {
        let (stop, log) = (stop.clone(), log.clone());
        let guest = t.guest.name.clone();
        std::thread::spawn(move || {
            let ns = svc_tests::NetNs { name: guest };
            let deadline = Instant::now() + Duration::from_secs(60);
            while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                let ok = tcp_fetch_within(
                    &ns,
                    SocketAddr::new(ALLOWED_V4.into(), 443),
                    Duration::from_millis(500),
                )
                .is_ok();
                let leaked = tcp_fetch_within(
                    &ns,
                    SocketAddr::new(OTHER_V4.into(), 443),
                    Duration::from_millis(150),
                )
                .is_ok();
                log.lock().unwrap().push((Instant::now(), ok, leaked));
                std::thread::sleep(Duration::from_millis(50));
            }
            std::mem::forget(ns); // the namespace belongs to the topology
        })
    };

    std::thread::sleep(Duration::from_millis(1000));
    svcd.kill().expect("SIGKILL");
    let _ = svcd.wait();
    let killed_at = Instant::now();
    std::thread::sleep(Duration::from_millis(2000));
    let mut svcd = start(&t, &spec, &pins, &audit);
    let restarted_at = Instant::now();
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    traffic.join().unwrap();
    let _ = Command::new("kill").arg(svcd.id().to_string()).status();
    let _ = svcd.wait();

    let log = log.lock().unwrap().clone();
    assert!(
        log.len() >= 10,
        "enough traffic was attempted: {}",
        log.len()
    );
    assert!(
        log.iter().all(|(_, _, leaked)| !leaked),
        "a denied connection succeeded at some point"
    );
    assert_eq!(
        denied.count(),
        0,
        "the denied server never saw a connection"
    );
    let down: Vec<_> = log
        .iter()
        .filter(|(at, _, _)| *at > killed_at && *at < restarted_at)
        .collect();
    assert!(
        !down.is_empty() && down.iter().all(|(_, ok, _)| *ok),
        "allowed flows kept working while svcd was down"
    );
    let after: Vec<_> = log.iter().filter(|(at, _, _)| *at > restarted_at).collect();
    assert!(
        !after.is_empty() && after.iter().all(|(_, ok, _)| *ok),
        "allowed flows work after the restart"
    );

    let records: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("audit lines are JSON"))
        .collect();
    assert!(
        records.iter().any(|r| r["layer"] == "packet"
            && r["reason"] == "drop_tcp_not_allowed"
            && r["dst"] == OTHER_V4.to_string()
            && r["dst_port"] == 443
            && r["sandbox"] == 51),
        "the denied attempts are in the audit log: {records:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
