//! Disk per sandbox on the microvm backend: the guest's disk is `[container] disk_mib` (its
//! qcow2 overlay's virtual size, which bounds what the overlay file can grow to), and its root
//! file system is grown to fill it, so `df /` inside shows that size.

use svc_tests::{
    require_root,
    world::{World, microvm_images},
};

/// The limit under test, in MiB: twice the image's own size (~916 MiB).
const DISK_MIB: u64 = 2048;

#[test]
fn a_microvm_guest_sees_a_disk_of_its_limit() {
    require_root();
    microvm_images();
    let w = World::start_with(&format!("disk_mib = {DISK_MIB}"));
    w.svc_ok(&["sandbox", "create", "vm", "--backend", "microvm"]);
    let (code, out, err) = w.sh("vm", "df -Pk / | tail -n 1");
    assert_eq!(code, 0, "df: {err}");
    let size_kib: u64 = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("df: {out}"));
    assert!(
        (DISK_MIB * 1024 * 9 / 10..=DISK_MIB * 1024).contains(&size_kib),
        "df / in the guest shows {size_kib} KiB, not its {DISK_MIB} MiB disk"
    );
    let info = std::process::Command::new("qemu-img")
        .args(["info", "--output", "json", "-U"])
        .arg(w.dir.join("state/sandboxes/vm/disk.qcow2"))
        .output()
        .unwrap_or_else(|e| panic!("qemu-img info: {e}"));
    let info: serde_json::Value =
        serde_json::from_slice(&info.stdout).unwrap_or_else(|e| panic!("qemu-img json: {e}"));
    assert_eq!(
        info["virtual-size"].as_u64(),
        Some(DISK_MIB << 20),
        "the overlay's virtual size: {info}"
    );
    w.destroy_checked("vm");
}
