//! Binding a tree the host attached (`Request::BindTree`) at a path of the guest, and
//! unbinding it. The path is walked one directory at a time from `/`, each opened without
//! following a symbolic link (and made when missing), and the mount goes on the directory so
//! opened: a link that a process of the guest put on the way fails the request, it never
//! takes the tree somewhere else.

use std::{
    os::fd::{AsFd, OwnedFd},
    path::{Component, Path},
};

use rustix::{
    fs::{CWD, Mode, OFlags},
    io::Errno,
    mount::{MoveMountFlags, OpenTreeFlags, UnmountFlags},
};

use crate::proto::GuestBind;

/// Bind `trees`/`tree` (the trees share's directory of one tree) at `path`, then the guest's
/// `binds` inside it ([`super::tree_binds`]): the places skipped (one the tree holds a link
/// at, …), each with why, said on the agent's standard error too.
pub fn bind(
    trees: &Path,
    tree: &str,
    path: &str,
    binds: &[GuestBind],
) -> Result<Vec<String>, String> {
    tree_name(tree)?;
    let parts = parts(path)?;
    let source = trees.join(tree);
    let said = |e: Errno| format!("the tree {tree} ({}): {e}", source.display());
    // The source is under the agent's own mount of the share: the guest's processes see it
    // too, so it is opened without following a link as well.
    let dir = rustix::fs::open(
        &source,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(said)?;
    let clone = rustix::mount::open_tree(
        &dir,
        "",
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_RECURSIVE
            | OpenTreeFlags::AT_EMPTY_PATH,
    )
    .map_err(said)?;
    let target = walk(&parts, true).map_err(|e| format!("{path}: {e}"))?;
    rustix::mount::move_mount(
        &clone,
        "",
        &target,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(|e| format!("binding the tree {tree} at {path}: {e}"))?;
    let skipped = super::tree_binds::bind_all(&clone, binds);
    for s in &skipped {
        eprintln!("svc-microvm-agent: tree {path}: {s}: not bound");
    }
    Ok(skipped)
}

/// Unmount what is mounted at `path` (and every mount under it): its parent walked as
/// [`bind`] walks, the last component not followed; every process of the guest whose root is
/// on the tree's mount (or one below it) is killed first ([`crate::procs`]), so no daemon a
/// removed pod container left runs on. Then the guest kernel's own mount of the
/// tree in the share (`trees`/`tree`: the submount virtio-fs makes for a host mount point), so
/// nothing of it is cached when the host attaches another tree under that name.
pub fn unbind(trees: &Path, tree: &str, path: &str) -> Result<(), String> {
    tree_name(tree)?;
    let parts = parts(path)?;
    let Some((last, parents)) = parts.split_last() else {
        return Err("/ is not a tree's path".into());
    };
    let parent = walk(parents, false).map_err(|e| format!("{path}: {e}"))?;
    let parent_at =
        Path::new("/proc/self/fd").join(rustix::fd::AsRawFd::as_raw_fd(&parent).to_string());
    let at = parent_at.join(last);
    let spared = crate::procs::Spared::caller()?;
    let mountinfo = Path::new("/proc/self/mountinfo");
    if let Some(rooted) = crate::procs::Rooted::at(&at, &parent_at, mountinfo, None, &spared)? {
        rooted
            .end_all(&spared)
            .map_err(|e| format!("ending the processes on {path}: {e}"))?;
    }
    rustix::mount::unmount(&at, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW)
        .map_err(|e| format!("unmounting {path}: {e}"))?;
    // EINVAL: the kernel made no submount there (or it is gone already).
    match rustix::mount::unmount(
        trees.join(tree),
        UnmountFlags::DETACH | UnmountFlags::NOFOLLOW,
    ) {
        Ok(()) | Err(Errno::INVAL | Errno::NOENT) => Ok(()),
        Err(e) => Err(format!("unmounting the tree {tree} in the share: {e}")),
    }
}

/// A tree's name in the share: one plain path component.
fn tree_name(tree: &str) -> Result<(), String> {
    let plain = !tree.is_empty()
        && tree.len() <= 255
        && tree
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if plain {
        Ok(())
    } else {
        Err(format!(
            "tree {tree:?}: a tree is named by 1-255 letters, digits, `-` or `_`"
        ))
    }
}

/// The components of `path`: absolute, no `..`, not `/` itself.
fn parts(path: &str) -> Result<Vec<&str>, String> {
    let p = Path::new(path);
    if !crate::enter::is_plain_absolute(p) {
        return Err(format!("{path}: not an absolute path without `..`"));
    }
    let parts: Vec<&str> = p
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => n.to_str(),
            _ => None,
        })
        .collect();
    if parts.is_empty() {
        return Err("/ cannot take a tree".into());
    }
    Ok(parts)
}

/// Open the directory `parts` names from `/`, no link followed; with `make`, missing
/// directories are made (0755, root's).
fn walk(parts: &[&str], make: bool) -> Result<OwnedFd, String> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mut dir = rustix::fs::openat(CWD, "/", flags, Mode::empty()).map_err(|e| e.to_string())?;
    for part in parts {
        let open = |d: &OwnedFd| rustix::fs::openat(d.as_fd(), *part, flags, Mode::empty());
        let next = match open(&dir) {
            Err(Errno::NOENT) if make => {
                match rustix::fs::mkdirat(&dir, *part, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => open(&dir),
                    Err(e) => Err(e),
                }
            }
            other => other,
        };
        dir = next.map_err(|e| match e {
            // O_NOFOLLOW|O_DIRECTORY on a link says ENOTDIR (or ELOOP).
            Errno::NOTDIR | Errno::LOOP => {
                format!("{part} is a symbolic link or not a directory (no link is followed)")
            }
            e => format!("{part}: {e}"),
        })?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_and_paths_are_refused_by_name() {
        for (tree, path, want) in [
            ("../etc", "/pod/c1", "a tree is named by"),
            ("a/b", "/pod/c1", "a tree is named by"),
            ("", "/pod/c1", "a tree is named by"),
            ("t1", "pod/c1", "not an absolute path"),
            ("t1", "/pod/../etc", "not an absolute path"),
            ("t1", "/", "/ cannot take a tree"),
        ] {
            let err = bind(Path::new("/nonexistent-trees"), tree, path, &[]).expect_err(want);
            assert!(err.contains(want), "{tree} {path}: {err}");
        }
        let nowhere = Path::new("/nonexistent-trees");
        assert!(
            unbind(nowhere, "t1", "/")
                .expect_err("root")
                .contains("/ cannot take a tree")
        );
        assert!(unbind(nowhere, "../x", "/pod/c1").is_err());
    }

    /// As root on the host: a link on the way to the target is refused, not followed, and a
    /// tree bound at a plain path is seen there and unbound again.
    #[test]
    fn a_link_on_the_way_is_refused_and_a_plain_path_is_bound() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("SKIPPED (loudly): binding needs root (mount), run the tests as root");
            return;
        }
        let t = tempfile::tempdir().expect("tempdir");
        let trees = t.path().join("trees");
        std::fs::create_dir_all(trees.join("t1")).expect("tree");
        std::fs::write(trees.join("t1/marker"), "in the tree").expect("marker");
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).expect("elsewhere");
        std::os::unix::fs::symlink(&elsewhere, t.path().join("link")).expect("link");
        let via_link = format!("{}/link/c1", t.path().display());
        let err = bind(&trees, "t1", &via_link, &[]).expect_err("a link on the way");
        assert!(err.contains("link is a symbolic link"), "{err}");
        assert!(
            !elsewhere.join("c1").exists(),
            "nothing was made through the link"
        );
        let plain = format!("{}/pod/c1", t.path().display());
        bind(&trees, "t1", &plain, &[]).expect("bind");
        let seen = std::fs::read_to_string(format!("{plain}/marker")).expect("marker");
        assert_eq!(seen, "in the tree");
        unbind(&trees, "t1", &plain).expect("unbind");
        assert!(!Path::new(&format!("{plain}/marker")).exists(), "unbound");
    }
}
