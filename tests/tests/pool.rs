//! Warm pools: a real svcd with `[pool] container = 2` makes two container sandboxes ahead;
//! a fitting `svc sandbox create` takes one (a hit in the metrics) and the sandbox works and
//! looks exactly like a fresh one (credential swapped on an allowed host, a denied host
//! refused, its own host name, no trace of the pool in its processes, /tmp, hosts file or
//! environment); the pool refills; a request the pool cannot honour misses with its reason;
//! destroy leaves nothing of the pooled guest; svcd's stop leaves no pooled sandbox.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use svc_tests::{
    require_root,
    world::{EXAMPLE_TOKEN, World, cgroup_roots},
};

/// svcd.toml's extra lines: a pool of two, refilled quickly.
const POOL: &str = "\n[pool]\ncontainer = 2\nrefill_per_second = 20\n";

/// The value of the metric line starting `series ` (0 when absent).
fn metric(w: &World, series: &str) -> u64 {
    w.metrics()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{series} ")))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Wait until the container pool holds `n` sandboxes.
fn wait_pool(w: &World, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(w, r#"svc_pool_size{backend="container"}"#) != n {
        assert!(
            Instant::now() < deadline,
            "the pool did not reach {n} within 60 s:\n{}\n{}",
            w.metrics(),
            w.svcd_log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The containers the runtime knows in this world.
fn runtime_ids(w: &World) -> Vec<String> {
    let out = Command::new(w.oci_runtime())
        .arg("--root")
        .arg(w.dir.join("state/runc"))
        .args(["list", "-q"])
        .output()
        .expect("runc list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What a guest shows of itself: host name, hosts file, /tmp, its processes' names, and its
/// environment (without what differs by design: the sandbox's name and placeholders, which
/// the allow-all sandbox compared has none of; and without the script's own processes).
const LOOK: &str = "hostname; cat /etc/hosts; ls -A /tmp; \
    for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done \
      | grep -v -x -e sh -e cat -e sort -e grep | sort; \
    env | sort | grep -v -e '^SVC_' -e '_TOKEN=' -e '^PWD=' -e '^SHLVL=' -e '^_='";

#[test]
fn a_pooled_sandbox_is_a_fresh_one_and_the_pool_leaves_nothing() {
    require_root();
    let mut w = World::start_with(POOL);
    wait_pool(&w, 2);
    let pooled: Vec<String> = runtime_ids(&w);
    assert_eq!(pooled.len(), 2, "{pooled:?}");
    assert!(
        pooled.iter().all(|p| p.starts_with("pool.container.")),
        "{pooled:?}"
    );
    assert!(
        w.svc_ok(&["sandbox", "list", "--json"]).trim() == "[]",
        "pooled sandboxes are nobody's: not listed"
    );

    // A request the pool cannot honour is made cold, its reason counted.
    w.svc_ok(&["sandbox", "create", "--egress", "allow-all", "cold"]);
    assert_eq!(
        metric(
            &w,
            r#"svc_pool_misses_total{backend="container",reason="allow-all"}"#
        ),
        1
    );
    assert_eq!(runtime_ids(&w).iter().filter(|i| *i == "cold").count(), 1);

    w.sandbox_with_example_secret_ok("warm", "env:EXAMPLE");
    assert_eq!(metric(&w, r#"svc_pool_hits_total{backend="container"}"#), 1);
    let warm_pid = w.show("warm")["pid"].as_u64().expect("pid");
    let warm_cgroup = std::fs::read_to_string(format!("/proc/{warm_pid}/cgroup")).expect("cgroup");
    let runtime = pooled
        .iter()
        .find(|p| warm_cgroup.contains(p.as_str()))
        .unwrap_or_else(|| panic!("warm's guest is none of the pooled {pooled:?}: {warm_cgroup}"))
        .clone();

    // It works as a fresh one: the credential swapped on the allowed host, others refused.
    let (code, _, err) = w.sh(
        "warm",
        "curl -sS -o /dev/null --max-time 10 \
         -H \"Authorization: Bearer $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" \
         https://allowed.example.test/pooled",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        w.received_auth("/pooled"),
        format!("Bearer {EXAMPLE_TOKEN}")
    );
    assert_ne!(w.curl_rc("warm", "https://db.example.test/"), 0);

    // It looks as a fresh one: only its name differs.
    let (code, warm, err) = w.sh("warm", LOOK);
    assert_eq!(code, 0, "{err}");
    let (code, cold, err) = w.sh("cold", LOOK);
    assert_eq!(code, 0, "{err}");
    assert!(
        !warm.contains("pool"),
        "a trace of the pool in the guest:\n{warm}"
    );
    assert_eq!(warm.replace("warm", "NAME"), cold.replace("cold", "NAME"));
    let (_, name, _) = w.sh("warm", "printf %s \"$SVC_SANDBOX\"");
    assert_eq!(name, "warm");

    // The pool refills.
    wait_pool(&w, 2);

    // Destroy leaves nothing, the pooled guest's runtime name and cgroup included.
    w.destroy_checked("warm");
    assert!(!runtime_ids(&w).contains(&runtime), "{runtime} is left");
    for root in cgroup_roots() {
        let cg = root.join(&w.cgroup_parent).join(&runtime);
        assert!(!cg.exists(), "{} is left", cg.display());
    }
    w.destroy_checked("cold");

    // svcd's stop removes the pool: no container, link, directory or row is left.
    let pid = w.svcd_pid().expect("svcd runs");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) {
        assert!(Instant::now() < deadline, "svcd did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(runtime_ids(&w).is_empty(), "{:?}", runtime_ids(&w));
    let links = w.host.exec("ip", &["-o", "link", "show"]);
    let links = String::from_utf8_lossy(&links.stdout);
    let sandbox_links = links.lines().filter(|l| {
        l.split(": ")
            .nth(1)
            .and_then(|n| n.strip_prefix("svc"))
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
    });
    assert_eq!(sandbox_links.count(), 0, "links are left:\n{links}");
    let dirs: Vec<_> = std::fs::read_dir(w.dir.join("state/sandboxes"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(dirs.is_empty(), "sandbox directories are left: {dirs:?}");
    // A restart finds no row to tear down.
    w.start_svcd();
    assert!(!w.svcd_log().contains("found a sandbox a crash interrupted"));
}
