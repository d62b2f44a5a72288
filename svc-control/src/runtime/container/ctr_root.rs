//! A pod container's root file system attached into its pod's running guest (the containerd
//! shim's `Create` of a pod's container, docs/shim.md): the image's layers as containerd
//! unpacked them, each mapped to the sandbox's own ids (its slice) and read-only, under a
//! writable layer of the container's own — an overlay made as the guest's own root file system
//! is (`rootfs::Layers`) — placed at `/.svc/ctr/<id>` in the guest, where svcd's rooted execs
//! chroot into it.
//!
//! Where it goes cannot be chosen or moved by the guest:
//!
//! - `/.svc` in the guest is a read-only bind of a directory of svcd's (`<sandbox>/ctr-points`,
//!   owned by the host's root: the guest's root, an unprivileged host id, cannot write in it),
//!   put there at the first attach: a mount point, so the guest cannot rename or remove it, and
//!   it holds no CAP_SYS_ADMIN to unmount it. Each container's mount point `ctr/<id>` is made
//!   in it by svcd, on the host.
//! - Every path in the guest is opened with no symbolic or magic link followed and nothing
//!   outside its base reached (`RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS`): a `/.svc` the guest
//!   made a link is refused, and the mount point opened in the guest must be the very
//!   directory svcd made (device and inode), or nothing is moved.
//! - The overlay is made in a private mount namespace and moved into the guest's as a
//!   detached tree (`open_tree`, `move_mount`): the host's mount table never holds it.
//!
//! Each sandbox's roots are attached and detached one at a time under its own lock
//! (`pod_root::RootLocks`); a detached container's layers (a writable layer the guest may
//! have filled with files) are renamed aside under it and removed after it is let go.
//!
//! The work in the guest's mount namespace runs on a thread of its own that leaves svcd's
//! file-system context first (`unshare(CLONE_FS)`) and ends with the work: no other thread of
//! svcd ever runs in a guest's namespace.
//!
//! Inside the container's tree the guest's `/proc`, `/dev` and `/sys`, its relay directory and
//! the files svcd gives every guest (resolv.conf, hosts, the CA bundle) are bound over the
//! image's, as the runtime gives them to the sandbox: a command in the container reaches the
//! same resolver, proxy CA and devices. A place in the image that is a link is left as it is
//! (never followed); one that is missing is made, as the guest's root.

use std::{
    os::{fd::OwnedFd, unix::fs::MetadataExt as _},
    path::{Path, PathBuf},
};

use super::{
    Container,
    rootfs::{IdRange, Layers, Lower, Overlay},
};
use crate::{
    dataplane::idmap,
    runtime::{
        GuestHandle, RuntimeError,
        pod_root::{self, RootIn, guest_binds, guest_path, lifecycle, remove_set_aside},
        start_time,
    },
};

/// Where the mount points live on the host, under the sandbox's directory (bound at `/.svc`).
const POINTS: &str = "ctr-points";

/// Where each container's layers live on the host, under the sandbox's directory.
const STATE: &str = "ctr";

/// What the thread that enters the guest is given.
struct Job {
    guest: GuestHandle,
    ctr: String,
    overlay: Overlay,
    merged: PathBuf,
    points: PathBuf,
    point: PathBuf,
    ids: IdRange,
}

impl Container {
    /// Attach `layers` (top first) as container `ctr`'s root file system into the running
    /// `guest` of sandbox `id` (directory `dir`); its guest path.
    pub(super) async fn attach_root_in(
        &self,
        guest: &GuestHandle,
        id: u32,
        dir: &Path,
        ctr: &str,
        layers: &[PathBuf],
    ) -> Result<RootIn, RuntimeError> {
        let one = self.roots.lock(&guest.name).await;
        let err = lifecycle("attaching a root file system to", guest, ctr);
        let ids = self.guest_ids(id).map_err(&err)?;
        let (state, point) = places(dir, ctr);
        if state.exists() || point.exists() {
            return Err(err("it is attached already".into()));
        }
        let made = (|| {
            make_points(dir, &point)?;
            let l = Layers {
                lower: state.join("lower"),
                upper: state.join("upper"),
                work: state.join("work"),
                merged: state.join("merged"),
                disk: None,
            };
            let overlay = l.prepare(&Lower::Layers(layers.to_vec()), ids, None)?;
            Ok::<_, String>(Job {
                guest: guest.clone(),
                ctr: ctr.to_owned(),
                overlay,
                merged: l.merged,
                points: dir.join(POINTS),
                point: point.clone(),
                ids,
            })
        })();
        let done = match made {
            Ok(job) => on_own_thread(move || attach(&job)).await,
            Err(e) => Err(e),
        };
        let aside = done.is_err().then(|| set_aside(&state, &point)).flatten();
        drop(one);
        // Outside the lock: what an earlier svcd left set aside, and a failed attach's files.
        remove_set_aside(aside, &dir.join(STATE)).await;
        let skipped = done.map_err(err)?;
        Ok(RootIn {
            guest_path: guest_path(ctr),
            skipped,
        })
    }

    /// Detach container `ctr`'s root file system from `guest` (directory `dir`) and remove its
    /// layers, once every process of the guest rooted in it is ended; whether it was attached.
    pub(super) async fn detach_root_in(
        &self,
        guest: &GuestHandle,
        dir: &Path,
        ctr: &str,
    ) -> Result<bool, RuntimeError> {
        let one = self.roots.lock(&guest.name).await;
        let err = lifecycle("detaching a root file system from", guest, ctr);
        let (state, point) = places(dir, ctr);
        if !state.exists() && !point.exists() {
            return Ok(false);
        }
        if start_time(guest.pid) == Some(guest.start) {
            // Its processes first, daemons it left included: none runs on in the sandbox.
            let (g, c) = (guest.clone(), ctr.to_owned());
            let ended =
                tokio::task::spawn_blocking(move || super::ctr_procs::end_processes(&g, &c))
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r);
            match ended {
                Ok(n) => tracing::debug!(ctr, ended = n, "a container's processes ended"),
                Err(e) => tracing::warn!(ctr, error = %e, "ending a container's processes"),
            }
            let (g, points, c) = (guest.clone(), dir.join(POINTS), ctr.to_owned());
            on_own_thread(move || detach(&g, &points, &c))
                .await
                .map_err(&err)?;
        }
        let aside = set_aside(&state, &point);
        drop(one);
        // The writable layer the guest filled goes outside the lock: however many files it
        // holds, no other attach or detach of this sandbox waits for them.
        remove_set_aside(aside, &dir.join(STATE)).await;
        Ok(true)
    }
}

/// Whether container `ctr`'s root file system is attached to the sandbox in `dir`.
pub(super) fn attached(dir: &Path, ctr: &str) -> bool {
    let (state, point) = places(dir, ctr);
    state.is_dir() && point.is_dir()
}

/// The layers' directory and the mount point of container `ctr` on the host.
fn places(dir: &Path, ctr: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(STATE).join(ctr),
        dir.join(POINTS).join("ctr").join(ctr),
    )
}

/// The mount points' directory (owned by the host's root, mode 0755: the guest reads it but
/// cannot write in it) and `point` in it.
fn make_points(dir: &Path, point: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(point)
        .map_err(|e| format!("{}: {e}", point.display()))?;
    for d in [dir.join(POINTS), dir.join(POINTS).join("ctr")] {
        std::os::unix::fs::chown(&d, Some(0), Some(0))
            .map_err(|e| format!("{}: {e}", d.display()))?;
    }
    Ok(())
}

/// Under the sandbox's lock: a container's layers set aside for removal (a rename: when that
/// fails they stay, logged, until the sandbox's destroy) and its mount point removed. What
/// was set aside.
fn set_aside(state: &Path, point: &Path) -> Option<PathBuf> {
    let aside = pod_root::set_aside(state).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "setting a container's layers aside");
        None
    });
    let _ = std::fs::remove_dir(point);
    aside
}

/// Run `work` on a thread of its own (it changes its mount namespace) and wait for it.
async fn on_own_thread<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("svc-ctr-root".into())
        .spawn(move || {
            let _ = tx.send(work());
        })
        .map_err(|e| format!("starting a thread: {e}"))?;
    rx.await
        .map_err(|_| "the thread ended without an answer".to_owned())?
}

/// The guest's mount namespace and root directory, opened from its init (checked to be the
/// guest's before and after).
fn guest_mnt_ns(guest: &GuestHandle) -> Result<(std::fs::File, OwnedFd), String> {
    if start_time(guest.pid) != Some(guest.start) {
        return Err("the guest is not running".into());
    }
    let ns = std::fs::File::open(format!("/proc/{}/ns/mnt", guest.pid))
        .map_err(|e| format!("its mount namespace: {e}"))?;
    let root = std::fs::File::open(format!("/proc/{}/root", guest.pid))
        .map_err(|e| format!("its root directory: {e}"))?;
    if start_time(guest.pid) != Some(guest.start) {
        return Err("the guest is not running".into());
    }
    Ok((ns, OwnedFd::from(root)))
}

/// On the job's own thread: make the overlay in a private namespace, copy it off, enter the
/// guest's namespace and put it (and the mount points' bind, the first time) in place. The
/// guest's places not bound inside it, each with why.
fn attach(job: &Job) -> Result<Vec<String>, String> {
    let (ns, root) = guest_mnt_ns(&job.guest)?;
    job.overlay
        .mount_in_private_namespace()
        .map_err(|e| format!("mounting its overlay: {e}"))?;
    let tree = detached_copy(
        &job.merged,
        libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
    )?;
    let points = detached_copy(
        &job.points,
        libc::MOUNT_ATTR_RDONLY
            | libc::MOUNT_ATTR_NOSUID
            | libc::MOUNT_ATTR_NODEV
            | libc::MOUNT_ATTR_NOEXEC,
    )?;
    let host_point = identity(&std::fs::metadata(&job.point).map_err(|e| e.to_string())?);
    let host_points = identity(&std::fs::metadata(&job.points).map_err(|e| e.to_string())?);
    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("entering the guest's mount namespace: {e}"))?;
    place_points(&root, points, host_points, job.ids)?;
    let rel = Path::new(".svc/ctr").join(&job.ctr);
    let at = idmap::open_under(&root, &rel, true)
        .map_err(|e| format!("its mount point /{} in the guest: {e}", rel.display()))?;
    if fd_identity(&at)? != host_point {
        return Err(format!(
            "/{} in the guest is not the mount point svcd made: nothing attached",
            rel.display()
        ));
    }
    idmap::move_tree_onto(raw(&tree), raw(&at))
        .map_err(|e| format!("moving it into the guest: {e}"))?;
    let mut skipped = Vec::new();
    for (path, dir) in guest_binds() {
        if let Err(e) = bind_into(&root, &tree, Path::new(path), dir, job.ids) {
            tracing::warn!(sandbox = %job.guest.name, container = %job.ctr, place = path, error = %e, "a guest place not bound into a container's root");
            skipped.push(format!("/{path}: {e}"));
        }
    }
    Ok(skipped)
}

/// `/.svc` in the guest (under `root`) as the read-only bind `points` of svcd's mount points'
/// directory (identity `host`): put there now unless it is already (a link in its place is
/// refused; a directory the guest made is covered).
fn place_points(
    root: &OwnedFd,
    points: OwnedFd,
    host: (u64, u64),
    ids: IdRange,
) -> Result<(), String> {
    match idmap::open_under(root, Path::new(".svc"), true) {
        Ok(fd) => {
            if fd_identity(&fd)? == host {
                return Ok(());
            }
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        // A link is opened as itself (O_NOFOLLOW) and is no directory; one on the way is ELOOP.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
            return Err(
                "/.svc in the guest is a symbolic link or no directory: nothing attached".into(),
            );
        }
        Err(e) => return Err(format!("/.svc in the guest: {e}")),
    }
    let at = idmap::open_or_make_dirs(root, Path::new("/.svc"), (ids.uid, ids.gid))
        .map_err(|e| format!("/.svc in the guest: {e}"))?;
    idmap::move_tree_onto(raw(&points), raw(&at))
        .map_err(|e| format!("binding /.svc in the guest: {e}"))?;
    let now = idmap::open_under(root, Path::new(".svc"), true)
        .map_err(|e| format!("/.svc in the guest: {e}"))?;
    if fd_identity(&now)? != host {
        return Err("/.svc in the guest is not svcd's after binding it".into());
    }
    Ok(())
}

/// Bind the guest's `rel` (under `root`; nothing there: nothing to bind) over the same place
/// in the container's `tree`, made there (as the guest's root) when missing.
fn bind_into(
    root: &OwnedFd,
    tree: &OwnedFd,
    rel: &Path,
    dir: bool,
    ids: IdRange,
) -> Result<(), String> {
    let source = match idmap::open_under(root, rel, dir) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()),
        Err(e) => return Err(format!("the guest's /{}: {e}", rel.display())),
    };
    of_kind(&source, dir).map_err(|e| format!("the guest's /{}: {e}", rel.display()))?;
    let copy = idmap::clone_tree(
        raw(&source),
        c"",
        (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as u32,
    )
    .map_err(|e| format!("copying the guest's /{}: {e}", rel.display()))?;
    let target = match idmap::open_under(tree, rel, dir) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            make_as(tree, rel, dir, ids)?;
            idmap::open_under(tree, rel, dir).map_err(|e| e.to_string())?
        }
        // A link is opened as itself (O_NOFOLLOW): no directory; one on the way is ELOOP.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
            return Err(format!(
                "the container's /{}: a symbolic link (or reached through one, or no \
                 directory): left as it is, never followed",
                rel.display()
            ));
        }
        Err(e) => return Err(format!("the container's /{}: {e}", rel.display())),
    };
    of_kind(&target, dir).map_err(|e| format!("the container's /{}: {e}", rel.display()))?;
    idmap::move_tree_onto(raw(&copy), raw(&target)).map_err(|e| e.to_string())
}

/// `fd` is a directory (`dir`) or a regular file: a link (opened as itself) or anything else
/// is left alone.
fn of_kind(fd: &OwnedFd, dir: bool) -> Result<(), String> {
    let mode = nix::sys::stat::fstat(fd)
        .map_err(|e| e.to_string())?
        .st_mode
        & libc::S_IFMT;
    let want = if dir { libc::S_IFDIR } else { libc::S_IFREG };
    if mode == want {
        return Ok(());
    }
    Err(if mode == libc::S_IFLNK {
        "a symbolic link: left as it is, never followed".to_owned()
    } else {
        format!(
            "not a {}: left as it is",
            if dir { "directory" } else { "file" }
        )
    })
}

/// Make `rel` (its last part; its parent must be there) in `tree`, a directory or an empty
/// file, as the guest's root (the file-system ids of this thread for the call).
fn make_as(tree: &OwnedFd, rel: &Path, dir: bool, ids: IdRange) -> Result<(), String> {
    use nix::{fcntl::OFlag, sys::stat::Mode, unistd};
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return Err("no place to make".into());
    };
    let parent = if parent.as_os_str().is_empty() {
        tree.try_clone().map_err(|e| e.to_string())?
    } else {
        idmap::open_under(tree, parent, true).map_err(|e| e.to_string())?
    };
    // O_PATH handles cannot be made in: a real directory handle of the same directory.
    let parent = nix::fcntl::openat(
        &parent,
        c".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| e.to_string())?;
    unistd::setfsgid(unistd::Gid::from_raw(ids.gid));
    unistd::setfsuid(unistd::Uid::from_raw(ids.uid));
    let made = if dir {
        nix::sys::stat::mkdirat(&parent, name, Mode::from_bits_truncate(0o755))
    } else {
        nix::fcntl::openat(
            &parent,
            name,
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o644),
        )
        .map(drop)
    };
    unistd::setfsuid(unistd::Uid::from_raw(0));
    unistd::setfsgid(unistd::Gid::from_raw(0));
    made.map_err(|e| format!("making /{}: {e}", rel.display()))
}

/// On the job's own thread: enter the guest's mount namespace and detach container `ctr`'s
/// tree (with everything bound in it) from `/.svc/ctr/<ctr>`, once `/.svc` is checked to be
/// the bind of svcd's `points`.
fn detach(guest: &GuestHandle, points: &Path, ctr: &str) -> Result<(), String> {
    let (ns, root) = guest_mnt_ns(guest)?;
    let host = identity(&std::fs::metadata(points).map_err(|e| e.to_string())?);
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS)
        .map_err(|e| format!("a file-system context of its own: {e}"))?;
    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNS)
        .map_err(|e| format!("entering the guest's mount namespace: {e}"))?;
    // Paths below resolve from the guest's root, whatever this thread's root became.
    nix::unistd::fchdir(&root).map_err(|e| format!("the guest's root: {e}"))?;
    let svc = idmap::open_under(&root, Path::new(".svc"), true)
        .map_err(|e| format!("/.svc in the guest: {e}"))?;
    if fd_identity(&svc)? != host {
        return Err("/.svc in the guest is not svcd's: nothing detached".into());
    }
    // Relative to the guest's root (this thread's working directory): `/.svc` is svcd's
    // read-only bind, in which the guest can make nothing.
    let at = Path::new(".svc/ctr").join(ctr);
    match nix::mount::umount2(
        &at,
        nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW,
    ) {
        Ok(()) | Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => Ok(()),
        Err(e) => Err(format!("unmounting /{} in the guest: {e}", at.display())),
    }
}

/// A detached, private copy of the mount at `path` (in this thread's namespace) with `attrs`.
fn detached_copy(path: &Path, attrs: u64) -> Result<OwnedFd, String> {
    let c =
        std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
    let tree = idmap::clone_tree(libc::AT_FDCWD, &c, 0)
        .map_err(|e| format!("copying {}: {e}", path.display()))?;
    idmap::set_tree_attrs(&tree, attrs, libc::MS_PRIVATE, 0, 0)
        .map_err(|e| format!("setting {}'s mount flags: {e}", path.display()))?;
    Ok(tree)
}

fn raw(fd: &OwnedFd) -> i32 {
    std::os::fd::AsRawFd::as_raw_fd(fd)
}

fn identity(m: &std::fs::Metadata) -> (u64, u64) {
    (m.dev(), m.ino())
}

fn fd_identity(fd: &OwnedFd) -> Result<(u64, u64), String> {
    let st = nix::sys::stat::fstat(fd).map_err(|e| e.to_string())?;
    Ok((st.st_dev, st.st_ino))
}
