//! `cargo xtask bench soak [SECONDS]` (default 180): svcd under steady traffic for minutes while
//! sandboxes come and go, then checked.
//!
//! - 10 sandboxes each make HTTPS requests one after another for the whole run (DNS through
//!   the guard, the connection through the fence, the request through the proxy), every one to
//!   a path of its own (`/soak/NAME/N`);
//! - meanwhile another sandbox is created, makes one request and is destroyed, again and again;
//! - every 30 s: svcd's resident memory and open descriptors.
//!
//! At the end (after the steady sandboxes are destroyed too): every request that got an answer
//! is in the audit log exactly once (by its path); svcd's open descriptors are back to where
//! they started and its memory within a bound of it; svcd's log holds no error. Each check is
//! printed; any failed one makes the run fail.

use std::{
    collections::HashMap,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use svc_tests::world::World;

/// Sandboxes making requests for the whole run.
const STEADY: usize = 10;
/// svcd's memory may end this much above where it started (its allocator keeps some pages).
const RSS_BOUND_KIB: u64 = 16 * 1024;

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// Requests from sandbox `name` until `seconds` have passed: (request number, HTTP status)
/// for each, as the guest's curl saw them (000: no answer).
fn requests(socket: &std::path::Path, name: &str, seconds: u64) -> Vec<(u64, String)> {
    let script = format!(
        "end=$(( $(date +%s) + {seconds} )); i=0; \
         while [ $(date +%s) -lt $end ]; do i=$((i + 1)); \
         c=$(curl -s -o /dev/null --max-time 20 -w '%{{http_code}}' \
         https://api.agent.test/soak/{name}/$i); echo \"$i $c\"; done"
    );
    let out = Command::new(svc_tests::world::workspace_bin("svc"))
        .args(["sandbox", "exec", name, "--", "sh", "-c", &script])
        .env("SVC_SOCKET", socket)
        .output()
        .expect("svc");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (n, code) = l.split_once(' ')?;
            Some((n.parse().ok()?, code.to_owned()))
        })
        .collect()
}

fn main() {
    let seconds: u64 = std::env::args().nth(1).map_or(180, |a| {
        a.parse().unwrap_or_else(|_| panic!("{a:?}: seconds"))
    });
    // Every answered request must be in the audit log: each sandbox's share of the log
    // (`[limits] audit_records_per_sec`, tested in guest_limits) is opened wide for this run.
    let w =
        World::start_with("\n[limits]\naudit_records_per_sec = 100000\naudit_burst = 10000000\n");
    let svcd = w.svcd_pid().expect("svcd's pid");
    // Warm up (first sandbox, first request: lazy state), then the baseline.
    w.svc_ok(&["sandbox", "create", "warm"]);
    let _ = requests(&w.socket, "warm", 1);
    w.svc_ok(&["sandbox", "destroy", "warm"]);
    std::thread::sleep(Duration::from_secs(1));
    let (rss0, fds0) = (svc_tests::rss_kib(svcd), fds(svcd));
    println!(
        "soak: {seconds} s, {STEADY} sandboxes requesting, one more created, used and destroyed \
         over and over; svcd at the start: RSS {:.1} MiB, {fds0} open descriptors",
        rss0 as f64 / 1024.0
    );
    for i in 1..=STEADY {
        w.svc_ok(&["sandbox", "create", &format!("soak{i}")]);
    }
    let started = Instant::now();
    let steady: Vec<_> = (1..=STEADY)
        .map(|i| {
            let socket = w.socket.clone();
            std::thread::spawn(move || {
                let name = format!("soak{i}");
                let r = requests(&socket, &name, seconds);
                (name, r)
            })
        })
        .collect();
    // Churn: create, one request, destroy, until the time is up.
    let done = Arc::new(AtomicBool::new(false));
    let churned = Arc::new(AtomicUsize::new(0));
    let churn_failures = Arc::new(AtomicUsize::new(0));
    let churn = {
        let (socket, done, churned, failures) = (
            w.socket.clone(),
            done.clone(),
            churned.clone(),
            churn_failures.clone(),
        );
        std::thread::spawn(move || {
            let mut results = Vec::new();
            let svc = |args: &[&str]| {
                Command::new(svc_tests::world::workspace_bin("svc"))
                    .args(args)
                    .env("SVC_SOCKET", &socket)
                    .output()
                    .expect("svc")
            };
            let mut k = 0;
            while !done.load(Ordering::Relaxed) {
                k += 1;
                let name = format!("churn{k}");
                if !svc(&["sandbox", "create", &name]).status.success() {
                    failures.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                results.push((name.clone(), requests(&socket, &name, 1)));
                if !svc(&["sandbox", "destroy", &name]).status.success() {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                churned.fetch_add(1, Ordering::Relaxed);
            }
            results
        })
    };
    let mut samples = Vec::new();
    while started.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_secs(30).min(
            Duration::from_secs(seconds).saturating_sub(started.elapsed())
                + Duration::from_millis(10),
        ));
        let (rss, n) = (svc_tests::rss_kib(svcd), fds(svcd));
        println!(
            "  {:>4.0} s: svcd RSS {:.1} MiB, {n} descriptors, {} sandboxes churned",
            started.elapsed().as_secs_f64(),
            rss as f64 / 1024.0,
            churned.load(Ordering::Relaxed)
        );
        samples.push(rss);
    }
    done.store(true, Ordering::Relaxed);
    let mut all: Vec<(String, Vec<(u64, String)>)> = steady
        .into_iter()
        .map(|t| t.join().expect("steady"))
        .collect();
    all.extend(churn.join().expect("churn"));
    for i in 1..=STEADY {
        w.svc_ok(&["sandbox", "destroy", &format!("soak{i}")]);
    }
    std::thread::sleep(Duration::from_secs(2));
    let (rss1, fds1) = (svc_tests::rss_kib(svcd), fds(svcd));

    // Every answered request audited exactly once.
    let mut audited: HashMap<String, usize> = HashMap::new();
    for line in std::fs::read_to_string(w.audit_path())
        .unwrap_or_default()
        .lines()
    {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if v["layer"] == "http"
            && let Some(p) = v["path"].as_str().filter(|p| p.starts_with("/soak/"))
        {
            *audited.entry(p.to_owned()).or_default() += 1;
        }
    }
    let (mut answered, mut ok, mut missing, mut twice) = (0usize, 0usize, Vec::new(), Vec::new());
    for (name, results) in &all {
        for (n, code) in results {
            if code == "000" {
                continue;
            }
            answered += 1;
            if code == "200" {
                ok += 1;
            }
            let path = format!("/soak/{name}/{n}");
            match audited.get(&path).copied().unwrap_or(0) {
                0 => missing.push(path),
                1 => {}
                _ => twice.push(path),
            }
        }
    }
    let unanswered: usize = all
        .iter()
        .map(|(_, r)| r.iter().filter(|(_, c)| c == "000").count())
        .sum();
    let log = w.svcd_log();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "\n{answered} requests answered ({ok} with 200, {:.1} a second), {unanswered} without an \
         answer; {} sandboxes churned ({} create/destroy failures)",
        answered as f64 / secs,
        churned.load(Ordering::Relaxed),
        churn_failures.load(Ordering::Relaxed)
    );
    let mut failed = false;
    let mut check = |pass: bool, what: String| {
        println!("  {} {what}", if pass { "PASS" } else { "FAIL" });
        failed |= !pass;
    };
    check(
        missing.is_empty() && twice.is_empty(),
        format!(
            "every answered request audited exactly once: {} missing{}, {} twice{}",
            missing.len(),
            missing
                .first()
                .map_or(String::new(), |p| format!(" (e.g. {p})")),
            twice.len(),
            twice
                .first()
                .map_or(String::new(), |p| format!(" (e.g. {p})")),
        ),
    );
    check(
        ok == answered && unanswered == 0 && churn_failures.load(Ordering::Relaxed) == 0,
        format!(
            "no request or sandbox failed: {} not 200, {unanswered} unanswered",
            answered - ok
        ),
    );
    check(
        fds1 <= fds0,
        format!("svcd's descriptors back: {fds0} at the start, {fds1} at the end"),
    );
    check(
        rss1 <= rss0 + RSS_BOUND_KIB,
        format!(
            "svcd's memory within {} MiB of the start: {:.1} → {:.1} MiB (peak {:.1})",
            RSS_BOUND_KIB / 1024,
            rss0 as f64 / 1024.0,
            rss1 as f64 / 1024.0,
            samples.iter().max().copied().unwrap_or(0) as f64 / 1024.0
        ),
    );
    check(
        errors.is_empty(),
        format!(
            "no error in svcd's log: {} error lines{}",
            errors.len(),
            errors
                .first()
                .map_or(String::new(), |l| format!(" (first: {l})"))
        ),
    );
    if failed {
        std::process::exit(1);
    }
}
