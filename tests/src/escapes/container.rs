//! Escapes from inside a container-backend guest: each is tried as the guest's root with the
//! tools a hostile agent would use, must fail with a clear error, and is checked from the host
//! afterwards (host files, svcd's files and socket, the fence's maps and pins, the link).

use std::path::Path;

use super::{Guest, fence_state, guest_checks, quoted};
use crate::{unique, world::World};

/// No escape from `g` (running in svc sandbox `sandbox`, whose policy allows
/// allowed.example.test) reaches the host, the fence or svcd. `extra_paths`: host paths beyond
/// svcd's own that must not be visible in the guest either.
pub fn no_escape_reaches_the_host_the_fence_or_svcd(
    w: &World,
    g: &dyn Guest,
    sandbox: &str,
    extra_paths: &[String],
) {
    let s = w.show(sandbox);
    let id = u32::try_from(s["id"].as_u64().expect("id")).expect("id fits");
    let pid = s["pid"].as_u64().expect("pid");
    let guest_v4 = s["guest_v4"].as_str().expect("guest_v4").to_owned();
    let gateway = s["gateway_v4"].as_str().expect("gateway_v4").to_owned();
    // Resolve an allowed name once, so the fence holds an entry the escapes could try to change.
    guest_checks(g, "getent hosts allowed.example.test >/dev/null");
    let before = fence_state(w, id);
    assert!(!before.0.is_empty(), "the allowed name left no fence entry");
    let routes_before = g.sh("ip route; ip -o addr").1;

    assert_guest_root_is_unprivileged(pid);
    assert_eq!(g.sh("id -u").1.trim(), "0", "root inside {}", g.describe());

    let marker = unique("esc");
    let svcd_pid = w.svcd_pid().expect("svcd runs");
    let out = guest_checks(
        g,
        &escape_script(w, &gateway, svcd_pid, &marker, extra_paths),
    );
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
    assert_eq!(fence_state(w, id), before, "the fence changed");
    assert_eq!(
        g.sh("ip route; ip -o addr").1,
        routes_before,
        "the guest's routes or addresses changed"
    );
    assert!(
        Path::new(&format!("/proc/{svcd_pid}")).exists(),
        "svcd was killed"
    );
    assert_eq!(w.show(sandbox)["guest_v4"], guest_v4.as_str());
    // The guest's writes stayed in its own layer.
    assert_eq!(g.sh(&format!("cat /etc/{marker}")).1.trim(), "owned");
}

/// The guest's root (its init, host pid `pid`) is an unprivileged host user.
fn assert_guest_root_is_unprivileged(pid: u64) {
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
}

/// The host's and svcd's paths no guest may see: `extra` and svcd's own.
fn host_paths(w: &World, extra: &[String]) -> Vec<String> {
    let mut paths = vec![
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
    paths.extend_from_slice(extra);
    paths
}

/// The script: every move, each checked to be refused; "all refused" at its end.
fn escape_script(
    w: &World,
    gateway: &str,
    svcd_pid: u32,
    marker: &str,
    extra_paths: &[String],
) -> String {
    format!(
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
{syscalls}
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
        paths = quoted(&host_paths(w, extra_paths)),
        syscalls = syscalls_script(gateway),
    )
}

/// Raw syscalls the filter refuses with EPERM (x86_64 numbers), vsock, raw and packet
/// sockets, and a spoofed source without a raw socket (a shell fragment).
fn syscalls_script(gateway: &str) -> String {
    format!(
        r#"python3 - <<'PY' || exit 1
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
PY"#
    )
}
