//! Floods of what the `[limits]` caps of connections do not count, from a hostile guest:
//!
//! - `h2_streams_hold_body_prefixes`: one HTTP/2 connection carries up to 200 concurrent
//!   streams, and for each the proxy first reads up to `body_prefix` (64 KiB) of the request
//!   body. A guest that sends just under 64 KiB on each stream and never ends them parked
//!   ~64 KiB per stream in svcd (+679 MiB from 40 connections, +3.2 GiB from 190). Now each
//!   request being read holds one of the sandbox's `limits.proxy_requests` (128) and the
//!   prefix must come within the head's time: svcd stays within 64 MiB.
//! - `audit_flood_from_refusals`: refused proxy connections as fast as one guest makes them
//!   (each one audit record): the sandbox's share of the audit log
//!   (`limits.audit_records_per_sec`) holds what is written, and another sandbox is served.
#![expect(clippy::expect_used, reason = "test helpers")]

use std::{
    io::{BufRead as _, BufReader},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use svc_tests::{require_root, rss_kib, world::World};

fn fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

/// Raw HTTP/2 over TLS: N connections to allowed.example.test, S streams each (POST, no
/// END_STREAM), B bytes of body on each stream, flow control respected, PINGs and SETTINGS
/// answered. Prints one `sent …` line when every connection has sent all it will, then holds
/// everything for H seconds.
const H2_HOLD: &str = r#"
import socket, ssl, struct, sys, threading, time, select
N, S, B, H = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
HOST = "allowed.example.test"
def frame(t, flags, sid, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([t, flags]) + struct.pack(">I", sid) + payload
def hint(x):
    if x < 127: return bytes([x])
    out = [127]; x -= 127
    while x >= 128:
        out.append((x & 127) | 128); x >>= 7
    out.append(x); return bytes(out)
def lit(n, v):
    n, v = n.encode(), v.encode()
    return b"\x00" + hint(len(n)) + n + hint(len(v)) + v
HEAD = lit(":method", "POST") + lit(":scheme", "https") + lit(":authority", HOST) + \
       lit(":path", "/upload") + lit("content-type", "application/octet-stream")
stats = {"streams": 0, "bytes": 0, "resets": 0, "goaway": 0, "responses": 0, "errors": 0}
lock = threading.Lock()
class Conn:
    def __init__(self):
        ctx = ssl.create_default_context()
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection((HOST, 443), timeout=60)
        self.s = ctx.wrap_socket(raw, server_hostname=HOST)
        assert self.s.selected_alpn_protocol() == "h2", self.s.selected_alpn_protocol()
        self.buf = b""
        self.conn_win = 65535
        self.win = {}
        self.init_win = 65535
        self.max_streams = 100
        self.dead = False
        self.s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, struct.pack(">HI", 4, 1 << 20)))
    def pump(self, timeout):
        r, _, _ = select.select([self.s], [], [], timeout) if self.s.pending() == 0 else ([self.s], 0, 0)
        if not r:
            return
        d = self.s.recv(1 << 16)
        if not d:
            self.dead = True
            return
        self.buf += d
        while len(self.buf) >= 9:
            ln = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + ln:
                break
            t, fl = self.buf[3], self.buf[4]
            sid = int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
            p = self.buf[9:9 + ln]
            self.buf = self.buf[9 + ln:]
            if t == 4 and not fl & 1:
                for i in range(0, len(p), 6):
                    k, v = struct.unpack(">HI", p[i:i + 6])
                    if k == 3: self.max_streams = v
                    if k == 4:
                        for x in self.win: self.win[x] += v - self.init_win
                        self.init_win = v
                self.s.sendall(frame(4, 1, 0))
            elif t == 6 and not fl & 1:
                self.s.sendall(frame(6, 1, 0, p))
            elif t == 8:
                inc = int.from_bytes(p[:4], "big") & 0x7FFFFFFF
                if sid == 0: self.conn_win += inc
                elif sid in self.win: self.win[sid] += inc
            elif t == 3:
                with lock: stats["resets"] += 1
                self.win.pop(sid, None)
            elif t == 7:
                with lock: stats["goaway"] += 1
                self.dead = True
            elif t == 1:
                with lock: stats["responses"] += 1
    def run(self):
        try:
            for _ in range(20):
                self.pump(0.05)
            sid = 1
            for k in range(min(S, self.max_streams)):
                if self.dead: break
                self.s.sendall(frame(1, 4, sid, HEAD))
                self.win[sid] = self.init_win
                with lock: stats["streams"] += 1
                left = B
                while left > 0 and not self.dead and sid in self.win:
                    n = min(16384, left, self.conn_win, self.win[sid])
                    if n <= 0:
                        self.pump(1)
                        continue
                    self.s.sendall(frame(0, 0, sid, b"x" * n))
                    self.conn_win -= n; self.win[sid] -= n; left -= n
                    with lock: stats["bytes"] += n
                sid += 2
        except Exception as e:
            with lock: stats["errors"] += 1
            print("error", repr(e), file=sys.stderr, flush=True)
        sent_all.wait()
        end = time.time() + H
        while time.time() < end and not self.dead:
            try:
                self.pump(1)
            except Exception:
                break
conns = []
for i in range(N):
    try:
        conns.append(Conn())
    except Exception as e:
        print("connect", i, repr(e), file=sys.stderr, flush=True)
sent_all = threading.Barrier(len(conns) + 1)
ts = [threading.Thread(target=c.run, daemon=True) for c in conns]
for t in ts: t.start()
sent_all.wait()
print("sent conns %d %s" % (len(conns), " ".join("%s %d" % kv for kv in stats.items())), flush=True)
for t in ts: t.join()
print("end conns %d %s" % (len(conns), " ".join("%s %d" % kv for kv in stats.items())), flush=True)
"#;

fn world() -> World {
    let w = World::start();
    w.flood_and_calm();
    w
}

fn exec_command(w: &World, name: &str, script: &str) -> Command {
    let mut c = w.sh_command(name, script);
    c.stderr(Stdio::inherit());
    c
}

fn python(script: &str, args: &str) -> String {
    format!("cat > /tmp/s.py <<'EOF'\n{script}\nEOF\nexec python3 /tmp/s.py {args}")
}

/// The other sandbox's DNS and HTTPS: `(ok, output)`.
fn calm(w: &World) -> (bool, String) {
    let t = Instant::now();
    let out = w.sh(
        "calm",
        "getent hosts api.agent.test && curl -sS -o /dev/null -w 'https %{http_code}\\n' --max-time 30 https://api.agent.test/",
    );
    (
        out.0 == 0 && out.1.contains("https 200"),
        format!("{} {} ({:?})", out.1.trim(), out.2.trim(), t.elapsed()),
    )
}

fn read_line(child: &mut Child, limit: Duration) -> Option<String> {
    let out = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(out);
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx.recv_timeout(limit).ok()
}

#[test]
fn h2_streams_hold_body_prefixes() {
    require_root();
    let w = world();
    let pid = w.svcd_pid().expect("svcd");
    let conns: u32 = std::env::var("ATTACK_H2_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let before = (rss_kib(pid), fds(pid));
    println!(
        "before: svcd RSS {} KiB, {} descriptors",
        before.0, before.1
    );
    let t = Instant::now();
    let mut flood = exec_command(
        &w,
        "flood",
        &python(H2_HOLD, &format!("{conns} 200 65000 90")),
    )
    .spawn()
    .expect("flood");
    let mut peak = before;
    let line = read_line(&mut flood, Duration::from_secs(400));
    println!("flood said: {line:?} after {:?}", t.elapsed());
    for _ in 0..10 {
        peak.0 = peak.0.max(rss_kib(pid));
        peak.1 = peak.1.max(fds(pid));
        std::thread::sleep(Duration::from_millis(500));
    }
    let (ok, said) = calm(&w);
    println!("calm sandbox during the hold: ok={ok} {said}");
    peak.0 = peak.0.max(rss_kib(pid));
    let hits = w
        .metrics()
        .lines()
        .filter(|l| l.starts_with("svc_guest_limit_hits_total"))
        .map(str::to_owned)
        .collect::<Vec<_>>();
    println!("limit hits: {hits:?}");
    println!(
        "during the hold: svcd RSS {} -> {} KiB (+{} MiB), descriptors {} -> {}",
        before.0,
        peak.0,
        peak.0.saturating_sub(before.0) / 1024,
        before.1,
        peak.1
    );
    let _ = flood.kill();
    let _ = flood.wait();
    std::thread::sleep(Duration::from_secs(3));
    println!(
        "after the flood's caller left: svcd RSS {} KiB, {} descriptors",
        rss_kib(pid),
        fds(pid)
    );
    assert!(
        peak.0.saturating_sub(before.0) < 64 * 1024,
        "one guest grew svcd by {} MiB through {conns} HTTP/2 connections (cap 192)",
        peak.0.saturating_sub(before.0) / 1024
    );
}

/// Refused proxy connections, as fast as one guest makes them: a ClientHello naming a host not
/// allowed, sent to the allowed address's port 443 on fresh connections from P processes for
/// T seconds. Each is one audit record.
const REFUSED: &str = r#"
import os, socket, ssl, sys, time
P, T = int(sys.argv[1]), float(sys.argv[2])
ctx = ssl.create_default_context()
inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
o = ctx.wrap_bio(inc, out, server_hostname="forbidden-" + "x" * 40 + ".example.test")
try:
    o.do_handshake()
except ssl.SSLWantReadError:
    pass
hello = out.read()
addr = socket.gethostbyname("allowed.example.test")
kids = []
for i in range(P):
    pid = os.fork()
    if pid == 0:
        n = 0
        end = time.time() + T
        while time.time() < end:
            try:
                s = socket.create_connection((addr, 443), timeout=5)
                s.sendall(hello)
                s.recv(100)
                s.close()
                n += 1
            except OSError:
                pass
        os.write(1, b"%d\n" % n)
        os._exit(0)
    kids.append(pid)
for k in kids:
    os.waitpid(k, 0)
"#;

#[test]
fn audit_flood_from_refusals() {
    require_root();
    let w = world();
    let audit = w.audit_path();
    let size = || std::fs::metadata(&audit).map_or(0, |m| m.len());
    let before = size();
    let t = Instant::now();
    let secs = 20;
    let out = svc_tests::output_within(
        &mut exec_command(&w, "flood", &python(REFUSED, &format!("4 {secs}"))),
        Duration::from_secs(120),
    )
    .expect("flood");
    let took = t.elapsed();
    let made: u64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse::<u64>().ok())
        .sum();
    std::thread::sleep(Duration::from_secs(2));
    let grown = size() - before;
    let text = std::fs::read_to_string(&audit).unwrap_or_default();
    let records = text.lines().count();
    let sample = text.lines().rev().take(1).collect::<Vec<_>>();
    let rate = grown as f64 / took.as_secs_f64();
    println!(
        "{made} refused connections in {took:?}: audit.jsonl +{grown} bytes ({records} lines), \
         {:.0} KiB/s; 512 MiB of audit history (audit.jsonl + .1) rewritten in {:.0} min; \
         last record: {sample:?}",
        rate / 1024.0,
        512.0 * 1024.0 * 1024.0 / rate / 60.0
    );
    let (ok, said) = calm(&w);
    println!("calm sandbox after: ok={ok} {said}");
    assert!(ok, "another sandbox after the flood: {said}");
    let written = text
        .lines()
        .filter(|l| l.contains("\"sandbox_name\":\"flood\"") && l.contains("\"layer\":\"http\""))
        .count() as u64;
    // The default share: bursts of 2,000, 50 a second after.
    let bound = 2000 + 50 * (took.as_secs() + 4);
    assert!(
        written <= bound,
        "{written} of the flood's records written in {took:?}: more than its share ({bound})"
    );
    assert!(
        made > bound,
        "the flood made only {made} refused connections"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&audit)
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains("\"layer\":\"suppressed\"") && l.contains("\"flood\""))
    {
        assert!(
            Instant::now() < deadline,
            "no suppressed record for the flood"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}
