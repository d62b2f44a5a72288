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

/// How many pids the pod's sandbox allocated over one second (the last pid of its pid
/// namespace, `/proc/loadavg`, read twice from the sandbox): a process that hops from pid to
/// pid shows as hundreds, an idle sandbox as the few the reads themselves take.
fn pids_per_second(w: &World, sandbox: &str) -> u64 {
    let (code, out, err) = w.sh(
        sandbox,
        "a=$(cut -d/ -f2 /proc/loadavg | cut -d' ' -f2); sleep 1; \
         b=$(cut -d/ -f2 /proc/loadavg | cut -d' ' -f2); echo $((b - a))",
    );
    assert_eq!(code, 0, "{err}");
    out.trim().parse().unwrap_or_else(|e| panic!("{out:?}: {e}"))
}

/// The pids an idle sandbox allocates in a second, at most (the reads' own processes).
const IDLE_PIDS: u64 = 20;

#[test]
fn a_daemon_in_a_pid_namespace_of_its_own_ends_with_its_containers_removal() {
    require_root();
    let w = World::start();
    let (c, cri, pod) = fenced_pod(&w, "pidns");
    let id = pods::run_container(&cri, &pod.id, &pod.config, "pidns", &["sleep", "1000"]);
    // The daemon leaves the sandbox's pid namespace for one of its own (a user namespace
    // of its own gives it the right to).
    let (code, _, err) = exec(
        &cri,
        &id,
        &[
            "sh",
            "-c",
            "setsid unshare --user --map-root-user --pid --fork sleep 4251 \
             </dev/null >/dev/null 2>/tmp/unshare.err & sleep 1; cat /tmp/unshare.err >&2",
        ],
    );
    eprintln!("pidns: exec {code}: {err}");
    std::thread::sleep(Duration::from_millis(500));
    let started = node_processes("sleep 425[1]");
    if started.is_empty() {
        // Refused inside the sandbox: nothing to end. Say so, and why.
        assert!(
            !err.trim().is_empty(),
            "the daemon neither started nor said why"
        );
        eprintln!("pidns: the sandbox refused a pid namespace of its own: {err}");
    }
    remove_container(&cri, &id);
    let left = left_after("sleep 425[1]", 5);
    remove_pod(&w, &c, &cri, &pod);
    assert!(
        left.is_empty(),
        "the removed container's daemon runs on in its own pid namespace: {left:?}"
    );
}

#[test]
fn a_process_hopping_from_pid_to_pid_ends_with_its_containers_removal() {
    require_root();
    let w = World::start();
    let (c, cri, pod) = fenced_pod(&w, "hopper");
    let id = pods::run_container(&cri, &pod.id, &pod.config, "hopper", &["sleep", "1000"]);
    // Each process starts the next and ends at once: one or two alive at any time, never
    // the same pid for long.
    let (code, _, err) = exec(
        &cri,
        &id,
        &[
            "sh",
            "-c",
            "echo 'sh /tmp/hop.sh &' > /tmp/hop.sh; \
             setsid sh /tmp/hop.sh </dev/null >/dev/null 2>&1",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let before = pids_per_second(&w, &pod.sandbox);
    eprintln!("hopper: {before} pids a second before the removal");
    assert!(before > 10 * IDLE_PIDS, "the hopper did not start: {before}");
    remove_container(&cri, &id);
    std::thread::sleep(Duration::from_secs(2));
    let after = pids_per_second(&w, &pod.sandbox);
    eprintln!("hopper: {after} pids a second after the removal");
    remove_pod(&w, &c, &cri, &pod);
    assert!(
        after <= IDLE_PIDS,
        "the removed container's hopping process runs on in the pod's sandbox: {after} pids a second"
    );
}
