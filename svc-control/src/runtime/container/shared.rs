//! The directories a container guest shares with the host (the coding agent's
//! home): each attached as an idmapped mount under the sandbox's directory, its owner shown as
//! the guest's root, and the paths pinned or made read-only inside it (a project's `.git`),
//! each opened with no link followed, again in the runtime's own namespace just before it
//! runs (`PinnedSource`).

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use super::{Container, rootfs::IdRange};
use crate::{
    dataplane::idmap::{self, IdShift, PinnedSource},
    runtime::{GuestSpec, SharedDir},
};

/// The shared directories' attachments, the binds inside them (see `oci::SandboxBundle`) and
/// the handles those binds are made from (opened in the runtime's namespace before it runs).
pub(super) type SharedMounts = (
    Vec<(PathBuf, PathBuf)>,
    Vec<(PathBuf, PathBuf, bool)>,
    Vec<PinnedSource>,
);

/// The descriptor each bind source is opened at while it is pinned (the rest follow).
const FIRST_PINNED_FD: i32 = 500;

impl Container {
    /// Attach each directory the guest shares with the host (the coding agent's
    /// home) as an idmapped mount under the sandbox's directory, its owner shown as the guest's
    /// root (host ids `ids`): (attachment, guest path) for the bundle, and the binds inside them (pinned, then
    /// read-only: see `SharedDir`). `detach_shared` takes them off again.
    pub(super) fn mount_shared(
        &self,
        spec: &GuestSpec,
        ids: IdRange,
    ) -> Result<SharedMounts, String> {
        detach_shared(&spec.dir);
        let mut out = Vec::new();
        let mut binds = Binds {
            // Where each bind inside a shared directory is pinned for the runtime (in its own
            // namespace): made anew for each creation.
            staging: spec.dir.join("pins"),
            sub_binds: Vec::new(),
            pinned: Vec::new(),
        };
        let _ = std::fs::remove_dir_all(&binds.staging);
        std::fs::create_dir_all(&binds.staging)
            .map_err(|e| format!("{}: {e}", binds.staging.display()))?;
        for (i, shared) in spec.shared.iter().enumerate() {
            let target = attach(&spec.dir, i, shared, ids)?;
            for (rel, read_only) in shared
                .pinned
                .iter()
                .map(|p| (p, false))
                .chain(shared.read_only.iter().map(|p| (p, true)))
            {
                binds.pin(&spec.dir, shared, &target, rel, read_only)?;
            }
            out.push((target, shared.guest.clone()));
        }
        Ok((out, binds.sub_binds, binds.pinned))
    }
}

/// Attach shared directory `i` of the sandbox in `dir` (idmapped: its owner shown as the
/// guest's root, the host ids `ids`) under `dir/live/i`; that path.
pub(super) fn attach(
    dir: &Path,
    i: usize,
    shared: &SharedDir,
    ids: IdRange,
) -> Result<PathBuf, String> {
    let what = |e: std::io::Error| {
        format!(
            "sharing {} with the guest at {}: {e}",
            shared.host.display(),
            shared.guest.display()
        )
    };
    let meta = std::fs::symlink_metadata(&shared.host).map_err(what)?;
    if !meta.is_dir() {
        return Err(what(std::io::Error::other("not a directory")));
    }
    let target = dir.join("live").join(i.to_string());
    std::fs::create_dir_all(&target).map_err(what)?;
    idmap::bind_idmapped(
        &shared.host,
        &target,
        IdShift {
            owner_uid: meta.uid(),
            owner_gid: meta.gid(),
            shown_uid: ids.uid,
            shown_gid: ids.gid,
        },
    )
    .map_err(|e| {
        detach_shared(dir);
        what(e)
    })?;
    Ok(target)
}

/// The binds inside the shared directories, as they are pinned.
struct Binds {
    /// Where each is pinned for the runtime: `pins/N`.
    staging: PathBuf,
    /// (staging path, guest path, read-only), for the bundle.
    sub_binds: Vec<(PathBuf, PathBuf, bool)>,
    /// The handles the runtime's namespace opens them through.
    pinned: Vec<PinnedSource>,
}

impl Binds {
    /// Pin `rel` inside the shared directory attached at `target` (of the sandbox in `dir`).
    fn pin(
        &mut self,
        dir: &Path,
        shared: &SharedDir,
        target: &Path,
        rel: &Path,
        read_only: bool,
    ) -> Result<(), String> {
        // The caller's (and a guest's) tree: checked here with no link followed, then
        // opened the same way in the runtime's own namespace just before it runs
        // (`PinnedSource`), and bound by the runtime through that handle: swapping
        // `.git` for a link while the sandbox is made binds nothing of the host's.
        let fail = |e: std::io::Error| {
            detach_shared(dir);
            format!(
                "sharing {} with the guest: {}: {e}",
                shared.host.display(),
                rel.display()
            )
        };
        let handle = idmap::open_beneath(target, rel).map_err(fail)?;
        let is_dir = nix::sys::stat::fstat(&handle)
            .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
            .map_err(|e| fail(e.into()))?;
        let source = self.staging.join(self.pinned.len().to_string());
        let made = if is_dir {
            std::fs::create_dir(&source)
        } else {
            std::fs::File::create(&source).map(drop)
        };
        made.map_err(fail)?;
        let at = FIRST_PINNED_FD
            + i32::try_from(self.pinned.len()).map_err(|_| "too many binds".to_owned())?;
        self.pinned
            .push(PinnedSource::new(target, rel, &source, at).map_err(fail)?);
        self.sub_binds
            .push((source, shared.guest.join(rel), read_only));
        Ok(())
    }
}

/// Take every shared directory's host-side attachment off (see `mount_shared`).
pub(super) fn detach_shared(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir.join("live")) else {
        return;
    };
    for e in entries.flatten() {
        if let Err(err) = idmap::detach(&e.path()) {
            tracing::warn!(path = %e.path().display(), error = %err, "detaching a shared directory");
        }
    }
}
