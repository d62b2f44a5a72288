//! One guest at each of its `[limits]` caps, from a real container sandbox: a flood of
//! DNS-over-TCP connections, of proxy connections (upgraded WebSockets holding their slots),
//! of exec streams, of Spotlight streams (a host flooding a forwarded port), and of git relay
//! sessions. svcd's resident memory and open descriptors are sampled from /proc
//! throughout and held to a stated bound; another sandbox's DNS (UDP and TCP), HTTPS through
//! the proxy and exec work during the flood and after it; the flooding sandbox gets its
//! refusal on that channel only; `svc_guest_limit_hits_total` counts every refusal and svcd
//! logs the first of them once.
#![expect(clippy::expect_used, reason = "test helpers")]

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    time::Duration,
};

use svc_tests::{
    require_root, rss_kib,
    world::{CODE_SSH_ADDR, World},
};

/// The caps these tests run under (DNS over TCP keeps its default, 16).
const LIMITS: &str = "proxy_connections = 24\nexec_streams = 6\n";
const DNS_TCP_CAP: u64 = 16;
const PROXY_CAP: u64 = 24;
const EXEC_CAP: usize = 6;
/// The relay's cap keeps its default.
const GIT_SSH_CAP: u64 = 8;

/// svcd may grow by this much resident memory while one guest floods.
const RSS_BOUND_KIB: u64 = 64 * 1024;
/// Descriptors svcd may open beyond what the capped channel holds: the other sandbox's
/// checks (an exec, a proxy connection and its upstream, DNS), the API calls, the audit log.
const FD_SLACK: u64 = 48;

/// How long any one step may take before the test gives up with svcd's log.
const STEP: Duration = Duration::from_secs(120);

/// The guest's DNS server (its gateway: the fence sends port 53 to the guard) from Python.
const NAMESERVER: &str = r#"
def nameserver():
    for l in open("/etc/resolv.conf"):
        if l.startswith("nameserver"):
            return l.split()[1]
"#;

/// How many of `socks` their refusals closed, from Python: waited for until `expected` are
/// (a loaded host takes its time; 30 s at most), then a second more to see that no more are.
const REFUSED: &str = r#"
import select, time
def refused(socks, expected):
    p = select.poll()
    for s in socks:
        p.register(s, select.POLLIN)
    ended = set()
    deadline = time.time() + 30
    while len(ended) < expected and time.time() < deadline:
        for fd, _ in p.poll(500):
            ended.add(fd)
            p.unregister(fd)
    time.sleep(1)
    return len(ended) + len(p.poll(0))
"#;

/// The other sandbox's checks: a name over UDP and over TCP, HTTPS through the proxy. Prints
/// `udp ADDR`, `tcp RCODE ANSWERS`, `https STATUS`.
const CALM: &str = r#"
import socket, struct, urllib.request, urllib.error
q = struct.pack(">HHHHHH", 0x5356, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(p)]) + p.encode() for p in "api.agent.test".split(".")) + b"\0"
q += struct.pack(">HH", 1, 1)
print("udp", socket.gethostbyname("api.agent.test"), flush=True)
s = socket.create_connection((nameserver(), 53), timeout=20)
s.sendall(struct.pack(">H", len(q)) + q)
def exactly(n):
    b = b""
    while len(b) < n:
        d = s.recv(n - len(b))
        if not d:
            raise SystemExit("tcp eof")
        b += d
    return b
a = exactly(struct.unpack(">H", exactly(2))[0])
print("tcp", a[3] & 0xF, struct.unpack(">H", a[6:8])[0], flush=True)
try:
    status = urllib.request.urlopen("https://api.agent.test/", timeout=30).status
except urllib.error.HTTPError as e:
    status = e.code
print("https", status, flush=True)
"#;

/// The DNS flood: N TCP connections to the guest's DNS server, held; once all but CAP are
/// closed (or 30 s), how many svcd kept and how many it closed unread. Holds them 6 s more (the guard's idle timeout is
/// 10 s), then ends.
const DNS_FLOOD: &str = r#"
import socket, sys, time
N, CAP = int(sys.argv[1]), int(sys.argv[2])
ns = nameserver()
socks = []
for i in range(N):
    try:
        socks.append(socket.create_connection((ns, 53), timeout=20))
    except OSError as e:
        print("connection", i, e, file=sys.stderr, flush=True)
# The refusals beyond the cap.
closed = refused(socks, len(socks) - CAP)
print("opened %d kept %d closed %d" % (len(socks), len(socks) - closed, closed), flush=True)
time.sleep(6)
"#;

/// The proxy flood: W WebSockets to allowed.example.test/ws-hold (each answered 101 and kept
/// open), then E more connections to its port 443 that send nothing: once the refused ones are
/// closed (or 30 s), how many of those the proxy kept waiting and how many it closed. Holds the
/// WebSockets 6 s more.
const PROXY_FLOOD: &str = r#"
import base64, os, socket, ssl, sys, time
W, E = int(sys.argv[1]), int(sys.argv[2])
ctx = ssl.create_default_context()
# Resolved once: 224 lookups of A and AAAA would be over the guard's query burst.
at = socket.getaddrinfo("allowed.example.test", 443, socket.AF_INET, socket.SOCK_STREAM)[0][4]
ws = []
for i in range(W):
    try:
        s = ctx.wrap_socket(socket.create_connection(at, timeout=20),
                            server_hostname="allowed.example.test")
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(("GET /ws-hold HTTP/1.1\r\nHost: allowed.example.test\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Key: " + key +
                   "\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            d = s.recv(4096)
            if not d:
                break
            head += d
        if head.startswith(b"HTTP/1.1 101"):
            ws.append(s)
    except OSError as e:
        print("websocket", i, e, file=sys.stderr, flush=True)
extra = []
for i in range(E):
    try:
        extra.append(socket.create_connection(at, timeout=20))
    except OSError as e:
        print("extra", i, e, file=sys.stderr, flush=True)
# Each refusal closes its connection.
closed = refused(extra, len(extra))
print("websockets %d extra %d kept %d closed %d" % (len(ws), len(extra), len(extra) - closed,
      closed), flush=True)
time.sleep(6)
"#;

/// The relay flood: N sessions on the guest's relay socket, each asking the code host for
/// `git-upload-pack` and then holding its session without a word more (upload-pack waits for
/// the client's wants). Prints how many were refused naming the limit and how many got the
/// repository's advertisement.
const RELAY_FLOOD: &str = r#"
import json, select, socket, struct, sys, time
HOST, N = sys.argv[1], int(sys.argv[2])
def frame(kind, payload):
    return struct.pack(">IBI", 1, kind, len(payload)) + payload
req = json.dumps({"op": "git-ssh", "git_protocol": None,
    "args": ["root@" + HOST, "git-upload-pack 'acme/widget.git'"]}).encode()
socks = []
for i in range(N):
    s = socket.socket(socket.AF_UNIX)
    s.connect("/run/svc/git-ssh.sock")
    s.sendall(frame(2, req))
    socks.append(s)
said = {s: b"" for s in socks}
done = lambda b: b"limits.git_ssh_sessions" in b or b"refs/heads/" in b
open_ = list(socks)
deadline = time.time() + 60
while open_ and time.time() < deadline and not all(done(b) for b in said.values()):
    r, _, _ = select.select(open_, [], [], 1)
    for s in r:
        d = s.recv(65536)
        said[s] += d
        if not d:
            open_.remove(s)
print("refused %d advertised %d" % (sum(b"limits.git_ssh_sessions" in b for b in said.values()),
      sum(b"refs/heads/" in b for b in said.values())), flush=True)
time.sleep(4)
"#;

/// svcd's resident memory (KiB) and open descriptors, sampled every 20 ms until dropped.
struct Sampler {
    pid: u32,
    before: (u64, u64),
    peak: Arc<(AtomicU64, AtomicU64)>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

impl Sampler {
    fn start(pid: u32) -> Self {
        let before = (rss_kib(pid), fds(pid));
        let peak = Arc::new((AtomicU64::new(before.0), AtomicU64::new(before.1)));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (peak.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.0.fetch_max(rss_kib(pid), Ordering::Relaxed);
                p.1.fetch_max(fds(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Self {
            pid,
            before,
            peak,
            stop,
            thread: Some(thread),
        }
    }

    /// Stop, and check svcd stayed within `RSS_BOUND_KIB` and `fd_bound` more descriptors.
    fn check(mut self, what: &str, fd_bound: u64) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("sampler");
        }
        let peak = (
            self.peak.0.load(Ordering::Relaxed).max(rss_kib(self.pid)),
            self.peak.1.load(Ordering::Relaxed).max(fds(self.pid)),
        );
        println!(
            "{what}: svcd RSS {} -> peak {} KiB, descriptors {} -> peak {}",
            self.before.0, peak.0, self.before.1, peak.1
        );
        assert!(
            peak.0.saturating_sub(self.before.0) < RSS_BOUND_KIB,
            "{what}: svcd grew from {} KiB to {} KiB",
            self.before.0,
            peak.0
        );
        assert!(
            peak.1.saturating_sub(self.before.1) <= fd_bound,
            "{what}: svcd went from {} to {} open descriptors (bound: +{fd_bound})",
            self.before.1,
            peak.1
        );
    }
}

fn world() -> World {
    // The `[limits]` table follows the world's `[container]` lines.
    let w = World::start_with(&format!("\n[limits]\n{LIMITS}"));
    w.flood_and_calm();
    w
}

fn spawn_exec(w: &World, name: &str, script: &str) -> Child {
    w.sh_command(name, script)
        .spawn()
        .expect("svc sandbox exec")
}

/// A Python script in sandbox `name` (with `nameserver()` and `refused()` defined) as a
/// shell script.
fn python(script: &str, args: &str) -> String {
    format!(
        "cat > /tmp/s.py <<'EOF'\n{NAMESERVER}\n{REFUSED}\n{script}\nEOF\npython3 /tmp/s.py {args}"
    )
}

/// The first line `child` prints, or a failure with svcd's log after [`STEP`].
fn first_line(w: &World, child: &mut Child) -> String {
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(STEP)
        .unwrap_or_else(|_| panic!("no answer from the flood; svcd's log:\n{}", w.svcd_log()))
}

/// The other sandbox's DNS (UDP, TCP), HTTPS and exec work.
fn calm_works(w: &World, when: &str) {
    let out = svc_tests::output_within(&mut w.sh_command("calm", &python(CALM, "")), STEP)
        .unwrap_or_else(|e| panic!("another sandbox {when}: {e}; svcd's log:\n{}", w.svcd_log()));
    let said = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "another sandbox {when}: {said}{err}");
    assert!(said.contains("udp 192.0.2.10"), "UDP DNS {when}: {said}");
    assert!(said.contains("tcp 0 1"), "DNS over TCP {when}: {said}");
    assert!(said.contains("https 200"), "HTTPS {when}: {said}");
}

/// `svc_guest_limit_hits_total{sandbox="flood",limit=…}`, 0 if absent.
fn hits(w: &World, limit: &str) -> u64 {
    let series = format!("svc_guest_limit_hits_total{{sandbox=\"flood\",limit=\"{limit}\"}} ");
    w.metrics()
        .lines()
        .find_map(|l| l.strip_prefix(&series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// svcd logged the first hit of `limit` once, naming the sandbox and the key.
fn logged_once(w: &World, limit: &str) {
    let line = format!("sandbox flood reached limits.{limit}");
    let n = w.svcd_log().matches(&line).count();
    assert_eq!(n, 1, "{line:?} logged {n} times:\n{}", w.svcd_log());
}

/// `svc sandbox exec` callers, killed when dropped (their commands end with them).
struct Killed(Vec<Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Sandbox `flood` runs `script` (its `what`) while the other sandbox's checks run, svcd held
/// to `fd_bound` more descriptors; the flood must end well: its first line, and what it said on
/// its standard error.
fn flooded(w: &World, what: &str, script: &str, fd_bound: u64) -> (String, String) {
    let sampler = Sampler::start(w.svcd_pid().expect("svcd runs"));
    let mut flood = spawn_exec(w, "flood", script);
    let line = first_line(w, &mut flood);
    calm_works(w, &format!("during a {what}"));
    let ended = flood.wait_with_output().expect("flood");
    sampler.check(what, fd_bound);
    let said = String::from_utf8_lossy(&ended.stderr).into_owned();
    assert!(ended.status.success(), "the flood: {line}{said}");
    (line, said)
}

fn numbers(line: &str) -> Vec<u64> {
    line.split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect()
}

#[test]
fn a_dns_over_tcp_flood_is_held_to_its_cap_and_another_sandbox_keeps_working() {
    require_root();
    let w = world();
    let (line, said) = flooded(
        &w,
        "DNS-over-TCP flood",
        &python(DNS_FLOOD, &format!("400 {DNS_TCP_CAP}")),
        DNS_TCP_CAP + FD_SLACK,
    );
    let [opened, kept, closed] = numbers(&line)[..] else {
        panic!("the flood said {line:?}");
    };
    assert_eq!(opened, 400, "{line}{said}");
    assert_eq!(
        kept, DNS_TCP_CAP,
        "svcd keeps the cap's worth: {line}{said}"
    );
    assert_eq!(
        hits(&w, "dns_tcp_connections"),
        closed,
        "one hit per refusal"
    );
    logged_once(&w, "dns_tcp_connections");
    calm_works(&w, "after a DNS-over-TCP flood");
    for name in ["flood", "calm"] {
        w.destroy_checked(name);
    }
}

#[test]
fn a_proxy_flood_with_upgraded_websockets_is_held_to_its_cap_and_another_sandbox_keeps_working() {
    require_root();
    let w = world();
    let (line, said) = flooded(
        &w,
        "proxy flood",
        &python(PROXY_FLOOD, &format!("{PROXY_CAP} 200")),
        // Each connection is two descriptors: the guest's and its upstream.
        2 * PROXY_CAP + FD_SLACK,
    );
    let [websockets, extra, kept, closed] = numbers(&line)[..] else {
        panic!("the flood said {line:?}");
    };
    assert_eq!(
        websockets, PROXY_CAP,
        "the cap's worth of WebSockets: {line}{said}"
    );
    assert_eq!(
        (extra, kept),
        (200, 0),
        "upgraded WebSockets hold their slots: nothing more is kept: {line}{said}"
    );
    assert_eq!(hits(&w, "proxy_connections"), closed, "one hit per refusal");
    logged_once(&w, "proxy_connections");
    let refused = w
        .audit()
        .into_iter()
        .filter(|r| {
            r["sandbox_name"] == "flood"
                && r["rule"]
                    .as_str()
                    .is_some_and(|s| s.contains("(limits.proxy_connections)"))
        })
        .count() as u64;
    assert_eq!(refused, closed, "each refusal is audited");
    calm_works(&w, "after a proxy flood");
    // The slots came back with the WebSockets: the flooding sandbox's HTTPS works again.
    let (code, out, err) = w.sh(
        "flood",
        "curl -sS -o /dev/null -w '%{http_code}' https://allowed.example.test/",
    );
    assert_eq!((code, out.as_str()), (0, "200"), "{err}");
    for name in ["flood", "calm"] {
        w.destroy_checked(name);
    }
}

#[test]
fn an_exec_flood_is_held_to_its_cap_and_another_sandbox_keeps_working() {
    require_root();
    let w = world();
    const TRIES: usize = 48;
    let sampler = Sampler::start(w.svcd_pid().expect("svcd runs"));
    let mut execs = Killed(
        (0..TRIES)
            // Each holds its stream until its caller goes (its input ends with it).
            .map(|_| spawn_exec(&w, "flood", "cat > /dev/null"))
            .collect(),
    );
    // The refused ones end with their error; the cap's worth keep running.
    let deadline = std::time::Instant::now() + STEP;
    let mut refused = Vec::new();
    while refused.len() < TRIES - EXEC_CAP {
        assert!(
            std::time::Instant::now() < deadline,
            "{} execs refused of {TRIES}; svcd's log:\n{}",
            refused.len(),
            w.svcd_log()
        );
        let mut i = 0;
        while i < execs.0.len() {
            if execs.0[i].try_wait().expect("wait").is_some() {
                refused.push(execs.0.swap_remove(i).wait_with_output().expect("output"));
            } else {
                i += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    for out in &refused {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains("already holds 6 exec streams (limits.exec_streams)"),
            "a refused exec names the limit: {err}"
        );
    }
    assert_eq!(execs.0.len(), EXEC_CAP, "the cap's worth run");
    calm_works(&w, "during an exec flood");
    drop(execs);
    // Each exec is a few descriptors (the API connection, the runtime's pipes).
    sampler.check("exec flood", 8 * EXEC_CAP as u64 + FD_SLACK);
    assert_eq!(hits(&w, "exec_streams"), (TRIES - EXEC_CAP) as u64);
    logged_once(&w, "exec_streams");
    calm_works(&w, "after an exec flood");
    // The slots come back as the held execs end.
    let deadline = std::time::Instant::now() + STEP;
    loop {
        let (code, out, _) = w.sh("flood", "echo again");
        if code == 0 && out.contains("again") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "exec slots never came back"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for name in ["flood", "calm"] {
        w.destroy_checked(name);
    }
}

/// The relay: a ninth session while eight are held is refused on the relay only, naming
/// `limits.git_ssh_sessions`; another sandbox's relay works during and after.
#[test]
fn a_relay_session_flood_is_held_to_its_cap_and_another_sandbox_keeps_working() {
    require_root();
    let w = World::start_with_git_ssh("");
    let ws = w.ssh_project();
    for name in ["flood", "calm"] {
        w.sandbox_in_project(name, "container", &ws, &[]);
    }
    let ls_remote = format!("git ls-remote root@{CODE_SSH_ADDR}:acme/widget.git");
    let sampler = Sampler::start(w.svcd_pid().expect("svcd runs"));
    let mut flood = spawn_exec(
        &w,
        "flood",
        &python(RELAY_FLOOD, &format!("{CODE_SSH_ADDR} {}", GIT_SSH_CAP + 1)),
    );
    let line = first_line(&w, &mut flood);
    let (code, out, err) = w.sh("calm", &ls_remote);
    assert_eq!(
        code, 0,
        "another sandbox's relay during the flood: {out}{err}"
    );
    let ended = flood.wait_with_output().expect("flood");
    // Each session is a few descriptors: the guest's stream, ssh's pipes and process.
    sampler.check("relay flood", 6 * GIT_SSH_CAP + FD_SLACK);
    assert!(
        ended.status.success(),
        "the flood: {line}{}",
        String::from_utf8_lossy(&ended.stderr)
    );
    assert_eq!(
        numbers(&line),
        [1, GIT_SSH_CAP],
        "one session past the cap is refused, the cap's worth served: {line}"
    );
    assert_eq!(hits(&w, "git_ssh_sessions"), 1);
    logged_once(&w, "git_ssh_sessions");
    for name in ["flood", "calm"] {
        let (code, out, err) = w.sh(name, &ls_remote);
        assert_eq!(code, 0, "{name}'s relay after the flood: {out}{err}");
    }
    for name in ["flood", "calm"] {
        w.destroy_checked(name);
    }
}

/// A server in the guest on port 8001 (its own loopback): greets each connection with `hi`
/// and holds it, never reading (so it never sees a client leave).
const GREETER: &str = r#"
import socket, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8001))
s.listen(256)
held = []
while True:
    c, _ = s.accept()
    try:
        c.sendall(b"hi\n")
        held.append(c)
    except OSError:
        pass
"#;

/// The host side of a Spotlight flood: N connections to the forwarded port, all opened before
/// any is read; then, for each, whether it was greeted, closed unanswered, or left silent.
/// Holds the greeted ones 4 s more.
const SPOTLIGHT_FLOOD: &str = r#"
import socket, sys, time
PORT, N = int(sys.argv[1]), int(sys.argv[2])
socks = [socket.create_connection(("127.0.0.1", PORT), timeout=10) for i in range(N)]
greeted = closed = silent = 0
deadline = time.time() + 30
for s in socks:
    s.settimeout(max(0.1, deadline - time.time()))
    try:
        d = s.recv(16)
    except socket.timeout:
        silent += 1
        continue
    except OSError:
        closed += 1
        continue
    if d.startswith(b"hi"):
        greeted += 1
    else:
        closed += 1
print("greeted %d closed %d silent %d" % (greeted, closed, silent), flush=True)
time.sleep(4)
"#;

/// Spotlight: a host flooding a workspace's forwarded port gets the cap's worth of streams
/// through the guest's exec, the rest closed at once; the workspace's own exec and another
/// sandbox keep working.
#[test]
fn a_spotlight_flood_is_held_to_its_cap_and_another_sandbox_keeps_working() {
    require_root();
    const CAP: u64 = 4;
    const TRIES: u64 = 40;
    const PORT: u16 = 18097;
    let w = World::start_with(&format!("\n[limits]\nspotlight_streams = {CAP}\n"));
    let dir = w.dir.join("flooded");
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join("docker-compose.yml"),
        format!("services:\n  web:\n    image: example/web\n    ports: [\"{PORT}:8001\"]\n"),
    )
    .expect("compose file");
    let up = w.workspace_up(dir.to_str().expect("utf-8"), "flood");
    assert!(
        up.status.success(),
        "{}",
        String::from_utf8_lossy(&up.stderr)
    );
    w.svc_ok(&["sandbox", "create", "calm", "--backend", "container"]);
    let (code, _, err) = w.sh(
        "flood",
        &format!(
            "cat > /tmp/g.py <<'EOF'\n{GREETER}\nEOF\n(setsid nohup python3 /tmp/g.py >/dev/null 2>&1 &); \
             for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 8001))' 2>/dev/null && exit 0; sleep 0.1; done; exit 1"
        ),
    );
    assert_eq!(code, 0, "the greeter in the sandbox: {err}");
    let sampler = Sampler::start(w.svcd_pid().expect("svcd runs"));
    let mut flood = Command::new("ip")
        .args([
            "netns",
            "exec",
            &w.host.name,
            "python3",
            "-c",
            SPOTLIGHT_FLOOD,
        ])
        .args([PORT.to_string(), TRIES.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("flood");
    let line = first_line(&w, &mut flood);
    let (code, out, err) = w.sh("flood", "echo still");
    assert_eq!(
        (code, out.trim()),
        (0, "still"),
        "the workspace's exec: {err}"
    );
    calm_works(&w, "during a Spotlight flood");
    let ended = flood.wait_with_output().expect("flood");
    // Each stream is a few descriptors: the host connection, the runtime's pipes.
    sampler.check("spotlight flood", 8 * CAP + FD_SLACK);
    assert!(
        ended.status.success(),
        "the flood: {line}{}",
        String::from_utf8_lossy(&ended.stderr)
    );
    assert_eq!(
        numbers(&line),
        [CAP, TRIES - CAP, 0],
        "the cap's worth greeted, the rest closed: {line}\nsvcd's log:\n{}",
        w.svcd_log()
    );
    assert_eq!(hits(&w, "spotlight_streams"), TRIES - CAP);
    logged_once(&w, "spotlight_streams");
    calm_works(&w, "after a Spotlight flood");
    // The slots come back as the streams end: the host clients are gone, the guest's server
    // holds its side and is silent, and the forward gives up after its linger.
    let deadline = std::time::Instant::now() + STEP;
    loop {
        let o = w.host.exec(
            "python3",
            &["-c", &format!("import socket; s = socket.create_connection((\"127.0.0.1\", {PORT}), timeout=10); print(s.recv(16).decode().strip())")],
        );
        if String::from_utf8_lossy(&o.stdout).trim() == "hi" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Spotlight slots never came back"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    w.svc_ok(&["workspace", "down", "flood"]);
    w.destroy_checked("calm");
}

/// How many `sleep 4242` run on this host (in any sandbox: no other test runs that one).
fn sleepers() -> usize {
    let out = Command::new("pgrep")
        .args(["-xcf", "sleep 4242"])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

/// The flooding sandbox's exec slots come back (as each killed command's exec ends, moments
/// after its process).
fn slots_back(w: &World, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (code, _, err) = w.sh("flood", "true");
        if code == 0 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the slots never came back: {err}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Execs whose callers vanish while their commands neither read nor write: killed, their
/// slots given back — the upgraded ones (`svc sandbox exec`, killed) and plain API calls
/// (the connection dropped).
#[test]
fn an_exec_whose_caller_is_gone_is_killed_and_gives_back_its_slot() {
    require_root();
    let w = world();
    // The cap's worth, upgraded.
    let callers = Killed(
        (0..EXEC_CAP)
            .map(|_| spawn_exec(&w, "flood", "exec sleep 4242"))
            .collect(),
    );
    let deadline = std::time::Instant::now() + STEP;
    while sleepers() < EXEC_CAP {
        assert!(
            std::time::Instant::now() < deadline,
            "the sleepers never ran ({} counted); svcd's log:\n{}",
            sleepers(),
            w.svcd_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (_, _, err) = w.sh("flood", "true");
    assert!(
        err.contains("limits.exec_streams"),
        "the cap is held: {err}"
    );
    drop(callers);
    let back = |what: &str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let left = sleepers();
            if left == 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: the callers are gone and {left} of their commands still run; svcd's \
                 log:\n{}",
                w.svcd_log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    back("upgraded execs");
    slots_back(&w, "upgraded execs");
    // The cap's worth, plain: each connection dropped once its command runs.
    let body = r#"{"argv":["sleep","4242"]}"#;
    let request = format!(
        "POST /v1/sandboxes/flood/exec HTTP/1.1\r\nhost: svcd\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let conns: Vec<_> = (0..EXEC_CAP)
        .map(|_| {
            let mut s = std::os::unix::net::UnixStream::connect(&w.socket).expect("connect");
            std::io::Write::write_all(&mut s, request.as_bytes()).expect("request");
            let mut head = [0u8; 12];
            std::io::Read::read_exact(&mut s, &mut head).expect("answer");
            assert_eq!(&head, b"HTTP/1.1 200", "a plain exec starts");
            s
        })
        .collect();
    let (_, _, err) = w.sh("flood", "true");
    assert!(
        err.contains("limits.exec_streams"),
        "the cap is held by plain execs: {err}"
    );
    drop(conns);
    back("plain execs");
    slots_back(&w, "plain execs");
    for name in ["flood", "calm"] {
        w.destroy_checked(name);
    }
}

/// N DNS questions for `api.agent.test` over UDP, paced at about 150 a second (under the
/// guard's own rate), each answer awaited; prints how many were answered.
const DNS_PACED: &str = r#"
import socket, struct, sys, time
N = int(sys.argv[1])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5)
ns = nameserver()
answered = 0
for i in range(N):
    q = struct.pack(">HHHHHH", i & 0xFFFF, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in "api.agent.test".split(".")) + b"\0"
    q += struct.pack(">HH", 1, 1)
    s.sendto(q, (ns, 53))
    try:
        s.recv(512)
        answered += 1
    except socket.timeout:
        pass
    time.sleep(1 / 150)
print("answered %d" % answered, flush=True)
"#;

/// One guest's share of the audit log: a sandbox asking 900 questions past its
/// `audit_records_per_sec` has its burst and its rate written and the rest counted in a
/// `suppressed` record; another sandbox's records are all written; the metrics count every
/// question.
#[test]
fn a_guest_past_its_audit_share_is_counted_not_written_and_another_sandbox_is_all_written() {
    require_root();
    const RATE: u64 = 20;
    const BURST: u64 = 100;
    const QUESTIONS: u64 = 900;
    let w = World::start_with(&format!(
        "\n[limits]\naudit_records_per_sec = {RATE}\naudit_burst = {BURST}\n"
    ));
    for name in ["flood", "calm"] {
        w.svc_ok(&["sandbox", "create", name, "--backend", "container"]);
    }
    let started = std::time::Instant::now();
    let mut flood = spawn_exec(&w, "flood", &python(DNS_PACED, &QUESTIONS.to_string()));
    let (code, _, err) = w.sh(
        "calm",
        "for i in $(seq 10); do getent hosts api.agent.test >/dev/null || exit 1; done",
    );
    assert_eq!(code, 0, "another sandbox's DNS during the flood: {err}");
    let line = first_line(&w, &mut flood);
    let elapsed = started.elapsed().as_secs() + 1;
    let _ = flood.wait();
    assert_eq!(
        numbers(&line),
        [QUESTIONS],
        "every question answered: {line}"
    );
    // The `suppressed` record comes within svcd's 5 s tick.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let suppressed_dns = || -> u64 {
        w.audit()
            .iter()
            .filter(|r| r["layer"] == "suppressed" && r["sandbox_name"] == "flood")
            .map(|r| r["records"]["dns"].as_u64().unwrap_or(0))
            .sum()
    };
    let suppressed = loop {
        if suppressed_dns() > 0 {
            std::thread::sleep(Duration::from_secs(6));
            break suppressed_dns();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no suppressed record; svcd's log:\n{}",
            w.svcd_log()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let audit = w.audit();
    let dns_of = |name: &str| {
        audit
            .iter()
            .filter(|r| r["layer"] == "dns" && r["sandbox_name"] == name)
            .count() as u64
    };
    let written = dns_of("flood");
    println!("flood: {written} DNS records written, {suppressed} suppressed in {elapsed} s");
    assert!(
        written <= BURST + RATE * elapsed,
        "{written} written: more than the burst and {elapsed} s of the rate"
    );
    assert!(written >= BURST, "the burst is written: {written}");
    assert_eq!(
        written + suppressed,
        QUESTIONS,
        "every question written or counted"
    );
    assert!(
        dns_of("calm") >= 10,
        "the other sandbox's records are all written"
    );
    assert_eq!(hits(&w, "audit_records_per_sec"), suppressed);
    let said = "sandbox flood went past limits.audit_records_per_sec";
    assert_eq!(
        w.svcd_log().matches(said).count(),
        1,
        "logged once:\n{}",
        w.svcd_log()
    );
    // The metrics count every question, written or not.
    let questions: u64 = w
        .metrics()
        .lines()
        .filter(|l| l.starts_with("svc_dns_questions_total{") && l.contains("sandbox=\"flood\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(questions, QUESTIONS, "svc_dns_questions_total");
    for name in ["flood", "calm"] {
        w.destroy_checked(name);
    }
}
