//! The runtime's own escapes (docs/isolation.md): a container is never created over files a
//! guest wrote, and svcd says at start when its runc predates the fixes for CVE-2025-31133,
//! CVE-2025-52565 and CVE-2025-52881. From inside a real container sandbox, with the real svcd
//! and runc. `cri_escapes.rs` plants the same tree in a pod container's own layer.
#![expect(clippy::expect_used, reason = "test helpers")]

use std::{os::unix::fs::PermissionsExt as _, path::Path};

use svc_tests::{
    escapes::{InSandbox, RemovedAtEnd, plant_hostile_layer},
    require_root,
    world::World,
};

/// A guest's writable layer ends with its sandbox, however the guest shaped it: a tree deeper
/// than svcd's stack and descriptors allow a recursive walk (which crashed svcd at destroy, or
/// left the layer in place for the next sandbox of the name), files and symlinks planted where
/// the runtime resolves paths. And a layer something else left behind is never created over:
/// the next sandbox of that name starts from the image. Run with the writable layer as a
/// directory of the host (`disk_mib = 0`), where a layer can outlive its sandbox; on its own
/// disk (the default) the layer is an image made new at each creation and removed whole.
#[test]
fn a_guest_written_layer_never_reaches_a_later_create() {
    require_root();
    let w = World::start_with("disk_mib = 0");
    let create = ["sandbox", "create", "--backend", "container", "reuse"];
    w.svc_ok(&create);
    plant_hostile_layer(&InSandbox::new(&w, "reuse"));
    let dir = w.dir.join("state/sandboxes/reuse");
    // Dropped before the world: whatever the guest's tree outlives goes without a recursive
    // walk (the world's own removal would overflow this test's stack on it).
    let _tree = RemovedAtEnd(dir.clone());
    assert!(
        dir.join("upper/var/tmp/d").is_dir(),
        "the layer is under {}",
        dir.display()
    );

    let out = w.svc(&["sandbox", "destroy", "reuse"]);
    assert!(
        out.status.success(),
        "destroy: {}\nsvcd:\n{}",
        String::from_utf8_lossy(&out.stderr),
        w.svcd_log()
    );
    let pid = w.svcd_pid().expect("svcd was started");
    assert!(
        Path::new(&format!("/proc/{pid}")).exists() && !svc_control::runtime::is_zombie(pid),
        "svcd died removing the guest's tree:\n{}",
        w.svcd_log()
    );
    assert!(!dir.exists(), "{} outlived its sandbox", dir.display());

    // What a crash (or any failed removal) leaves: an earlier guest's layer at the name's
    // directory, with a planted file and a symlink toward /proc where the runtime resolves.
    std::fs::create_dir_all(dir.join("upper/etc")).expect("leftover");
    std::fs::write(dir.join("upper/etc/planted"), "planted\n").expect("leftover file");
    std::os::unix::fs::symlink("/proc/sys/kernel", dir.join("upper/run")).expect("leftover link");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    w.svc_ok(&create);
    let (code, out, err) = w.sh(
        "reuse",
        "test ! -e /etc/planted && test ! -L /etc/null-link && test ! -L /run && \
         test ! -e /var/tmp/d && echo fresh",
    );
    assert!(
        code == 0 && out.contains("fresh"),
        "the new sandbox sees the earlier guest's files: {out}{err}"
    );
    assert!(
        w.svcd_log()
            .contains("removing an earlier sandbox's leftover files"),
        "{}",
        w.svcd_log()
    );
    w.destroy_checked("reuse");
}

/// A runc that reports `version` (and runs the real one for everything else).
fn fake_runtime(w: &World, version: &str, commit: &str) -> std::path::PathBuf {
    let real = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([std::path::PathBuf::from("/usr/sbin")])
        .map(|d| d.join("runc"))
        .find(|p| p.exists())
        .expect("runc is installed");
    let dir = w.dir.join(format!("runtime-{version}"));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = dir.join("runc");
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nif [ \"$1\" = --version ]; then\n  echo 'runc version {version}'\n  \
             echo 'commit: {commit}'\n  exit 0\nfi\nexec {} \"$@\"\n",
            real.display()
        ),
    )
    .expect("script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// svcd's start-up names the three advisories and the fixed releases when its runtime is
/// older, and says nothing when it is a fixed release.
#[test]
fn svcd_warns_at_start_about_a_runtime_older_than_the_fixes() {
    require_root();
    let mut w = World::start();
    let old = fake_runtime(&w, "1.1.5+ds1", "1.1.5+ds1-1+deb12u1");
    let fixed = fake_runtime(&w, "1.3.3", "v1.3.3-0-gd842d771");
    for (runtime, warned) in [(old, true), (fixed, false)] {
        let before = w
            .svcd_log()
            .lines()
            .filter(|l| l.contains("CVE-2025-31133"))
            .count();
        w.kill_svcd();
        let config = std::fs::read_to_string(&w.config).expect("svcd.toml");
        let config = config
            .lines()
            .filter(|l| !l.starts_with("runtime = "))
            .map(|l| {
                if l == "[container]" {
                    format!("[container]\nruntime = \"{}\"", runtime.display())
                } else {
                    l.to_owned()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&w.config, config).expect("svcd.toml");
        w.start_svcd();
        let log = w.svcd_log();
        let this_start: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("CVE-2025-31133"))
            .skip(before)
            .collect();
        if warned {
            let line = this_start
                .iter()
                .find(|l| l.contains("predates the fixes"))
                .unwrap_or_else(|| panic!("no warning:\n{log}"));
            for part in [
                "runc 1.1.5+ds1 (1.1.5+ds1-1+deb12u1)",
                "CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881",
                "runc 1.2.8 and 1.3.3",
                "WARN",
            ] {
                assert!(line.contains(part), "{part} in {line}");
            }
        } else {
            assert_eq!(
                this_start,
                Vec::<&str>::new(),
                "a fixed runtime is warned about"
            );
        }
    }
}
