//! Disk per sandbox (`[container] disk_mib`), against the real svcd and container sandboxes: a
//! guest sees its own disk's size in `df /`, filling it is ENOSPC for that guest while its
//! image on the host stays within the limit, another sandbox keeps writing and its HTTPS is
//! proxied and audited; the disk survives an svcd restart (re-adopted) and destroy leaves no
//! image and no loop device.

use std::os::unix::fs::MetadataExt as _;

use svc_tests::{loop_devices_under, require_root, world::World};

/// The limit under test, in MiB.
const DISK_MIB: u64 = 64;

/// How much the guest tries to write: well past its disk.
const FILL_MIB: u64 = 200;

/// `df -Pk /` in sandbox `name`: (size, available), KiB.
fn df_root(w: &World, name: &str) -> (u64, u64) {
    let (code, out, err) = w.sh(name, "df -Pk / | tail -n 1");
    assert_eq!(code, 0, "df in {name}: {err}");
    let cols: Vec<u64> = out
        .split_whitespace()
        .filter_map(|c| c.parse().ok())
        .collect();
    assert!(cols.len() >= 3, "df in {name}: {out}");
    (cols[0], cols[2])
}

/// The bytes allocated on the host under `dir` (what a guest took from the host's disk).
fn allocated(dir: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        total += m.blocks() * 512;
        if m.is_dir()
            && let Ok(rd) = std::fs::read_dir(&p)
        {
            stack.extend(rd.flatten().map(|e| e.path()));
        }
    }
    total
}

#[test]
fn a_full_sandbox_disk_is_enospc_for_its_guest_alone_and_destroy_leaves_nothing() {
    require_root();
    let mut w = World::start_with(&format!("disk_mib = {DISK_MIB}"));
    for name in ["full", "calm"] {
        w.svc_ok(&["sandbox", "create", name, "--backend", "container"]);
    }
    let sandboxes = w.dir.join("state/sandboxes");

    // `df /` is the sandbox's own disk, not the host's.
    let (size_kib, _) = df_root(&w, "full");
    assert!(
        (DISK_MIB * 1024 * 8 / 10..=DISK_MIB * 1024).contains(&size_kib),
        "df / in the guest shows {size_kib} KiB, not its {DISK_MIB} MiB disk"
    );
    let image = sandboxes.join("full/disk.img");
    let meta = std::fs::metadata(&image).expect("the sandbox's disk image");
    assert_eq!(meta.len(), DISK_MIB << 20, "the image's size");
    assert_eq!(meta.mode() & 0o777, 0o600, "the image is root's alone");
    assert_eq!(
        loop_devices_under(&sandboxes.join("full")).len(),
        1,
        "one loop device backs the disk"
    );

    // Fill it: ENOSPC for this guest, and the host keeps only what the limit allows.
    let before = allocated(&sandboxes.join("full"));
    let (code, out, err) = w.sh(
        "full",
        &format!("dd if=/dev/zero of=/fill bs=1M count={FILL_MIB} 2>&1; echo rc=$?; sync"),
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("No space left on device") && !out.contains("rc=0"),
        "filling the guest's disk must end in ENOSPC: {out}"
    );
    let grown = allocated(&sandboxes.join("full")).saturating_sub(before);
    assert!(
        grown <= (DISK_MIB + 8) << 20,
        "the guest took {grown} bytes of the host's disk, past its {DISK_MIB} MiB"
    );
    let (_, avail) = df_root(&w, "full");
    assert!(avail < 1024, "the guest's disk is full: {avail} KiB left");

    // Another sandbox writes, and its HTTPS goes through the proxy and is audited.
    let (code, out, err) = w.sh(
        "calm",
        "dd if=/dev/zero of=/calm bs=1M count=16 2>&1 && sync && echo wrote && \
         curl -sS -o /dev/null -w '%{http_code}' --max-time 20 https://api.agent.test/",
    );
    assert_eq!(code, 0, "another sandbox while one is full: {out}{err}");
    assert!(out.contains("wrote"), "{out}");
    assert!(out.trim_end().ends_with("200"), "HTTPS answer: {out}");
    assert!(
        w.audit()
            .iter()
            .any(|r| r["sandbox_name"] == "calm" && r["host"] == "api.agent.test"),
        "the other sandbox's request is audited while one disk is full"
    );

    // Freed space comes back to the guest (and its blocks to the host).
    let (code, out, err) = w.sh(
        "full",
        "rm /fill && sync && echo again > /again && cat /again",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.trim(), "again");

    // An svcd restart re-adopts the sandbox, disk and all; destroy then leaves nothing.
    w.kill_svcd();
    w.start_svcd();
    let (code, out, _) = w.sh("full", "cat /again");
    assert_eq!((code, out.trim()), (0, "again"), "the disk after a restart");
    for name in ["full", "calm"] {
        w.destroy_checked(name);
    }
    assert!(!image.exists(), "the image is removed");
}
