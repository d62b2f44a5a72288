//! Escapes from inside a microVM guest. The guest is root of its own kernel: it may load eBPF,
//! mount, add addresses and open raw sockets — all in its own kernel. None of that reaches the
//! host: the host's paths are not there, the image it booted from is not written, a spoofed or
//! stolen source address is dropped at the tap, the host's own ports are closed, and a console
//! flood fills nothing on the host.

use std::{path::Path, time::SystemTime};

use super::{Guest, fence_state, guest_checks, quoted};
use crate::{
    unique,
    world::{World, cgroup_roots, microvm_images},
};

/// The modification time of the microvm image the VMs boot from.
pub fn image_mtime() -> SystemTime {
    microvm_images()
        .join("rootfs.ext4")
        .metadata()
        .expect("image")
        .modified()
        .expect("mtime")
}

/// No escape from `g` (running in microvm sandbox `sandbox`, whose policy allows
/// allowed.example.test) reaches the host, the fence or svcd, nor the address of sandbox
/// `neighbour`; the image is as it was at `image_before`. `extra_paths`: host paths beyond
/// svcd's own that must not be visible in the guest either.
pub fn no_escape_reaches_the_host_the_fence_or_svcd(
    w: &World,
    g: &dyn Guest,
    sandbox: &str,
    neighbour: &str,
    image_before: SystemTime,
    extra_paths: &[String],
) {
    let s = w.show(sandbox);
    let id = u32::try_from(s["id"].as_u64().expect("id")).expect("id fits");
    let gateway = s["gateway_v4"].as_str().expect("gateway_v4").to_owned();
    let neighbour = w.show(neighbour)["guest_v4"]
        .as_str()
        .expect("neighbour address")
        .to_owned();
    guest_checks(g, "getent hosts allowed.example.test >/dev/null");
    let before = fence_state(w, id);
    assert!(!before.0.is_empty(), "the allowed name left no fence entry");
    let marker = unique("esc");
    let mut host_paths = vec![
        w.config.display().to_string(),
        w.dir.join("state").display().to_string(),
        w.audit_path().display().to_string(),
        w.socket.display().to_string(),
        w.pins.path.display().to_string(),
        microvm_images().join("rootfs.ext4").display().to_string(),
        format!("/run/netns/{}", w.host.name),
    ];
    host_paths.extend_from_slice(extra_paths);
    let out = guest_checks(
        g,
        &escape_script(&host_paths, &marker, &gateway, &neighbour),
    );
    println!("{out}");
    assert!(out.contains("all refused"), "{out}");

    assert!(
        !Path::new(&format!("/etc/{marker}")).exists(),
        "the guest wrote the host's /etc"
    );
    assert_eq!(
        image_mtime(),
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
        shape(fence_state(w, id)),
        shape(before),
        "the fence changed"
    );
    assert_host_holds_the_vm(w, sandbox, &s["pid"].as_u64().expect("pid").to_string());
    // Its writes stayed on its own disk.
    assert_eq!(g.sh(&format!("cat /etc/{marker}")).1.trim(), "owned");
}

/// The script: every move, each checked to be refused or harmless; "all refused" at its end.
fn escape_script(host_paths: &[String], marker: &str, gateway: &str, neighbour: &str) -> String {
    format!(
        r#"set -u
fail() {{ echo "ESCAPED: $*"; exit 1; }}
refused() {{ what=$1; shift
  if out=$("$@" 2>&1); then fail "$what succeeded: $out"; fi
  echo "refused: $what: $(echo "$out" | head -n1)"; }}
for p in {paths}; do [ -e "$p" ] && fail "host path $p is visible"; done
echo "no host path visible"
echo owned > /etc/{marker} && sync || fail "cannot write the guest's own /etc"
if ps -eo comm | grep -qx svcd; then fail "svcd is visible"; fi
# Root of its own kernel with CAP_NET_ADMIN (bit 12): it may add addresses; the fence drops
# what they send. Without it (a pod container given containerd's default capability sets):
# adding one is refused, and the plain VM's run of this script tries the spoofing.
if [ $(( 0x$(awk '/^CapEff/{{print $2}}' /proc/self/status) >> 12 & 1 )) = 1 ]; then
  ip addr add 10.203.255.250/32 dev eth0 || fail "cannot add an address in its own kernel"
  refused "connect from a made-up source" curl -sS --interface 10.203.255.250 --connect-timeout 3 https://allowed.example.test/
  ip addr add {neighbour}/32 dev eth0 || fail "cannot add the neighbour's address"
  refused "connect from the neighbour's address" curl -sS --interface {neighbour} --connect-timeout 3 https://allowed.example.test/
else
  refused "add an address without CAP_NET_ADMIN" ip addr add 10.203.255.250/32 dev eth0
fi
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
        paths = quoted(host_paths),
    )
}

/// The console flood filled nothing on the host, and the memory ceiling is on the VM's QEMU
/// (`qemu`, a host pid): guest RAM + QEMU's overhead.
fn assert_host_holds_the_vm(w: &World, sandbox: &str, qemu: &str) {
    let dir = w.dir.join("state/sandboxes").join(sandbox);
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
    let memory = cgroup_roots()
        .iter()
        .map(|r| r.join(&w.cgroup_parent).join(sandbox))
        .find(|d| d.join("memory.limit_in_bytes").exists() || d.join("memory.max").exists())
        .expect("the VM's memory cgroup");
    let limit = std::fs::read_to_string(memory.join("memory.limit_in_bytes"))
        .or_else(|_| std::fs::read_to_string(memory.join("memory.max")))
        .expect("limit");
    assert_eq!(limit.trim(), ((512u64 + 256) << 20).to_string());
    let procs = std::fs::read_to_string(memory.join("cgroup.procs")).expect("procs");
    assert!(
        procs.lines().any(|p| p == qemu),
        "QEMU {qemu} is not in {}",
        memory.display()
    );
}
