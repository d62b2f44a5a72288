//! Escapes from inside a container sandbox: each is tried as the guest's root with the tools a
//! hostile agent would use, must fail with a clear error, and is checked from the host
//! afterwards (host files, svcd's files and socket, the fence's maps and pins, the link, other
//! sandboxes). The real svcd, runc, kernel and fence (see `svc_tests::world`).

use std::path::Path;

use svc_tests::{
    require_root, unique,
    world::{World, cgroup_roots},
};

/// Run `script` in sandbox `name`; assert it exits 0 (the script itself checks each refusal
/// and prints what it saw); its stdout.
fn guest_checks(w: &World, name: &str, script: &str) -> String {
    let (code, out, err) = w.sh(name, script);
    assert_eq!(
        code, 0,
        "a refusal did not hold inside {name}:\n--- stdout\n{out}\n--- stderr\n{err}"
    );
    out
}

/// `paths` for a shell script: each in single quotes, separated by spaces.
fn quoted(paths: &[String]) -> String {
    paths
        .iter()
        .map(|p| format!("'{p}'"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What the host's fence holds for sandbox `id`, and the names under the pin directory.
fn fence_state(w: &World, id: u32) -> (Vec<String>, Vec<String>) {
    let fence = svc_control::dataplane::Fence::load(&w.pins.path).expect("load the fence");
    let mut entries: Vec<String> = fence
        .allow_entries(id)
        .into_iter()
        .map(|(a, v)| format!("{a} {v:?}"))
        .collect();
    entries.sort();
    let mut pins = Vec::new();
    let mut stack = vec![w.pins.path.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            pins.push(e.path().display().to_string());
            if e.path().is_dir() {
                stack.push(e.path());
            }
        }
    }
    pins.sort();
    (entries, pins)
}

#[test]
fn no_escape_from_a_container_sandbox_reaches_the_host_the_fence_or_svcd() {
    require_root();
    let w = World::start();
    w.sandbox_allowing("jail", &["allowed.example.test"]);
    let s = w.show("jail");
    let id = u32::try_from(s["id"].as_u64().expect("id")).expect("id fits");
    let pid = s["pid"].as_u64().expect("pid");
    let guest_v4 = s["guest_v4"].as_str().expect("guest_v4").to_owned();
    let gateway = s["gateway_v4"].as_str().expect("gateway_v4").to_owned();
    // Resolve an allowed name once, so the fence holds an entry the escapes could try to change.
    guest_checks(&w, "jail", "getent hosts allowed.example.test >/dev/null");
    let before = fence_state(&w, id);
    assert!(!before.0.is_empty(), "the allowed name left no fence entry");
    let routes_before = w.sh("jail", "ip route; ip -o addr").1;

    // The guest's root is an unprivileged host user.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("guest init");
    let uid_line = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .expect("Uid line");
    let host_uid: u32 = uid_line
        .split_whitespace()
        .nth(1)
        .and_then(|u| u.parse().ok())
        .expect("uid");
    assert!(
        host_uid >= 100_000,
        "the guest's root is host uid {host_uid}, not an unprivileged range: {uid_line}"
    );
    assert_eq!(w.sh("jail", "id -u").1.trim(), "0", "root inside");

    let marker = unique("esc");
    let svcd_pid = w.svcd_pid().expect("svcd runs");
    let host_paths = [
        w.config.display().to_string(),
        w.dir.join("state").display().to_string(),
        w.dir.join("state/svcd.db").display().to_string(),
        w.audit_path().display().to_string(),
        w.socket.display().to_string(),
        w.pins.path.display().to_string(),
        "/etc/svc".to_owned(),
        "/var/lib/svc".to_owned(),
        "/var/log/svc".to_owned(),
        "/run/svc/svcd.sock".to_owned(),
        "/sys/fs/bpf".to_owned(),
        "/sys/fs/cgroup".to_owned(),
        format!("/run/netns/{}", w.host.name),
    ];
    let script = format!(
        r#"set -u
fail() {{ echo "ESCAPED: $*"; exit 1; }}
refused() {{ # refused WHAT CMD...: the command must fail
  what=$1; shift
  if out=$("$@" 2>&1); then fail "$what succeeded: $out"; fi
  echo "refused: $what: $(echo "$out" | head -n1)"
}}
# Host and svcd paths are not in the guest's file tree.
for p in {paths}; do
  if [ -e "$p" ]; then fail "host path $p is visible"; fi
done
echo "no host path visible"
# Writing /etc writes the guest's own layer only (checked from the host afterwards).
echo owned > /etc/{marker} || fail "cannot write the guest's own /etc"
echo owned > /{marker} || fail "cannot write the guest's own /"
# Other network namespaces: every one the guest can name.
for ns in /run/netns/* /proc/[0-9]*/ns/net; do
  [ -e "$ns" ] || continue
  refused "setns into $ns" nsenter --net="$ns" true
done
refused "unshare a user namespace" unshare -U true
refused "unshare user+net namespaces" unshare -Urn true
refused "mount a tmpfs" mount -t tmpfs none /mnt
refused "mount a bpffs" mount -t bpf bpf /mnt
refused "mount a procfs" mount -t proc proc /mnt
refused "remount / read-write elsewhere" mount --bind / /mnt
# Raw syscalls the filter refuses with EPERM (x86_64 numbers).
python3 - <<'PY' || exit 1
import ctypes, errno, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
def refused(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(nr, *args)
    e = ctypes.get_errno()
    if r != -1 or e != errno.EPERM:
        print(f"ESCAPED: {{name}} returned {{r}} errno {{e}}"); sys.exit(1)
    print(f"refused: {{name}}: EPERM")
refused("bpf(BPF_MAP_CREATE)", 321, 0, 0, 0)
refused("bpf(BPF_OBJ_GET)", 321, 7, 0, 0)
refused("init_module", 175, 0, 0, b"")
refused("finit_module", 313, 0, b"", 0)
refused("perf_event_open", 298, 0, 0, -1, -1, 0)
refused("keyctl", 250, 0, 0, 0)
refused("kexec_load", 246, 0, 0, 0, 0)
refused("userfaultfd", 323, 0)
refused("setns", 308, 0, 0)
refused("unshare(CLONE_NEWUSER)", 272, 0x10000000)
refused("ptrace(PTRACE_ATTACH, 1)", 101, 16, 1, 0, 0)
refused("open_by_handle_at", 304, 0, 0, 0)
refused("acct (not on the allow list)", 163, 0)
refused("swapoff (not on the allow list)", 168, 0)
try:
    socket.socket(40, socket.SOCK_STREAM)  # AF_VSOCK
    print("ESCAPED: a vsock socket opened"); sys.exit(1)
except OSError as e:
    if e.errno != errno.EPERM:
        print(f"ESCAPED: vsock socket failed with {{e}}, not EPERM"); sys.exit(1)
    print("refused: AF_VSOCK socket: EPERM")
for fam, kind, what in [(socket.AF_PACKET, socket.SOCK_RAW, "AF_PACKET raw socket"),
                        (socket.AF_INET, socket.SOCK_RAW, "IPv4 raw socket"),
                        (socket.AF_INET6, socket.SOCK_RAW, "IPv6 raw socket")]:
    try:
        socket.socket(fam, kind, socket.IPPROTO_ICMP if fam != socket.AF_PACKET else 0)
    except PermissionError:
        print(f"refused: {{what}}: EPERM"); continue
    print(f"ESCAPED: {{what}} opened"); sys.exit(1)
# A spoofed source without a raw socket: bind a non-local address (IP_FREEBIND), connect out.
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.IPPROTO_IP, 15, 1)  # IP_FREEBIND
s.bind(("10.203.255.250", 0))
s.settimeout(2)
try:
    s.connect(("{gateway}", 53))
    print("ESCAPED: a spoofed-source connection was answered"); sys.exit(1)
except OSError as e:
    print(f"refused: spoofed source: {{e}}")
PY
# The guest's link, addresses and routes are not its to change.
refused "add an address" ip addr add 10.203.255.251/32 dev eth0
refused "replace the default route" ip route replace default via {gateway} dev eth0 metric 1
refused "add a route" ip route add 192.0.2.0/24 dev eth0
refused "take the link down" ip link set eth0 down
refused "create a link" ip link add x0 type dummy
refused "write a sysctl" sh -c 'echo 1 > /proc/sys/net/ipv4/ip_forward'
# Host processes are neither seen nor signalled.
if ps -eo comm | grep -qx svcd; then fail "svcd is visible"; fi
[ "$(ps -e --no-headers | wc -l)" -lt 10 ] || fail "many processes are visible: $(ps -e)"
refused "signal svcd's host pid" kill -0 {svcd_pid}
[ ! -e /sys/fs/bpf ] || fail "bpffs visible"
[ -z "$(ls -A /sys)" ] || fail "/sys is not empty: $(ls /sys)"
refused "write /sys" touch /sys/x
refused "read /proc/kcore" head -c1 /proc/kcore
echo "all refused"
"#,
        paths = quoted(&host_paths),
    );
    let out = guest_checks(&w, "jail", &script);
    println!("{out}");
    assert!(out.contains("all refused"), "{out}");
    for expected in [
        "refused: setns into",
        "refused: bpf(BPF_MAP_CREATE): EPERM",
        "refused: AF_PACKET raw socket",
        "refused: mount a bpffs",
        "refused: spoofed source",
        "refused: add an address",
    ] {
        assert!(out.contains(expected), "{expected:?} not tried:\n{out}");
    }

    // From the host: nothing changed.
    for p in [format!("/etc/{marker}"), format!("/{marker}")] {
        assert!(!Path::new(&p).exists(), "the guest wrote the host's {p}");
    }
    assert_eq!(fence_state(&w, id), before, "the fence changed");
    assert_eq!(
        w.sh("jail", "ip route; ip -o addr").1,
        routes_before,
        "the guest's routes or addresses changed"
    );
    assert!(
        Path::new(&format!("/proc/{svcd_pid}")).exists(),
        "svcd was killed"
    );
    assert_eq!(w.show("jail")["guest_v4"], guest_v4.as_str());
    // The guest's writes stayed in its own layer.
    assert_eq!(
        w.sh("jail", &format!("cat /etc/{marker}")).1.trim(),
        "owned"
    );
}

#[test]
fn a_sandbox_cannot_reach_another_sandboxs_files_or_processes() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "left"]);
    w.svc_ok(&["sandbox", "create", "right"]);
    let secret = unique("s3cret");
    guest_checks(
        &w,
        "right",
        &format!(
            "echo {secret} > /root/secret && echo {secret} > /tmp/secret && \
             (exec -a holder-{secret} sleep 300 </dev/null >/dev/null 2>&1 &)"
        ),
    );
    let out = guest_checks(
        &w,
        "left",
        &format!(
            r#"if grep -rqs --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev {secret} /; then
  echo "ESCAPED: found the other sandbox's file"; exit 1; fi
if ps -eo args | grep -v grep | grep -q holder-{secret}; then
  echo "ESCAPED: the other sandbox's process is visible"; exit 1; fi
echo isolated"#
        ),
    );
    assert!(out.contains("isolated"), "{out}");
    // The secret is still there for its owner.
    assert_eq!(w.sh("right", "cat /root/secret").1.trim(), secret);
}

#[test]
fn a_fork_bomb_and_a_memory_hog_are_contained_by_the_cgroup() {
    require_root();
    let w = World::start_with("memory_mib = 128\npids_max = 64\n");
    w.svc_ok(&["sandbox", "create", "bomb"]);
    w.svc_ok(&["sandbox", "create", "bystander"]);

    // A memory hog is killed inside its cgroup; the sandbox itself lives on.
    let (code, _, _) = w.sh(
        "bomb",
        "python3 -c 'b = bytearray(512 * 1024 * 1024); print(len(b))'",
    );
    assert_eq!(code, 137, "the memory hog was not killed by the OOM killer");
    assert_eq!(w.sh("bomb", "echo alive").1.trim(), "alive");

    // A fork bomb fills its pids limit and no more.
    let (code, _, err) = w.sh(
        "bomb",
        "(bomb() { bomb | bomb & }; bomb) </dev/null >/dev/null 2>&1 & sleep 3; echo started",
    );
    assert!(
        code == 0 || code == 2 || code == 126,
        "starting the bomb: {code} {err}"
    );
    let cgroup = cgroup_roots()
        .into_iter()
        .map(|r| r.join(&w.cgroup_parent).join("bomb"))
        .find(|p| p.join("pids.max").exists())
        .expect("the sandbox's pids cgroup");
    let max = std::fs::read_to_string(cgroup.join("pids.max")).expect("pids.max");
    assert_eq!(max.trim(), "64", "pids limit not applied");
    let current: u64 = std::fs::read_to_string(cgroup.join("pids.current"))
        .expect("pids.current")
        .trim()
        .parse()
        .expect("number");
    assert!(current <= 64, "{current} tasks exceed the limit");
    // svcd and the other sandbox keep answering while the bomb runs.
    w.svc_ok(&["sandbox", "list"]);
    assert_eq!(w.sh("bystander", "echo fine").1.trim(), "fine");
    // And the bomb goes with its sandbox.
    w.destroy_checked("bomb");
}

/// In a microVM the guest is root of its own kernel: it may load eBPF, mount, add addresses
/// and open raw sockets — all in its own kernel. None of that reaches the host: the host's
/// paths are not there, the image it booted from is not written, a spoofed or stolen source
/// address is dropped at the tap, the host's own ports are closed, and a console flood fills
/// nothing on the host.
#[test]
fn no_escape_from_a_microvm_sandbox_reaches_the_host_the_fence_or_svcd() {
    require_root();
    let images = svc_tests::world::microvm_images();
    let image = images.join("rootfs.ext4");
    let image_before = std::fs::metadata(&image)
        .expect("image")
        .modified()
        .expect("mtime");
    let w = World::start();
    w.svc_ok(&[
        "sandbox",
        "create",
        "--backend",
        "microvm",
        "--allow-host",
        "allowed.example.test",
        "vmjail",
    ]);
    // A neighbour whose address the guest will try to take.
    w.svc_ok(&["sandbox", "create", "neighbour"]);
    let s = w.show("vmjail");
    let id = u32::try_from(s["id"].as_u64().expect("id")).expect("id fits");
    let gateway = s["gateway_v4"].as_str().expect("gateway_v4").to_owned();
    let neighbour = w.show("neighbour")["guest_v4"]
        .as_str()
        .expect("neighbour address")
        .to_owned();
    guest_checks(&w, "vmjail", "getent hosts allowed.example.test >/dev/null");
    let before = fence_state(&w, id);
    assert!(!before.0.is_empty(), "the allowed name left no fence entry");
    let marker = unique("esc");
    let host_paths = [
        w.config.display().to_string(),
        w.dir.join("state").display().to_string(),
        w.audit_path().display().to_string(),
        w.socket.display().to_string(),
        w.pins.path.display().to_string(),
        image.display().to_string(),
        format!("/run/netns/{}", w.host.name),
    ];
    let script = format!(
        r#"set -u
fail() {{ echo "ESCAPED: $*"; exit 1; }}
refused() {{ what=$1; shift
  if out=$("$@" 2>&1); then fail "$what succeeded: $out"; fi
  echo "refused: $what: $(echo "$out" | head -n1)"; }}
for p in {paths}; do [ -e "$p" ] && fail "host path $p is visible"; done
echo "no host path visible"
echo owned > /etc/{marker} && sync || fail "cannot write the guest's own /etc"
if ps -eo comm | grep -qx svcd; then fail "svcd is visible"; fi
# Root of its own kernel: it may add addresses; the fence drops what they send.
ip addr add 10.203.255.250/32 dev eth0 || fail "cannot add an address in its own kernel"
refused "connect from a made-up source" curl -sS --interface 10.203.255.250 --connect-timeout 3 https://allowed.example.test/
ip addr add {neighbour}/32 dev eth0 || fail "cannot add the neighbour's address"
refused "connect from the neighbour's address" curl -sS --interface {neighbour} --connect-timeout 3 https://allowed.example.test/
refused "reach the neighbour" curl -sS --connect-timeout 3 telnet://{neighbour}:22
# The host's own ports behind the gateway: only DNS (port 53) is answered.
refused "the proxy's port" curl -sS --connect-timeout 3 http://{gateway}:15443/
refused "the DNS guard's port" curl -sS --connect-timeout 3 http://{gateway}:15353/
refused "ssh on the host" curl -sS --connect-timeout 3 telnet://{gateway}:22
refused "a host off the list by address" curl -sS --connect-timeout 3 -k https://192.0.2.66/
[ -e /proc/net/if_inet6 ] && fail "IPv6 is on in the guest"
# A console flood: the host keeps at most its ring buffer.
timeout 3 sh -c 'yes svc-flood > /dev/ttyS0' || true
echo "all refused"
"#,
        paths = quoted(&host_paths),
    );
    let out = guest_checks(&w, "vmjail", &script);
    println!("{out}");
    assert!(out.contains("all refused"), "{out}");

    assert!(
        !Path::new(&format!("/etc/{marker}")).exists(),
        "the guest wrote the host's /etc"
    );
    assert_eq!(
        std::fs::metadata(&image)
            .expect("image")
            .modified()
            .expect("mtime"),
        image_before,
        "the guest wrote the image it booted from"
    );
    // The guest asked DNS again for the allowed name (its curls), which renews its entry's
    // expiry: the entries' addresses and rules, and every pin, are what count.
    let shape = |(entries, pins): (Vec<String>, Vec<String>)| {
        let entries: Vec<String> = entries
            .iter()
            .map(|e| e.split(" expiry_ns").next().unwrap_or(e).to_owned())
            .collect();
        (entries, pins)
    };
    assert_eq!(
        shape(fence_state(&w, id)),
        shape(before),
        "the fence changed"
    );
    let dir = w.dir.join("state/sandboxes/vmjail");
    let on_host: u64 = std::fs::read_dir(&dir)
        .expect("sandbox dir")
        .flatten()
        .filter(|e| e.file_name() != "disk.qcow2")
        .filter_map(|e| e.metadata().ok())
        .map(|m| m.len())
        .sum();
    assert!(
        on_host < 4 << 20,
        "the console flood reached the host's disk: {on_host} bytes in {}",
        dir.display()
    );
    // The memory ceiling is on the QEMU process: guest RAM + QEMU's overhead.
    let pid = s["pid"].as_u64().expect("pid").to_string();
    let cgroups = cgroup_roots();
    let memory = cgroups
        .iter()
        .map(|r| r.join(&w.cgroup_parent).join("vmjail"))
        .find(|d| d.join("memory.limit_in_bytes").exists() || d.join("memory.max").exists())
        .expect("the VM's memory cgroup");
    let limit = std::fs::read_to_string(memory.join("memory.limit_in_bytes"))
        .or_else(|_| std::fs::read_to_string(memory.join("memory.max")))
        .expect("limit");
    assert_eq!(limit.trim(), ((512u64 + 256) << 20).to_string());
    let procs = std::fs::read_to_string(memory.join("cgroup.procs")).expect("procs");
    assert!(
        procs.lines().any(|p| p == pid),
        "QEMU {pid} is not in {}",
        memory.display()
    );
    // Its writes stayed on its own disk.
    assert_eq!(
        w.sh("vmjail", &format!("cat /etc/{marker}")).1.trim(),
        "owned"
    );
    w.destroy_checked("vmjail");
    w.destroy_checked("neighbour");
}
