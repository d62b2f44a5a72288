//! A sandbox's own disk (`[container] disk_mib`): a sparse ext4 image in its directory
//! (`disk.img`, root's alone), bound to a loop device and mounted — in the runtime's mount
//! namespace only, never the host's — under the overlay's writable layer. The guest's `df /`
//! shows its size; a full disk is ENOSPC for that guest and nothing else, since its writes
//! never reach the state file system beyond the image's size.
//!
//! Why an image and not project quotas: the state directory's file system would need the
//! `prjquota` feature (ext4: `tune2fs -O project,quota` on an unmounted file system; XFS:
//! mounted with `prjquota`), which hosts rarely have, and `df` in the guest would still show
//! the host's disk. An image works on any file system that holds sparse files and costs
//! one `mkfs.ext4` per creation (docs/PERFORMANCE.md).

use std::{
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::rootfs::{IdRange, Layers, Lower, Overlay};
use crate::dataplane::loopdev;

/// The image, in the sandbox's directory.
const IMAGE: &str = "disk.img";
/// The loop device the image was bound to (its number), for `release`.
const LOOP_RECORD: &str = "disk.loop";
/// How long `release` waits for the kernel to detach the device once the container is gone.
const DETACH_WAIT: Duration = Duration::from_secs(5);

/// The image of the sandbox in `dir`.
pub fn image(dir: &Path) -> PathBuf {
    dir.join(IMAGE)
}

/// Check the host can give sandboxes disks: loop devices and `mkfs.ext4`.
pub fn check() -> Result<(), String> {
    if !Path::new("/dev/loop-control").exists() {
        return Err("/dev/loop-control is missing (load the loop module: modprobe loop)".into());
    }
    if super::find_program(Path::new("mkfs.ext4")).is_none() {
        return Err("mkfs.ext4 is not installed (apt-get install e2fsprogs)".into());
    }
    Ok(())
}

/// The overlay of the sandbox in `dir` (its guest's ids from `ids` on) over `lower`, ready to be mounted, on a disk of its
/// own of `mib` MiB (none if 0). The disk's device stays bound while the returned handle
/// lives: until runc has mounted it.
pub async fn root_file_system(
    dir: &Path,
    lower: &Lower,
    ids: IdRange,
    mib: u64,
) -> Result<(Option<loopdev::LoopDevice>, Overlay), String> {
    if mib == 0 {
        return Ok((None, Layers::under(dir).prepare(lower, ids, None)?));
    }
    let disk = make(dir, mib).await?;
    let overlay = Layers::on_disk(dir).prepare(lower, ids, Some(&disk.path()))?;
    Ok((Some(disk), overlay))
}

/// Make the sandbox's disk (a sparse image of `mib` MiB with an empty ext4 file system) and
/// bind it to a loop device, recorded for [`release`]. The device stays bound while the
/// returned handle or a mount of it lives.
pub async fn make(dir: &Path, mib: u64) -> Result<loopdev::LoopDevice, String> {
    let path = image(dir);
    let _ = std::fs::remove_file(&path);
    let what = |e: std::io::Error| format!("making the sandbox's disk {}: {e}", path.display());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(what)?;
    file.set_len(mib.saturating_mul(1 << 20)).map_err(what)?;
    drop(file);
    // No journal: the layer does not outlive its container (a host crash leaves it dead and
    // destroyed), and each creation skips writing one. No blocks reserved for root: the
    // guest's root is not the host's, and `df` shows the guest all of its size.
    let out = tokio::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "0", "-O", "^has_journal"])
        .args(["-E", "lazy_itable_init=1,nodiscard"])
        .arg(&path)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| format!("running mkfs.ext4: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "mkfs.ext4 {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let dev = loopdev::attach(&path).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(LOOP_RECORD), format!("{}\n", dev.number()))
        .map_err(|e| format!("recording the sandbox's loop device: {e}"))?;
    Ok(dev)
}

/// After the container is gone: wait for the kernel to detach its loop device (the last mount
/// of the disk went with the container's namespace) and remove the image. What was removed,
/// or nothing for a sandbox without a disk.
pub async fn release(dir: &Path) -> Result<Option<String>, String> {
    let path = image(dir);
    if !path.exists() {
        return Ok(None);
    }
    let number = std::fs::read_to_string(dir.join(LOOP_RECORD))
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok());
    if let Some(n) = number {
        let deadline = Instant::now() + DETACH_WAIT;
        while bound_to(n, &path) {
            if Instant::now() > deadline {
                tracing::warn!(
                    device = %format!("/dev/loop{n}"),
                    image = %path.display(),
                    "the sandbox's loop device is still bound after its container ended; the \
                     kernel detaches it when its last user goes"
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    std::fs::remove_file(&path).map_err(|e| format!("removing {}: {e}", path.display()))?;
    let _ = std::fs::remove_file(dir.join(LOOP_RECORD));
    Ok(Some(match number {
        Some(n) => format!("disk image (loop device {n})"),
        None => "disk image".to_owned(),
    }))
}

/// Whether `/dev/loopN` is still bound to `image` (the kernel appends " (deleted)" to an
/// unlinked one).
fn bound_to(number: u32, image: &Path) -> bool {
    loopdev::backing_file(number).is_some_and(|b| {
        let b = b.to_string_lossy();
        let b = b.strip_suffix(" (deleted)").unwrap_or(&b);
        Path::new(b) == image
    })
}
