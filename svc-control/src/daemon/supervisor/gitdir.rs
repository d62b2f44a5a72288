//! The workspace's shared directory with its git directory protected (`policy::gitdir`):
//! `.git` pinned, `.git/config` and `.git/hooks` read-only in the guest.

use std::path::{Path, PathBuf};

use super::Failure;
use crate::{
    api::{WORKSPACE_GUEST_DIR, WorkspaceSpec},
    policy::gitdir::{self, GitEntry, GitLayout},
    runtime::SharedDir,
};

/// The workspace's project directory as the guest shares it, on the backend `backend`
/// describes (whether it can keep paths under the share read-only).
pub(super) fn workspace_mount(
    w: &WorkspaceSpec,
    backend: crate::runtime::Description,
) -> Result<SharedDir, Failure> {
    let root = Path::new(&w.root);
    let layout = GitLayout {
        git: entry(&root.join(".git")),
        config: entry(&root.join(".git/config")),
        hooks: entry(&root.join(".git/hooks")),
        commondir: entry(&root.join(".git/commondir")),
        config_worktree: entry(&root.join(".git/config.worktree")),
        worktrees: entry(&root.join(".git/worktrees")),
    };
    let p = gitdir::protection(layout, w.auth.git_config_writable)
        .map_err(|e| Failure::bad(format!("workspace {}: {e}", w.root)))?;
    let protected = !p.pinned.is_empty() || !p.read_only.is_empty();
    if protected && !backend.read_only_subpaths {
        return Err(Failure::unsupported(format!(
            "workspace {}: the microvm backend cannot keep .git/config and .git/hooks read-only \
             (virtio-fs shares the directory whole, and the guest's kernel is the guest's): use \
             the container backend, or accept that the guest may change what git runs as you \
             with auth.defaults.gitConfigWritable: true",
            w.root
        )));
    }
    if p.make_hooks {
        make_hooks(root)?;
    }
    let paths = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
    Ok(SharedDir {
        host: root.to_owned(),
        guest: PathBuf::from(WORKSPACE_GUEST_DIR),
        pinned: paths(&p.pinned),
        read_only: paths(&p.read_only),
    })
}

/// What `path` is, without following a symbolic link.
fn entry(path: &Path) -> GitEntry {
    match std::fs::symlink_metadata(path) {
        Err(_) => GitEntry::Missing,
        Ok(m) if m.file_type().is_symlink() => GitEntry::Symlink,
        Ok(m) if m.is_dir() => GitEntry::Dir,
        Ok(m) if m.is_file() => GitEntry::File,
        Ok(_) => GitEntry::Other,
    }
}

/// An empty `.git/hooks`, owned as `.git` is, so it can be bound read-only. Made through a
/// handle on `.git` opened with no symbolic link followed anywhere in its path, and owned
/// through a handle on what was made: a caller that swaps its `.git` (or a directory above
/// it) for a link while svcd works makes svcd fail, never create or chown a directory
/// elsewhere as root.
fn make_hooks(root: &Path) -> Result<(), Failure> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    let hooks = root.join(".git/hooks");
    let fail = |e: std::io::Error| Failure::internal(format!("making {}: {e}", hooks.display()));
    let git = crate::dataplane::idmap::open_no_symlinks(&root.join(".git")).map_err(fail)?;
    let owner = nix::sys::stat::fstat(&git).map_err(|e| fail(e.into()))?;
    let name = c"hooks";
    // SAFETY: a directory handle we own and a NUL-terminated name.
    if unsafe { libc::mkdirat(git.as_raw_fd(), name.as_ptr(), 0o755) } != 0 {
        return Err(fail(std::io::Error::last_os_error()));
    }
    // SAFETY: as above; O_NOFOLLOW: a link swapped in for what was just made is not opened.
    let fd = unsafe {
        libc::openat(
            git.as_raw_fd(),
            name.as_ptr(),
            libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_RDONLY,
        )
    };
    if fd < 0 {
        return Err(fail(std::io::Error::last_os_error()));
    }
    // SAFETY: openat returned a new descriptor that nothing else owns.
    let made = unsafe { OwnedFd::from_raw_fd(fd) };
    nix::unistd::fchown(
        &made,
        Some(nix::unistd::Uid::from_raw(owner.st_uid)),
        Some(nix::unistd::Gid::from_raw(owner.st_gid)),
    )
    .map_err(|e| fail(e.into()))
}
