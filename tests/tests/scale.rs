//! More sandboxes than a kernel limit per user allows by default: every container guest is
//! the same host uid, so anything the kernel counts per user must not be spent per sandbox.
//! The first one found by `cargo xtask bench scale`: runc's session keyring per container
//! (kernel.keys.maxkeys, 200 by default) — the 201st sandbox failed with "disk quota exceeded".
//! Nor may anything be kept per sandbox in the host's mount table: every mount there lengthens
//! each later runtime call's walk of it (the second thing the benchmark found).

use svc_tests::{require_root, world::World};

#[test]
fn more_sandboxes_than_the_kernels_key_quota_run_at_once() {
    require_root();
    let maxkeys: usize = std::fs::read_to_string("/proc/sys/kernel/keys/maxkeys")
        .expect("kernel.keys.maxkeys")
        .trim()
        .parse()
        .expect("a number");
    assert!(
        maxkeys <= 1000,
        "kernel.keys.maxkeys is {maxkeys}: this test would need more than 1000 sandboxes to \
         cross it; lower it for the test's run (sysctl kernel.keys.maxkeys=200)"
    );
    let n = maxkeys + 10;
    let w = World::start();
    let mounts_before = host_mounts();
    for i in 1..=n {
        let out = w.svc(&["sandbox", "create", &format!("k{i}")]);
        assert!(
            out.status.success(),
            "sandbox {i} of {n}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The last one works, behind its fence.
    let (rc, out, err) = w.sh(
        &format!("k{n}"),
        "curl -sS -o /dev/null -w '%{http_code}' https://api.agent.test/",
    );
    assert_eq!((rc, out.as_str()), (0, "200"), "{err}");
    // Each guest's overlay is in its own mount namespace, not the host's.
    let mounts_live = host_mounts();
    assert!(
        mounts_live.len() <= mounts_before.len() + 5,
        "{n} live sandboxes added {} mounts to the host's table, e.g. {:?}",
        mounts_live.len() - mounts_before.len(),
        mounts_live
            .iter()
            .filter(|m| !mounts_before.contains(m))
            .take(3)
            .collect::<Vec<_>>()
    );
    let (rc, out, err) = w.sh(&format!("k{n}"), "grep -c ' / / ' /proc/self/mountinfo");
    assert_eq!((rc, out.trim()), (0, "1"), "the guest's own root: {err}");
    let listed: Vec<serde_json::Value> =
        serde_json::from_str(&w.svc_ok(&["sandbox", "list", "--json"])).expect("list");
    assert_eq!(listed.len(), n);
    for i in 1..=n {
        w.svc_ok(&["sandbox", "destroy", &format!("k{i}")]);
    }
    assert_eq!(w.svc_ok(&["sandbox", "list", "--json"]).trim(), "[]");
}

/// The host's mount points (svcd's namespace is the host's).
fn host_mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .collect()
}
