//! Session 44's changes attacked, against the real svcd and crun. The exec `user` field
//! (a command with supplementary groups runs through crun's `exec --process` file, which holds
//! the whole process) gets nothing the container's own process lacks and leaves no file; a
//! second API member reads no stats of another's sandbox, cannot pause, resume or exec in it,
//! and sees none of its records by `--pod`; a pod identity that would break an audit line or
//! a metric label is refused as the request is read; a pooled sandbox opens no route by its
//! pool name; a sandbox paused before a restart is destroyed whole after it. Found and fixed:
//! a guest's commands inherited its init server's channel to svcd (fd 3) and could read svcd's
//! frames (the server now holds it close-on-exec); any member could give its sandbox any pod's
//! identity (root only now: the node's shim).

use svc_tests::{
    require_root,
    users::{User, pair},
    world::World,
};

fn users() -> (User, User) {
    pair("svcs44")
}

/// What a process's privileges are: its capability sets, no_new_privs, seccomp, limits and
/// oom score (ids aside: those are what the request asked for).
const PRIVS: &str = "grep -E '^(Cap[A-Za-z]+|NoNewPrivs|Seccomp|Seccomp_filters):' \
                     /proc/self/status; cat /proc/self/limits; cat /proc/self/oom_score_adj; \
                     cat /proc/self/cgroup";

/// Run `PRIVS` in sandbox `name` through the API with `user` (none: the guest's root through
/// its init), its output left in the guest at `out`; then that output.
fn privileges(w: &World, name: &str, user: Option<serde_json::Value>, out: &str) -> String {
    let mut body = serde_json::json!({
        "argv": ["sh", "-c", format!("({PRIVS}) > {out} 2>&1")],
    });
    if let Some(u) = user {
        body["user"] = u;
    }
    let (status, answer) = w.api_exec(name, &body);
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("{\"exit\":0}"), "{body}: {answer}");
    let (code, text, err) = w.sh(name, &format!("cat {out}"));
    assert_eq!(code, 0, "{err}");
    text
}

/// crun's `exec --process` takes the whole process from svcd's file: one that names only
/// the user, the arguments, the environment and the working directory leaves crun to fill in
/// the rest. A command asking for supplementary groups must still get exactly the container
/// process's capabilities (bounding, effective, permitted, inheritable, ambient), its
/// no_new_privs and seccomp filter, its limits and its cgroup — as the same user without
/// supplementary groups gets through `--user`.
#[test]
fn exec_user_with_supplementary_groups_gets_nothing_the_container_lacks() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "groups"]);
    let root = privileges(&w, "groups", None, "/tmp/p-init");
    assert!(root.contains("NoNewPrivs:\t1"), "{root}");
    assert!(root.contains("Seccomp:\t2"), "{root}");
    let as_root = privileges(
        &w,
        "groups",
        Some(serde_json::json!({"uid": 0, "gid": 0})),
        "/tmp/p-root",
    );
    assert_eq!(as_root, root, "--user 0:0 against the init's command");
    let root_with_groups = privileges(
        &w,
        "groups",
        Some(serde_json::json!({"uid": 0, "gid": 0, "additional_gids": [1, 4]})),
        "/tmp/p-root-groups",
    );
    assert_eq!(
        root_with_groups, root,
        "root with supplementary groups (crun exec --process) against the init's command"
    );
    let user = privileges(
        &w,
        "groups",
        Some(serde_json::json!({"uid": 1234, "gid": 1234})),
        "/tmp/p-user",
    );
    let user_with_groups = privileges(
        &w,
        "groups",
        Some(serde_json::json!({"uid": 1234, "gid": 1234, "additional_gids": [27, 4]})),
        "/tmp/p-user-groups",
    );
    assert_eq!(
        user_with_groups, user,
        "a user with supplementary groups (crun exec --process) against the same user without"
    );
    // svcd leaves no process file behind (they hold a command's arguments and environment).
    let execs = w.dir.join("state/exec");
    let left: Vec<String> = std::fs::read_dir(&execs)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".process.json"))
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "process files left in {execs:?}: {left:?}");
    w.destroy_checked("groups");
}

/// B, another member of the API group, asks for A's sandbox's figures, pauses and resumes it,
/// and runs a command in it as a user of its choosing: each is refused, and A's sandbox runs on
/// unpaused.
#[test]
fn a_member_reads_no_stats_of_anothers_sandbox_nor_pauses_or_execs_in_it() {
    require_root();
    let w = World::start();
    let (a, b) = users();
    a.svc_ok(&w, &["sandbox", "create", "a-box"]);
    let b_ids = b.ids();
    let b_ids: Vec<&str> = b_ids.iter().map(String::as_str).collect();
    let exec = serde_json::json!({"argv": ["touch", "/tmp/b-was-here"],
                                  "user": {"uid": 1234, "gid": 1234, "additional_gids": [4]}});
    let exec = exec.to_string();
    for (method, path, body) in [
        ("GET", "/v1/sandboxes/a-box/stats", None),
        ("POST", "/v1/sandboxes/a-box/pause", None),
        ("POST", "/v1/sandboxes/a-box/resume", None),
        ("POST", "/v1/sandboxes/a-box/exec", Some(exec.as_bytes())),
    ] {
        let (status, answer) = w.api(&b_ids, method, path, body);
        assert!(
            status == 403 || status == 404,
            "B's {method} {path}: {status} {answer}"
        );
        assert!(
            !answer.contains("memory") && !answer.contains("cpu"),
            "B's {method} {path} shows figures: {answer}"
        );
    }
    // A's guest runs on, unpaused, and B's command never ran in it.
    let out = a.svc_ok(
        &w,
        &[
            "sandbox",
            "exec",
            "a-box",
            "--",
            "sh",
            "-c",
            "test ! -e /tmp/b-was-here && echo clean",
        ],
    );
    assert_eq!(out, "clean\n");
    // A's own stats are A's to read.
    let a_ids = a.ids();
    let a_ids: Vec<&str> = a_ids.iter().map(String::as_str).collect();
    let (status, answer) = w.api(&a_ids, "GET", "/v1/sandboxes/a-box/stats", None);
    assert_eq!(status, 200, "A's own stats: {answer}");
    a.svc_ok(&w, &["sandbox", "destroy", "a-box"]);
}

/// A pod identity with what would break an audit text line or a metric label (a newline, a
/// quote, `=`, a space, a brace, an overlong namespace) is refused as the request is read, and
/// no sandbox is made.
#[test]
fn a_pod_identity_that_would_break_an_audit_line_or_a_label_is_refused() {
    require_root();
    let w = World::start();
    let long = "a".repeat(64);
    for (ns, name) in [
        ("team-a\nsandbox=x", "web-0"),
        ("team-a", "web-0\" pod_name=\"other"),
        ("team-a", "web-0}\nsvc_http_requests_total{pod=\"x\"} 1"),
        ("team-a", "web 0"),
        ("team=a", "web-0"),
        (long.as_str(), "web-0"),
        ("team-a", "Web-0"),
        ("team-a", "web-0."),
    ] {
        let body = serde_json::json!({"name": "podded", "pod": {"namespace": ns, "name": name}});
        let (status, answer) = w.api(
            &[],
            "POST",
            "/v1/sandboxes",
            Some(body.to_string().as_bytes()),
        );
        assert_eq!(status, 400, "pod {ns:?}/{name:?}: {answer}");
        assert!(answer.contains("pod "), "{answer}");
    }
    let (status, answer) = w.api(&[], "GET", "/v1/sandboxes", None);
    assert_eq!(status, 200, "{answer}");
    assert!(!answer.contains("podded"), "{answer}");
    assert!(!w.metrics().contains("pod_name"), "{}", w.metrics());
}

/// A pod's identity is what the containerd shim (root, from containerd's CRI annotations) says
/// of the sandbox it makes; a member of the API group creating a sandbox of its own must not
/// be able to write another pod's name into every audit record and metric of that sandbox
/// (`svc audit --pod kube-system/coredns-0` would show the member's traffic as that pod's).
#[test]
fn a_member_cannot_claim_a_pods_identity_for_its_own_sandbox() {
    require_root();
    let w = World::start();
    let (_a, b) = users();
    let b_ids = b.ids();
    let b_ids: Vec<&str> = b_ids.iter().map(String::as_str).collect();
    let body = serde_json::json!({
        "name": "spoof",
        "pod": {"namespace": "kube-system", "name": "coredns-0"},
    });
    let (status, answer) = w.api(
        &b_ids,
        "POST",
        "/v1/sandboxes",
        Some(body.to_string().as_bytes()),
    );
    if status == 201 {
        // Show what it gave B before failing: the operator's view by that pod.
        let _ = w.sh(
            "spoof",
            "curl -s --max-time 5 https://not-allowed.example.test/ >/dev/null 2>&1",
        );
        let mut records = String::new();
        svc_tests::users::within(10, || {
            let by_pod = w.svc(&["audit", "--pod", "kube-system/coredns-0", "--json"]);
            records = String::from_utf8_lossy(&by_pod.stdout).into_owned();
            !records.is_empty()
        });
        let labelled = w
            .metrics()
            .lines()
            .filter(|l| l.contains("pod_name=\"coredns-0\""))
            .count();
        let _ = w.api(&b_ids, "DELETE", "/v1/sandboxes/spoof", None);
        panic!(
            "member {} made sandbox 'spoof' as pod kube-system/coredns-0 ({answer}); root's \
             `svc audit --pod kube-system/coredns-0` shows {} of its records; {labelled} metric \
             series carry pod_name=\"coredns-0\"",
            b.named(),
            records.lines().count()
        );
    }
    assert!(
        status == 403 || status == 400,
        "B's pod identity: {status} {answer}"
    );
}

/// The server's descriptors of the channel to svcd (fd 3, the first channel) and of the
/// hand-over socket must be its own: svc-init's PID 1 drops its copy so that "only the server
/// holds the channel", and ptrace and pidfd_getfd (the ways into the server's descriptors) are
/// the seccomp filter's refusals. A command of the guest's that held the channel could read
/// the frames svcd sends for the guest's other commands (their argv, environment and stdin)
/// and write frames in the server's name.
#[test]
fn a_guests_commands_hold_no_socket_of_its_init() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "fds"]);
    let init = w.show("fds")["pid"].as_u64().expect("pid");
    let (code, out, err) = w.sh(
        "fds",
        "for f in /proc/$$/fd/*; do echo \"$f $(readlink $f)\"; done; grep Seccomp: /proc/self/status",
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Seccomp:\t2"), "{out}");
    let server = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
        .expect("the init's children")
        .split_whitespace()
        .next()
        .expect("the init's server")
        .to_owned();
    let server_fds: Vec<String> = (3..=6)
        .filter_map(|n| std::fs::read_link(format!("/proc/{server}/fd/{n}")).ok())
        .map(|l| l.to_string_lossy().into_owned())
        .collect();
    let held: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("/proc/"))
        .filter_map(|l| l.split_once(' '))
        .filter(|(fd, target)| {
            let n: u32 = fd
                .rsplit('/')
                .next()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            n > 2 && target.starts_with("socket:")
        })
        .map(|(_, target)| target)
        .collect();
    if held.is_empty() {
        w.destroy_checked("fds");
        return;
    }
    // Evidence: a long-running command of the guest's (its agent) reads the channel beside
    // the server (the description is non-blocking, the server's: read again and again) while the sandbox's owner runs commands; what the guest's reader got of them.
    let mut reader = w
        .svc_command(&[
            "sandbox",
            "exec",
            "fds",
            "--",
            "sh",
            "-c",
            "while :; do dd bs=65536 count=1 <&3 >> /tmp/stolen 2>/dev/null; done",
        ])
        .spawn()
        .expect("svc");
    std::thread::sleep(std::time::Duration::from_secs(1));
    // (Nothing here waits on the guest unbounded: the reader may take any exec's request.)
    let mut answered = 0;
    for n in 0..4 {
        let mut c = w.svc_command(&[
            "sandbox",
            "exec",
            "fds",
            "--",
            "echo",
            &format!("owner-arg-{n}"),
        ]);
        let mut child = c.spawn().expect("svc");
        let done = svc_tests::users::within(15, || matches!(child.try_wait(), Ok(Some(_))));
        if done {
            answered += 1;
        } else {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    let stolen = std::fs::read(format!("/proc/{init}/root/tmp/stolen")).unwrap_or_default();
    let _ = reader.kill();
    let _ = reader.wait();
    let stolen = String::from_utf8_lossy(&stolen);
    let seen: Vec<String> = (0..4)
        .map(|n| format!("owner-arg-{n}"))
        .filter(|m| stolen.contains(m.as_str()))
        .collect();
    panic!(
        "a guest command holds {held:?} (its server's fds 3-6: {server_fds:?}); a reader started \
         by the guest got {} bytes of svcd's frames, naming {seen:?}; {answered} \
         of 4 later execs answered within 15 s",
        stolen.len()
    );
}

/// A pod's sandbox (made by root, as the node's shim makes it) and a member's own sandbox:
/// the member's `svc audit --pod` shows none of the pod's records, and the member cannot give
/// its own sandbox that pod's name to be shown them.
#[test]
fn a_members_audit_by_pod_shows_none_of_anothers_records() {
    require_root();
    let w = World::start();
    let (_a, b) = users();
    let body =
        serde_json::json!({"name": "a-pod", "pod": {"namespace": "team-a", "name": "web-0"}});
    let (status, answer) = w.api(
        &[],
        "POST",
        "/v1/sandboxes",
        Some(body.to_string().as_bytes()),
    );
    assert_eq!(status, 201, "{answer}");
    b.svc_ok(&w, &["sandbox", "create", "b-own"]);
    let a_marker = "a-only-7c1f.example.test";
    let _ = w.sh(
        "a-pod",
        &format!("curl -s --max-time 5 https://{a_marker}/ >/dev/null 2>&1"),
    );
    let mut all = String::new();
    assert!(
        svc_tests::users::within(10, || {
            all = w.svc_ok(&["audit", "--pod", "team-a/web-0", "--json"]);
            all.contains(a_marker)
        }),
        "root sees the pod's record by pod: {all}"
    );
    for args in [
        vec!["audit", "--pod", "team-a/web-0", "--json"],
        vec![
            "audit",
            "--pod",
            "team-a/web-0",
            "--sandbox",
            "a-pod",
            "--json",
        ],
        vec!["audit", "--json"],
    ] {
        let out = b.svc(&w, &args);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains(a_marker), "B's {args:?}: {text}");
        assert!(!text.contains("\"a-pod\""), "B's {args:?}: {text}");
    }
    b.svc_ok(&w, &["sandbox", "destroy", "b-own"]);
    w.svc_ok(&["sandbox", "destroy", "a-pod"]);
}

/// A pooled sandbox is nobody's: its row's name (`pool.container.N`) opens none of the API's
/// routes to a member or to root (no figures, no pause, no exec, no destroy), a member cannot
/// create a sandbox under that name, and the pool is whole afterwards.
#[test]
fn a_pooled_sandbox_is_no_callers_by_its_pool_name() {
    require_root();
    let w = World::start_with("\n[pool]\ncontainer = 2\nrefill_per_second = 20\n");
    let size = |w: &World| {
        w.metrics()
            .lines()
            .find_map(|l| l.strip_prefix("svc_pool_size{backend=\"container\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert!(
        svc_tests::users::within(60, || size(&w) >= 2.0),
        "the pool did not fill: {}",
        w.metrics()
    );
    let (_a, b) = users();
    let b_ids = b.ids();
    let b_ids: Vec<&str> = b_ids.iter().map(String::as_str).collect();
    let exec = serde_json::json!({"argv": ["touch", "/tmp/planted"]}).to_string();
    for caller in [&b_ids[..], &[][..]] {
        for n in 0..4 {
            let name = format!("pool.container.{n}");
            for (method, rest, body) in [
                ("GET", "", None),
                ("GET", "/stats", None),
                ("POST", "/pause", None),
                ("POST", "/resume", None),
                ("POST", "/exec", Some(exec.as_bytes())),
                ("DELETE", "", None),
            ] {
                let path = format!("/v1/sandboxes/{name}{rest}");
                let (status, answer) = w.api(caller, method, &path, body);
                assert!(
                    (400..500).contains(&status),
                    "{caller:?} {method} {path}: {status} {answer}"
                );
            }
        }
    }
    let body = serde_json::json!({"name": "pool.container.0"}).to_string();
    let (status, answer) = w.api(&b_ids, "POST", "/v1/sandboxes", Some(body.as_bytes()));
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        size(&w),
        2.0,
        "the pool after the attempts: {}",
        w.metrics()
    );
    // The next claim's guest has nothing planted.
    w.svc_ok(&["sandbox", "create", "claimed"]);
    let (code, out, err) = w.sh("claimed", "ls -A /tmp");
    assert_eq!((code, out.as_str()), (0, ""), "{err}");
    w.destroy_checked("claimed");
}

/// A sandbox paused before an svcd restart and destroyed after it (never resumed) goes whole:
/// its guest, link, cgroup and directory (`World::destroy_checked`), not a frozen guest left
/// behind or a destroy that never answers.
#[test]
fn a_sandbox_paused_before_a_restart_is_destroyed_whole_after_it() {
    require_root();
    let mut w = World::start();
    w.svc_ok(&["sandbox", "create", "iced"]);
    let (status, answer) = w.api(&[], "POST", "/v1/sandboxes/iced/pause", None);
    assert_eq!(status, 200, "{answer}");
    w.kill_svcd();
    w.start_svcd();
    w.destroy_checked("iced");
}
