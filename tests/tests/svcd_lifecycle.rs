//! svcd's own life: configuration refused before anything binds, crashes mid-create and
//! mid-destroy cleaned up at start, AllowAll windows restarted by a supervisor restart,
//! `supervisor-upgrade --force`, malformed API calls, `svc events --follow`, and a second svcd
//! on the same state refused before it touches anything.

use std::{
    io::{BufRead as _, Read as _, Write as _},
    os::unix::net::UnixStream,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use svc_control::store::Store;
use svc_tests::{
    require_root,
    world::{World, workspace_bin},
};

#[test]
fn bad_configuration_exits_78_before_binding_anything() {
    let dir = svc_tests::fresh_dir("svcfg");
    let config = dir.join("svcd.toml");
    let socket = dir.join("svcd.sock");
    std::fs::write(
        &config,
        format!(
            "socket = \"{}\"\nstate_dir = \"{}\"\n[proxy]\nport = 0\nextra = 1\n",
            socket.display(),
            dir.join("state").display()
        ),
    )
    .expect("write");
    let out = Command::new(workspace_bin("svcd"))
        .arg("--config")
        .arg(&config)
        .arg("run")
        .output()
        .expect("svcd");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("extra"), "names the unknown key: {err}");
    assert!(!socket.exists(), "nothing was bound");
    assert!(!dir.join("state").exists(), "no state was created");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_crash_mid_create_or_mid_destroy_is_cleaned_up_at_start() {
    require_root();
    let mut w = World::start();
    w.svc_ok(&["sandbox", "create", "keep"]);
    w.svc_ok(&["sandbox", "create", "dying"]);
    let dying = w.show("dying");
    w.kill_svcd();
    // What a crash leaves: a row still `creating` whose link was already made, and a row
    // marked `destroying` whose sandbox is still fully there.
    let mut store = Store::open(&w.dir.join("state")).expect("store");
    let id = store
        .reserve("half", "{}", "2026-01-01T00:00:00Z", 16_384)
        .expect("reserve");
    store.set_destroying("dying").expect("mark");
    drop(store);
    let half_link = format!("svc{id}");
    let out = w.host.exec(
        "ip",
        &[
            "link",
            "add",
            &half_link,
            "type",
            "veth",
            "peer",
            "name",
            &format!("{half_link}g"),
        ],
    );
    assert!(out.status.success());
    w.start_svcd();
    let list: Vec<Value> =
        serde_json::from_str(&w.svc_ok(&["sandbox", "list", "--json"])).expect("list");
    let names: Vec<&str> = list.iter().filter_map(|s| s["name"].as_str()).collect();
    assert_eq!(names, ["keep"], "{}", w.svcd_log());
    let links = w.host.exec("ip", &["-o", "link", "show"]);
    assert!(
        !String::from_utf8_lossy(&links.stdout).contains(&format!(" {half_link}")),
        "the half-built link was removed"
    );
    w.assert_gone(
        dying["id"].as_u64().expect("id") as u32,
        dying["link"].as_str().expect("link"),
        dying["pid"].as_u64().expect("pid") as u32,
        "dying",
    );
    assert_eq!(w.show("keep")["state"], "running");
    let code = w
        .svc(&["sandbox", "exec", "keep", "--", "true"])
        .status
        .code();
    assert_eq!(code, Some(0));
}

#[test]
fn allow_all_is_open_for_its_window_and_a_restart_restarts_the_window() {
    require_root();
    let mut w = World::start();
    w.svc_ok(&["sandbox", "create", "--egress", "allow-all", "open"]);
    let before = w.show("open");
    assert_eq!(before["mode"], "allow-all");
    assert!(
        before["placeholders"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    );
    let env = w.svc_ok(&["sandbox", "exec", "open", "--", "env"]);
    assert!(
        !env.contains("_TOKEN="),
        "AllowAll seeds no credentials: {env}"
    );
    // `curl ARGS… URL` inside the sandbox: (succeeded, stderr).
    let curl = |args: &[&str], url: &str| {
        let mut all = vec!["sandbox", "exec", "open", "--", "curl"];
        all.extend_from_slice(args);
        all.push(url);
        let out = w.svc(&all);
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // Any outside address, even one no allowlist names (no proxy: TLS from the server itself).
    let (ok, err) = curl(&["-sSk", "--max-time", "5"], "https://192.0.2.66/");
    assert!(ok, "allow-all reaches the outside: {err}");
    // Any name resolves through the guard (no allowlist in AllowAll), and is reachable.
    let (ok, err) = curl(
        &["-sSk", "--max-time", "5"],
        "https://forbidden.example.test/",
    );
    assert!(ok, "allow-all resolves and reaches any name: {err}");
    // Never the host itself.
    let (ok, _) = curl(
        &["-sS", "--connect-timeout", "2"],
        "http://192.0.2.1:15443/",
    );
    assert!(!ok, "a host address was reachable");

    let ends = |v: &Value| {
        humantime::parse_rfc3339(v["window_ends"].as_str().expect("window_ends")).expect("rfc3339")
    };
    let first = ends(&before);
    let hours = first
        .duration_since(std::time::SystemTime::now())
        .expect("future")
        .as_secs_f64()
        / 3600.0;
    assert!((23.9..=24.0).contains(&hours), "24 h window, got {hours}");
    w.kill_svcd();
    std::thread::sleep(Duration::from_millis(1100));
    w.start_svcd();
    let after = w.show("open");
    assert_eq!(after["mode"], "allow-all");
    assert!(
        ends(&after) >= first + Duration::from_secs(1),
        "the window restarted from svcd's start"
    );
}

#[test]
fn supervisor_upgrade_re_executes_and_keeps_every_sandbox() {
    require_root();
    let w = World::start();
    w.sandbox_allowing("u", &["allowed.example.test"]);
    let before: Value = serde_json::from_str(&{
        let mut s = UnixStream::connect(&w.socket).expect("connect");
        s.write_all(b"GET /v1/health HTTP/1.1\r\nhost: svcd\r\nconnection: close\r\n\r\n")
            .expect("write");
        let mut r = String::new();
        s.read_to_string(&mut r).expect("read");
        r.split("\r\n\r\n").nth(1).unwrap_or("").to_owned()
    })
    .expect("health");
    let out = w.svc_ok(&["supervisor-upgrade", "--force"]);
    assert!(
        out.contains("svcd upgraded") && out.contains("1 sandboxes re-adopted"),
        "{out}"
    );
    assert_eq!(
        before["pid"].as_u64(),
        w.svcd_pid().map(u64::from),
        "the same process, re-executed"
    );
    let s = w.show("u");
    assert_eq!(s["state"], "running");
    let ok = w.svc(&[
        "sandbox",
        "exec",
        "u",
        "--",
        "curl",
        "-sS",
        "--max-time",
        "10",
        "https://allowed.example.test/",
    ]);
    assert!(ok.status.success(), "{}", w.svcd_log());
    let events = w.svc_ok(&["events", "--json"]);
    assert_eq!(events.matches("\"supervisor.started\"").count(), 2);
}

#[test]
fn a_second_svcd_on_the_same_state_stops_before_touching_anything() {
    require_root();
    let w = World::start();
    w.sandbox_allowing("one", &["allowed.example.test"]);
    let first = w.svcd_pid().expect("svcd's pid");
    let second = svc_tests::output_within(
        w.svcd_command().env("NO_COLOR", "1"),
        Duration::from_secs(20),
    )
    .expect("the second svcd ends by itself");
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("another svcd (pid {first}) is running")),
        "the refusal names the running svcd: {err}"
    );
    // The first is untouched: the same process, its sandbox served by its guard and proxy.
    assert_eq!(w.svcd_pid(), Some(first));
    let (code, out, stderr) = w.sh(
        "one",
        "curl -sS --max-time 10 https://allowed.example.test/after",
    );
    assert_eq!(code, 0, "{out}{stderr}\n{}", w.svcd_log());
    w.destroy_checked("one");
}

/// One raw HTTP/1.1 exchange on the API socket: (status, body).
fn raw(w: &World, request: &[u8]) -> (u16, String) {
    let mut s = UnixStream::connect(&w.socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let _ = s.write_all(request);
    let mut r = Vec::new();
    let _ = s.read_to_end(&mut r);
    let text = String::from_utf8_lossy(&r).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (
        status,
        text.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default(),
    )
}

fn post(path: &str, body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "POST {path} HTTP/1.1\r\nhost: svcd\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

#[test]
fn the_api_refuses_malformed_calls_and_keeps_serving() {
    require_root();
    let w = World::start();
    let get = |p: &str| format!("GET {p} HTTP/1.1\r\nhost: svcd\r\nconnection: close\r\n\r\n");
    let big = vec![b'x'; 2 * 1024 * 1024];
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        (
            "unknown_field",
            post("/v1/sandboxes", br#"{"name":"a","bogus":1}"#),
            400,
            "bogus",
        ),
        (
            "not_json",
            post("/v1/sandboxes", b"name=a"),
            400,
            "request body",
        ),
        ("too_large", post("/v1/sandboxes", &big), 413, "limit"),
        (
            "path_name",
            get("/v1/sandboxes/..%2Fx").into_bytes(),
            400,
            "contains",
        ),
        (
            "not_utf8_name",
            get("/v1/sandboxes/%FF%FE").into_bytes(),
            400,
            "contains",
        ),
        (
            "unicode_name",
            post("/v1/sandboxes", "{\"name\":\"caf\u{e9}\"}".as_bytes()),
            400,
            "contains",
        ),
        (
            "empty_exec",
            post("/v1/sandboxes/nope/exec", br#"{"argv":[]}"#),
            404,
            "no sandbox",
        ),
        (
            "unknown_route",
            get("/v1/nothing").into_bytes(),
            404,
            "no API route",
        ),
        (
            "old_version",
            get("/v0/health").into_bytes(),
            404,
            "speaks /v1",
        ),
        (
            "bad_query",
            get("/v1/events?after=yesterday").into_bytes(),
            400,
            "expected a number",
        ),
    ];
    for (name, request, status, fragment) in cases {
        let (got, body) = raw(&w, &request);
        assert_eq!(got, status, "{name}: {body}");
        let err: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert!(
            err["error"].as_str().is_some_and(|e| e.contains(fragment)),
            "{name}: expected {fragment:?} in {body}"
        );
        assert!(err["code"].is_string(), "{name}: {body}");
    }
    // Garbage that is not HTTP at all: the connection closes, svcd goes on.
    let _ = raw(&w, b"\x00\x01\x02 not http\r\n\r\n");
    let (ok, _) = raw(&w, get("/v1/health").as_bytes());
    assert_eq!(ok, 200);

    // A name that is not UTF-8 on the command line.
    use std::os::unix::ffi::OsStrExt as _;
    let out = Command::new(workspace_bin("svc"))
        .args(["sandbox", "create"])
        .arg(std::ffi::OsStr::from_bytes(b"\xff\xfe"))
        .env("SVC_SOCKET", &w.socket)
        .output()
        .expect("svc");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("UTF-8"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_sandbox_whose_processes_die_is_reported_dead_and_destroyable() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "gone"]);
    let s = w.show("gone");
    let pid = s["pid"].as_u64().expect("pid") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let events = w.svc_ok(&["events", "--json"]);
        if events.contains("\"sandbox.dead\"") {
            break;
        }
        assert!(Instant::now() < deadline, "no sandbox.dead event: {events}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(w.show("gone")["state"], "dead");
    w.svc_ok(&["sandbox", "destroy", "gone"]);
    w.assert_gone(
        s["id"].as_u64().expect("id") as u32,
        s["link"].as_str().expect("link"),
        pid as u32,
        "gone",
    );
}

#[test]
fn events_follow_streams_what_happens() {
    require_root();
    let w = World::start();
    let mut follow = Command::new(workspace_bin("svc"))
        .args(["events", "--follow", "--json"])
        .env("SVC_SOCKET", &w.socket)
        .stdout(Stdio::piped())
        .spawn()
        .expect("svc events");
    let stdout = follow.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if let Ok(v) = serde_json::from_str(&line)
                && tx.send(v).is_err()
            {
                break;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(300));
    w.svc_ok(&["sandbox", "create", "ev"]);
    w.svc_ok(&["sandbox", "destroy", "ev"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while seen.len() < 3 && Instant::now() < deadline {
        if let Ok(e) = rx.recv_timeout(Duration::from_millis(200))
            && e["sandbox"] == "ev"
        {
            seen.push(e["kind"].as_str().unwrap_or("").to_owned());
        }
    }
    let _ = follow.kill();
    let _ = follow.wait();
    assert_eq!(
        seen,
        ["sandbox.created", "workspace.ready", "sandbox.destroyed"]
    );
}
