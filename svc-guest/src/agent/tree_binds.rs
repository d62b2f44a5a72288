//! The guest's own places bound inside a tree just bound by the agent's `trees` module: a pod
//! container's root file system gets the guest's `/proc`, `/dev`, `/sys`, relay directory and
//! resolver and CA files, as the container backend gives them (the host names the list).
//!
//! Every path inside the tree is resolved beneath its root with no symbolic or magic link
//! followed (`openat2` `RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS|RESOLVE_NO_MAGICLINKS`): a place
//! the image made a link, or reaches through one, is left as it is and gets nothing. A
//! missing place is made (its parent must be there); one of another kind is left alone. The
//! trees share itself is never carried into a tree: a guest place above it is bound without
//! the mounts under it.

use std::os::fd::{AsFd, OwnedFd};

use rustix::{
    fs::{FileType, Mode, OFlags, ResolveFlags},
    io::Errno,
    mount::{MoveMountFlags, OpenTreeFlags},
};

use crate::proto::{GuestBind, TREES_DIR};

/// Bind each of `binds` over the same place inside `tree` (the root of the tree, opened): the
/// places skipped, each with why (none skipped: every one is bound).
pub fn bind_all(tree: &OwnedFd, binds: &[GuestBind]) -> Vec<String> {
    binds
        .iter()
        .filter_map(|b| bind_one(tree, b).err().map(|e| format!("/{}: {e}", b.path)))
        .collect()
}

fn bind_one(tree: &OwnedFd, b: &GuestBind) -> Result<(), String> {
    let rel = b.path.trim_start_matches('/');
    if rel.is_empty()
        || rel
            .split('/')
            .any(|p| p.is_empty() || p == "." || p == "..")
    {
        return Err("not a plain relative path".into());
    }
    let root = rustix::fs::open("/", dir_flags(), Mode::empty()).map_err(|e| e.to_string())?;
    let source = match beneath(&root, rel) {
        Ok(fd) => fd,
        // Nothing of the guest's there: nothing to bind.
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(format!("the guest's: {e}")),
    };
    of_kind(&source, b.dir).map_err(|e| format!("the guest's: {e}"))?;
    let mut flags = OpenTreeFlags::OPEN_TREE_CLONE
        | OpenTreeFlags::OPEN_TREE_CLOEXEC
        | OpenTreeFlags::AT_EMPTY_PATH;
    if !TREES_DIR.starts_with(&format!("/{rel}/")) {
        flags |= OpenTreeFlags::AT_RECURSIVE;
    }
    let copy = rustix::mount::open_tree(&source, "", flags).map_err(|e| e.to_string())?;
    let target = match beneath(tree, rel) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => {
            make(tree, rel, b.dir)?;
            beneath(tree, rel).map_err(|e| e.to_string())?
        }
        Err(Errno::LOOP | Errno::XDEV) => {
            return Err("reached through a symbolic link in the tree: never followed".into());
        }
        Err(e) => return Err(format!("in the tree: {e}")),
    };
    of_kind(&target, b.dir).map_err(|e| format!("in the tree: {e}"))?;
    rustix::mount::move_mount(
        &copy,
        "",
        &target,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
    .map_err(|e| format!("binding it: {e}"))
}

fn dir_flags() -> OFlags {
    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC
}

/// `rel` under `base`, the last component opened as itself (a link is not followed), no link
/// or `..` on the way, nothing outside `base` reached.
fn beneath(base: &OwnedFd, rel: &str) -> Result<OwnedFd, Errno> {
    rustix::fs::openat2(
        base.as_fd(),
        rel,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
}

/// `fd` is a directory (`dir`) or a regular file; a link (opened as itself) or anything else
/// is left alone.
fn of_kind(fd: &OwnedFd, dir: bool) -> Result<(), String> {
    let st = rustix::fs::fstat(fd).map_err(|e| e.to_string())?;
    let kind = FileType::from_raw_mode(st.st_mode);
    let want = if dir {
        FileType::Directory
    } else {
        FileType::RegularFile
    };
    if kind == want {
        return Ok(());
    }
    Err(if kind == FileType::Symlink {
        "a symbolic link: left as it is, never followed".to_owned()
    } else {
        format!(
            "not a {}: left as it is",
            if dir { "directory" } else { "file" }
        )
    })
}

/// Make `rel`'s last component in `tree` (its parent must be there, reached with no link): a
/// directory or an empty file.
fn make(tree: &OwnedFd, rel: &str, dir: bool) -> Result<(), String> {
    let (parent, name) = match rel.rsplit_once('/') {
        Some((p, n)) => (
            beneath(tree, p).map_err(|e| format!("its parent in the tree: {e}"))?,
            n,
        ),
        None => (
            rustix::fs::openat(tree.as_fd(), ".", dir_flags(), Mode::empty())
                .map_err(|e| e.to_string())?,
            rel,
        ),
    };
    of_kind(&parent, true).map_err(|e| format!("its parent in the tree: {e}"))?;
    let made = if dir {
        rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o755))
    } else {
        rustix::fs::openat(
            &parent,
            name,
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map(drop)
    };
    made.map_err(|e| format!("making it in the tree: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_places_are_refused_by_name() {
        let tree = rustix::fs::open("/", dir_flags(), Mode::empty()).expect("/");
        let binds: Vec<GuestBind> = ["", "/", "../etc", "etc/../x", "etc//hosts", "./proc"]
            .into_iter()
            .map(|p| GuestBind {
                path: p.into(),
                dir: true,
            })
            .collect();
        let skipped = bind_all(&tree, &binds);
        assert_eq!(skipped.len(), binds.len(), "{skipped:?}");
        assert!(
            skipped
                .iter()
                .all(|s| s.contains("not a plain relative path")),
            "{skipped:?}"
        );
    }
}
