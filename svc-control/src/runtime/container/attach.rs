//! The directories a running guest made ahead of its request (a warm pool's, docs/pool.md)
//! shares with the host once a sandbox that shares them claims it: the project and the coding
//! agent's home. Each is made as `mount_shared` makes it for a guest being created — attached
//! idmapped under the sandbox's directory (its owner shown as the guest's root), the paths
//! inside it pinned, then read-only, each opened with no link followed and bound through that
//! handle — then a copy of that whole tree (`open_tree`) is moved onto its guest path in the
//! guest's mount namespace (`move_mount`) by a short-lived helper process that joins it, and
//! the host-side attachment goes. The guest then has what a guest made with it has: the same
//! mounts, ids, `nosuid,nodev` and read-only flags, private, at the same place.

use std::{
    ffi::CString,
    os::{
        fd::{AsRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::{Path, PathBuf},
};

use super::{Container, rootfs::IdRange, shared};
use crate::{
    dataplane::idmap,
    runtime::{GuestHandle, RuntimeError, SharedDir, start_time},
};

/// One shared directory ready to go into the guest: a detached copy of its tree, the guest's
/// mount namespace, and the mount point there (all handles).
struct Ready {
    tree: OwnedFd,
    mnt_ns: std::fs::File,
    mount_point: OwnedFd,
}

impl Container {
    /// Share `dirs` (in order, as a guest being made gets them) into the running `guest` of
    /// sandbox `id`, whose directory is `dir`.
    pub(super) async fn share_into_guest(
        &self,
        guest: &GuestHandle,
        id: u32,
        dir: &Path,
        dirs: &[SharedDir],
    ) -> Result<(), RuntimeError> {
        // Named as the sandbox is (its directory's name), not as the pool made its guest.
        let sandbox = dir
            .file_name()
            .map_or_else(|| guest.name.clone(), |n| n.to_string_lossy().into_owned());
        let err = |message: String| RuntimeError::Lifecycle {
            operation: "sharing directories with",
            name: sandbox.clone(),
            message,
        };
        let ids = self.guest_ids(id).map_err(err)?;
        for (i, shared) in dirs.iter().enumerate() {
            let what = |e: String| {
                err(format!(
                    "{} at {}: {e}",
                    shared.host.display(),
                    shared.guest.display()
                ))
            };
            let (g, d, s) = (guest.clone(), dir.to_owned(), shared.clone());
            let ready = tokio::task::spawn_blocking(move || prepare(&g, &d, i, &s, ids))
                .await
                .map_err(|e| what(e.to_string()))?
                .map_err(what)?;
            move_in(guest, ready).await.map_err(what)?;
        }
        Ok(())
    }
}

/// Shared directory `i` of the guest (sandbox directory `dir`, host ids `ids`) made as a guest
/// being created gets it, copied off the host, and where it goes in the guest.
fn prepare(
    guest: &GuestHandle,
    dir: &Path,
    i: usize,
    shared: &SharedDir,
    ids: IdRange,
) -> Result<Ready, String> {
    if start_time(guest.pid) != Some(guest.start) {
        return Err("the guest is not running".to_owned());
    }
    let target = shared::attach(dir, i, shared, ids)?;
    let tree = copy_tree(&target, shared);
    // The copy holds every mount it needs: the host keeps none of them.
    shared::detach_shared(dir);
    let tree = tree?;
    let proc = PathBuf::from(format!("/proc/{}", guest.pid));
    let mnt_ns = std::fs::File::open(proc.join("ns/mnt"))
        .map_err(|e| format!("its mount namespace: {e}"))?;
    let root =
        std::fs::File::open(proc.join("root")).map_err(|e| format!("its root directory: {e}"))?;
    // Both opened from the guest's init, not from a process that took its pid meanwhile.
    if start_time(guest.pid) != Some(guest.start) {
        return Err("the guest is not running".to_owned());
    }
    let mount_point =
        idmap::open_or_make_dirs(&OwnedFd::from(root), &shared.guest, (ids.uid, ids.gid))
            .map_err(|e| format!("its mount point in the guest: {e}"))?;
    Ok(Ready {
        tree,
        mnt_ns,
        mount_point,
    })
}

/// The binds inside the shared directory attached at `target` (pinned, then read-only, as
/// `mount_shared` has the runtime make them: `bind,nosuid,nodev`, `ro` for the read-only
/// ones), each opened with no link followed and bound onto itself through that handle; then a
/// detached copy of the whole tree, private (as the guest's own mounts are: `rprivate`).
fn copy_tree(target: &Path, shared: &SharedDir) -> Result<OwnedFd, String> {
    let binds = (shared.pinned.iter().map(|p| (p, false)))
        .chain(shared.read_only.iter().map(|p| (p, true)));
    for (rel, read_only) in binds {
        let fail = |e: std::io::Error| format!("{}: {e}", rel.display());
        let at = idmap::open_beneath(target, rel).map_err(fail)?;
        let bind =
            idmap::clone_tree(at.as_raw_fd(), c"", libc::AT_EMPTY_PATH as u32).map_err(fail)?;
        let flags = libc::MOUNT_ATTR_NOSUID
            | libc::MOUNT_ATTR_NODEV
            | if read_only {
                libc::MOUNT_ATTR_RDONLY
            } else {
                0
            };
        idmap::set_tree_attrs(&bind, flags, 0, 0, 0).map_err(fail)?;
        idmap::move_tree_onto(bind.as_raw_fd(), at.as_raw_fd()).map_err(fail)?;
    }
    let path = CString::new(target.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    let tree = idmap::clone_tree(libc::AT_FDCWD, &path, libc::AT_RECURSIVE as u32)
        .map_err(|e| format!("copying its mounts: {e}"))?;
    idmap::set_tree_attrs(&tree, 0, libc::MS_PRIVATE, 0, libc::AT_RECURSIVE as u32)
        .map_err(|e| format!("making its mounts private: {e}"))?;
    Ok(tree)
}

/// Move the `ready` tree onto its mount point in the guest: a short-lived helper process
/// (never one of svcd's threads) joins the guest's mount namespace and calls move_mount(2)
/// there.
async fn move_in(guest: &GuestHandle, ready: Ready) -> Result<(), String> {
    if start_time(guest.pid) != Some(guest.start) {
        return Err("the guest is not running".to_owned());
    }
    let (tree, ns, at) = (
        ready.tree.as_raw_fd(),
        ready.mnt_ns.as_raw_fd(),
        ready.mount_point.as_raw_fd(),
    );
    let mut c = tokio::process::Command::new("/bin/true");
    c.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true);
    // SAFETY: the closure only makes system calls (setns, move_mount) on descriptors opened
    // before the fork (close-on-exec: open until the exec).
    unsafe {
        c.pre_exec(move || {
            if libc::setns(ns, libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            idmap::move_tree_onto(tree, at)
        });
    }
    let status = c
        .status()
        .await
        .map_err(|e| format!("moving it into the guest: {e}"))?;
    drop(ready);
    if status.success() {
        Ok(())
    } else {
        Err(format!("moving it into the guest: {status}"))
    }
}
