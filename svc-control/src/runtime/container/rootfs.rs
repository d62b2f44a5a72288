//! The guest's ids and root file system: the unprivileged host id range from `/etc/subuid` and
//! `/etc/subgid`, the base image shifted into that range once, and a per-sandbox overlay (the
//! shared image read-only below, the sandbox's own writable layer above).

use std::{
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
};

use super::super::RuntimeError;

pub use super::super::ids::{ID_COUNT, IdRange, id_range, subordinate_range};
use crate::dataplane::idmap::IdmappedTree;

/// The base image as the sandboxes' overlays see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lower {
    /// A copy shifted into the one range every guest maps to ([`shifted_image`]), used as is.
    Shifted(PathBuf),
    /// The image's own tree, unshifted ([`image_root`]): each sandbox mounts it idmapped to
    /// its own slice, read-only, in the runtime's mount namespace.
    Idmapped(PathBuf),
    /// A root file system handed to the sandbox as layers, top first (one: a whole tree),
    /// each mounted idmapped to the sandbox's ids, read-only, as a lower layer of its overlay.
    Layers(Vec<PathBuf>),
    /// Layers (top first) used as they are, read-only, with no id mapping: a tree the host's
    /// root reads and writes for a guest that does not share the host's kernel (the microvm
    /// backend's pod containers, served to the VM by virtiofsd with its own id translation).
    Plain(Vec<PathBuf>),
}

impl Lower {
    /// The tree's directory on the host.
    pub fn path(&self) -> &Path {
        match self {
            Self::Shifted(p) | Self::Idmapped(p) => p,
            Self::Layers(l) | Self::Plain(l) => l.first().map_or(Path::new("/"), PathBuf::as_path),
        }
    }
}

/// The image's root file system (`<image>/rootfs`), checked to be one made by `cargo xtask
/// images`, and its stamp's text.
pub fn image_root(image: &Path) -> Result<(PathBuf, String), RuntimeError> {
    let source = image.join("rootfs");
    let stamp = std::fs::read_to_string(image.join("stamp")).map_err(|e| {
        RuntimeError::Setup(format!(
            "the base image {} has no stamp ({e}): build it with `svcd images build`, or point \
             svcd.toml container.image at a directory made by it",
            image.display()
        ))
    })?;
    if !source.join("bin").exists() && !source.join("usr/bin").exists() {
        return Err(RuntimeError::Setup(format!(
            "the base image {} holds no root file system: rebuild it with `svcd images build`",
            source.display()
        )));
    }
    Ok((source, stamp))
}

/// The image's root file system shifted into `ids`, made once per image build and id range
/// and shared read-only by every sandbox: `<image>/rootfs.<build>.uid<U>-gid<G>`. The image
/// stays owned by real root (the microvm backend turns the same tree into its disk).
pub fn shifted_image(image: &Path, ids: IdRange) -> Result<PathBuf, RuntimeError> {
    let (source, stamp) = image_root(image)?;
    let build: String = stamp
        .lines()
        .find_map(|l| l.strip_prefix("build: "))
        .unwrap_or("0")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(32)
        .collect();
    let target = image.join(format!("rootfs.{build}.uid{}-gid{}", ids.uid, ids.gid));
    if target.join(".svc-shifted").exists() {
        return Ok(target);
    }
    let tmp = image.join(format!(
        ".rootfs.{build}.uid{}.tmp-{}",
        ids.uid,
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    let setup = |what: &str, e: String| RuntimeError::Setup(format!("{what}: {e}"));
    let out = std::process::Command::new("cp")
        .arg("-a")
        .arg(&source)
        .arg(&tmp)
        .output()
        .map_err(|e| setup("running cp", e.to_string()))?;
    if !out.status.success() {
        return Err(setup(
            &format!("copying {} to {}", source.display(), tmp.display()),
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ));
    }
    shift_tree(&tmp, ids).map_err(|e| setup(&format!("shifting {}", tmp.display()), e))?;
    std::fs::write(tmp.join(".svc-shifted"), &stamp)
        .map_err(|e| setup("marking the shifted image", e.to_string()))?;
    std::fs::set_permissions(
        tmp.join(".svc-shifted"),
        std::fs::Permissions::from_mode(0o444),
    )
    .map_err(|e| setup("marking the shifted image", e.to_string()))?;
    if std::fs::rename(&tmp, &target).is_err() {
        // Another svcd made it first: use theirs.
        let _ = std::fs::remove_dir_all(&tmp);
        if !target.join(".svc-shifted").exists() {
            return Err(setup(
                &format!("moving the shifted image to {}", target.display()),
                "rename failed".into(),
            ));
        }
    }
    Ok(target)
}

/// Add the range's start to the owner and group of every file under `root` (not following
/// links, each hard-linked inode once), keeping set-id bits (chown clears them).
fn shift_tree(root: &Path, ids: IdRange) -> Result<(), String> {
    let mut stack = vec![root.to_path_buf()];
    let mut linked = std::collections::HashSet::new();
    while let Some(path) = stack.pop() {
        let meta =
            std::fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !meta.is_dir() && meta.nlink() > 1 && !linked.insert((meta.dev(), meta.ino())) {
            continue;
        }
        let (uid, gid) = (meta.uid(), meta.gid());
        if uid >= ID_COUNT || gid >= ID_COUNT {
            return Err(format!(
                "{} is owned by {uid}:{gid}, outside the guest's {ID_COUNT} ids",
                path.display()
            ));
        }
        std::os::unix::fs::lchown(&path, Some(uid + ids.uid), Some(gid + ids.gid))
            .map_err(|e| format!("chown {}: {e}", path.display()))?;
        let ft = meta.file_type();
        if !ft.is_symlink() && meta.mode() & 0o6000 != 0 {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(meta.mode() & 0o7777))
                .map_err(|e| format!("chmod {}: {e}", path.display()))?;
        }
        if ft.is_dir() {
            for entry in std::fs::read_dir(&path).map_err(|e| format!("{}: {e}", path.display()))? {
                stack.push(
                    entry
                        .map_err(|e| format!("{}: {e}", path.display()))?
                        .path(),
                );
            }
        }
    }
    Ok(())
}

/// A sandbox's layers under its directory.
#[derive(Debug, Clone)]
pub struct Layers {
    /// Where an idmapped base image is attached (in the runtime's namespace) for the overlay.
    pub lower: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
    pub merged: PathBuf,
    /// Where the sandbox's own disk is mounted (its file system holds `upper` and `work`),
    /// or none: they are directories on the state file system.
    pub disk: Option<PathBuf>,
}

impl Layers {
    /// The writable layer as directories of the sandbox's directory (no disk limit).
    pub fn under(dir: &Path) -> Self {
        Self {
            lower: dir.join("lower"),
            upper: dir.join("upper"),
            work: dir.join("work"),
            merged: dir.join("bundle/rootfs"),
            disk: None,
        }
    }

    /// The writable layer on the sandbox's own disk, mounted at `<dir>/disk`.
    pub fn on_disk(dir: &Path) -> Self {
        let disk = dir.join("disk");
        Self {
            lower: dir.join("lower"),
            upper: disk.join("upper"),
            work: disk.join("work"),
            merged: dir.join("bundle/rootfs"),
            disk: Some(disk),
        }
    }

    /// Make the writable layer (owned by the guest's root) and mount the overlay here, in
    /// the caller's mount namespace (the benchmarks' runc floor; svcd itself mounts it with
    /// [`Overlay::mount_in_private_namespace`] in the runtime's own namespace).
    pub fn mount(&self, lower: &Path, ids: IdRange) -> Result<(), String> {
        let overlay = self.prepare(&Lower::Shifted(lower.to_path_buf()), ids, None)?;
        nix::mount::mount(
            Some("overlay"),
            overlay.target.as_c_str(),
            Some("overlay"),
            nix::mount::MsFlags::MS_NODEV,
            Some(overlay.options.as_c_str()),
        )
        .map_err(|e| format!("mounting the overlay on {}: {e}", self.merged.display()))
    }

    /// Make the writable layer (owned by the guest's root) and the mount point: the overlay,
    /// ready to be mounted. With a disk (`device`, the block device of the sandbox's file
    /// system, for layers made by [`Layers::on_disk`]), the layer's directories are made on
    /// it once it is mounted, in the runtime's namespace (see [`Overlay`]). A writable layer
    /// that already holds files is refused: it was written by an earlier guest, and a
    /// container is never created over one (the runtime resolves paths in it while it sets
    /// the container up, as root of the guest's ids: see docs/isolation.md, "The runtime's own
    /// escapes"). A disk is made new at each creation. An idmapped `lower` is shown to the
    /// overlay as owned by `ids` (see [`Overlay`]).
    pub fn prepare(
        &self,
        lower: &Lower,
        ids: IdRange,
        device: Option<&Path>,
    ) -> Result<Overlay, String> {
        let c = |p: &Path| {
            std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|e| format!("{}: {e}", p.display()))
        };
        let disk = match (&self.disk, device) {
            (Some(at), Some(device)) => {
                std::fs::create_dir_all(at).map_err(|e| format!("{}: {e}", at.display()))?;
                Some(DiskMount {
                    device: c(device)?,
                    target: c(at)?,
                    upper: c(&self.upper)?,
                    work: c(&self.work)?,
                    ids,
                })
            }
            (None, None) => {
                for d in [&self.upper, &self.work] {
                    std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
                }
                let written = std::fs::read_dir(&self.upper)
                    .map_err(|e| format!("{}: {e}", self.upper.display()))?
                    .next()
                    .is_some();
                if written {
                    return Err(format!(
                        "the writable layer {} already holds an earlier guest's files: a \
                         container is never created over them",
                        self.upper.display()
                    ));
                }
                std::os::unix::fs::chown(&self.upper, Some(ids.uid), Some(ids.gid))
                    .map_err(|e| format!("chown {}: {e}", self.upper.display()))?;
                std::fs::set_permissions(&self.upper, std::fs::Permissions::from_mode(0o755))
                    .map_err(|e| format!("chmod {}: {e}", self.upper.display()))?;
                None
            }
            _ => return Err("the writable layer's disk and its device go together".into()),
        };
        std::fs::create_dir_all(&self.merged)
            .map_err(|e| format!("{}: {e}", self.merged.display()))?;
        let (lowers, idmapped) = match lower {
            Lower::Shifted(p) => (vec![p.clone()], Vec::new()),
            Lower::Idmapped(image) => {
                let tree = idmapped_at("the base image", image, &self.lower, ids)?;
                (vec![self.lower.clone()], vec![tree])
            }
            Lower::Layers(layers) => {
                let at: Vec<PathBuf> = (0..layers.len())
                    .map(|i| self.lower.join(i.to_string()))
                    .collect();
                let trees = layers
                    .iter()
                    .zip(&at)
                    .map(|(layer, at)| idmapped_at("the root file system", layer, at, ids))
                    .collect::<Result<_, _>>()?;
                (at, trees)
            }
            Lower::Plain(layers) => (layers.clone(), Vec::new()),
        };
        let lower = lowers
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(":");
        for p in lowers.iter().chain([&self.upper, &self.work]) {
            let s = p.display().to_string();
            if s.contains([',', ':', '\\']) {
                return Err(format!(
                    "{s}: an overlay layer path cannot hold ',', ':' or '\\'"
                ));
            }
        }
        let options = format!(
            "lowerdir={lower},upperdir={},workdir={}",
            self.upper.display(),
            self.work.display()
        );
        Ok(Overlay {
            target: c(&self.merged)?,
            options: std::ffi::CString::new(options).map_err(|e| e.to_string())?,
            disk,
            idmapped,
        })
    }

    /// Unmount the overlay if it is mounted; whether it was.
    pub fn unmount(&self) -> Result<bool, String> {
        match nix::mount::umount2(&self.merged, nix::mount::MntFlags::MNT_DETACH) {
            Ok(()) => Ok(true),
            Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOENT) => Ok(false),
            Err(e) => Err(format!("unmounting {}: {e}", self.merged.display())),
        }
    }
}

/// `tree` (`what` it is, for errors) to be attached at `at` (made now) idmapped to `ids`,
/// read-only.
fn idmapped_at(what: &str, tree: &Path, at: &Path, ids: IdRange) -> Result<IdmappedTree, String> {
    std::fs::create_dir_all(at).map_err(|e| format!("{}: {e}", at.display()))?;
    IdmappedTree::new(tree, at, ids.uid, ids.gid, ID_COUNT).map_err(|e| {
        format!(
            "mapping {what} {} to the sandbox's ids: {e}",
            tree.display()
        )
    })
}

/// Remove a sandbox's directory and everything in it, however deep a guest made its tree
/// (`rm -rf --one-file-system`: no recursion on svcd's stack, no descriptor per level, never
/// into another file system mounted below). An error names the directory and what rm said.
pub async fn remove_tree(dir: &Path) -> Result<(), String> {
    let out = tokio::process::Command::new("rm")
        .args(["-rf", "--one-file-system", "--"])
        .arg(dir)
        .output()
        .await
        .map_err(|e| format!("removing {}: running rm: {e}", dir.display()))?;
    if out.status.success() && !dir.exists() {
        return Ok(());
    }
    Err(format!(
        "removing {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .last()
            .unwrap_or("rm left it in place")
    ))
}

/// A prepared overlay: where it goes and its mount options, made before a fork so the child
/// only makes system calls.
#[derive(Debug)]
pub struct Overlay {
    target: std::ffi::CString,
    options: std::ffi::CString,
    disk: Option<DiskMount>,
    /// The base image (or each handed layer), attached idmapped where the overlay's lower
    /// layers are expected.
    idmapped: Vec<IdmappedTree>,
}

/// The sandbox's own file system, to be mounted under the overlay's writable layer.
#[derive(Debug)]
struct DiskMount {
    device: std::ffi::CString,
    target: std::ffi::CString,
    upper: std::ffi::CString,
    work: std::ffi::CString,
    ids: IdRange,
}

/// The sandbox file system's mount options: its inode tables are never zeroed in the
/// background (that would write ~1.6% of its size to the host's disk whatever the guest
/// does), and blocks the guest frees are given back to the host (holes punched in the image).
pub(in crate::runtime) const DISK_OPTIONS: &std::ffi::CStr = c"noinit_itable,discard";

impl Overlay {
    /// For a runtime's `pre_exec`: a mount namespace of the runtime's own (a private copy of
    /// the caller's) with the overlay mounted in it — first the sandbox's own disk under its
    /// writable layer, when it has one. The container's namespace is then copied from this
    /// one, and nothing is mounted in the host's: every sandbox's overlay there would
    /// lengthen each mount-table walk of every later `runc create` and `start` (measured:
    /// 2,000 host mounts take runc's create from ~35 to ~67 ms). The overlay (and the disk
    /// under it) lives as long as the container's namespace holds it and goes with it.
    ///
    /// Only system calls, no allocation: safe between fork and exec.
    pub fn mount_in_private_namespace(&self) -> std::io::Result<()> {
        use nix::mount::{MsFlags, mount};
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
        mount(
            None::<&std::ffi::CStr>,
            c"/",
            None::<&std::ffi::CStr>,
            MsFlags::MS_REC | MsFlags::MS_PRIVATE,
            None::<&std::ffi::CStr>,
        )?;
        self.mount_here()
    }

    /// Mount the overlay (and the disk under it, and its idmapped layers) in the caller's
    /// mount namespace. Only system calls.
    pub fn mount_here(&self) -> std::io::Result<()> {
        if let Some(d) = &self.disk {
            d.mount()?;
        }
        for tree in &self.idmapped {
            tree.attach()?;
        }
        nix::mount::mount(
            Some(c"overlay"),
            self.target.as_c_str(),
            Some(c"overlay"),
            nix::mount::MsFlags::MS_NODEV,
            Some(self.options.as_c_str()),
        )?;
        Ok(())
    }
}

impl DiskMount {
    /// Mount the disk and make the writable layer on it (the guest root's upper directory,
    /// root's work directory). Only system calls.
    fn mount(&self) -> std::io::Result<()> {
        use nix::{errno::Errno, sys::stat::Mode, unistd};
        nix::mount::mount(
            Some(self.device.as_c_str()),
            self.target.as_c_str(),
            Some(c"ext4"),
            nix::mount::MsFlags::MS_NODEV | nix::mount::MsFlags::MS_NOSUID,
            Some(DISK_OPTIONS),
        )?;
        let made = |r: nix::Result<()>| match r {
            Ok(()) | Err(Errno::EEXIST) => Ok(()),
            Err(e) => Err(e),
        };
        made(unistd::mkdir(
            self.upper.as_c_str(),
            Mode::from_bits_truncate(0o755),
        ))?;
        unistd::chown(
            self.upper.as_c_str(),
            Some(unistd::Uid::from_raw(self.ids.uid)),
            Some(unistd::Gid::from_raw(self.ids.gid)),
        )?;
        made(unistd::mkdir(
            self.work.as_c_str(),
            Mode::from_bits_truncate(0o700),
        ))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writable_layer_an_earlier_guest_wrote_is_never_prepared_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layers = Layers::under(dir.path());
        let ids = IdRange {
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        };
        let lower = dir.path().join("lower");
        std::fs::create_dir_all(&lower).expect("lower");
        let lower = Lower::Shifted(lower);
        assert!(
            layers.prepare(&lower, ids, None).is_ok(),
            "an empty layer is fine"
        );
        std::os::unix::fs::symlink("/proc/sys/kernel/core_pattern", layers.upper.join("null"))
            .expect("plant");
        let e = layers.prepare(&lower, ids, None).expect_err("refused");
        assert!(
            e.contains(&layers.upper.display().to_string())
                && e.contains("already holds an earlier guest's files"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_tree_far_deeper_than_path_max_is_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("sandbox");
        let mut at = root.clone();
        // Built relative to an open directory, as a guest would (the whole path is far past
        // PATH_MAX).
        std::fs::create_dir_all(&at).expect("root");
        let mut fd = std::fs::File::open(&at).expect("open");
        for _ in 0..2000 {
            at = std::path::PathBuf::from(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&fd)
            ));
            std::fs::create_dir(at.join("d")).expect("mkdir");
            fd = std::fs::File::open(at.join("d")).expect("open");
        }
        drop(fd);
        remove_tree(&root).await.expect("removed");
        assert!(!root.exists());
        remove_tree(&root)
            .await
            .expect("nothing left to remove is no error");
    }

    #[test]
    fn the_users_first_range_of_65536_ids_is_taken() {
        let text = "alice:100000:65536\nsvc-sandbox:300000:1000\nsvc-sandbox:400000:65536\n";
        assert_eq!(subordinate_range(text, "svc-sandbox"), Some(400_000));
        assert_eq!(subordinate_range(text, "alice"), Some(100_000));
        assert_eq!(subordinate_range(text, "bob"), None);
    }

    #[test]
    fn malformed_and_overflowing_lines_are_skipped() {
        for text in [
            "svc-sandbox:x:65536",
            "svc-sandbox:200000",
            "svc-sandbox:200000:65536:extra",
            "svc-sandbox:4294967000:65536",
            "svc-sandbox:0:65536",
            "",
        ] {
            assert_eq!(subordinate_range(text, "svc-sandbox"), None, "{text:?}");
        }
    }
}
