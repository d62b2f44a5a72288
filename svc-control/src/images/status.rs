//! What is there: each image's paths, its stamp, and whether a build would leave it as it is
//! (the same test the build makes before it skips a step).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Layout, base, guest_bins, microvm};

/// One image's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageStatus {
    /// Its files (the base image: its directory).
    pub paths: Vec<PathBuf>,
    /// Every file is there.
    pub present: bool,
    /// Its stamp's lines, as written by the build (empty: no stamp).
    pub stamp: Vec<String>,
    /// A build now would change nothing.
    pub current: bool,
    /// Why it is not current (empty when it is).
    pub why: String,
}

/// The base image and the microvm images.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Status {
    pub base: ImageStatus,
    pub microvm: ImageStatus,
    /// The guest binaries compared with those in the images.
    pub guest_bins: PathBuf,
}

/// The state of the images in `layout`, compared with what a build from `guest_bins_dir`
/// would make.
pub fn status(layout: &Layout, guest_bins_dir: &Path) -> Status {
    let bins = guest_bins(guest_bins_dir);
    let base_stamp = stamp(&layout.base.join("stamp"));
    let base_present = layout.base.join("rootfs").is_dir();
    let base_why = match (base::wanted(), &bins) {
        _ if !base_present => "not built".to_owned(),
        (Err(e), _) => e.to_string(),
        (Ok(w), _) if !base::tree_current(&layout.base, &w) => {
            "its stamp is not this host's suite and package list".to_owned()
        }
        (_, Err(e)) => e.to_string(),
        (_, Ok(b)) => {
            let stale = base::stale_bins(&layout.base, b);
            if stale.is_empty() {
                String::new()
            } else {
                format!("/{} differ from the guest binaries", stale.join(", /"))
            }
        }
    };
    let files = [&layout.kernel, &layout.initrd, &layout.rootfs];
    let vm_present = files.iter().all(|f| f.exists());
    let vm_why = match &bins {
        _ if !vm_present => "not built".to_owned(),
        Err(e) => e.to_string(),
        Ok(b) => match microvm::wanted(layout, &b.agent) {
            Err(e) => e.to_string(),
            Ok(w) if !microvm::current(layout, &w) => {
                "its stamp is not the base tree's and the agent's".to_owned()
            }
            Ok(_) => String::new(),
        },
    };
    Status {
        base: ImageStatus {
            paths: vec![layout.base.clone()],
            present: base_present,
            stamp: base_stamp,
            current: base_why.is_empty(),
            why: base_why,
        },
        microvm: ImageStatus {
            paths: files.iter().map(|p| (*p).clone()).collect(),
            present: vm_present,
            stamp: stamp(&layout.microvm_dir().join("stamp")),
            current: vm_why.is_empty(),
            why: vm_why,
        },
        guest_bins: guest_bins_dir.to_owned(),
    }
}

/// A stamp's lines (none when it is not there).
fn stamp(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}
