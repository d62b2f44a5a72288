//! Live allowlist changes with real traffic (`svc sandbox allow`): a host added works from the
//! next DNS question; a host removed stops at once — a loop hitting it never succeeds after the
//! change returns, a kept-alive connection to it is cut — and the change survives an svcd
//! restart, is audited and announced, and two callers at once end in one consistent list.
//! Two allowed names that share an address (behind one load balancer) keep each other's ports
//! open, and removing one closes its port alone — and ends whatever the guest still holds to
//! the removed one (HTTP/2 and HTTP/1.1 streams, plain HTTP, WebSockets).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, SystemTime},
};

use svc_tests::{
    project::text,
    require_root,
    world::{World, workspace_bin},
};

/// `svc …` against the svcd at `socket` (callable from any thread).
fn svc_at(socket: &Path, args: &[&str]) -> Output {
    Command::new(workspace_bin("svc"))
        .args(args)
        .env("SVC_SOCKET", socket)
        .output()
        .expect("svc")
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .expect("clock")
        .as_nanos()
}

fn curl(w: &World, url: &str) -> i32 {
    w.curl_rc("live", url)
}

/// A keep-alive connection: one request, then (once `/tmp/go` exists) a second on the same
/// connection; prints what each got.
const KEEP_ALIVE: &str = r#"
import http.client, os, time
c = http.client.HTTPSConnection("allowed.example.test", timeout=10)
c.request("GET", "/ka1"); r = c.getresponse(); r.read()
print("first", r.status, flush=True)
open("/tmp/ka-first", "w").close()
for _ in range(400):
    if os.path.exists("/tmp/go"): break
    time.sleep(0.05)
try:
    c.request("GET", "/ka2"); r = c.getresponse(); r.read()
    print("second", r.status, flush=True)
except Exception as e:
    print("second", type(e).__name__, flush=True)
"#;

#[test]
fn a_running_sandboxs_allowlist_changes_live() {
    require_root();
    let mut w = World::start();
    w.sandbox_allowing("live", &["allowed.example.test"]);
    assert_eq!(curl(&w, "https://allowed.example.test/"), 0);
    assert_ne!(curl(&w, "https://forbidden.example.test/"), 0);

    // Adding: usable from the next question; new execs get its placeholder.
    let v: serde_json::Value = serde_json::from_str(&w.svc_ok(&[
        "sandbox",
        "allow",
        "live",
        "--add-host",
        "forbidden.example.test",
        "--json",
    ]))
    .expect("json");
    assert_eq!(v["policy_generation"], 1, "{v}");
    assert!(
        v["allowed_hosts"]
            .to_string()
            .contains("forbidden.example.test"),
        "{v}"
    );
    assert_eq!(curl(&w, "https://forbidden.example.test/"), 0);
    let (_, env, _) = w.sh("live", "env");
    assert!(
        env.contains("SVC_CRED_FORBIDDEN_EXAMPLE_TEST_TOKEN="),
        "{env}"
    );

    // Removing, under load: a loop and a kept-alive connection to the host.
    std::fs::write(w.dir.join("ka.py"), KEEP_ALIVE).expect("script");
    let socket: PathBuf = w.socket.clone();
    let returned = std::thread::scope(|s| {
        let keep_alive = s.spawn(|| {
            svc_at(
                &socket,
                &["sandbox", "exec", "live", "--", "python3", "-c", KEEP_ALIVE],
            )
        });
        let looping = s.spawn(|| {
            svc_at(
                &socket,
                &[
                    "sandbox",
                    "exec",
                    "live",
                    "--",
                    "sh",
                    "-c",
                    "for i in $(seq 40); do t=$(date +%s%N); c=$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 https://allowed.example.test/loop); echo \"$c $t\"; sleep 0.1; done",
                ],
            )
        });
        // The kept-alive connection has made its first request, the loop has succeeded.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while w.sh("live", "test -e /tmp/ka-first").0 != 0 {
            assert!(std::time::Instant::now() < deadline, "no first request");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(500));
        let out = svc_at(
            &socket,
            &[
                "sandbox",
                "allow",
                "live",
                "--remove-host",
                "allowed.example.test",
            ],
        );
        let returned = now_ns();
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(w.sh("live", "touch /tmp/go").0, 0);
        let ka = keep_alive.join().expect("keep-alive");
        let lp = looping.join().expect("loop");
        (returned, ka, lp)
    });
    let (returned, ka, lp) = returned;
    let ka = String::from_utf8_lossy(&ka.stdout).into_owned();
    assert!(ka.contains("first 200"), "{ka}");
    assert!(
        !ka.contains("second 200"),
        "a kept-alive connection reached a removed host: {ka}"
    );
    let lines = String::from_utf8_lossy(&lp.stdout).into_owned();
    let results: Vec<(String, u128)> = lines
        .lines()
        .filter_map(|l| {
            let (code, t) = l.split_once(' ')?;
            Some((code.to_owned(), t.parse().ok()?))
        })
        .collect();
    assert!(
        results.iter().any(|(c, t)| c == "200" && *t < returned),
        "the loop never succeeded before the change: {lines}"
    );
    assert!(
        results.iter().any(|(_, t)| *t > returned),
        "the loop did not run past the change: {lines}"
    );
    for (code, t) in &results {
        assert!(
            !(code == "200" && *t > returned),
            "a request begun after the change returned succeeded: {lines}"
        );
    }

    // The guest's cached answer for it no longer works either: its address left the fence.
    assert_ne!(
        curl(
            &w,
            "--resolve allowed.example.test:443:192.0.2.20 https://allowed.example.test/cached"
        ),
        0,
        "the removed host's address is still reachable"
    );

    // Refusals name what cannot change here.
    let out = w.svc(&[
        "sandbox",
        "allow",
        "live",
        "--remove-host",
        "api.agent.test",
    ]);
    assert!(!out.status.success());
    assert!(text(&out).contains("built-in hosts"), "{}", text(&out));
    let out = w.svc(&["sandbox", "allow", "live", "--add-host", "bad host"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("bad host"), "{}", text(&out));

    // Two callers at once: both changes land, one after the other.
    std::thread::scope(|s| {
        let a = s.spawn(|| {
            svc_at(
                &socket,
                &["sandbox", "allow", "live", "--add-host", "one.example.test"],
            )
        });
        let b = s.spawn(|| {
            svc_at(
                &socket,
                &["sandbox", "allow", "live", "--add-host", "two.example.test"],
            )
        });
        for o in [a.join().expect("a"), b.join().expect("b")] {
            assert!(o.status.success(), "{}", text(&o));
        }
    });
    let show = w.show("live");
    assert_eq!(show["policy_generation"], 4, "{show}");
    let hosts = show["allowed_hosts"].to_string();
    for h in [
        "one.example.test",
        "two.example.test",
        "forbidden.example.test",
    ] {
        assert!(hosts.contains(h), "{h} missing: {hosts}");
    }
    assert!(!hosts.contains("allowed.example.test"), "{hosts}");

    // An svcd restart keeps the list.
    w.kill_svcd();
    w.start_svcd();
    let show = w.show("live");
    assert_eq!(show["policy_generation"], 4, "{show}");
    assert!(
        !show["allowed_hosts"]
            .to_string()
            .contains("allowed.example.test")
    );
    assert_eq!(curl(&w, "https://forbidden.example.test/"), 0);
    assert_ne!(curl(&w, "https://allowed.example.test/"), 0);

    // Audited (who, what, generation) and announced.
    let changes: Vec<serde_json::Value> = w
        .audit()
        .into_iter()
        .filter(|r| r["layer"] == "policy")
        .collect();
    assert_eq!(changes.len(), 4, "{changes:?}");
    assert!(
        changes
            .iter()
            .any(|r| r["removed"][0] == "allowed.example.test"
                && r["generation"] == 2
                && r["by"] == "uid 0"),
        "{changes:?}"
    );
    let events = w.svc_ok(&["events", "--json"]);
    assert_eq!(
        events.matches("sandbox.policy_changed").count(),
        4,
        "{events}"
    );
    w.destroy_checked("live");
}

#[test]
fn an_allow_all_sandbox_has_no_allowlist_to_change() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "open", "--egress", "allow-all"]);
    let out = w.svc(&["sandbox", "allow", "open", "--add-host", "x.example.test"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("AllowAll mode"), "{}", text(&out));
    let out = w.svc(&["sandbox", "allow", "open"]);
    assert!(!out.status.success());
    assert!(text(&out).contains("--add-host"), "{}", text(&out));
    w.destroy_checked("open");
}

/// Connect to `host`:5432 from the guest and print what the server says first.
const DB_HELLO: &str = "import socket, sys\nc = socket.create_connection((sys.argv[1], 5432), timeout=5)\nprint(c.recv(16).decode().strip())";

#[test]
fn names_sharing_an_address_keep_each_others_ports_and_a_removal_closes_only_its_own() {
    require_root();
    let w = World::start();
    // db.example.test answers with allowed.example.test's address (192.0.2.20); a server on
    // 5432 there greets with "db".
    let listener = w
        .outside
        .run(|| std::net::TcpListener::bind("192.0.2.20:5432"))
        .expect("listen on 192.0.2.20:5432 in the outside world");
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let _ = std::io::Write::write_all(&mut &conn, b"db\n");
        }
    });
    w.sandbox_allowing("shared", &["allowed.example.test", "db.example.test:5432"]);
    let db = |target: &str| {
        w.sh(
            "shared",
            &format!("python3 -c '{}' {target}", DB_HELLO.replace('\'', "\"")),
        )
    };
    let web_without_dns = || {
        w.sh(
            "shared",
            "curl -sS -o /dev/null --max-time 5 --resolve allowed.example.test:443:192.0.2.20 https://allowed.example.test/kept",
        )
        .0
    };

    // The web name answered first, then the database name with the same address: the second
    // answer must not shut the first's ports, nor the first the second's.
    let (code, _, err) = w.sh(
        "shared",
        "curl -sS -o /dev/null --max-time 5 https://allowed.example.test/",
    );
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = db("db.example.test");
    assert_eq!((code, out.trim()), (0, "db"), "{err}");
    assert_eq!(
        web_without_dns(),
        0,
        "the database's answer shut the web ports"
    );
    let (code, out, err) = db("192.0.2.20");
    assert_eq!(
        (code, out.trim()),
        (0, "db"),
        "5432 without a new answer: {err}"
    );

    // The database name removed: its port closes at once, the web name's stay open.
    w.svc_ok(&[
        "sandbox",
        "allow",
        "shared",
        "--remove-host",
        "db.example.test:5432",
    ]);
    let (code, out, err) = db("192.0.2.20");
    assert_ne!(code, 0, "the removed name's port is still open: {out}{err}");
    assert_eq!(web_without_dns(), 0, "the kept name lost its ports");
    w.destroy_checked("shared");
}

/// A WebSocket client with nothing but the standard library: the handshake to
/// `allowed.example.test/ws-drip`, then every text frame appended to `/tmp/ws.out`; prints how
/// many came and how it ended (`close-frame`, `eof`, or the exception).
const WS_DRIP: &str = r#"
import base64, os, socket, ssl, sys
ctx = ssl.create_default_context()
s = ctx.wrap_socket(socket.create_connection(("allowed.example.test", 443), timeout=60),
                    server_hostname="allowed.example.test")
key = base64.b64encode(os.urandom(16)).decode()
s.sendall(("GET /ws-drip HTTP/1.1\r\nHost: allowed.example.test\r\nUpgrade: websocket\r\n"
           "Connection: Upgrade\r\nSec-WebSocket-Key: " + key + "\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
buf = b""
while b"\r\n\r\n" not in buf:
    d = s.recv(4096)
    if not d:
        print("handshake eof", flush=True); sys.exit(1)
    buf += d
head, buf = buf.split(b"\r\n\r\n", 1)
out = open("/tmp/ws.out", "w")
n, how = 0, "eof"
try:
    while True:
        while len(buf) >= 2:
            ln, off = buf[1] & 0x7F, 2
            if ln == 126:
                if len(buf) < 4: break
                ln, off = int.from_bytes(buf[2:4], "big"), 4
            if len(buf) < off + ln: break
            op, payload, buf = buf[0] & 0x0F, buf[off:off + ln], buf[off + ln:]
            if op == 8:
                raise StopIteration
            n += 1
            out.write(payload.decode()); out.flush()
        d = s.recv(4096)
        if not d: break
        buf += d
except StopIteration:
    how = "close-frame"
except Exception as e:
    how = type(e).__name__
print("ws", n, how, flush=True)
"#;

/// What the guest holds open to a host when a live change removes it is cut, however it is
/// held: an HTTP/2 stream, an HTTPS/1.1 response and a plain HTTP response still streaming, and
/// a relayed WebSocket. The removed name shares its address with a name still allowed (its
/// address stays in the fence, for the other name's port), so only the name can end them.
#[test]
fn a_removal_cuts_every_stream_and_tunnel_to_the_removed_host() {
    require_root();
    let w = World::start();
    w.sandbox_allowing("held", &["allowed.example.test", "db.example.test:5432"]);
    // Both names answered with 192.0.2.20.
    let (code, _, err) = w.sh(
        "held",
        "python3 -c 'import socket; print(socket.gethostbyname(\"db.example.test\"), socket.gethostbyname(\"allowed.example.test\"))'",
    );
    assert_eq!(code, 0, "{err}");
    std::fs::write(w.dir.join("ws.py"), WS_DRIP).expect("script");
    let drips = "rm -f /tmp/codes; \
        (curl -sS -N --http2 --max-time 60 -o /tmp/h2.out https://allowed.example.test/drip; echo \"h2 $?\" >> /tmp/codes) & \
        (curl -sS -N --http1.1 --max-time 60 -o /tmp/h1.out https://allowed.example.test/drip; echo \"h1 $?\" >> /tmp/codes) & \
        (curl -sS -N --max-time 60 -o /tmp/plain.out http://allowed.example.test/drip; echo \"plain $?\" >> /tmp/codes) & \
        (python3 -c \"$WS\" >> /tmp/codes 2>&1) & \
        wait; cat /tmp/codes";
    let socket: PathBuf = w.socket.clone();
    let lines = |file: &str| -> usize {
        w.sh("held", &format!("cat /tmp/{file} 2>/dev/null"))
            .1
            .lines()
            .count()
    };
    let (out, removed) = std::thread::scope(|s| {
        let held = s.spawn(|| {
            Command::new(workspace_bin("svc"))
                .args(["sandbox", "exec", "held", "--env"])
                .arg(format!("WS={WS_DRIP}"))
                .args(["--", "sh", "-c", drips])
                .env("SVC_SOCKET", &socket)
                .output()
                .expect("svc")
        });
        // Each has its first ticks.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while ["h2.out", "h1.out", "plain.out", "ws.out"]
            .iter()
            .any(|f| lines(f) < 3)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the streams did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let removed = svc_at(
            &socket,
            &[
                "sandbox",
                "allow",
                "held",
                "--remove-host",
                "allowed.example.test",
            ],
        );
        (held.join().expect("held"), removed)
    });
    assert!(removed.status.success(), "{}", text(&removed));
    let out = text(&out);
    // Each ended early (300 ticks would take 30 s), by a reset, not a timeout or a clean end.
    for kind in ["h2", "h1", "plain"] {
        let code = out
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{kind} ")))
            .unwrap_or_else(|| panic!("no exit code for {kind}: {out}"));
        assert!(
            code != "0" && code != "28",
            "{kind}: curl exited {code}, the stream was not cut: {out}"
        );
        let got = lines(&format!("{kind}.out"));
        assert!(got < 300, "{kind}: all {got} ticks arrived: {out}");
    }
    let ws = out
        .lines()
        .find(|l| l.starts_with("ws "))
        .unwrap_or_else(|| panic!("no WebSocket result: {out}"));
    assert!(
        !ws.ends_with("close-frame") && !ws.starts_with("ws 300"),
        "the WebSocket was not cut: {ws}"
    );
    // Audited: the connections cut by name, the WebSocket cut.
    let audit = w.audit();
    let cut = |method: &str| {
        audit.iter().any(|r| {
            r["layer"] == "http"
                && r["decision"] == "cut"
                && r["rule"] == "allowlist-change"
                && r["method"] == method
                && r["host"] == "allowed.example.test"
        })
    };
    assert!(cut("TLS") && cut("HTTP"), "{audit:?}");
    assert!(
        audit.iter().any(|r| r["upgrade"] == "websocket-cut"),
        "{audit:?}"
    );
    w.destroy_checked("held");
}
