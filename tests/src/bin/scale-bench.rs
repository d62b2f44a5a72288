//! `cargo xtask bench scale [COUNT…]` (default 1 100 500 1000): container sandboxes created one
//! after another until the largest count is live at once. At each count:
//!
//! - create→running: the `svc sandbox create` call (svcd answers once the guest runs behind its
//!   fence), median and p90 of the last 10 creates, and the ratio to the first 10;
//! - svcd's own step per create: its nftables change (from svcd's log, `phases=… nft=…`), and
//!   beside it, in the same run on a scratch table of as many links, what that step costs when
//!   the whole link set is rewritten (how svcd did it before) against adding one element;
//! - `svc sandbox list` latency (median of 5);
//! - svcd's resident memory, per sandbox above an idle svcd.
//!
//! Then HTTPS requests from the sandboxes (DNS through the guard, HTTPS through the proxy):
//! 20 one after another (the floor), then 100 (or all, if fewer) at once, started together at
//! an agreed instant after every exec is up: curl's name-lookup and total times, p50/p90/max. Then every sandbox
//! is destroyed, timed, and what is left is counted (links, nftables set elements, runtime
//! containers, svcd's memory).

use std::{
    process::Command,
    time::{Duration, Instant},
};

use svc_tests::world::World;

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// svcd's nftables step of each create so far, milliseconds, in order.
fn nft_steps(log: &str) -> Vec<f64> {
    log.lines()
        .filter(|l| l.contains("sandbox created"))
        .filter_map(|l| {
            let at = l.find(" nft=")? + 5;
            let rest = &l[at..];
            rest[..rest.find("ms")?].parse().ok()
        })
        .collect()
}

/// The container backend's steps of each create so far (svcd's debug log, `container
/// started create_and_link_ms=… runc_create_ms=… link_ms=… attach_ms=… start_ms=…`), in
/// order: [the runtime's create, the host link (made beside it), attach, its start] in milliseconds.
fn runtime_steps(log: &str) -> Vec<[f64; 4]> {
    let field = |l: &str, key: &str| -> Option<f64> {
        let at = l.find(key)? + key.len();
        l[at..].split_whitespace().next()?.parse().ok()
    };
    log.lines()
        .filter(|l| l.contains("container started"))
        .filter_map(|l| {
            Some([
                field(l, "runc_create_ms=")?,
                field(l, " link_ms=")?,
                field(l, "attach_ms=")?,
                field(l, " start_ms=")?,
            ])
        })
        .collect()
}

/// In the host namespace: a scratch table whose link set holds `n` links; then the median of 5
/// runs each of rewriting the whole set (flush + add n) and of adding one element.
fn nft_whole_vs_one(w: &World, n: usize) -> (f64, f64) {
    let names: Vec<String> = (0..n).map(|i| format!("\"scale{i}\"")).collect();
    let elems = if names.is_empty() {
        String::new()
    } else {
        format!("    elements = {{ {} }}\n", names.join(", "))
    };
    let file = w.dir.join("scale.nft");
    let run = |text: &str| {
        std::fs::write(&file, text).expect("nft file");
        let t = Instant::now();
        let out = w.host.exec("nft", &["-f", file.to_str().expect("utf-8")]);
        assert!(out.status.success(), "nft: {out:?}");
        ms(t.elapsed())
    };
    run(&format!(
        "table inet svcscale {{}}\ndelete table inet svcscale\ntable inet svcscale {{\n  set links {{\n    type ifname\n{elems}  }}\n}}\n"
    ));
    let (mut whole, mut one) = (Vec::new(), Vec::new());
    for i in 0..5 {
        whole.push(run(&format!(
            "flush set inet svcscale links\n{}",
            if n == 0 {
                String::new()
            } else {
                format!(
                    "add element inet svcscale links {{ {} }}\n",
                    names.join(", ")
                )
            }
        )));
        one.push(run(&format!(
            "add element inet svcscale links {{ \"extra{i}\" }}\n"
        )));
        run(&format!(
            "delete element inet svcscale links {{ \"extra{i}\" }}\n"
        ));
    }
    run("delete table inet svcscale\n");
    (pct(&mut whole, 0.5), pct(&mut one, 0.5))
}

fn unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// One HTTPS request from sandbox `name` (DNS through the guard, HTTPS through the proxy),
/// started at the Unix time `at_ns` (at once if 0): (ok, DNS ms, total ms), or `None` if its
/// shell started after `at_ns` (not together with the others).
type Request = Option<(bool, f64, f64)>;

fn request_at(socket: &std::path::Path, name: &str, at_ns: u128) -> Request {
    let script = format!(
        "d=$(( {at_ns} - $(date +%s%N) )); \\
         if [ {at_ns} -gt 0 ] && [ $d -le 0 ]; then echo late; exit 0; fi; \\
         [ $d -gt 0 ] && sleep $(printf '%d.%09d' $((d / 1000000000)) $((d % 1000000000))); \\
         curl -sS -o /dev/null --max-time 30 -w '%{{time_namelookup}} %{{time_total}}' \\
         https://api.agent.test/"
    );
    let out = Command::new(svc_tests::world::workspace_bin("svc"))
        .args(["sandbox", "exec", name, "--", "sh", "-c", &script])
        .env("SVC_SOCKET", socket)
        .output()
        .expect("svc");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if text.trim() == "late" {
        return None;
    }
    let mut parts = text
        .split_whitespace()
        .map(|p| p.parse::<f64>().unwrap_or(f64::NAN));
    Some((
        out.status.success(),
        parts.next().unwrap_or(f64::NAN) * 1000.0,
        parts.next().unwrap_or(f64::NAN) * 1000.0,
    ))
}

/// Print one line of request figures.
fn report(what: &str, results: &[Request]) {
    let late = results.iter().filter(|r| r.is_none()).count();
    let results: Vec<(bool, f64, f64)> = results.iter().flatten().copied().collect();
    let ok = results.iter().filter(|r| r.0).count();
    let mut dns: Vec<f64> = results.iter().filter(|r| r.0).map(|r| r.1).collect();
    let mut total: Vec<f64> = results.iter().filter(|r| r.0).map(|r| r.2).collect();
    println!(
        "{what}: {ok}/{} ok{}; DNS p50 {:.1} p90 {:.1} max {:.1} ms; whole request p50 {:.1} p90 {:.1} max {:.1} ms",
        results.len(),
        if late > 0 {
            format!(" ({late} started late, not counted)")
        } else {
            String::new()
        },
        pct(&mut dns, 0.5),
        pct(&mut dns, 0.9),
        pct(&mut dns, 1.0),
        pct(&mut total, 0.5),
        pct(&mut total, 0.9),
        pct(&mut total, 1.0)
    );
}

/// The proxy's own time for each request so far (its audit records' `duration_ms`: from the
/// request head to the end of the response), in order.
fn http_durations(w: &World) -> Vec<f64> {
    std::fs::read_to_string(w.audit_path())
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["layer"] == "http")
        .filter_map(|v| v["duration_ms"].as_f64())
        .collect()
}

fn report_proxy(mut own: Vec<f64>) {
    println!(
        "    the proxy's own part (audit duration_ms, {} records): p50 {:.0} p90 {:.0} max {:.0} ms",
        own.len(),
        pct(&mut own, 0.5),
        pct(&mut own, 0.9),
        pct(&mut own, 1.0)
    );
}

fn main() {
    let mut counts: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| {
            a.parse()
                .unwrap_or_else(|_| panic!("{a:?}: expected a count"))
        })
        .collect();
    if counts.is_empty() {
        counts = vec![1, 100, 500, 1000];
    }
    counts.sort_unstable();
    counts.dedup();
    let max = *counts.last().expect("a count");

    let w = World::start();
    let svcd = w.svcd_pid().expect("svcd's pid");
    // Warm up, then the idle baseline.
    w.svc_ok(&["sandbox", "create", "warm"]);
    w.svc_ok(&["sandbox", "destroy", "warm"]);
    std::thread::sleep(Duration::from_millis(500));
    let idle_rss = svc_tests::rss_kib(svcd);
    println!(
        "scale bench: container backend, {max} sandboxes live at most; svcd idle RSS {:.1} MiB",
        idle_rss as f64 / 1024.0
    );
    println!(
        "\n{:>6} | {:>18} | {:>9} | {:>22} | {:>12} | {:>12} | {:>10}",
        "live",
        "create ms p50/p90",
        "vs first",
        "nft step ms (svcd)",
        "whole set ms",
        "one elem ms",
        "list ms"
    );
    let mut creates: Vec<f64> = Vec::new();
    let started = Instant::now();
    let mut first10 = f64::NAN;
    for i in 1..=max {
        let name = format!("s{i}");
        let t = Instant::now();
        let out = w.svc(&["sandbox", "create", &name]);
        assert!(
            out.status.success(),
            "create {name}: {}\nsvcd:\n{}",
            String::from_utf8_lossy(&out.stderr),
            w.svcd_log()
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        );
        creates.push(ms(t.elapsed()));
        if i <= 10 {
            first10 = pct(&mut creates.clone(), 0.5);
        }
        if !counts.contains(&i) {
            continue;
        }
        let last: Vec<f64> = creates[creates.len().saturating_sub(10)..].to_vec();
        let (p50, p90) = (pct(&mut last.clone(), 0.5), pct(&mut last.clone(), 0.9));
        let steps = nft_steps(&w.svcd_log());
        let mut last_steps: Vec<f64> = steps[steps.len().saturating_sub(10)..].to_vec();
        let (whole, one) = nft_whole_vs_one(&w, i);
        let mut list = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            w.svc_ok(&["sandbox", "list", "--json"]);
            list.push(ms(t.elapsed()));
        }
        let rss = svc_tests::rss_kib(svcd);
        println!(
            "{i:>6} | {p50:>8.1} / {p90:>7.1} | {:>8.2}x | {:>22.2} | {whole:>12.2} | {one:>12.2} | {:>10.1}",
            p50 / first10.max(f64::MIN_POSITIVE),
            pct(&mut last_steps, 0.5),
            pct(&mut list, 0.5)
        );
        println!(
            "         svcd RSS {:.1} MiB: {:.1} KiB per sandbox above idle",
            rss as f64 / 1024.0,
            (rss.saturating_sub(idle_rss)) as f64 / i as f64
        );
        let steps = runtime_steps(&w.svcd_log());
        if !steps.is_empty() {
            let last = &steps[steps.len().saturating_sub(10)..];
            let med = |k: usize| pct(&mut last.iter().map(|s| s[k]).collect::<Vec<_>>(), 0.5);
            println!(
                "         runtime steps (median of the last 10): the runtime's create {:.1} ms, beside it the host link {:.1} ms; attach {:.1} ms, the runtime's start {:.1} ms",
                med(0),
                med(1),
                med(2),
                med(3)
            );
        }
    }
    println!("created {max} in {:.1} s", started.elapsed().as_secs_f64());

    // Requests from many sandboxes: one after another (the floor), then all at once. Each
    // `svc sandbox exec` starts its guest shell ahead of time and sleeps until an agreed
    // instant (the guests share the host's clock), so the 100 requests start together and the
    // exec start-ups (a runc exec each) are not inside the figures.
    let sample = max.min(100);
    let audited = http_durations(&w).len();
    let one_by_one: Vec<Request> = (1..=sample.min(20))
        .map(|i| request_at(&w.socket, &format!("s{i}"), 0))
        .collect();
    report("one after another", &one_by_one);
    let proxy_own = http_durations(&w).split_off(audited);
    report_proxy(proxy_own);
    let audited = http_durations(&w).len();
    let at = unix_ns() + 8_000_000_000 + sample as u128 * 40_000_000;
    let threads: Vec<_> = (1..=sample)
        .map(|i| {
            let socket = w.socket.clone();
            std::thread::spawn(move || request_at(&socket, &format!("s{i}"), at))
        })
        .collect();
    let results: Vec<Request> = threads
        .into_iter()
        .map(|t| t.join().expect("thread"))
        .collect();
    report(&format!("{sample} at once"), &results);
    report_proxy(http_durations(&w).split_off(audited));

    // Destroy all.
    let t = Instant::now();
    let mut destroys = Vec::new();
    for i in 1..=max {
        let t = Instant::now();
        w.svc_ok(&["sandbox", "destroy", &format!("s{i}")]);
        destroys.push(ms(t.elapsed()));
    }
    println!(
        "destroyed {max} in {:.1} s (each p50 {:.1} p90 {:.1} ms)",
        t.elapsed().as_secs_f64(),
        pct(&mut destroys.clone(), 0.5),
        pct(&mut destroys, 0.9)
    );
    std::thread::sleep(Duration::from_millis(500));
    let links = w.host.exec("ip", &["-o", "link", "show"]);
    let left_links = String::from_utf8_lossy(&links.stdout)
        .lines()
        .filter(|l| l.contains(": svc"))
        .count();
    let sets = w.host.exec("nft", &["-j", "list", "sets"]);
    let sets: serde_json::Value = serde_json::from_slice(&sets.stdout).unwrap_or_default();
    let left_elems: usize = sets["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|o| o["set"]["name"] == "links")
        .map(|o| o["set"]["elem"].as_array().map_or(0, Vec::len))
        .sum();
    println!(
        "left: {left_links} sandbox links, {left_elems} link-set elements, {} sandboxes listed; svcd RSS {:.1} MiB (idle was {:.1})",
        w.svc_ok(&["sandbox", "list", "--json"])
            .matches("\"name\"")
            .count(),
        svc_tests::rss_kib(svcd) as f64 / 1024.0,
        idle_rss as f64 / 1024.0
    );
}
