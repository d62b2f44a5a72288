//! Session 48's changes attacked from inside a pod's containers and a microvm's guest,
//! against containerd's CRI (kubelet's calls), the shim, a real svcd, crun, QEMU and the
//! guest's init and agent.
//!
//! - FOUND: the places a microvm's agent says it skipped while binding a container's tree
//!   came back as the agent wrote them. A guest that replaces its agent (VM root may: it
//!   stops it, takes its port from it and speaks the channel's frames) put carriage returns,
//!   terminal escapes and bidirectional overrides into the attach's answer, its event and
//!   svcd's log (the log's own escaping leaves `\r` and U+202E), 16 lines of 16 KiB each.
//!   Fixed: svcd passes them on through `policy::ctr_root::skipped_places` (escaped, 16
//!   lines of at most 200 characters).
//! - A pod container's removal ends every process of its sandbox rooted on its tree
//!   (`container::ctr_procs`): a daemon that left the sandbox's pid namespace for one of its
//!   own (`unshare -Upf`), and a process that hops from pid to pid faster than a sweep
//!   looks, each must end with it too. Neither gets through: the sandbox refuses a user
//!   namespace of its own (so a pid namespace), and the sweep ends the hopper. A daemon of
//!   the sandbox's own that works in the container's tree (not rooted on it) lives on.
//! - Attaches and detaches of one container id raced: nothing is left. An attach of an id
//!   attached already answered 500 `internal` (svcd's failure) for the caller's conflict;
//!   now 409 `exists`.

use std::time::{Duration, Instant};

use svc_tests::{
    containerd::Containerd,
    cri::Cri,
    pods::{self, ALLOWED, Pod, STORED, exec, remove_container, remove_pod, run_fenced_pod, start},
    require_root,
    world::{EXAMPLE_TOKEN, World, microvm_images},
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
    out.trim()
        .parse()
        .unwrap_or_else(|e| panic!("{out:?}: {e}"))
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
    // A daemon of the sandbox's own (not the container's) that works in the container's tree
    // (its working directory there, a file of it open) is no process of the container: it
    // lives on.
    let (code, _, err) = w.sh(
        &pod.sandbox,
        &format!(
            "cd /.svc/ctr/{id}/etc && setsid sh -c 'exec sleep 4262 < hostname' \
             </dev/null >/dev/null 2>&1 &"
        ),
    );
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        node_processes("sleep 426[2]").len(),
        1,
        "the sandbox's daemon"
    );
    remove_container(&cri, &id);
    let left = left_after("sleep 425[1]", 5);
    let own = node_processes("sleep 426[2]");
    remove_pod(&w, &c, &cri, &pod);
    assert_eq!(
        own.len(),
        1,
        "the sandbox's own daemon working in the container's tree was ended with it"
    );
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
    assert!(
        before > 10 * IDLE_PIDS,
        "the hopper did not start: {before}"
    );
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

/// A guest's own agent, in Python: it stops the real one, takes the channel's port from it and
/// answers the host's hello as an agent does; every request succeeds, and a tree's binding
/// says on its standard error what `EVIL` holds.
const FORGED_AGENT: &str = r#"
import glob, os, struct, time
EVIL = ("\x1b[2J\x1b[31mFORGED\r/etc/hosts: fine\u202egnp.exe\n" + "y" * 20000 + "\n"
        + "line\n" * 100).encode()
import ctypes, signal
agent = None
for comm in glob.glob('/proc/[0-9]*/comm'):
    if open(comm).read().startswith('svc-microvm-age'):
        agent = int(comm.split('/')[2])
time.sleep(1)
# The agent stopped (it dies, the VM's init ends with it) and its port taken from it.
os.kill(agent, signal.SIGSTOP)
port = None
for link in glob.glob('/proc/%d/fd/*' % agent):
    if os.readlink(link).startswith('/dev/vport'):
        port = int(link.rsplit('/', 1)[1])
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(438, os.pidfd_open(agent), port, 0)
assert fd >= 0, ctypes.get_errno()
print('forged agent on', port, flush=True)
def send(sid, kind, payload):
    frame = memoryview(struct.pack('>IBI', sid, kind, len(payload)) + payload)
    while frame:
        frame = frame[os.write(fd, frame):]
#PRELUDE#
buf = b''
while True:
    chunk = os.read(fd, 65536)
    if not chunk:
        time.sleep(0.05)
        continue
    buf += chunk
    while len(buf) >= 9:
        sid, kind, n = struct.unpack('>IBI', buf[:9])
        if len(buf) < 9 + n:
            break
        payload, buf = buf[9:9 + n], buf[9 + n:]
        print('frame', sid, kind, payload[:80], flush=True)
        if kind == 1:
            send(0, 1, b'svc-microvm-agent ready v1 ' + payload)
        elif kind == 2:
            if b'"bind-tree"' in payload:
                for i in range(0, len(EVIL), 4096):
                    send(sid, 6, EVIL[i:i + 4096])
            send(sid, 7, struct.pack('>i', 0))
"#;

/// A microvm sandbox `name` whose guest replaced its agent by [`FORGED_AGENT`], which first
/// runs `prelude` (Python; `send(stream, kind, payload)` writes a frame to the host).
fn forge(w: &World, name: &str, prelude: &str) {
    w.svc_ok(&["sandbox", "create", "--backend", "microvm", name]);
    let agent = FORGED_AGENT.replace("#PRELUDE#", prelude);
    let script = format!(
        "cat > /tmp/forge.py <<'EOF'\n{agent}\nEOF\n\
         setsid python3 /tmp/forge.py </dev/null >/tmp/forge.log 2>&1 &"
    );
    let (code, _, err) = w.sh(name, &script);
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(Duration::from_secs(4));
}

/// `POST /v1/sandboxes/{sandbox}/roots` of container c1 (one empty layer) as root: status,
/// body.
fn attach_root(w: &World, sandbox: &str) -> (u16, String) {
    let layer = w.dir.join(format!("layer-{sandbox}"));
    std::fs::create_dir_all(layer.join("etc")).expect("layer");
    let layer = std::fs::canonicalize(&layer).expect("canonical");
    let body = serde_json::json!({"id": "c1", "layers": [layer]}).to_string();
    let route = format!("/v1/sandboxes/{sandbox}/roots");
    w.api(&[], "POST", &route, Some(body.as_bytes()))
}

/// Whether `c` would move a terminal's cursor, colour it or reorder what it shows.
fn unsafe_char(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[test]
fn places_skipped_a_forged_agent_names_reach_no_answer_event_or_log_as_written() {
    require_root();
    microvm_images();
    let w = World::start();
    forge(&w, "forger", "");
    let (status, said) = attach_root(&w, "forger");
    eprintln!(
        "attach: {status} {}",
        said.chars().take(2000).collect::<String>()
    );
    assert_eq!(
        status,
        200,
        "the forged agent's attach: {said}\n{}",
        w.svcd_log()
    );
    let answer: serde_json::Value = serde_json::from_str(&said).expect("json");
    let skipped: Vec<String> = answer["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .map(|s| s.as_str().expect("a string").to_owned())
        .collect();
    assert!(
        skipped.iter().any(|s| s.contains("FORGED")),
        "the forged agent's words did not come back at all: {skipped:?}"
    );
    assert!(skipped.len() <= 16, "{} places skipped", skipped.len());
    for s in &skipped {
        assert!(
            !s.chars().any(unsafe_char),
            "a place skipped as the guest wrote it: {s:?}"
        );
        assert!(s.chars().count() <= 201, "{} characters", s.chars().count());
    }
    let log = w.svcd_log();
    for line in log.lines().filter(|l| l.contains("FORGED")) {
        assert!(
            !line.chars().any(unsafe_char),
            "svcd's log holds the guest's words as written: {line:?}"
        );
        assert!(line.len() < 4096, "a log line of {} bytes", line.len());
    }
    w.svc(&["sandbox", "destroy", "forger"]);
}

/// A guest whose agent sends the frames only the host sends (`Go`, `Cancel`, `Open`,
/// `Signal`) on every kind of stream id, replays them, and claims features in hellos no host
/// asked for (a megabyte of them, in frames of the largest size): svcd takes none of it for anything — its channel to that
/// guest still works, another sandbox's exec works, svcd lives on.
#[test]
fn host_only_frames_and_features_a_forged_agent_sends_are_taken_for_nothing() {
    require_root();
    microvm_images();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "other"]);
    let prelude = "
for rnd in range(3):
    for sid in [0, 1, 2, 3, 7, 0x7fffffff, 0x80000001, 0xffffffff]:
        for kind in (12, 13, 2, 9, 12, 13):
            send(sid, kind, b'')
    for _ in range(20):
        send(0, 1, b'svc-agent features 0000000000000000 held-exec ' + b'x' * 60000)
    send(0, 1, b'svc-microvm-agent ready v1 0000000000000000')
";
    forge(&w, "forger2", prelude);
    std::thread::sleep(Duration::from_secs(2));
    let (status, said) = attach_root(&w, "forger2");
    assert_eq!(
        status,
        200,
        "the forged agent's channel broke: {said}\n{}",
        w.svcd_log()
    );
    let (code, out, err) = w.sh("other", "echo fine");
    assert_eq!(
        (code, out.as_str()),
        (0, "fine\n"),
        "another sandbox: {err}"
    );
    w.svc_ok(&["sandbox", "list"]);
    w.svc(&["sandbox", "destroy", "forger2"]);
    w.svc(&["sandbox", "destroy", "other"]);
}

/// Attaches and detaches of one container id raced from eight threads, on a sandbox of the
/// container backend: each answers (attached, 409 attached already, detached or not attached),
/// and once the last detach is done nothing of the container is left — no layers or
/// set-aside files in the sandbox's directory, no mount of its tree — and the sandbox's
/// guest still runs.
#[test]
fn attaches_and_detaches_of_one_container_raced_leave_nothing() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "racer"]);
    let outcomes: Vec<(u16, String)> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let w = &w;
                s.spawn(move || {
                    (0..4)
                        .map(|_| {
                            if i % 2 == 0 {
                                attach_root(w, "racer")
                            } else {
                                w.api(&[], "DELETE", "/v1/sandboxes/racer/roots/c1", None)
                            }
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        threads
            .into_iter()
            .flat_map(|t| t.join().expect("a racing thread"))
            .collect()
    });
    let statuses: Vec<u16> = outcomes.iter().map(|(s, _)| *s).collect();
    eprintln!("statuses: {statuses:?}");
    assert!(
        outcomes.iter().all(|(s, _)| *s < 500),
        "a raced attach or detach failed inside svcd: {outcomes:?}\n{}",
        w.svcd_log()
    );
    let (status, said) = w.api(&[], "DELETE", "/v1/sandboxes/racer/roots/c1", None);
    assert!(status < 500, "{status} {said}");
    let dir = w.dir.join("state/sandboxes/racer");
    let deadline = Instant::now() + Duration::from_secs(10);
    let left = loop {
        let left: Vec<String> = std::fs::read_dir(dir.join("ctr"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        if left.is_empty() || Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(left.is_empty(), "left in the sandbox's ctr/: {left:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let ctr = dir.join("ctr").display().to_string();
    assert!(
        !mounts.lines().any(|l| l.contains(&ctr)),
        "a mount of the container's tree is left"
    );
    let (code, out, err) = w.sh("racer", "ls /.svc/ctr 2>&1; echo up");
    assert_eq!(code, 0, "{err}");
    assert!(out.ends_with("up\n"), "{out}");
    w.svc(&["sandbox", "destroy", "racer"]);
}
