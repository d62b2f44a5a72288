//! The workspace's shared directory with its git directory protected (`policy::gitdir`):
//! `.git` pinned, `.git/config` and `.git/hooks` read-only in the guest.

use std::{
    os::unix::fs::{DirBuilderExt as _, MetadataExt as _},
    path::{Path, PathBuf},
};

use super::Failure;
use crate::{
    api::{WORKSPACE_GUEST_DIR, WorkspaceSpec},
    policy::gitdir::{self, GitEntry, GitLayout},
    runtime::SharedDir,
};

/// The workspace's project directory as the guest shares it, on backend `backend`.
pub(super) fn workspace_mount(w: &WorkspaceSpec, backend: &str) -> Result<SharedDir, Failure> {
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
    if protected && backend == "microvm" {
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

/// An empty `.git/hooks`, owned as `.git` is, so it can be bound read-only.
fn make_hooks(root: &Path) -> Result<(), Failure> {
    let git = root.join(".git");
    let hooks = git.join("hooks");
    let fail = |e: std::io::Error| Failure::internal(format!("making {}: {e}", hooks.display()));
    let meta = std::fs::symlink_metadata(&git).map_err(fail)?;
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&hooks)
        .map_err(fail)?;
    // Not following a link: `hooks` was just made a directory by us.
    std::os::unix::fs::lchown(&hooks, Some(meta.uid()), Some(meta.gid())).map_err(fail)
}
