//! Idmapped bind mounts: a host directory shown to a container's root as its own.
//!
//! The container backend's guest root is an unprivileged host id (`ids.uid`). The coding
//! agent's home belongs to a host user (say uid 1000), so a plain bind mount would
//! show the guest its files as `nobody` and refuse its writes. An idmapped mount
//! (`mount_setattr(2)` with `MOUNT_ATTR_IDMAP`) translates ids at the mount instead: files owned
//! by the directory's owner appear owned by the guest's root, and what the guest's root creates
//! lands on disk as the owner. Every other id appears as the overflow id, and nothing on the
//! host changes ownership. runc 1.1 has no idmapped mounts of its own, so svcd makes the mount
//! and hands the runtime a plain bind of it (a bind of an idmapped mount keeps the mapping).

use std::{
    ffi::{CStr, CString},
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::ffi::OsStrExt as _,
    },
    path::Path,
};

/// One id mapping for the mount: files owned by `owner` (on disk) appear as `shown_as` (a host
/// id, the guest's root) and the reverse for writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdShift {
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub shown_uid: u32,
    pub shown_gid: u32,
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))
}

/// A user namespace whose only mappings are `uid_map` and `gid_map` (lines of
/// `/proc/PID/uid_map`), held as an fd. Made by a forked child that unshares its user
/// namespace and waits while we write its maps.
///
/// Many are made at once (sandboxes and pod containers created side by side): the child
/// closes every descriptor it inherited but its own two pipe ends first. A child that kept
/// another call's release pipe open would wait for that call's child, which waits for it,
/// and both calls would wait forever in `waitpid` (with every API call behind them). And it
/// is killed once its namespace is held, whoever else holds its pipe.
fn user_namespace(uid_map: &str, gid_map: &str) -> io::Result<OwnedFd> {
    let mut ready = [0i32; 2];
    let mut release = [0i32; 2];
    // SAFETY: `pipe2` writes two fds into each array.
    if unsafe { libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above; the fds are owned (and closed) below.
    if unsafe { libc::pipe2(release.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        let e = io::Error::last_os_error();
        // SAFETY: closing fds we own.
        unsafe {
            libc::close(ready[0]);
            libc::close(ready[1]);
        }
        return Err(e);
    }
    // SAFETY: the fds were just made and are owned by nobody else.
    let (ready_r, ready_w, release_r, release_w) = unsafe {
        (
            OwnedFd::from_raw_fd(ready[0]),
            OwnedFd::from_raw_fd(ready[1]),
            OwnedFd::from_raw_fd(release[0]),
            OwnedFd::from_raw_fd(release[1]),
        )
    };
    // SAFETY: the child calls only async-signal-safe functions (unshare, write, read, _exit)
    // on fds it inherited, and never returns into Rust code.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above; the child ends with _exit whatever happens.
        unsafe {
            // The parent's ends: the release pipe must reach EOF when the parent closes its end.
            libc::close(ready_r.as_raw_fd());
            libc::close(release_w.as_raw_fd());
            keep_only(ready_w.as_raw_fd(), release_r.as_raw_fd());
            let ok: u8 = u8::from(libc::unshare(libc::CLONE_NEWUSER) == 0);
            libc::write(ready_w.as_raw_fd(), (&raw const ok).cast(), 1);
            let mut b = 0u8;
            libc::read(release_r.as_raw_fd(), (&raw mut b).cast(), 1);
            libc::_exit(0);
        }
    }
    drop(ready_w);
    drop(release_r);
    let result = (|| {
        let mut ok = 0u8;
        // SAFETY: reading one byte into a local.
        let n = unsafe { libc::read(ready_r.as_raw_fd(), (&raw mut ok).cast(), 1) };
        if n != 1 || ok != 1 {
            return Err(io::Error::other(
                "could not make a user namespace for the idmapped mount",
            ));
        }
        let proc = format!("/proc/{pid}");
        std::fs::write(format!("{proc}/uid_map"), uid_map)?;
        std::fs::write(format!("{proc}/setgroups"), "deny\n")?;
        std::fs::write(format!("{proc}/gid_map"), gid_map)?;
        let ns = std::fs::File::open(format!("{proc}/ns/user"))?;
        Ok(OwnedFd::from(ns))
    })();
    drop(release_w);
    // SAFETY: signalling and reaping our own child, not reaped yet (its pid is not reused).
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        let mut status = 0;
        libc::waitpid(pid, &raw mut status, 0);
    }
    result
}

/// In a forked child: close every descriptor from 3 up but `a` and `b`. Only system calls
/// (`close_range`, Linux 5.9; idmapped mounts need 5.12).
unsafe fn keep_only(a: i32, b: i32) {
    let (Ok(a), Ok(b)) = (libc::c_uint::try_from(a), libc::c_uint::try_from(b)) else {
        return;
    };
    let (lo, hi) = (a.min(b), a.max(b));
    let ranges = [
        (3, lo.saturating_sub(1)),
        (lo + 1, hi - 1),
        (hi + 1, libc::c_uint::MAX),
    ];
    for (first, last) in ranges {
        if first <= last {
            // SAFETY: closing descriptors the child inherited and does not use.
            unsafe { libc::syscall(libc::SYS_close_range, first, last, 0 as libc::c_uint) };
        }
    }
}

/// Attach an idmapped, `nosuid,nodev` clone of `source` (not recursive) at `target` (an
/// existing empty directory).
///
/// `source` is resolved once, refusing symbolic links anywhere in it (so a directory swapped
/// for a link after it was checked is not followed), and must still belong to
/// `shift.owner_uid`: the mapping is made for the directory that is actually mounted.
pub fn bind_idmapped(source: &Path, target: &Path, shift: IdShift) -> io::Result<()> {
    let dir = open_no_symlinks(source)?;
    // SAFETY: fstat on an fd we own into a zeroed stat buffer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(dir.as_raw_fd(), &raw mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(io::Error::other("not a directory"));
    }
    if st.st_uid != shift.owner_uid || st.st_gid != shift.owner_gid {
        return Err(io::Error::other(format!(
            "its owner changed since it was checked (now {}:{}, was {}:{})",
            st.st_uid, st.st_gid, shift.owner_uid, shift.owner_gid
        )));
    }
    let ns = user_namespace(
        &format!("{} {} 1\n", shift.owner_uid, shift.shown_uid),
        &format!("{} {} 1\n", shift.owner_gid, shift.shown_gid),
    )?;
    let dst = cstr(target)?;
    idmapped_clone(
        dir.as_raw_fd(),
        c"",
        libc::AT_EMPTY_PATH as u32,
        ns.as_raw_fd(),
        libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
        &dst,
    )
}

/// Clone the mount at `path` (beneath the directory descriptor `dir`; `flags` adds to
/// `OPEN_TREE_CLONE`), idmap it through the user namespace `userns` with the other mount
/// attributes `attrs`, and attach it at `target`. Only system calls, no allocation: safe
/// between fork and exec.
fn idmapped_clone(
    dir: i32,
    path: &CStr,
    flags: u32,
    userns: i32,
    attrs: u64,
    target: &CStr,
) -> io::Result<()> {
    let tree = clone_tree(dir, path, flags)?;
    let userns = u64::try_from(userns).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    set_tree_attrs(&tree, libc::MOUNT_ATTR_IDMAP | attrs, 0, userns, 0)?;
    // SAFETY: valid fd and NUL-terminated paths.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A detached copy (`open_tree(2)` with `OPEN_TREE_CLONE`, close-on-exec, and `flags`:
/// `AT_RECURSIVE` for the mounts under it too, `AT_EMPTY_PATH` for `dir` itself) of the mount at
/// `path` beneath the directory descriptor `dir`. Only a system call: safe between fork and
/// exec.
pub(crate) fn clone_tree(dir: i32, path: &CStr, flags: u32) -> io::Result<OwnedFd> {
    // SAFETY: a valid fd (or AT_FDCWD) and a NUL-terminated path; the returned fd is owned
    // below.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            dir,
            path.as_ptr(),
            libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | flags,
        )
    };
    if tree < 0 {
        return Err(io::Error::last_os_error());
    }
    let tree_fd = i32::try_from(tree).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: open_tree returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(tree_fd) })
}

/// `mount_setattr(2)` on the detached tree `tree`: the attributes `set` (with
/// `MOUNT_ATTR_IDMAP`, `userns` is the user namespace's fd), the propagation `propagation`
/// (`MS_PRIVATE`…; 0 leaves it), on every mount in it with `flags` = `AT_RECURSIVE`. Only a
/// system call: safe between fork and exec.
pub(crate) fn set_tree_attrs(
    tree: &OwnedFd,
    set: u64,
    propagation: u64,
    userns: u64,
    flags: u32,
) -> io::Result<()> {
    let attr = libc::mount_attr {
        attr_set: set,
        attr_clr: 0,
        propagation,
        userns_fd: userns,
    };
    // SAFETY: `attr` is a valid mount_attr of the size passed; the path is the empty string
    // with AT_EMPTY_PATH, so the fd itself is the mount changed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as u32 | flags,
            &raw const attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `move_mount(2)` of the detached tree `tree` onto what the handle `target` is (a directory
/// or a file, opened with no link followed: the mount lands there whatever its path becomes).
/// The target must be in the caller's mount namespace. Only a system call: safe between fork
/// and exec.
pub(crate) fn move_tree_onto(tree: i32, target: i32) -> io::Result<()> {
    // SAFETY: two descriptors and empty NUL-terminated paths (both ends are the fds).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree,
            c"".as_ptr(),
            target,
            c"".as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A read-only tree (the container backend's base image) to be shown with its ids 0..65535
/// moved to a range: files owned by id N on disk appear owned by the range's start + N.
/// The user namespace is made at once; [`IdmappedTree::attach`] mounts the tree later, in the
/// runtime's own mount namespace (between fork and exec).
#[derive(Debug)]
pub struct IdmappedTree {
    source: CString,
    target: CString,
    userns: OwnedFd,
}

impl IdmappedTree {
    /// `source` to be shown at `target` (an existing empty directory), ids 0..`count` mapped
    /// to `uid..` and `gid..`.
    pub fn new(source: &Path, target: &Path, uid: u32, gid: u32, count: u32) -> io::Result<Self> {
        Ok(Self {
            source: cstr(source)?,
            target: cstr(target)?,
            userns: user_namespace(&format!("0 {uid} {count}\n"), &format!("0 {gid} {count}\n"))?,
        })
    }

    /// Attach the idmapped, read-only clone (not recursive) at the target. Only system calls,
    /// no allocation: safe between fork and exec.
    pub fn attach(&self) -> io::Result<()> {
        idmapped_clone(
            libc::AT_FDCWD,
            &self.source,
            0,
            self.userns.as_raw_fd(),
            libc::MOUNT_ATTR_RDONLY | libc::MOUNT_ATTR_NODEV,
            &self.target,
        )
    }
}

/// `openat2(2)` of `path` from the directory descriptor `dir` (`AT_FDCWD`: the working
/// directory) with `flags` and `resolve`, always `O_CLOEXEC`. Only a system call, no
/// allocation: safe between fork and exec.
fn openat2(dir: i32, path: &CStr, flags: i32, resolve: u64) -> io::Result<OwnedFd> {
    // SAFETY: open_how is plain data; zero is every field's "nothing".
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = resolve;
    // SAFETY: a descriptor (or AT_FDCWD), a valid NUL-terminated path and an open_how of the
    // size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            path.as_ptr(),
            &raw const how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: openat2 returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Nothing but the path as given: no symbolic or magic link followed.
const NO_LINKS: u64 = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

/// `e`, or for ELOOP (a link in the way) what `said` says instead.
fn link_refused(e: io::Error, said: impl FnOnce() -> String) -> io::Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        io::Error::other(said())
    } else {
        e
    }
}

/// `path` opened as a directory handle (`O_PATH`), with no symbolic link followed on the way.
pub(crate) fn open_no_symlinks(path: &Path) -> io::Result<OwnedFd> {
    let p = cstr(path)?;
    openat2(
        libc::AT_FDCWD,
        &p,
        libc::O_PATH | libc::O_DIRECTORY,
        NO_LINKS,
    )
    .map_err(|e| {
        link_refused(e, || {
            "a symbolic link is in its path: give the path without links".to_owned()
        })
    })
}

/// A handle (`O_PATH`) on `rel` beneath the directory `dir`, no symbolic link followed in
/// `rel` and nothing outside `dir` reached: what a guest (or a caller) controls inside a shared
/// directory can only be opened as itself.
pub(crate) fn open_beneath(dir: &Path, rel: &Path) -> io::Result<OwnedFd> {
    let base = std::fs::File::open(dir)?;
    let p = cstr(rel)?;
    openat2(
        std::os::fd::AsRawFd::as_raw_fd(&base),
        &p,
        libc::O_PATH | libc::O_NOFOLLOW,
        NO_LINKS | libc::RESOLVE_BENEATH,
    )
    .map_err(|e| {
        link_refused(e, || {
            format!("{} is or passes through a symbolic link", rel.display())
        })
    })
}

/// A handle (`O_PATH`, and `O_DIRECTORY` when `dir`) on `rel` beneath the directory handle
/// `at`, no symbolic or magic link followed anywhere in `rel` and nothing outside `at` reached
/// (ELOOP for a link in the way, ENOENT for nothing there).
pub(crate) fn open_under(at: &OwnedFd, rel: &Path, dir: bool) -> io::Result<OwnedFd> {
    let p = cstr(rel)?;
    let kind = if dir { libc::O_DIRECTORY } else { 0 };
    openat2(
        at.as_raw_fd(),
        &p,
        libc::O_PATH | libc::O_NOFOLLOW | kind,
        NO_LINKS | libc::RESOLVE_BENEATH,
    )
}

/// A handle (`O_PATH`) on the directory `path` (absolute, as a guest names it) beneath the
/// directory handle `root` (a guest's root), each missing directory on the way made (mode 0755,
/// owned by `owner`: the guest's root, as the runtime makes a mount point the image lacks). No
/// symbolic link is followed and nothing outside `root` is reached: a link planted anywhere
/// on the way is refused, never followed.
pub(crate) fn open_or_make_dirs(
    root: &OwnedFd,
    path: &Path,
    owner: (u32, u32),
) -> io::Result<OwnedFd> {
    use std::path::Component;
    let refused = || format!("{} is or passes through a symbolic link", path.display());
    let mut at = root.try_clone()?;
    for part in path.components() {
        let name = match part {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(n) => cstr(Path::new(n))?,
            Component::ParentDir | Component::Prefix(_) => {
                return Err(io::Error::other(format!(
                    "{}: only a plain absolute path can be a mount point",
                    path.display()
                )));
            }
        };
        let open = |at: &OwnedFd| {
            openat2(
                at.as_raw_fd(),
                &name,
                // No O_NOFOLLOW: a link in the last place is refused (ELOOP) all the same.
                libc::O_PATH | libc::O_DIRECTORY,
                NO_LINKS | libc::RESOLVE_BENEATH,
            )
        };
        at = match open(&at) {
            Ok(fd) => fd,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                // SAFETY: a directory handle we own and a NUL-terminated name; mkdirat never
                // follows a link in the name's place (it fails with EEXIST).
                if unsafe { libc::mkdirat(at.as_raw_fd(), name.as_ptr(), 0o755) } != 0 {
                    return Err(link_refused(io::Error::last_os_error(), refused));
                }
                let made = open(&at).map_err(|e| link_refused(e, refused))?;
                // SAFETY: the handle just opened (O_PATH works with AT_EMPTY_PATH).
                let rc = unsafe {
                    libc::fchownat(
                        made.as_raw_fd(),
                        c"".as_ptr(),
                        owner.0,
                        owner.1,
                        libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
                    )
                };
                if rc != 0 {
                    return Err(io::Error::last_os_error());
                }
                made
            }
            Err(e) => return Err(link_refused(e, refused)),
        };
    }
    Ok(at)
}

/// A bind source for the runtime, pinned between fork and exec in the runtime's own mount
/// namespace: `rel` beneath `dir` opened with no link followed, and that handle bound onto
/// `staging` (a path of svcd's, of the same type, made beforehand), which the runtime then
/// binds into the guest. What the runtime binds is what was opened, whatever `rel` becomes.
#[derive(Debug)]
pub(crate) struct PinnedSource {
    dir: CString,
    rel: CString,
    staging: CString,
    /// The descriptor the handle is placed at, and its `/proc/self/fd/N`.
    at: i32,
    via: CString,
}

impl PinnedSource {
    pub(crate) fn new(dir: &Path, rel: &Path, staging: &Path, at: i32) -> io::Result<Self> {
        Ok(Self {
            dir: cstr(dir)?,
            rel: cstr(rel)?,
            staging: cstr(staging)?,
            at,
            via: cstr(Path::new(&format!("/proc/self/fd/{at}")))?,
        })
    }

    /// Open it and bind it onto its staging path. Only system calls, no allocation: safe
    /// between fork and exec. ELOOP when `rel` is (or passes through) a symbolic link.
    pub(crate) fn pin(&self) -> io::Result<()> {
        use std::os::fd::AsRawFd as _;
        let base = openat2(
            libc::AT_FDCWD,
            &self.dir,
            libc::O_PATH | libc::O_DIRECTORY,
            0,
        )?;
        let fd = openat2(
            base.as_raw_fd(),
            &self.rel,
            libc::O_PATH | libc::O_NOFOLLOW,
            NO_LINKS | libc::RESOLVE_BENEATH,
        )?;
        drop(base);
        // dup2 leaves the new descriptor without close-on-exec, where the bind below finds it.
        // SAFETY: two descriptors of this process.
        if unsafe { libc::dup2(fd.as_raw_fd(), self.at) } < 0 {
            return Err(io::Error::last_os_error());
        }
        drop(fd);
        // SAFETY: valid NUL-terminated paths; a bind takes no type or data.
        let r = unsafe {
            libc::mount(
                self.via.as_ptr(),
                self.staging.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        let err = io::Error::last_os_error();
        // SAFETY: closing the handle placed above.
        unsafe { libc::close(self.at) };
        if r != 0 {
            return Err(err);
        }
        Ok(())
    }
}

/// Detach whatever is mounted at `target` (lazily); `Ok` if nothing was.
pub fn detach(target: &Path) -> io::Result<()> {
    let dst = cstr(target)?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(dst.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL | libc::ENOENT) => Ok(()),
        _ => Err(e),
    }
}
