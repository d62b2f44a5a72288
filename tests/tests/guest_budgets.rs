//! What one guest can take from svcd, tried from inside a real container sandbox with svcd's
//! resident memory sampled from /proc throughout, and another sandbox's relay and exec used
//! during and after the flood.
//!
//! The relay: a guest that runs its own client on its relay socket (not the image's shim,
//! which waits for credit) opens four sessions toward an allowed repository on a port that
//! drops every packet (so the host's ssh sits in connect and reads nothing) and sends 64 KiB
//! `Data` frames as fast as the socket takes them. Each session is cut once it is a window
//! past its credit, with the line naming why on the client's stderr stream.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use svc_tests::{
    require_root, rss_kib,
    world::{CODE_SSH_ADDR, World},
};

/// A port of the code host whose packets the outside world drops.
const BLACKHOLE_PORT: u16 = 2299;

/// svcd may grow by this much while one guest floods (it grew by gigabytes before the relay
/// held guests to their window).
const RSS_BOUND_KIB: u64 = 64 * 1024;

/// The guest's own relay client: four sessions, each sending up to 64 MiB past its credit.
const FLOOD: &str = r#"
import json, socket, struct, sys, threading
SOCK = "/run/svc/git-ssh.sock"
PORT = sys.argv[1]
HOST = sys.argv[2]
def frame(kind, payload):
    return struct.pack(">IBI", 1, kind, len(payload)) + payload
request = json.dumps({"op": "git-ssh", "git_protocol": None,
    "args": ["-p", PORT, "root@" + HOST, "git-upload-pack 'acme/widget.git'"]}).encode()
results = [None] * 4
def flood(i):
    s = socket.socket(socket.AF_UNIX)
    s.connect(SOCK)
    s.sendall(frame(2, request))
    chunk = frame(3, b"x" * 65536)
    sent = 0
    try:
        while sent < (64 << 20):
            s.sendall(chunk)
            sent += 65536
    except OSError:
        pass
    said = b""
    s.settimeout(20)
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            said += b
    except OSError:
        pass
    results[i] = (sent, said)
threads = [threading.Thread(target=flood, args=(i,)) for i in range(4)]
for t in threads: t.start()
for t in threads: t.join()
for sent, said in results:
    print("sent=%d cut=%s" % (sent, b"the session is cut" in said))
"#;

#[test]
fn a_relay_flood_is_held_to_its_window_and_another_sandbox_keeps_working() {
    require_root();
    let w = World::start_with_git_ssh("");
    let ws = w.ssh_project();
    for name in ["flood", "calm"] {
        w.sandbox_in_project(name, "container", &ws, &[]);
    }
    let drop_rule = Command::new("ip")
        .args(["netns", "exec", &w.outside.name, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write as _;
            c.stdin.take().expect("stdin").write_all(
                format!(
                    "table inet budgets {{\n chain input {{\n  type filter hook input priority 0;\n  \
                     tcp dport {BLACKHOLE_PORT} drop\n }}\n}}\n"
                )
                .as_bytes(),
            )?;
            c.wait()
        })
        .expect("nft in the outside world");
    assert!(drop_rule.success(), "the outside world's drop rule");

    let pid = w.svcd_pid().expect("svcd runs");
    let before = rss_kib(pid);
    let script = format!(
        "cat > /tmp/flood.py <<'EOF'\n{FLOOD}\nEOF\npython3 /tmp/flood.py {BLACKHOLE_PORT} \
         {CODE_SSH_ADDR}"
    );
    let mut flood = w
        .svc_command(&["sandbox", "exec", "flood", "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("svc exec");
    let mut peak = before;
    let mut calm_during = None;
    let deadline = Instant::now() + Duration::from_secs(120);
    while flood.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = flood.kill();
            let log = w.svcd_log();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            panic!(
                "the flood did not end (svcd at {} KiB, from {before}); svcd's last lines:\n{}",
                rss_kib(pid),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        peak = peak.max(rss_kib(pid));
        if calm_during.is_none() {
            // The other sandbox's relay, while the flood runs.
            calm_during = Some(w.sh(
                "calm",
                &format!("git ls-remote root@{CODE_SSH_ADDR}:acme/widget.git"),
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    peak = peak.max(rss_kib(pid));
    let out = flood.wait_with_output().expect("flood output");
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        peak.saturating_sub(before) < RSS_BOUND_KIB,
        "svcd grew from {before} KiB to {peak} KiB during one guest's relay flood"
    );
    assert!(out.status.success(), "the flood client: {said}{err}");
    assert_eq!(
        said.lines().filter(|l| l.ends_with("cut=True")).count(),
        4,
        "every flooding session is cut with the relay's line: {said}"
    );

    let (code, out, err) = calm_during.expect("the calm sandbox ran during the flood");
    assert_eq!(
        code, 0,
        "another sandbox's relay during the flood: {out}{err}"
    );
    assert!(out.contains("refs/heads/"), "{out}");
    let (code, out, err) = w.sh(
        "calm",
        &format!("git ls-remote root@{CODE_SSH_ADDR}:acme/widget.git && echo exec-ok"),
    );
    assert_eq!(
        code, 0,
        "another sandbox's relay after the flood: {out}{err}"
    );
    assert!(out.contains("exec-ok"), "{out}");

    let audit = w.audit();
    let cut = audit
        .iter()
        .filter(|r| {
            r["layer"] == "ssh"
                && r["sandbox_name"] == "flood"
                && r["decision"] == "deny"
                && r["reason"]
                    .as_str()
                    .is_some_and(|s| s.contains("the session is cut"))
        })
        .count();
    assert_eq!(cut, 4, "each cut session is audited");
    for name in ["flood", "calm"] {
        w.destroy_checked(name);
    }
}
