//! The sandboxes' images, built on the host from Debian packages only: the base tree
//! (mmdebstrap with the host's own apt sources, plus the statically linked guest binaries) that
//! the container backend shifts into its guests' id range, and from it the microvm backend's
//! kernel, initramfs and ext4 root file system. One implementation for `svcd images build` and
//! `cargo xtask images` (which builds the guest binaries, then runs it).
//!
//! Each image carries a stamp saying what it was built from; a build whose stamp matches what
//! is wanted is skipped, so building again is cheap and changes nothing.

mod base;
mod host;
mod initramfs;
mod microvm;
mod status;

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use serde::Serialize;

use crate::config::host::HostConfig;

pub use base::PACKAGES;
pub use status::{ImageStatus, Status, status};

/// The statically linked in-guest binaries every image carries, by file name in the guest
/// binaries' directory: the microvm agent, the git SSH shim, the service supervisor and the
/// container guest's init.
pub const GUEST_BINS: [&str; 4] = [
    "svc-microvm-agent",
    "svc-git-ssh",
    "svc-supervise",
    "svc-init",
];

/// Where the Debian package installs the guest binaries.
pub const PACKAGED_GUEST_BINS: &str = "/usr/lib/svc/guest";

/// Where the images go: the base image's directory (`rootfs/` and `stamp`) and the microvm
/// backend's three files (their stamp is beside the root file system).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// The base image: `rootfs/` and `stamp` (svcd.toml's `container.image`).
    pub base: PathBuf,
    /// The microvm guest's kernel (`microvm.kernel`).
    pub kernel: PathBuf,
    /// Its initramfs (`microvm.initrd`).
    pub initrd: PathBuf,
    /// Its ext4 root file system (`microvm.rootfs`).
    pub rootfs: PathBuf,
}

impl Layout {
    /// Everything under one directory: `OUT/base`, `OUT/microvm/{vmlinuz,initrd.img,rootfs.ext4}`.
    pub fn under(out: &Path) -> Self {
        let vm = out.join("microvm");
        Self {
            base: out.join("base"),
            kernel: vm.join("vmlinuz"),
            initrd: vm.join("initrd.img"),
            rootfs: vm.join("rootfs.ext4"),
        }
    }

    /// Where svcd reads them: `container.image`, and `[microvm]`'s `kernel`, `initrd` and
    /// `rootfs`; those not set go into `microvm/` beside the base image's directory.
    pub fn configured(host: &HostConfig) -> Self {
        let base = host.container.image.clone();
        let root = base.parent().unwrap_or(Path::new("/")).to_owned();
        let default = Self::under(&root);
        let images = &host.microvm.images;
        Self {
            base,
            kernel: images.kernel.clone().unwrap_or(default.kernel),
            initrd: images.initrd.clone().unwrap_or(default.initrd),
            rootfs: images.rootfs.clone().unwrap_or(default.rootfs),
        }
    }

    /// The microvm images' stamp and work directory: beside the root file system.
    fn microvm_dir(&self) -> PathBuf {
        self.rootfs.parent().unwrap_or(Path::new("/")).to_owned()
    }
}

/// Which images a build makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// The base tree, then the microvm images made from it.
    All,
    /// Only the base tree (what the container backend needs).
    BaseOnly,
    /// Only the microvm images, from the base tree already built.
    MicrovmOnly,
}

/// A build: where, which, and the guest binaries' directory.
#[derive(Debug, Clone)]
pub struct Options {
    pub layout: Layout,
    pub which: Which,
    /// The directory holding [`GUEST_BINS`].
    pub guest_bins: PathBuf,
    /// Build every image again even when its stamp is current (Debian's updates).
    pub force: bool,
}

/// The steps of a build, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Step {
    /// The base tree from Debian packages.
    Mmdebstrap,
    /// The guest binaries put into the base tree.
    GuestBinaries,
    /// The microvm kernel (Debian's cloud kernel).
    Kernel,
    /// The microvm initramfs.
    Initramfs,
    /// The microvm ext4 root file system.
    Rootfs,
}

impl Step {
    /// The step's name, as progress lines and the JSON report say it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Mmdebstrap => "mmdebstrap",
            Self::GuestBinaries => "guest-binaries",
            Self::Kernel => "kernel",
            Self::Initramfs => "initramfs",
            Self::Rootfs => "rootfs",
        }
    }
}

/// What a step did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepDone {
    pub step: Step,
    /// It made something new (false: what was there is current).
    pub built: bool,
    /// What it did, in words.
    pub detail: String,
    /// How long it took, in seconds.
    pub secs: f64,
}

/// What a build did, step by step.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Report {
    pub steps: Vec<StepDone>,
    /// Whether any step built something.
    pub rebuilt: bool,
    /// The whole build, in seconds.
    pub secs: f64,
}

/// Where a build's progress lines go (svcd prints them; a test may collect them).
pub trait Progress {
    /// One line of progress.
    fn line(&mut self, text: &str);
}

impl<F: FnMut(&str)> Progress for F {
    fn line(&mut self, text: &str) {
        self(text);
    }
}

/// Why a build failed.
#[derive(Debug, thiserror::Error)]
pub enum ImagesError {
    /// A tool the build runs is not on PATH.
    #[error("{tool} is not installed ({why}): install it with `apt install {package}`")]
    MissingTool {
        tool: &'static str,
        package: &'static str,
        why: &'static str,
    },
    /// The build needs root.
    #[error(
        "building the images needs root (mmdebstrap --mode=root, files owned by root in the \
         root file system): run it as root"
    )]
    NotRoot,
    /// A file operation failed.
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A command exited with an error.
    #[error("{command} failed ({status}): {stderr}")]
    Command {
        command: String,
        status: String,
        stderr: String,
    },
    /// An input is not what the build needs (no guest binary, no apt sources, …).
    #[error("{0}")]
    Input(String),
}

/// `what` failed with `source`.
fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ImagesError {
    let what = what.into();
    move |source| ImagesError::Io { what, source }
}

/// Build what `options` asks for, skipping each image that is current; progress lines go to
/// `progress`.
pub fn build(options: &Options, progress: &mut dyn Progress) -> Result<Report, ImagesError> {
    let started = Instant::now();
    host::require_root()?;
    let bins = guest_bins(&options.guest_bins)?;
    let mut steps = Steps {
        progress,
        done: Vec::new(),
    };
    if options.which != Which::MicrovmOnly {
        host::require_tool("mmdebstrap")?;
        let tree = base::tree(&options.layout.base, options.force, &mut steps)?;
        steps.done(tree);
        let installed = base::guest_bins(&options.layout.base, &bins)?;
        steps.done(installed);
    }
    if options.which != Which::BaseOnly {
        for tool in ["apt-get", "dpkg-deb", "mkfs.ext4", "debugfs"] {
            host::require_tool(tool)?;
        }
        microvm::build(&options.layout, &bins.agent, options.force, &mut steps)?;
    }
    let rebuilt = steps.done.iter().any(|s| s.built);
    let secs = started.elapsed().as_secs_f64();
    steps.line(&if rebuilt {
        format!("built in {secs:.1} s")
    } else {
        "up to date: nothing rebuilt".to_owned()
    });
    Ok(Report {
        steps: steps.done,
        rebuilt,
        secs,
    })
}

/// A build's steps as they end, each said on `progress` when it does.
struct Steps<'a> {
    progress: &'a mut dyn Progress,
    done: Vec<StepDone>,
}

impl Steps<'_> {
    /// A line of progress within a step.
    fn line(&mut self, text: &str) {
        self.progress.line(text);
    }

    /// A step ended.
    fn done(&mut self, d: StepDone) {
        self.progress.line(&format!(
            "[{}] {} ({:.1} s)",
            d.step.name(),
            d.detail,
            d.secs
        ));
        self.done.push(d);
    }
}

/// The guest binaries' paths, each checked to be there.
pub(crate) struct GuestBins {
    pub agent: PathBuf,
    pub shim: PathBuf,
    pub supervisor: PathBuf,
    pub init: PathBuf,
}

fn guest_bins(dir: &Path) -> Result<GuestBins, ImagesError> {
    let [agent, shim, supervisor, init] = GUEST_BINS.map(|n| dir.join(n));
    for bin in [&agent, &shim, &supervisor, &init] {
        if !bin.is_file() {
            return Err(ImagesError::Input(format!(
                "{} is missing: the images need the statically linked guest binaries ({}) in \
                 one directory (the Debian package installs them in {PACKAGED_GUEST_BINS}; \
                 `cargo xtask images` builds them); name it with --guest-bins DIR",
                bin.display(),
                GUEST_BINS.join(", ")
            )));
        }
    }
    Ok(GuestBins {
        agent,
        shim,
        supervisor,
        init,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_under_one_directory_matches_what_svcd_toml_names() {
        let l = Layout::under(Path::new("/var/lib/svc/images"));
        assert_eq!(l.base, Path::new("/var/lib/svc/images/base"));
        assert_eq!(l.kernel, Path::new("/var/lib/svc/images/microvm/vmlinuz"));
        assert_eq!(
            l.initrd,
            Path::new("/var/lib/svc/images/microvm/initrd.img")
        );
        assert_eq!(
            l.rootfs,
            Path::new("/var/lib/svc/images/microvm/rootfs.ext4")
        );
        assert_eq!(l.microvm_dir(), Path::new("/var/lib/svc/images/microvm"));
    }

    #[test]
    fn missing_guest_binary_is_named_with_the_flag_that_fixes_it() {
        let dir = std::env::temp_dir().join(format!("svc-images-bins-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("svc-microvm-agent"), b"x").expect("write");
        let err = guest_bins(&dir).err().expect("two are missing").to_string();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(err.contains("svc-git-ssh is missing"), "{err}");
        assert!(err.contains("--guest-bins DIR"), "{err}");
    }
}
