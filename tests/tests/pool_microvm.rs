//! The microvm warm pool: a real svcd with `[pool] microvm = 1` boots a QEMU guest ahead; a
//! fitting `svc sandbox create --backend microvm` takes it (a hit in the metrics), and the
//! sandbox works and looks as a fresh one: it trusts its own sandbox CA (the claim wrote the
//! claimer's over the pooled stand-in through the agent), the credential is swapped on an
//! allowed host, a denied host is refused, its host name and hosts file are its own and nothing
//! in it names the pool. A request the pool cannot honour (allow-all) misses with its reason;
//! the pool refills; svcd's stop removes the pool and keeps the claimed VM, which the next svcd
//! adopts; destroy leaves no VM, link or directory.

use std::time::{Duration, Instant};

use svc_tests::{
    require_root,
    world::{EXAMPLE_TOKEN, World, microvm_images},
};

/// svcd.toml's extra lines: one booted VM kept ready.
const POOL: &str = "\n[pool]\nmicrovm = 1\nrefill_per_second = 20\n";

/// Wait until the microvm pool holds `n` sandboxes.
fn wait_pool(w: &World, n: u64) {
    w.wait_pool("microvm", n, Duration::from_secs(180));
}

/// The QEMU processes running now whose command line names `needle`.
fn qemus_naming(needle: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("qemu-system") && cmdline.contains(needle) {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn a_pooled_microvm_is_a_fresh_one_and_the_pool_leaves_nothing() {
    require_root();
    microvm_images();
    let mut w = World::start_with(POOL);
    wait_pool(&w, 1);
    let state = w.dir.join("state/sandboxes");
    let pooled: Vec<String> = std::fs::read_dir(&state)
        .expect("sandboxes")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(pooled.len(), 1, "{pooled:?}");
    let runtime = pooled[0].clone();
    assert!(runtime.starts_with("pool.microvm."), "{runtime}");
    assert_eq!(qemus_naming(&runtime).len(), 1, "the pooled VM runs");
    assert_eq!(
        w.svc_ok(&["sandbox", "list", "--json"]).trim(),
        "[]",
        "a pooled VM is nobody's: not listed"
    );

    // A request the pool cannot honour is made cold, its reason counted.
    w.svc_ok(&[
        "sandbox",
        "create",
        "--backend",
        "microvm",
        "--egress",
        "allow-all",
        "cold",
    ]);
    assert_eq!(
        w.metric(r#"svc_pool_misses_total{backend="microvm",reason="allow-all"}"#),
        1,
        "{}",
        w.metrics()
    );
    w.destroy_checked("cold");

    // A fitting request takes the pooled VM.
    let token = w.dir.join("example-token");
    std::fs::write(&token, EXAMPLE_TOKEN).expect("token file");
    let started = Instant::now();
    w.svc_ok(&[
        "sandbox",
        "create",
        "--backend",
        "microvm",
        "--allow-host",
        "allowed.example.test",
        "--secret",
        &format!(
            "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN@file:{}",
            token.display()
        ),
        "warm",
    ]);
    let took = started.elapsed();
    assert_eq!(
        w.metric(r#"svc_pool_hits_total{backend="microvm"}"#),
        1,
        "{}",
        w.metrics()
    );
    assert_eq!(w.show("warm")["backend"], "microvm");
    eprintln!("create from the microvm pool took {took:?}");

    // It trusts its own sandbox CA and works as a fresh one.
    let (code, _, err) = w.sh(
        "warm",
        "curl -sS -o /dev/null --max-time 20 \
         -H \"Authorization: Bearer $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" \
         https://allowed.example.test/pooled-vm",
    );
    assert_eq!(code, 0, "{err}\n{}", w.svcd_log());
    assert_eq!(
        w.received_auth("/pooled-vm"),
        format!("Bearer {EXAMPLE_TOKEN}")
    );
    assert_ne!(w.curl_rc("warm", "https://db.example.test/"), 0);

    // Its identity is its own: nothing names the pool.
    let (code, look, err) = w.sh(
        "warm",
        "hostname; cat /etc/hosts; cat /proc/sys/kernel/hostname; env | sort",
    );
    assert_eq!(code, 0, "{err}");
    assert!(look.starts_with("warm\n"), "{look}");
    assert!(look.contains("127.0.1.1\twarm"), "{look}");
    assert!(
        !look.contains("pool"),
        "a trace of the pool in the guest:\n{look}"
    );

    // The pool refills with another VM.
    wait_pool(&w, 1);

    // svcd's stop removes the pool and keeps the claimed VM: a claimed sandbox is an ordinary
    // one, re-adopted by the next svcd through its runtime name.
    w.stop_svcd();
    assert_eq!(
        qemus_naming("pool.microvm."),
        qemus_naming(&runtime),
        "a pooled VM is left beside the claimed one"
    );
    let mut dirs: Vec<String> = std::fs::read_dir(&state)
        .expect("sandboxes")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    dirs.sort();
    assert_eq!(dirs, [runtime.clone(), "warm".to_owned()], "{dirs:?}");
    w.start_svcd();
    assert!(!w.svcd_log().contains("found a sandbox a crash interrupted"));
    let (code, host, err) = w.sh("warm", "hostname");
    assert_eq!((code, host.trim()), (0, "warm"), "{err}");

    // Destroy leaves nothing of the pooled VM: no QEMU, directory or link to it.
    w.destroy_checked("warm");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !qemus_naming(&runtime).is_empty() {
        assert!(Instant::now() < deadline, "the claimed VM's QEMU is left");
        std::thread::sleep(Duration::from_millis(100));
    }
    for left in [runtime.as_str(), "warm"] {
        assert!(
            state.join(left).symlink_metadata().is_err(),
            "{left} is left in {}",
            state.display()
        );
    }

    // The restarted svcd refilled its pool; its stop leaves no VM or directory.
    w.stop_svcd();
    assert!(
        qemus_naming("pool.microvm.").is_empty(),
        "a pooled VM is left"
    );
    let dirs: Vec<_> = std::fs::read_dir(&state)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(dirs.is_empty(), "sandbox directories are left: {dirs:?}");
}
