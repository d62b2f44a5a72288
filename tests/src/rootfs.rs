//! Root file systems handed to sandboxes (`svc sandbox create --rootfs`, the containerd shim's
//! images): a tree made from the base image, marked so a test can tell it from the base, and a
//! fingerprint of a tree to show that nothing changed it.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// What the handed tree's `/etc/handed-rootfs` holds (the base image has no such file).
pub const MARK: &str = "the handed root file system";

/// A root file system at `<dir>/rootfs`: the base image's tree linked file by file (fast, and
/// nothing of the base is ever written: the sandbox's writes go to its own layer), with
/// `/etc/handed-rootfs` of its own. Its canonical path.
pub fn handed_tree(dir: &Path) -> PathBuf {
    let base = crate::world::image_dir().join("rootfs");
    let root = dir.join("rootfs");
    let out = Command::new("cp")
        .arg("-al")
        .arg(&base)
        .arg(&root)
        .output()
        .expect("cp");
    assert!(
        out.status.success(),
        "cp -al: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(root.join("etc/handed-rootfs"), MARK).expect("mark");
    std::fs::canonicalize(&root).expect("canonical")
}

/// Every path under `root` with its type, size, owner, mode and modification time, sorted:
/// equal before and after means nothing in the tree was added, removed or changed.
pub fn fingerprint(root: &Path) -> String {
    let out = Command::new("find")
        .arg(root)
        .args(["-printf", "%P %y %s %U:%G %m %T@\n"])
        .output()
        .expect("find");
    assert!(
        out.status.success(),
        "find: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<&str> = std::str::from_utf8(&out.stdout)
        .expect("utf-8")
        .lines()
        .collect();
    lines.sort_unstable();
    lines.join("\n")
}
