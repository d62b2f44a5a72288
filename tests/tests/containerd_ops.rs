//! The shim's task operations beyond running processes, through a real containerd and svcd:
//! `ctr task pause`/`resume` freeze and thaw the sandbox (a counter its process writes stops,
//! then grows again; `ctr events` shows `/tasks/paused` and `/tasks/resumed`; the perimeter
//! still answers after), `ctr task metrics` prints the sandbox's cgroup figures, `ctr task ps`
//! its processes' host pids, `ctr task exec --user` runs the process as that guest user; the pod's identity (containerd's CRI annotations) is shown by
//! `svc sandbox show`, written in the sandbox's audit records (`svc audit --pod`) and put on
//! its metrics; `svc sandbox stats`; a paused sandbox is destroyed; and `svc doctor
//! --kubernetes` passes against a containerd configuration registering the runtime and fails
//! naming the table against one that does not, naming svcd's socket when svcd does not answer,
//! and naming the shim when the one on `PATH` is not executable or not a regular file. A
//! signal `ctr task kill --exec-id` sends reaches a command the runtime's exec runs (one as
//! another user than the guest's root): its trap's exit code is the exec's.

use std::{
    os::unix::fs::PermissionsExt as _,
    time::{Duration, Instant},
};

use svc_tests::{
    containerd::{Containerd, shim_path},
    require_root,
    world::World,
};

/// The shim's file name, as containerd looks it up on its `PATH`.
const SHIM: &str = "containerd-shim-svc-v1";

/// Lines written so far by the task's counter, read from the host through its init's root.
fn ticks(pid: u64) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/root/tmp/ticks"))
        .unwrap_or_default()
        .lines()
        .count()
}

/// Wait (at most 30 s) until `cond` holds; `what` names it in the failure.
fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The value of `metric` in `ctr task metrics`' table.
fn metric(table: &str, metric: &str) -> u64 {
    table
        .lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(metric)).then(|| f.next().and_then(|v| v.parse().ok()))?
        })
        .unwrap_or_else(|| panic!("no {metric} in:\n{table}"))
}

#[test]
fn pause_resume_metrics_pids_user_and_the_pods_identity_through_containerd() {
    require_root();
    let w = World::start();
    let c = Containerd::start_with_base(&w);

    // What the shim tells containerd, from before the task exists.
    let events = c.events();

    // A pod's task (the CRI's annotations) whose process counts.
    c.run_detached_ok(
        "counter",
        &[
            "io.kubernetes.cri.sandbox-namespace=team-a",
            "io.kubernetes.cri.sandbox-name=agent-7",
            "svc.dev/allow-hosts=allowed.example.test",
        ],
        &[
            "sh",
            "-c",
            "while :; do echo x >> /tmp/ticks; sleep 0.05; done",
        ],
    );
    events.wait_for("/tasks/start", "counter");
    let sandbox = "ctr-counter";
    let s = w.show(sandbox);
    assert_eq!(
        s["pod"],
        serde_json::json!({"namespace": "team-a", "name": "agent-7"}),
        "{s}"
    );
    let shown = w.svc_ok(&["sandbox", "show", sandbox]);
    assert!(shown.contains("team-a/agent-7"), "{shown}");
    let pid = s["pid"].as_u64().expect("pid");
    until("the counter did not start", || ticks(pid) > 2);

    // A process runs as its spec's user (containerd 1.6's `ctr run` has no --user; its
    // `task exec --user` writes the same `process.user` the shim reads for a task's process).
    let out = c.ctr_ok(&[
        "task",
        "exec",
        "--exec-id",
        "user",
        "--user",
        "1000:1000",
        "counter",
        "sh",
        "-c",
        "id -u; id -g",
    ]);
    assert_eq!(out, "1000\n1000\n");

    // Pids: the host pids of the task's processes, its init among them.
    let ps = c.ctr_ok(&["task", "ps", "counter"]);
    let pids: Vec<u64> = ps
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(pids.contains(&pid), "init {pid} not in:\n{ps}");
    // Each is a host pid of a process in the sandbox's pid namespace (the counter's `sleep`s
    // come and go: one may have ended since).
    let ns = |p: u64| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
    assert!(ns(pid).is_some(), "init {pid} is no host process");
    for p in &pids {
        if let Some(theirs) = ns(*p) {
            assert_eq!(Some(theirs), ns(pid), "{p} is not the sandbox's:\n{ps}");
        }
    }

    // Metrics: the sandbox's cgroup's figures, as containerd's cgroups v1 metrics.
    let table = c.ctr_ok(&["task", "metrics", "counter"]);
    assert!(metric(&table, "memory.usage_in_bytes") > 0, "{table}");
    assert!(metric(&table, "cpuacct.usage") > 0, "{table}");
    assert!(metric(&table, "pids.current") >= 2, "{table}");

    // The same figures through svc.
    let stats: serde_json::Value =
        serde_json::from_str(&w.svc_ok(&["sandbox", "stats", sandbox, "--json"])).expect("json");
    assert!(stats["cpu_ns"].as_u64() > Some(0), "{stats}");
    assert!(stats["memory_bytes"].as_u64() > Some(0), "{stats}");
    let listed = stats["pids"].as_array().expect("pids");
    assert!(listed.iter().any(|p| p.as_u64() == Some(pid)), "{stats}");
    let table = w.svc_ok(&["sandbox", "stats", sandbox]);
    assert!(
        table.starts_with("NAME") && table.contains(sandbox) && table.contains("MEM USAGE"),
        "{table}"
    );

    // Pause: the process does not run; resume: it does again. containerd hears both.
    c.ctr_ok(&["task", "pause", "counter"]);
    let state = |c: &Containerd| {
        c.ctr_ok(&["task", "ls"])
            .lines()
            .find(|l| l.starts_with("counter"))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(state(&c).contains("PAUSED"), "{}", state(&c));
    assert_eq!(w.show(sandbox)["state"], "paused");
    let frozen = ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(ticks(pid), frozen, "the paused task's process went on");
    events.wait_for("/tasks/paused", "counter");
    c.ctr_ok(&["task", "resume", "counter"]);
    assert!(state(&c).contains("RUNNING"), "{}", state(&c));
    events.wait_for("/tasks/resumed", "counter");
    drop(events);
    until("the resumed task's process did not go on", || {
        ticks(pid) > frozen + 2
    });

    // The perimeter still answers after the resume; the pod is in the audit and the metrics.
    let curl = |url: &str| c.curl("counter", url);
    assert_eq!(curl("https://allowed.example.test/after-resume"), Some(0));
    assert_ne!(curl("https://forbidden.example.test/"), Some(0));
    let pod = serde_json::json!({"namespace": "team-a", "name": "agent-7"});
    until("no audit record of the pod's request", || {
        w.audit()
            .iter()
            .any(|r| r["path"] == "/after-resume" && r["pod"] == pod)
    });
    for r in w.audit().iter().filter(|r| r["sandbox_name"] == sandbox) {
        assert_eq!(
            r["pod"], pod,
            "a record of the pod's sandbox without it: {r}"
        );
    }
    let by_pod = w.svc_ok(&["audit", "--pod", "team-a/agent-7", "-o", "json"]);
    let records: Vec<serde_json::Value> = by_pod
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert!(
        records.iter().any(|r| r["path"] == "/after-resume"),
        "{by_pod}"
    );
    assert!(records.iter().all(|r| r["pod"] == pod), "{by_pod}");
    let none = w.svc_ok(&["audit", "--pod", "team-b/agent-7", "-o", "json"]);
    assert_eq!(none.trim(), "", "another pod's records: {none}");
    let text = w.svc_ok(&["audit", "--pod", "team-a/agent-7"]);
    assert!(text.contains("pod=team-a/agent-7"), "{text}");
    let bad = w.svc(&["audit", "--pod", "Team-A/agent-7"]);
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("pod namespace \"Team-A\""),
        "{bad:?}"
    );
    let metrics = w.metrics();
    assert!(
        metrics
            .lines()
            .any(|l| l.contains(&format!("sandbox=\"{sandbox}\""))
                && l.contains("pod_namespace=\"team-a\",pod_name=\"agent-7\"")),
        "{metrics}"
    );

    // A paused task is destroyed whole.
    c.ctr_ok(&["task", "pause", "counter"]);
    w.svc_ok(&["sandbox", "destroy", sandbox]);
    w.assert_gone_shown(&s);
    let _ = c.ctr(&["task", "kill", "--signal", "SIGKILL", "counter"]);
    let _ = c.ctr(&["task", "delete", "--force", "counter"]);
    let _ = c.ctr(&["container", "delete", "counter"]);
}

#[test]
fn a_user_outside_the_guests_ids_is_refused_naming_it() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "users"]);
    let body = serde_json::json!({"argv": ["id"], "user": {"uid": 70000, "gid": 0}});
    let (status, answer) = w.api_exec("users", &body);
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer.contains("uid 70000 is outside the guest's ids (0-65535)"),
        "{answer}"
    );
    let body = serde_json::json!({"argv": ["id", "-u"], "user": {"uid": 1234, "gid": 1234}});
    let (status, answer) = w.api_exec("users", &body);
    assert_eq!(status, 200, "{answer}");
    // "1234\n", base64.
    assert!(answer.contains("MTIzNAo="), "{answer}");
    // Supplementary groups too (with crun, through `exec --process`).
    let body = serde_json::json!({
        "argv": ["sh", "-c", "[ \"$(id -u) $(id -G)\" = '1234 1234 4 27' ]"],
        "user": {"uid": 1234, "gid": 1234, "additional_gids": [27, 4]},
    });
    let (status, answer) = w.api_exec("users", &body);
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("{\"exit\":0}"), "{answer}");
    w.destroy_checked("users");
}

#[test]
fn signals_reach_a_non_root_exec_command() {
    require_root();
    let w = World::start();
    let c = Containerd::start_with_base(&w);
    c.run_detached_ok("sig", &[], &["sh", "-c", "while :; do sleep 1; done"]);
    let pid = w.show("ctr-sig")["pid"].as_u64().expect("pid");
    // An exec as a user other than the guest's root, with the spec's capability sets (containerd
    // writes its default set into every spec): the init enters the user and the sets itself.
    for (signal, code) in [("SIGUSR1", 43), ("SIGTERM", 44)] {
        let id = format!("trap-{code}");
        let marker = format!("/proc/{pid}/root/tmp/{id}");
        let script = format!(
            "trap 'exit 43' USR1; trap 'exit 44' TERM; echo $PPID > /tmp/{id}; \
             while :; do sleep 0.1; done"
        );
        let out = std::thread::scope(|s| {
            let exec = s.spawn(|| {
                c.ctr(&[
                    "task",
                    "exec",
                    "--exec-id",
                    &id,
                    "--user",
                    "1000:1000",
                    "sig",
                    "sh",
                    "-c",
                    &script,
                ])
            });
            until("the trap was never set", || {
                std::fs::read_to_string(&marker).is_ok_and(|t| t.ends_with('\n'))
            });
            c.ctr_ok(&["task", "kill", "--exec-id", &id, "--signal", signal, "sig"]);
            exec.join().expect("ctr task exec")
        });
        assert_eq!(out.status.code(), Some(code), "{signal}'s trap: {out:?}");
    }
    let _ = c.ctr(&["task", "kill", "--signal", "SIGKILL", "sig"]);
    let _ = c.ctr(&["task", "delete", "--force", "sig"]);
    let _ = c.ctr(&["container", "delete", "sig"]);
}

#[test]
fn doctor_kubernetes_passes_with_the_runtime_registered_and_names_the_table_without() {
    require_root();
    let w = World::start();
    let c = Containerd::start(&w, &w.dir.join("containerd"));
    let path = shim_path();

    let (code, report) = doctor(&w, &k8s_config(&w, &c, "with.toml", true), &path, None);
    assert_eq!(code, Some(0), "{report:#}");
    for name in [
        "host:svcd",
        "kubernetes:shim",
        "kubernetes:containerd-config",
        "kubernetes:containerd-socket",
    ] {
        assert_eq!(probe(&report, name)["status"], "passed", "{report:#}");
    }
    let shim = probe(&report, "kubernetes:shim");
    let said = shim["output"].as_str().unwrap_or_default();
    assert!(
        said.contains("containerd-shim-svc-v1") && said.contains("Version: "),
        "{shim}"
    );

    let (code, report) = doctor(&w, &k8s_config(&w, &c, "without.toml", false), &path, None);
    assert_ne!(code, Some(0), "{report:#}");
    let why = only_failure(&report, "kubernetes:containerd-config");
    assert!(
        why.contains("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.svc]")
            && why.contains("runc (io.containerd.runc.v2)"),
        "{why}"
    );
}

#[test]
fn doctor_kubernetes_fails_naming_an_unreachable_svcd_and_a_shim_that_cannot_run() {
    require_root();
    let w = World::start();
    let c = Containerd::start(&w, &w.dir.join("containerd"));
    let config = k8s_config(&w, &c, "with.toml", true);
    let path = shim_path();

    let gone = w.dir.join("no-svcd.sock");
    let (code, report) = doctor(&w, &config, &path, Some(&gone));
    assert_ne!(code, Some(0), "{report:#}");
    let why = only_failure(&report, "host:svcd");
    assert!(
        why.contains(&format!("svcd does not answer on {}", gone.display()))
            && why.contains("fix: start it"),
        "{why}"
    );

    // A shim that is a plain file without an execute bit, then a directory in its place: each
    // alone on PATH fails naming itself and the fix.
    let plain = w.dir.join("bin-plain");
    std::fs::create_dir_all(&plain).expect("bin-plain");
    std::fs::write(plain.join(SHIM), "#!/bin/sh\n").expect("shim file");
    std::fs::set_permissions(plain.join(SHIM), std::fs::Permissions::from_mode(0o644))
        .expect("chmod 644");
    let dir = w.dir.join("bin-dir");
    std::fs::create_dir_all(dir.join(SHIM)).expect("shim directory");
    let system = "/usr/bin:/bin";
    for (bin, wrong, fix) in [
        (
            &plain,
            "is not executable (mode 100644)",
            "fix: chmod 755 it",
        ),
        (
            &dir,
            "is not a regular file",
            "fix: remove what is in its place",
        ),
    ] {
        let path = format!("{}:{system}", bin.display());
        let (code, report) = doctor(&w, &config, &path, None);
        assert_ne!(code, Some(0), "{report:#}");
        let why = only_failure(&report, "kubernetes:shim");
        let shim = bin.join(SHIM);
        assert!(
            why.contains(&format!("{} {wrong}", shim.display())) && why.contains(fix),
            "{why}"
        );
    }
    // As containerd's lookup does, an unusable entry before the real shim is passed over.
    let path = format!("{}:{path}", plain.display());
    let (code, report) = doctor(&w, &config, &path, None);
    assert_eq!(code, Some(0), "{report:#}");
}

/// A containerd configuration in `w`'s directory naming `c`'s socket, with the svc runtime
/// registered for the CRI plugin or (without `runtime`) only runc.
fn k8s_config(w: &World, c: &Containerd, name: &str, runtime: bool) -> std::path::PathBuf {
    let p = w.dir.join(name);
    let table = if runtime {
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.svc]\n  runtime_type = \"io.containerd.svc.v1\"\n"
    } else {
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n"
    };
    let text = format!(
        "version = 2\n[grpc]\n  address = \"{}\"\n{table}",
        c.socket.display()
    );
    std::fs::write(&p, text).expect("config");
    p
}

/// `svc doctor --kubernetes --no-host --json` against `config` with `PATH` = `path` (and svcd's
/// socket `socket`, else `w`'s): its exit code and its report.
fn doctor(
    w: &World,
    config: &std::path::Path,
    path: &str,
    socket: Option<&std::path::Path>,
) -> (Option<i32>, serde_json::Value) {
    let workspace = w.dir.join("doctor-ws");
    std::fs::create_dir_all(&workspace).expect("workspace");
    let mut cmd = w.svc_command(&[
        "doctor",
        "--kubernetes",
        "--no-host",
        "--json",
        "--containerd-config",
        config.to_str().expect("utf-8"),
        workspace.to_str().expect("utf-8"),
    ]);
    cmd.env("PATH", path);
    if let Some(socket) = socket {
        cmd.env("SVC_SOCKET", socket);
    }
    let out = cmd.output().expect("svc doctor");
    let report: serde_json::Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    (out.status.code(), report)
}

/// The result named `name` in a doctor report.
fn probe(report: &serde_json::Value, name: &str) -> serde_json::Value {
    report["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|r| r["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} in {report:#}"))
}

/// The reason of `name`, the report's one failed result.
fn only_failure(report: &serde_json::Value, name: &str) -> String {
    let failed: Vec<_> = report["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter(|r| r["status"] == "failed")
        .map(|r| r["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(failed, [name], "{report:#}");
    probe(report, name)["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}
