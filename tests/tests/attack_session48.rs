//! Session 48's changes attacked from inside a pod's containers, against containerd's CRI
//! (kubelet's calls), the shim, a real svcd, crun and the guest's init.
//!
//! - A pod container's removal ends every process of its sandbox rooted on its tree
//!   (`container::ctr_procs`): a daemon that left the sandbox's pid namespace for one of its
//!   own (`unshare -Upf`), and a process that hops from pid to pid faster than a sweep looks,
//!   each must end with it too.

use std::time::{Duration, Instant};

use svc_tests::{
    containerd::Containerd,
    cri::Cri,
    pods::{self, ALLOWED, Pod, STORED, exec, remove_container, remove_pod, run_fenced_pod, start},
    require_root,
    world::{EXAMPLE_TOKEN, World},
};

/// containerd with CRI on and a fenced pod named `name`.
fn fenced_pod(w: &World, name: &str) -> (Containerd, Cri, Pod) {
    w.store_secret(STORED, EXAMPLE_TOKEN, ALLOWED);
    let (c, cri) = start(w);
    let pod = run_fenced_pod(w, &c, &cri, name, &[]);
    (c, cri, pod)
}

/// The node's processes whose command line matches `pattern` (`pgrep -af`; write one
/// character of it as a class, `sleep 425[1]`, so the pattern never matches its own shell).
fn node_processes(pattern: &str) -> Vec<String> {
    let out = std::process::Command::new("pgrep")
        .args(["-af", pattern])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Wait up to `secs` for `pattern`'s processes to be gone: those left.
fn left_after(pattern: &str, secs: u64) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let left = node_processes(pattern);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A container of `pod` running `daemon` (a shell script) in the background in a session
/// of its own, then sleeping; once `pattern` shows it running (or `start_secs` passed:
/// the attack could not start, which is said), the container is removed and nothing matching
/// `pattern` may be left. The pod is removed at the end.
fn removal_ends(w: &World, name: &str, daemon: &str, pattern: &str) {
    let (c, cri, pod) = fenced_pod(w, name);
    let script = format!("setsid sh -c '{daemon}' </dev/null >/dev/null 2>&1 & exec sleep 1000");
    let id = pods::run_container(&cri, &pod.id, &pod.config, name, &["sh", "-c", &script]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while node_processes(pattern).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let started = node_processes(pattern);
    let (_, seen, _) = exec(&cri, &id, &["sh", "-c", "ps -ef 2>/dev/null | tail -5"]);
    eprintln!("{name}: started: {started:?}\n{seen}");
    assert!(
        !started.is_empty(),
        "{name}: the attack's process never started (the sandbox refused it?): nothing tried\n{}",
        w.svcd_log()
    );
    remove_container(&cri, &id);
    let left = left_after(pattern, 5);
    // The pod goes whatever was found: its sandbox's end kills what is left.
    remove_pod(w, &c, &cri, &pod);
    assert!(
        left.is_empty(),
        "{name}: the removed container's processes run on in the pod's sandbox: {left:?}"
    );
}

#[test]
fn a_daemon_in_a_pid_namespace_of_its_own_ends_with_its_containers_removal() {
    require_root();
    let w = World::start();
    removal_ends(
        &w,
        "pidns",
        "exec unshare --user --map-root-user --pid --fork sleep 4251",
        "sleep 425[1]",
    );
}

#[test]
fn a_process_hopping_from_pid_to_pid_ends_with_its_containers_removal() {
    require_root();
    let w = World::start();
    // Each process starts the next and ends at once: at any time one or two are alive,
    // never the same pid for long.
    removal_ends(
        &w,
        "hopper",
        "echo \"sh /tmp/hop.sh 4253 &\" > /tmp/hop.sh; exec sh /tmp/hop.sh 4253",
        "hop.sh 425[3]",
    );
}
