//! `svc sandbox stats` (`GET /v1/sandboxes/{name}/stats`) on real sandboxes: a container's
//! figures are its cgroup's (its processes, its limits), read while it is paused too; a
//! microvm's are its VM's (its memory cgroup, its QEMU's CPU time, QEMU its only process); a
//! user the guest's id mapping does not hold is refused naming it, and a microvm refuses any
//! user but root.

use svc_tests::{
    require_root,
    world::{World, microvm_images},
};

fn stats(w: &World, name: &str) -> serde_json::Value {
    serde_json::from_str(&w.svc_ok(&["sandbox", "stats", name, "--json"])).expect("stats json")
}

#[test]
fn a_containers_figures_are_its_cgroups_paused_or_not() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "figures"]);
    let pid = w.show("figures")["pid"].as_u64().expect("pid");
    let s = stats(&w, "figures");
    assert_eq!(s["backend"], "container", "{s}");
    assert_eq!(s["scope"], "the sandbox's cgroup", "{s}");
    assert!(
        s["cgroup"]
            .as_str()
            .unwrap_or_default()
            .ends_with("/figures"),
        "{s}"
    );
    assert!(s["memory_bytes"].as_u64() > Some(0), "{s}");
    assert!(s["cpu_ns"].as_u64() > Some(0), "{s}");
    let pids: Vec<u64> = s["pids"]
        .as_array()
        .expect("pids")
        .iter()
        .filter_map(serde_json::Value::as_u64)
        .collect();
    assert!(pids.contains(&pid), "the init {pid} in {s}");
    // Every pid is a process in the sandbox's pid namespace (or one that ended since).
    let ns = |p: u64| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
    assert!(ns(pid).is_some(), "init {pid} is no host process");
    for p in &pids {
        if let Some(theirs) = ns(*p) {
            assert_eq!(Some(theirs), ns(pid), "{p} is not the sandbox's: {s}");
        }
    }
    // svcd's default limits (container.memory_mib, pids_max) are the cgroup's.
    assert!(s["memory_limit_bytes"].as_u64().is_some(), "{s}");
    assert!(s["pids_limit"].as_u64().is_some(), "{s}");

    w.svc_ok(&["sandbox", "pause", "figures"]);
    let paused = stats(&w, "figures");
    assert_eq!(paused["state"], "paused", "{paused}");
    assert_eq!(paused["pids"], s["pids"], "{paused}");
    w.svc_ok(&["sandbox", "resume", "figures"]);

    let missing = w.svc(&["sandbox", "stats", "nothing-here"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no sandbox named \"nothing-here\""),
        "{missing:?}"
    );
    w.destroy_checked("figures");
}

#[test]
fn a_microvms_figures_are_its_vms_and_it_runs_commands_as_the_user_named() {
    require_root();
    microvm_images();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "--backend", "microvm", "vmfig"]);
    let pid = w.show("vmfig")["pid"].as_u64().expect("pid");
    let s = stats(&w, "vmfig");
    assert_eq!(s["backend"], "microvm", "{s}");
    assert!(
        s["scope"].as_str().unwrap_or_default().contains("QEMU"),
        "{s}"
    );
    assert_eq!(s["pids"], serde_json::json!([pid]), "QEMU only: {s}");
    assert!(s["memory_bytes"].as_u64() > Some(0), "{s}");
    assert!(
        s["memory_limit_bytes"].as_u64() > Some(0),
        "the VM's memory cgroup: {s}"
    );
    assert!(s["cpu_ns"].as_u64() > Some(0), "{s}");
    assert_eq!(s["pids_current"], serde_json::Value::Null, "{s}");

    let body = serde_json::json!({"argv": ["id"], "user": {"uid": 1000, "gid": 1000}});
    let (status, answer) = w.api_exec("vmfig", &body);
    // The guest's agent takes the user (groups, gid, then uid) as the container backend does.
    assert_eq!(status, 200, "{answer}");
    // "uid=1000 gid=1000 groups=1000\n", base64.
    assert!(
        answer.contains("dWlkPTEwMDAgZ2lkPTEwMDAgZ3JvdXBzPTEwMDAK"),
        "{answer}"
    );
    assert!(answer.contains("{\"exit\":0}"), "{answer}");
    w.destroy_checked("vmfig");
}
