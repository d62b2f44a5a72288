//! `svc workspace up|logs|down` against the real svcd and container sandboxes: the project
//! directory shared at /workspace (its owner's files are the guest root's), `.svc/config.yaml`'s
//! egress section in force from the first request, lifecycle hooks run in the sandbox in order
//! with their output streamed and logged, onStart again on resume, onTeardown at down; a
//! failing hook stops its phase and leaves the sandbox up; a hook past its timeout is killed
//! with its children; and directories a caller may not share are refused.

use std::{os::unix::fs::MetadataExt as _, path::PathBuf};

use svc_tests::{
    project::{path_str as p, text},
    require_root,
    world::World,
};

/// A project directory under the world's, owned by `uid`, with `workspace.json` and, if
/// given, `config.yaml` in its `.svc`.
fn project(
    w: &World,
    name: &str,
    uid: u32,
    workspace_json: &str,
    config_yaml: Option<&str>,
) -> PathBuf {
    let mut files = vec![(".svc/workspace.json", workspace_json)];
    files.extend(config_yaml.map(|y| (".svc/config.yaml", y)));
    w.project_owned(name, uid, &files)
}

#[test]
fn workspace_up_shares_the_project_applies_its_egress_and_runs_its_hooks() {
    require_root();
    let w = World::start();
    let dir = project(
        &w,
        "proj",
        1000,
        r#"{"version":1,"lifecycle":{
            "onSetup":["echo setup-one; echo setup-err >&2","id -u > /workspace/guest-uid; touch /workspace/setup-ran; pwd > /workspace/cwd"],
            "onStart":["echo \"start $SVC_HOOK_PHASE\" >> /workspace/starts"],
            "onTeardown":["echo bye > /workspace/teardown-ran"]}}"#,
        Some("egress:\n  policy:\n    allowed.example.test:\n      paths: [\"/v1/**\"]\n"),
    );
    let up = w.workspace_up(p(&dir), "ws");
    let out = text(&up);
    assert!(
        up.status.success(),
        "workspace up failed:\n{out}\nsvcd:\n{}",
        w.svcd_log()
    );
    // Streamed as it ran, in order.
    let order = [
        "▸ onSetup[0] echo setup-one",
        "│ setup-one",
        "✓ onSetup[0]",
        "▸ onSetup[1]",
        "▸ onStart[0]",
        "● workspace ready",
        "workspace ws is ready",
    ];
    let mut at = 0;
    for want in order {
        let found = out[at..]
            .find(want)
            .unwrap_or_else(|| panic!("{want:?} missing or out of order in:\n{out}"));
        at += found + want.len();
    }
    assert!(
        out.contains("│ setup-err"),
        "stderr is streamed too:\n{out}"
    );

    // The project is shared: written by the guest's root, owned on the host by its owner.
    for f in ["setup-ran", "guest-uid", "starts", "cwd"] {
        let m = std::fs::metadata(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(
            (m.uid(), m.gid()),
            (1000, 1000),
            "{f} is the project owner's"
        );
    }
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect(f);
    assert_eq!(
        read("guest-uid").trim(),
        "0",
        "hooks run as the guest's root"
    );
    assert_eq!(read("cwd").trim(), "/workspace");
    assert_eq!(read("starts"), "start start\n");
    let s = w.show("ws");
    assert_eq!(s["workspace"]["state"], "ready", "{s}");
    assert_eq!(s["workspace"]["root"], p(&dir));
    assert!(
        s["live_mounts"]
            .to_string()
            .contains(&format!("{} -> /workspace", p(&dir))),
        "{s}"
    );

    // The project's egress section is in force: its host is allowed, its paths gate it.
    let curl = |path: &str| {
        w.sh(
            "ws",
            &format!("curl -sS -o /dev/null -w '%{{http_code}}' --max-time 10 https://allowed.example.test{path}"),
        )
    };
    let (rc, code, err) = curl("/v1/models");
    assert_eq!(
        (rc, code.as_str()),
        (0, "200"),
        "a path the policy allows: {err}"
    );
    let (_, code, _) = curl("/admin");
    assert_eq!(code, "403", "a path outside egress.policy paths");
    let rc = w.curl_rc("ws", "https://forbidden.example.test/");
    assert_ne!(rc, 0, "a host the project does not name stays closed");

    // Events: each hook started, ready once.
    assert_eq!(w.events("workspace.hook_started", "ws").len(), 3);
    assert_eq!(w.events("workspace.ready", "ws").len(), 1);
    assert!(w.events("workspace.hook_failed", "ws").is_empty());

    // The log keeps it all, as JSON lines.
    let log = w.svc_ok(&["workspace", "logs", "ws", "--json"]);
    let records: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let seqs: Vec<u64> = records.iter().filter_map(|r| r["seq"].as_u64()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "{log}");
    assert!(
        records.iter().any(|r| r["kind"] == "output"
            && r["stream"] == "stderr"
            && r["text"] == "setup-err"
            && r["hook"] == 0
            && r["phase"] == "setup"),
        "{log}"
    );
    assert_eq!(
        records
            .iter()
            .filter(|r| r["kind"] == "hook_finished")
            .count(),
        3,
        "{log}"
    );

    // A resume is a start: onStart again, ready again; onSetup not.
    w.svc_ok(&["sandbox", "pause", "ws"]);
    w.svc_ok(&["sandbox", "resume", "ws"]);
    let ready = w
        .events_until("workspace.ready", "ws", 100, |e| e.len() == 2)
        .len();
    assert_eq!(ready, 2, "workspace.ready after the resume");
    assert_eq!(read("starts"), "start start\nstart start\n");
    assert_eq!(w.events("workspace.hook_started", "ws").len(), 4);

    // Down: onTeardown runs (shown), then the sandbox goes.
    let down = w.svc(&["workspace", "down", "ws"]);
    let out = text(&down);
    assert!(down.status.success(), "{out}");
    assert!(
        out.contains("▸ onTeardown[0]") && out.contains("destroyed ws"),
        "{out}"
    );
    assert_eq!(read("teardown-ran"), "bye\n");
    assert!(
        !w.svc(&["sandbox", "show", "ws"]).status.success(),
        "ws is gone"
    );
    // The project itself stays, with what the hooks wrote.
    assert!(dir.join(".svc/workspace.json").exists());
}

#[test]
fn a_failing_hook_stops_its_phase_a_slow_one_is_killed_and_unsafe_directories_are_refused() {
    require_root();
    let w = World::start();

    // onSetup[1] fails: onSetup[2] and onStart do not run; the sandbox stays up.
    let dir = project(
        &w,
        "failing",
        0,
        r#"{"version":1,"lifecycle":{
            "onSetup":["echo one","echo boom >&2; exit 3","touch /workspace/never"],
            "onStart":["touch /workspace/never-start"]}}"#,
        None,
    );
    let up = w.workspace_up(p(&dir), "failing");
    let out = text(&up);
    assert_eq!(up.status.code(), Some(1), "{out}");
    assert!(
        out.contains(r#"onSetup[1] "echo boom >&2; exit 3" exited with 3"#),
        "the failure names the hook, its command and its exit code:\n{out}"
    );
    assert!(out.contains("│ boom"), "{out}");
    assert!(out.contains("svc workspace down failing"), "{out}");
    assert!(
        !dir.join("never").exists(),
        "the rest of onSetup did not run"
    );
    assert!(!dir.join("never-start").exists(), "onStart did not run");
    let s = w.show("failing");
    assert_eq!(s["state"], "running", "the sandbox stays up: {s}");
    assert_eq!(s["workspace"]["state"], "failed");
    let failed = w.events("workspace.hook_failed", "failing");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["detail"]["exit_code"], 3);
    assert_eq!(failed[0]["detail"]["phase"], "setup");
    assert!(w.events("workspace.ready", "failing").is_empty());
    assert_eq!(w.sh("failing", "echo still-here").1.trim(), "still-here");
    w.svc_ok(&["workspace", "down", "failing"]);

    // A hook past lifecycle.timeoutMs is killed, the children it started too.
    let dir = project(
        &w,
        "slow",
        0,
        r#"{"version":1,"lifecycle":{"timeoutMs":1500,
            "onSetup":["sleep 301 & sleep 302; echo never"]}}"#,
        None,
    );
    let up = w.workspace_up(p(&dir), "slow");
    let out = text(&up);
    assert_eq!(up.status.code(), Some(1), "{out}");
    assert!(out.contains("timed out after 1500 ms"), "{out}");
    assert!(!out.contains("│ never"), "{out}");
    let (_, ps, _) = w.sh("slow", "ps -eo args");
    assert!(
        !ps.contains("sleep 301") && !ps.contains("sleep 302"),
        "the hook's processes are gone:\n{ps}"
    );
    w.svc_ok(&["workspace", "down", "slow"]);

    // Configuration: an unknown capability (exit 78, nothing made).
    let dir = project(
        &w,
        "caps",
        0,
        r#"{"version":1,"capabilities":{"required":["gpu.cuda"]}}"#,
        None,
    );
    let up = w.svc(&["workspace", "up", "--trust", p(&dir), "--name", "caps"]);
    assert_eq!(up.status.code(), Some(78), "{}", text(&up));
    assert!(text(&up).contains("gpu.cuda"), "{}", text(&up));
    assert_eq!(
        w.svc_ok(&["sandbox", "list", "--json"]).trim(),
        "[]",
        "nothing was made"
    );

    // Directories nobody may share, whoever asks.
    for (bad, says) in [("/etc", "system directory"), ("/", "system directory")] {
        let up = w.workspace_up(bad, "bad");
        assert_eq!(up.status.code(), Some(1), "{bad}: {}", text(&up));
        assert!(text(&up).contains(says), "{bad}: {}", text(&up));
    }
    // A member of the API group may share only a directory of its own.
    let rootowned = project(&w, "rootowned", 0, r#"{"version":1}"#, None);
    let mine = project(&w, "mine", 65534, r#"{"version":1}"#, None);
    let ids = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    let up = w.svc_as(&ids, &World::workspace_up_args(p(&rootowned), "notmine"));
    assert_eq!(up.status.code(), Some(1), "{}", text(&up));
    assert!(
        text(&up).contains("is owned by uid 0, not by you (uid 65534)"),
        "{}",
        text(&up)
    );
    let up = w.svc_as(&ids, &World::workspace_up_args(p(&mine), "mine"));
    assert!(
        up.status.success(),
        "{}\nsvcd:\n{}",
        text(&up),
        w.svcd_log()
    );
    // The mount is nosuid and nodev: a set-uid file or a device the guest makes there is
    // inert, in the guest and for the host user.
    let (_, mounts, _) = w.sh("mine", "grep ' /workspace ' /proc/self/mounts");
    assert!(
        mounts.contains("nosuid") && mounts.contains("nodev"),
        "{mounts}"
    );
    // The shared project is no way out: no device nodes, no hard links to the guest's own
    // files, no unmounting or bind-mounting over it.
    for (attempt, script) in [
        ("mknod", "mknod /workspace/mem c 1 1"),
        ("hard link", "ln /etc/passwd /workspace/passwd-link"),
        ("umount", "umount /workspace"),
        (
            "bind mount",
            "mkdir -p /workspace/b && mount --bind / /workspace/b",
        ),
    ] {
        let (code, _, _) = w.sh("mine", script);
        assert_ne!(code, 0, "{attempt} through the shared project succeeded");
    }
    assert!(!mine.join("mem").exists() && !mine.join("passwd-link").exists());
    let (_, count, _) = w.sh("mine", "grep -c ' /workspace ' /proc/self/mounts");
    assert_eq!(count, "1\n", "the project mount is still the one svcd made");
    w.svc_ok(&["workspace", "down", "mine"]);
    assert_eq!(w.svc_ok(&["sandbox", "list", "--json"]).trim(), "[]");
}

/// The log's records of `name` (JSON lines of `svc workspace logs --json`).
fn log_records(w: &World, name: &str) -> Vec<serde_json::Value> {
    w.svc_ok(&["workspace", "logs", name, "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Milliseconds since the epoch of an RFC 3339 time with milliseconds.
fn ms_of(t: &serde_json::Value) -> i64 {
    let t = t.as_str().expect("a time");
    let out = std::process::Command::new("date")
        .args(["-u", "-d", t, "+%s%3N"])
        .output()
        .expect("date");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("time {t:?}"))
}

#[test]
fn services_are_supervised_restarted_and_waited_for() {
    require_root();
    let w = World::start();
    let dir = project(
        &w,
        "svcs",
        0,
        r#"{"version":1,
            "services":{
              "defaults":{"maxRestarts":2,"restartDelayMs":400,"stopTimeoutMs":3000},
              "definitions":{
                "web":{"command":"exec python3 -m http.server 8000 --bind 127.0.0.1",
                       "healthCheck":{"command":"curl -sf -o /dev/null http://127.0.0.1:8000/","intervalMs":200}},
                "crash":{"command":"echo crashing; exit 7"},
                "slowdb":{"command":"sleep 1.5; touch /tmp/db-ready; exec sleep 1000",
                          "healthCheck":{"command":"test -e /tmp/db-ready","intervalMs":100}}}},
            "readiness":{"profiles":{
              "default":[{"name":"http","type":"service","serviceName":"web"},
                         {"name":"db","type":"service","serviceName":"slowdb"}],
              "broken":[{"name":"c","type":"service","serviceName":"crash"}]}}}"#,
        None,
    );
    let up = w.workspace_up(p(&dir), "svcs");
    let out = text(&up);
    assert!(up.status.success(), "{out}\nsvcd:\n{}", w.svcd_log());
    assert!(
        out.contains("▸ service web started") && out.contains("✓ service slowdb healthy"),
        "{out}"
    );

    // Ready once, and only after the profile's services were healthy.
    let all: Vec<serde_json::Value> = w
        .svc_ok(&["events", "--json"])
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|e: &serde_json::Value| e["sandbox"] == "svcs")
        .collect();
    let seq_of = |kind: &str, service: Option<&str>| {
        all.iter()
            .find(|e| e["kind"] == kind && service.is_none_or(|s| e["detail"]["service"] == s))
            .and_then(|e| e["seq"].as_i64())
            .unwrap_or_else(|| panic!("no {kind} {service:?} in {all:?}"))
    };
    let ready = seq_of("workspace.ready", None);
    assert!(seq_of("workspace.service_healthy", Some("slowdb")) < ready);
    assert!(seq_of("workspace.service_healthy", Some("web")) < ready);
    assert_eq!(w.events("workspace.ready", "svcs").len(), 1);
    assert_eq!(
        w.events("workspace.ready", "svcs")[0]["detail"]["profile"],
        "default"
    );
    assert_eq!(
        w.sh(
            "svcs",
            "curl -sf -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/"
        )
        .1,
        "200"
    );

    // The crashing service: restarted maxRestarts (2) times, restartDelayMs apart, then failed.
    let failed = w.events_until("workspace.service_failed", "svcs", 100, |e| !e.is_empty());
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["detail"]["service"], "crash");
    assert_eq!(failed[0]["detail"]["exit_code"], 7);
    assert_eq!(failed[0]["detail"]["restarts"], 2);
    let restarted = w.events("workspace.service_restarted", "svcs");
    assert_eq!(restarted.len(), 2, "{restarted:?}");
    let log = log_records(&w, "svcs");
    let crash: Vec<&serde_json::Value> = log.iter().filter(|r| r["service"] == "crash").collect();
    let kinds: Vec<&str> = crash
        .iter()
        .filter(|r| r["kind"] != "output")
        .filter_map(|r| r["kind"].as_str())
        .collect();
    assert_eq!(
        kinds,
        [
            "service_started",
            "service_exited",
            "service_restarting",
            "service_started",
            "service_exited",
            "service_restarting",
            "service_started",
            "service_exited",
            "service_failed"
        ]
    );
    let times = |kind: &str| -> Vec<i64> {
        crash
            .iter()
            .filter(|r| r["kind"] == kind)
            .map(|r| ms_of(&r["time"]))
            .collect()
    };
    // The supervisor says it waits restartDelayMs before each restart...
    for r in &restarted {
        assert_eq!(r["detail"]["delay_ms"], 400, "{r}");
    }
    // ...and it does: svcd stamps each record as its report arrives, so a report delivered
    // late (a loaded host) shortens the measured gap by its delay; 100 ms is allowed for that,
    // while a restart without the delay would come within a few milliseconds.
    let (exits, starts) = (times("service_exited"), times("service_started"));
    for i in 0..2 {
        let gap = starts[i + 1] - exits[i];
        assert!(
            gap >= 300,
            "restart {} came {gap} ms after the exit (restartDelayMs 400)",
            i + 1
        );
    }
    assert_eq!(
        crash
            .iter()
            .filter(|r| r["kind"] == "output" && r["text"] == "crashing")
            .count(),
        3
    );
    // Not in the profile: the workspace stays ready.
    assert_eq!(w.show("svcs")["workspace"]["state"], "ready");

    // A profile that needs the crashing service fails the workspace, naming it.
    let up = w.svc(
        &[
            &World::workspace_up_args(p(&dir), "svcs2")[..],
            &["--profile", "broken"],
        ]
        .concat(),
    );
    let out = text(&up);
    assert_eq!(up.status.code(), Some(1), "{out}");
    assert!(
        out.contains("service crash failed: exited with 7 after 2 restart(s)"),
        "{out}"
    );
    assert_eq!(w.show("svcs2")["workspace"]["state"], "failed");
    let up = w.svc(&[
        "workspace",
        "up",
        "--trust",
        p(&dir),
        "--name",
        "svcs3",
        "--profile",
        "nope",
    ]);
    assert_eq!(up.status.code(), Some(2), "{}", text(&up));
    assert!(
        text(&up).contains("has no such readiness profile (it has: broken, default)"),
        "{}",
        text(&up)
    );

    // Down stops the services (SIGTERM; web goes at once), shown as it happens.
    let down = w.svc(&["workspace", "down", "svcs"]);
    let out = text(&down);
    assert!(down.status.success(), "{out}");
    assert!(
        out.contains("■ service web stopped") && out.contains("■ service slowdb stopped"),
        "{out}"
    );
    w.svc_ok(&["workspace", "down", "svcs2"]);
    assert_eq!(w.svc_ok(&["sandbox", "list", "--json"]).trim(), "[]");
}

#[test]
fn spotlight_forwards_exactly_the_published_ports_through_the_guest() {
    require_root();
    let w = World::start();
    // No workspace.json: the compose file's published ports, in three syntaxes; `expose` and
    // a service of an inactive profile are not published.
    let dir = w.dir.join("composeproj");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join("docker-compose.yml"),
        "services:\n  web:\n    image: example/web\n    ports:\n      - \"18081:8001\"\n      - target: 8002\n        published: \"18082\"\n        host_ip: 127.0.0.1\n      - \"127.0.0.1:18083:8003/tcp\"\n    expose: [\"8004\"]\n  debug:\n    image: example/debug\n    profiles: [debug]\n    ports: [\"18085:8005\"]\n",
    )
    .expect("compose file");
    let up = w.workspace_up(p(&dir), "spot");
    let out = text(&up);
    assert!(up.status.success(), "{out}\nsvcd:\n{}", w.svcd_log());
    for f in [
        "127.0.0.1:18081 -> web:8001",
        "127.0.0.1:18082 -> web:8002",
        "127.0.0.1:18083 -> web:8003",
    ] {
        assert!(out.contains(&format!("forward: {f}")), "{f} in:\n{out}");
    }
    let opened = w.events("workspace.forward_opened", "spot");
    let mut ports: Vec<u64> = opened
        .iter()
        .filter_map(|e| e["detail"]["local_port"].as_u64())
        .collect();
    ports.sort_unstable();
    assert_eq!(ports, [18081, 18082, 18083], "{opened:?}");

    // Servers inside the sandbox, on its own loopback only.
    let (rc, _, err) = w.sh(
        "spot",
        "for p in 8001 8002 8003 8004 8005; do mkdir -p /tmp/s$p && echo port-$p > /tmp/s$p/index.html && \
         (cd /tmp/s$p && setsid nohup python3 -m http.server $p --bind 127.0.0.1 >/dev/null 2>&1 &); done; \
         for i in $(seq 100); do curl -sf http://127.0.0.1:8005/ >/dev/null && exit 0; sleep 0.1; done; exit 1",
    );
    assert_eq!(rc, 0, "servers in the sandbox: {err}");
    let host_curl = |port: u16| {
        let o = w.host.exec(
            "curl",
            &[
                "-sS",
                "--max-time",
                "10",
                &format!("http://127.0.0.1:{port}/index.html"),
            ],
        );
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        )
    };
    for (local, remote) in [(18081, 8001), (18082, 8002), (18083, 8003)] {
        assert_eq!(
            host_curl(local),
            (true, format!("port-{remote}")),
            "through {local}"
        );
    }
    // Several connections at once through one forward.
    let many: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn({
                let host = w.host.name.clone();
                move || {
                    std::process::Command::new("ip")
                        .args([
                            "netns",
                            "exec",
                            &host,
                            "curl",
                            "-sS",
                            "--max-time",
                            "10",
                            "http://127.0.0.1:18082/index.html",
                        ])
                        .output()
                        .expect("curl")
                }
            })
        })
        .collect();
    for t in many {
        let o = t.join().expect("thread");
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "port-8002");
    }
    for port in [18084, 18085, 8004] {
        assert!(!host_curl(port).0, "port {port} is not forwarded");
    }
    // The perimeter is unchanged: the guest still reaches nothing it was not allowed.
    let rc = w.curl_rc("spot", "https://forbidden.example.test/");
    assert_ne!(rc, 0);
    w.svc_ok(&["workspace", "down", "spot"]);
    let listening = w.host.exec(
        "ss",
        &[
            "-Hltn", "sport", ">=", ":18081", "and", "sport", "<=", ":18083",
        ],
    );
    assert_eq!(
        String::from_utf8_lossy(&listening.stdout).trim(),
        "",
        "the forwards' ports are free again with the sandbox gone"
    );

    // A local port in use: refused before anything is made, naming who holds it.
    let mut holder = std::process::Command::new("ip")
        .args([
            "netns", "exec", &w.host.name, "python3", "-c",
            "import socket,time; s=socket.socket(); s.bind(('127.0.0.1',18090)); s.listen(); time.sleep(60)",
        ])
        .spawn()
        .expect("holder");
    svc_tests::wait_tcp(Some(&w.host.name), "127.0.0.1", 18090, "the port holder");
    let busy = project(
        &w,
        "busy",
        0,
        r#"{"version":1,"spotlight":{"defaults":[{"service":"web","remotePort":8000,"localPort":18090}]}}"#,
        None,
    );
    let up = w.workspace_up(p(&busy), "busy");
    let _ = holder.kill();
    let _ = holder.wait();
    let out = text(&up);
    assert_eq!(up.status.code(), Some(1), "{out}");
    assert!(
        out.contains("local port 18090 (for web:8000) is in use by pid")
            && out.contains("(python3)"),
        "{out}"
    );
    assert_eq!(w.svc_ok(&["sandbox", "list", "--json"]).trim(), "[]");
}

#[test]
fn auth_defaults_give_git_an_identity_a_placeholder_credential_and_no_ssh_unless_asked() {
    require_root();
    let w = World::start();
    let dir = project(
        &w,
        "authproj",
        0,
        r#"{"version":1,"auth":{"defaults":{"authProfiles":["gitconfig"],"gitCredentialMode":"host-helper","sshAgentForward":false}}}"#,
        None,
    );
    // The calling user's git identity (their ~/.gitconfig).
    let home = w.dir.join("home");
    std::fs::create_dir_all(&home).expect("home");
    std::fs::write(
        home.join(".gitconfig"),
        "[user]\n\tname = Dev Host\n\temail = dev@host.test\n",
    )
    .expect(".gitconfig");
    let up = w.svc_env(
        &[
            &World::workspace_up_args(p(&dir), "auth")[..],
            &["--repo", "acme/widget"],
        ]
        .concat(),
        &[("HOME", p(&home))],
    );
    assert!(
        up.status.success(),
        "{}\nsvcd:\n{}",
        text(&up),
        w.svcd_log()
    );

    let (_, ident, _) = w.sh(
        "auth",
        "cd /tmp && git config user.name && git config user.email",
    );
    assert_eq!(ident, "Dev Host\ndev@host.test\n");
    // HTTPS git to the code host: the placeholder header, swapped for the real token on the
    // wire; the guest never sees the token.
    let (rc, out, err) = w.sh(
        "auth",
        "cd /tmp && git clone -q https://code.test/acme/widget.git && cat widget/README && \
         test \"$(git config --get http.https://code.test/.extraheader)\" = \"Authorization: Bearer $CODE_HOST_TOKEN\" && echo header-is-the-placeholder",
    );
    assert_eq!(rc, 0, "{out}{err}");
    assert!(
        out.contains("acme/widget") && out.contains("header-is-the-placeholder"),
        "{out}"
    );
    let git_requests: Vec<serde_json::Value> = w
        .received()
        .into_iter()
        .filter(|r| r["kind"] == "http" && r["host"] == "code.test")
        .collect();
    assert!(!git_requests.is_empty(), "the clone reached the code host");
    for r in &git_requests {
        assert_eq!(
            r["authorization"],
            format!("Bearer {}", svc_tests::world::CODE_TOKEN),
            "the code host got the real token: {r}"
        );
    }
    let (_, everything, _) = w.sh("auth", "env; git config --list");
    assert!(
        !everything.contains(svc_tests::world::CODE_TOKEN),
        "the real token is in the guest"
    );
    // sshAgentForward false: the relay refuses the sandbox's git over SSH, saying why.
    let (rc, _, err) = w.sh("auth", "git ls-remote ssh://git@code.test/acme/widget.git");
    assert_ne!(rc, 0);
    assert!(
        err.contains("auth.defaults.sshAgentForward is false"),
        "{err}"
    );
    w.svc_ok(&["workspace", "down", "auth"]);
}

#[test]
fn doctor_runs_the_workspaces_checks_inside_its_sandbox() {
    require_root();
    let w = World::start();
    let dir = project(
        &w,
        "doc",
        0,
        r#"{"version":1,"doctor":{
            "probes":[
              {"name":"in-sandbox","command":"test","args":["-e","/workspace/.svc/workspace.json"],"required":true},
              {"name":"its-env","command":"sh","args":["-c","test \"$SVC_SANDBOX\" = doc"],"required":true}],
            "tests":[
              {"name":"flaky","command":"sh","args":["-c","n=$(cat /tmp/n 2>/dev/null || echo 0); echo $((n+1)) > /tmp/n; echo try $n; [ $n -ge 1 ]"],"retries":1},
              {"name":"missing","command":"no-such-tool"},
              {"name":"slow","command":"sh","args":["-c","sleep 301 & sleep 302"],"timeoutMs":1500,"required":true}]}}"#,
        None,
    );
    w.workspace_up_ok(p(&dir), "doc");
    let report = w.dir.join("doctor.json");
    let out = w.svc(&[
        "doctor",
        p(&dir),
        "--sandbox",
        "doc",
        "--no-host",
        "--report-json",
        p(&report),
    ]);
    let shown = text(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a required test timed out:\n{shown}"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("report")).expect("json");
    let schema = svc_control::doctor::schema();
    let validator = jsonschema::validator_for(&serde_json::to_value(&schema).expect("schema"))
        .expect("the schema compiles");
    assert!(validator.is_valid(&r), "the report fits its schema: {r}");
    let by = |n: &str| {
        r["results"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["name"] == n))
            .cloned()
            .unwrap_or_else(|| panic!("no {n} in {r}"))
    };
    assert_eq!(by("in-sandbox")["status"], "passed", "{shown}");
    assert_eq!(by("its-env")["status"], "passed", "{shown}");
    assert_eq!(
        (
            by("flaky")["status"].clone(),
            by("flaky")["attempts"].clone()
        ),
        ("passed".into(), 2.into())
    );
    assert_eq!(by("missing")["status"], "failed");
    assert!(
        by("missing")["reason"]
            .as_str()
            .unwrap_or("")
            .contains("not found"),
        "{shown}"
    );
    assert_eq!(by("slow")["status"], "timed_out", "{shown}");
    assert_eq!(by("slow")["phase"], "test");
    let (_, ps, _) = w.sh("doc", "ps -eo args");
    assert!(
        !ps.contains("sleep 301") && !ps.contains("sleep 302"),
        "{ps}"
    );
    // On the host the same probe fails: it did run in the sandbox.
    let host = w.svc(&["doctor", p(&dir), "--no-host", "--json"]);
    assert_eq!(host.status.code(), Some(1), "{}", text(&host));
    assert!(
        text(&host).contains("\"skipped\""),
        "tests skipped after the failed probe: {}",
        text(&host)
    );
    w.svc_ok(&["workspace", "down", "doc"]);
}
