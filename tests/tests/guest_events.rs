//! A guest forges its service supervisor's reports.
//!
//! svcd reads `svc-supervise`'s standard output (a pipe through `runc exec`) as JSON lines and
//! turns reports into the workspace's log, its services' states and events (10,000 kept for
//! the whole host). The guest's root can open `/proc/<svc-supervise>/fd/1` and write into that
//! pipe. Before the fix 30,000 forged reports (each a new service name) grew svcd by 278 MiB,
//! the state database to 91 MB, and evicted every other sandbox's events. Now a report naming
//! no service of the workspace is only logged, and the events the others raise are held to
//! 10 a second per sandbox (bursts of 200).

use std::time::{Duration, Instant};

use svc_tests::{require_root, rss_kib, world::World};

const FORGE: &str = r#"
import os, sys, json, time
N, PAD, SAME = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "same"
pid = None
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            if open("/proc/%s/comm" % p).read().strip() == "svc-supervise":
                pid = p
        except OSError:
            pass
print("svc-supervise pid", pid, flush=True)
fd = os.open("/proc/%s/fd/1" % pid, os.O_WRONLY)
pad = "x" * PAD
t = time.time()
for i in range(N):
    name = "idle" if SAME else "s%07d-%s" % (i, pad)
    line = json.dumps({"service": name, "event": "started", "pid": 1}) + "\n"
    os.write(fd, line.encode())
print("wrote %d reports in %.1f s" % (N, time.time() - t), flush=True)
"#;

#[test]
fn forged_service_reports_are_held_to_the_workspaces_services_and_a_rate() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "calm", "--backend", "container"]);
    let dir = w.project(
        "forger",
        &[(
            ".svc/workspace.json",
            r#"{"version":1,"services":{"definitions":{"idle":{"command":"exec sleep 100000"}}}}"#,
        )],
    );
    let d = dir.to_str().expect("utf-8");
    w.workspace_up_ok(d, "forger");
    let events = |w: &World| -> Vec<serde_json::Value> {
        w.svc_ok(&["events", "--json"])
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let before_ev = events(&w);
    let calm_before = before_ev.iter().filter(|e| e["sandbox"] == "calm").count();
    println!("events before: {} (calm's: {calm_before})", before_ev.len());
    let pid = w.svcd_pid().expect("svcd");
    let db = w.dir.join("state/svcd.db");
    let dbsize = |p: &std::path::Path| {
        ["", "-wal"]
            .iter()
            .map(|s| std::fs::metadata(format!("{}{s}", p.display())).map_or(0, |m| m.len()))
            .sum::<u64>()
    };
    let (rss0, db0) = (rss_kib(pid), dbsize(&db));
    let n: u64 = std::env::var("ATTACK_FORGE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30000);
    let t = Instant::now();
    let script = format!(
        "cat > /tmp/f.py <<'EOF'\n{FORGE}\nEOF\npython3 /tmp/f.py {n} 8000 new && \
         python3 /tmp/f.py {n} 0 same"
    );
    let (code, out, err) = w.sh("forger", &script);
    println!("forger ({code}) in {:?}: {out}{err}", t.elapsed());
    // Let svcd drain the pipe.
    let mut last = 0;
    for _ in 0..120 {
        std::thread::sleep(Duration::from_secs(1));
        let r = rss_kib(pid);
        if r == last {
            break;
        }
        last = r;
    }
    let after_ev = events(&w);
    let calm_after = after_ev.iter().filter(|e| e["sandbox"] == "calm").count();
    let forged = after_ev
        .iter()
        .filter(|e| e["kind"] == "workspace.service_started")
        .count();
    println!(
        "after {:?}: svcd RSS {rss0} -> {} KiB (+{} MiB); state db+wal {db0} -> {} bytes; \
         events listed {} (forged service_started {forged}); calm's events {calm_before} -> {calm_after}",
        t.elapsed(),
        rss_kib(pid),
        rss_kib(pid).saturating_sub(rss0) / 1024,
        dbsize(&db),
        after_ev.len()
    );
    let (code, out, _) = w.sh("calm", "echo calm-alive");
    println!("calm exec after: {code} {out}");
    assert_eq!(code, 0, "the forger: {err}");
    assert!(
        rss_kib(pid).saturating_sub(rss0) < 64 * 1024,
        "one guest's forged reports grew svcd by {} MiB",
        rss_kib(pid).saturating_sub(rss0) / 1024
    );
    assert_eq!(
        calm_after, calm_before,
        "another sandbox's events were evicted"
    );
    let bound = 200 + 10 * (t.elapsed().as_secs() + 1);
    assert!(
        (forged as u64) <= bound,
        "{forged} forged service events raised in {:?} (bound {bound})",
        t.elapsed()
    );
    assert!(
        dbsize(&db) < db0 + 16 * 1024 * 1024,
        "the state database grew from {db0} to {} bytes",
        dbsize(&db)
    );
}
