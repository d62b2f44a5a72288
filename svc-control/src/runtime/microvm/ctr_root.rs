//! A pod container's root file system on the microvm backend (the containerd shim's `Create`
//! of a pod's container, docs/shim.md): the image's layers as containerd unpacked them,
//! read-only, under a writable layer of the container's own — an overlay made with the
//! container backend's [`Layers`] — mounted on the host in the sandbox's directory and put
//! into the running VM as a tree ([`Microvm::attach_tree`]) at `/.svc/ctr/<id>`, where the
//! agent binds the guest's `/proc`, `/dev`, `/sys`, `/run/svc`, resolv.conf, hosts and CA
//! files inside it (`pod_root::guest_binds`, no link of the image followed) and rooted execs
//! chroot.
//!
//! No id mapping: the guest's ids are not the host's (the VM has a kernel of its own), and
//! the tree reaches it only through the trees share's virtiofsd, which shows the host's root
//! as guest root and makes every file the guest writes the host root's, never with a setid
//! bit or as a device node (`virtiofsd`). The layers are containerd's files as they are, and
//! the overlay's own writes go to the writable layer alone.
//!
//! Disk bound: every container's writable layer lives on one file system of the sandbox's —
//! a sparse ext4 image bound to a loop device (the container backend's `disk::make`), of
//! `[container] disk_mib` MiB (the guest's own disk size; when 0, the VM image's size) —
//! mounted at `<sandbox>/ctr-disk/fs`. A pod container that fills it gets ENOSPC in the
//! guest; the state file system never holds more than the image's size. It is made at the
//! first attach and removed when the last container's root is detached, or with the VM.
//!
//! Each sandbox's roots are attached and detached one at a time under its own lock
//! (`pod_root::RootLocks`); a detached container's writable layer is renamed aside on the
//! disk under it and removed after. A root detached after its VM is gone has the host's side
//! of its tree released then (its bind in the trees share, the overlay, the disk with the
//! last), not at the sandbox's destroy. The places the agent skipped while binding the
//! guest's places inside a tree come back in the attach's answer.
//!
//! Mounts live in svcd's own mount namespace (virtiofsd's copy of the trees share follows
//! them): they outlive an svcd restart, where an attached root is found again
//! ([`attached`]: its overlay is mounted).

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use svc_guest::proto::GuestBind;

use super::Microvm;
use crate::runtime::{
    Backend as _, GuestHandle, RuntimeError,
    container::{
        disk,
        rootfs::{self, IdRange, Layers, Lower},
    },
    pod_root::{self, lifecycle, remove_set_aside},
};

/// Where each container's overlay is mounted on the host, under the sandbox's directory.
const STATE: &str = "ctr";
/// The sandbox's containers' disk: its image and loop record, and its mount point `fs`.
const DISK: &str = "ctr-disk";

impl Microvm {
    /// Attach `layers` (top first) as container `ctr`'s root file system into the running
    /// `guest` of the sandbox in `dir`; its guest path.
    pub(super) async fn attach_root_in(
        &self,
        guest: &GuestHandle,
        dir: &Path,
        ctr: &str,
        layers: &[PathBuf],
    ) -> Result<pod_root::RootIn, RuntimeError> {
        let one = self.roots.lock(&guest.name).await;
        let err = lifecycle("attaching a root file system to", guest, ctr);
        if !self.alive(guest) {
            return Err(RuntimeError::NotRunning);
        }
        let state = dir.join(STATE).join(ctr);
        if state.exists() {
            return Err(err("it is attached already".into()));
        }
        let fs = self.containers_disk(dir).await.map_err(&err)?;
        private_dir(&dir.join(STATE)).map_err(&err)?;
        let l = Layers {
            lower: state.join("lower"),
            upper: fs.join(ctr).join("upper"),
            work: fs.join(ctr).join("work"),
            merged: state.join("merged"),
            disk: None,
        };
        let guest_path = pod_root::guest_path(ctr);
        let mounted = l
            .prepare(
                &Lower::Plain(layers.to_vec()),
                IdRange { uid: 0, gid: 0 },
                None,
            )
            .and_then(|o| {
                o.mount_here()
                    .and_then(|()| no_setid(&l.merged))
                    .map_err(|e| format!("mounting its overlay on {}: {e}", l.merged.display()))
            })
            .and_then(|()| {
                std::fs::canonicalize(&l.merged).map_err(|e| format!("{}: {e}", l.merged.display()))
            });
        let attached = match mounted {
            Ok(merged) => self
                .attach_tree_with(guest, &merged, &guest_path, binds())
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        let aside = match attached {
            Ok(_) => None,
            Err(_) => forget(dir, ctr).await,
        };
        drop(one);
        // Outside the lock: what an earlier svcd left set aside, and a failed attach's files.
        remove_set_aside(aside, &dir.join(DISK).join("fs")).await;
        let skipped = attached.map_err(err)?;
        for place in &skipped {
            tracing::warn!(sandbox = %guest.name, container = ctr, place = %place, "a guest place not bound into a container's root");
        }
        Ok(pod_root::RootIn {
            guest_path,
            skipped,
        })
    }

    /// Detach container `ctr`'s root file system from `guest` (the sandbox in `dir`) and
    /// remove its layers (and the containers' disk with the last); whether it was attached.
    pub(super) async fn detach_root_in(
        &self,
        guest: &GuestHandle,
        dir: &Path,
        ctr: &str,
    ) -> Result<bool, RuntimeError> {
        let one = self.roots.lock(&guest.name).await;
        let err = lifecycle("detaching a root file system from", guest, ctr);
        if !dir.join(STATE).join(ctr).exists() && !dir.join(DISK).join("fs").join(ctr).exists() {
            return Ok(false);
        }
        let guest_path = pod_root::guest_path(ctr);
        let said = if self.alive(guest) {
            self.detach_tree(guest, &guest_path)
                .await
                .map_err(|e| e.to_string())
        } else {
            // The VM is gone: its tree's bind in the trees share goes now (it holds the
            // overlay, and through it the containers' disk and its loop device).
            self.release_tree(&guest.name, &guest_path)
        };
        let aside = forget(dir, ctr).await;
        drop(one);
        // The writable layer the guest filled goes outside the lock.
        remove_set_aside(aside, &dir.join(DISK).join("fs")).await;
        said.map_err(err)?;
        Ok(true)
    }

    /// The sandbox's containers' disk mounted at `<dir>/ctr-disk/fs`: made and mounted now
    /// unless it is already.
    async fn containers_disk(&self, dir: &Path) -> Result<PathBuf, String> {
        let at = dir.join(DISK);
        let fs = at.join("fs");
        if mounted_on(&fs) {
            return Ok(fs);
        }
        std::fs::create_dir_all(&fs).map_err(|e| format!("{}: {e}", fs.display()))?;
        let device = disk::make(&at, self.containers_mib()).await?;
        let c = |p: &Path| {
            std::ffi::CString::new(p.as_os_str().as_encoded_bytes())
                .map_err(|e| format!("{}: {e}", p.display()))
        };
        nix::mount::mount(
            Some(c(&device.path())?.as_c_str()),
            c(&fs)?.as_c_str(),
            Some(c"ext4"),
            nix::mount::MsFlags::MS_NODEV | nix::mount::MsFlags::MS_NOSUID,
            Some(rootfs::DISK_OPTIONS),
        )
        .map_err(|e| format!("mounting the containers' disk on {}: {e}", fs.display()))?;
        // The mount holds the device now (bound with autoclear: it goes with the last mount).
        drop(device);
        std::fs::set_permissions(&fs, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| format!("{}: {e}", fs.display()))?;
        Ok(fs)
    }

    /// The containers' disk size: the guest's own (`[container] disk_mib`), or the VM
    /// image's when that is 0.
    fn containers_mib(&self) -> u64 {
        if self.config.disk_mib > 0 {
            return self.config.disk_mib;
        }
        self.images()
            .and_then(|i| std::fs::metadata(&i.rootfs).ok())
            .map_or(1024, |m| m.len().div_ceil(1 << 20).max(64))
    }
}

/// Whether container `ctr`'s root file system is attached to the sandbox in `dir`: its
/// overlay is mounted (it outlives an svcd restart).
pub(super) fn attached(dir: &Path, ctr: &str) -> bool {
    mounted_on(&dir.join(STATE).join(ctr).join("merged"))
}

/// With the VM (its trees share released first): every container's overlay and the
/// containers' disk unmounted, the disk's image removed. What was.
pub(super) async fn release(dir: &Path) -> Vec<String> {
    let mut done = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir.join(STATE)) {
        for e in entries.flatten() {
            if unmount(&e.path().join("merged")) {
                done.push(format!(
                    "container root {}",
                    e.file_name().to_string_lossy()
                ));
            }
        }
    }
    done.extend(release_disk(dir).await);
    done
}

/// Under the sandbox's lock: container `ctr`'s overlay unmounted and its state removed (a
/// mount point and empty directories), its writable layer set aside for removal after the
/// lock, and the containers' disk released when no container is left on it (what was set
/// aside goes with it). What is left to remove.
async fn forget(dir: &Path, ctr: &str) -> Option<PathBuf> {
    let state = dir.join(STATE).join(ctr);
    unmount(&state.join("merged"));
    if state.exists()
        && let Err(e) = rootfs::remove_tree(&state).await
    {
        tracing::warn!(error = %e, "removing a container's overlay");
    }
    let _ = std::fs::remove_dir(dir.join(STATE));
    let fs = dir.join(DISK).join("fs");
    let aside = pod_root::set_aside(&fs.join(ctr)).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "setting a container's writable layer aside");
        None
    });
    let left = std::fs::read_dir(&fs)
        .map(|d| {
            d.flatten().any(|e| {
                let name = e.file_name();
                name != "lost+found" && !pod_root::is_set_aside(&name)
            })
        })
        .unwrap_or(false);
    if left {
        return aside;
    }
    release_disk(dir).await;
    None
}

/// Unmount the containers' disk, remove its image and mount point. What was removed.
async fn release_disk(dir: &Path) -> Option<String> {
    let at = dir.join(DISK);
    if !at.exists() {
        return None;
    }
    unmount(&at.join("fs"));
    let removed = disk::release(&at).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "removing the containers' disk");
        None
    });
    let _ = std::fs::remove_dir(at.join("fs"));
    let _ = std::fs::remove_dir(&at);
    removed.map(|r| format!("containers' {r}"))
}

/// `dir` made (if missing) root's alone, 0700: the overlays under it are the guest's files
/// (its containers' writes) and the images' (their setid programs), for no host user to reach.
fn private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    let said = |e: std::io::Error| format!("{}: {e}", dir.display());
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(dir)
        .map_err(said)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(said)
}

/// The overlay at `merged` made `nosuid` (and `nodev`) on the host: an image's setid program
/// runs set-id in the guest (its own mount's flags), never on the host through svcd's mount.
fn no_setid(merged: &Path) -> std::io::Result<()> {
    use nix::mount::MsFlags;
    nix::mount::mount(
        None::<&str>,
        merged,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )?;
    Ok(())
}

/// Unmount what is mounted at `path` (lazily: a virtiofsd still holding a file lets go when
/// it closes it); whether something was.
fn unmount(path: &Path) -> bool {
    nix::mount::umount2(
        path,
        nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW,
    )
    .is_ok()
}

/// Whether `path` is a mount point (another device than its parent's).
fn mounted_on(path: &Path) -> bool {
    let (Ok(m), Some(Ok(p))) = (
        std::fs::symlink_metadata(path),
        path.parent().map(std::fs::symlink_metadata),
    ) else {
        return false;
    };
    m.is_dir() && m.dev() != p.dev()
}

/// The guest's places bound inside each container's tree.
fn binds() -> Vec<GuestBind> {
    pod_root::guest_binds()
        .into_iter()
        .map(|(path, dir)| GuestBind {
            path: path.to_owned(),
            dir,
        })
        .collect()
}
