//! `cargo xtask images`: the sandboxes' images, built by svcd's own `svcd images build` (one
//! implementation, `svc_control::images`) from the guest binaries cargo builds here.
//! `OUT/base` holds the base tree (`rootfs/`, owned by real root, and `stamp`), `OUT/microvm`
//! the microvm kernel, initramfs, ext4 root file system and their stamp. Each is skipped while
//! its stamp is current.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::ui;

/// Where the guest binaries are built (statically linked, for the guest).
pub const GUEST_DIR: &str = "target/guest/x86_64-unknown-linux-gnu/release";

/// The base tree, then the microvm images made from it.
pub fn build_all(out: &Path) -> anyhow::Result<()> {
    svcd_images(out, None)
}

/// The base tree with the guest binaries in it.
pub fn build(out: &Path) -> anyhow::Result<()> {
    svcd_images(out, Some("--base-only"))
}

pub fn default_dir() -> PathBuf {
    PathBuf::from("target/images")
}

/// The guest binaries and svcd built, then `svcd images build --out OUT` (`which`: one of
/// its flags choosing the images).
fn svcd_images(out: &Path, which: Option<&str>) -> anyhow::Result<()> {
    ui::heading("images: the sandboxes' images (Debian packages, svcd images build)");
    guest_bins()?;
    let svcd = crate::setup::svcd()?;
    ui::run(
        Command::new(svcd)
            // The images go under --out: no host configuration is needed.
            .args([
                "--config",
                "/dev/null",
                "images",
                "build",
                "--guest-bins",
                GUEST_DIR,
            ])
            .arg("--out")
            .arg(out)
            .args(which),
    )
}

/// Build the agent, the git SSH shim, the service supervisor and the container init statically linked for the
/// guest, into [`GUEST_DIR`].
pub fn guest_bins() -> anyhow::Result<()> {
    ui::run(
        Command::new("cargo")
            .args([
                "build",
                "--quiet",
                "--release",
                "-p",
                "svc-guest",
                "--bin",
                "svc-microvm-agent",
                "--bin",
                "svc-git-ssh",
                "--bin",
                "svc-supervise",
                "--bin",
                "svc-init",
                "--target",
                "x86_64-unknown-linux-gnu",
                "--target-dir",
                "target/guest",
            ])
            .env("RUSTFLAGS", "-C target-feature=+crt-static"),
    )
}
