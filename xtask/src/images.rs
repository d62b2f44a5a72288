//! `cargo xtask images`: the sandboxes' base image, built from Debian packages only with
//! mmdebstrap and this machine's own apt sources. `OUT/base/rootfs` is the root file system
//! (owned by real root; svcd shifts a copy into the sandbox user's id range for the container
//! backend), `OUT/base/stamp` says what is in it. Building again is skipped while the stamp
//! matches the package list.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Instant, SystemTime},
};

use anyhow::{Context as _, bail};

use crate::ui;

/// What the base image holds besides Debian's minbase: the tools a coding agent's sandbox is
/// expected to have, and the guest's init.
pub const PACKAGES: &[&str] = &[
    "ca-certificates",
    "curl",
    "git",
    "python3",
    "tini",
    "iproute2",
    "procps",
];

/// The base tree, then the microvm images made from it.
pub fn build_all(out: &Path) -> anyhow::Result<()> {
    build(out)?;
    let bins = crate::microvm_images::guest_bins()?;
    crate::microvm_images::build(out, &out.join("base"), &bins.agent)
}

/// The (statically linked) in-guest binaries every image carries: the git SSH shim (what
/// `GIT_SSH_COMMAND` names) and the workspace's service supervisor.
const GUEST_BINS: [(&str, &str); 2] = [
    ("usr/local/bin/svc-git-ssh", "the git SSH shim"),
    ("usr/local/bin/svc-supervise", "the service supervisor"),
];

/// Put an in-guest binary into the base tree at `path` if it is not the one there; a new one
/// is a new build of the image (svcd shifts it again, the microvm root file system is made
/// again).
fn install_guest_bin(base: &Path, bin: &Path, path: &str, what: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let target = base.join("rootfs").join(path);
    let new = std::fs::read(bin).with_context(|| format!("{what} {}", bin.display()))?;
    if std::fs::read(&target).is_ok_and(|old| old == new) {
        return Ok(());
    }
    let dir = target.parent().context("binary path")?;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(".svc-guest-bin.new");
    std::fs::write(&tmp, &new)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&tmp, &target)?;
    let stamp = base.join("stamp");
    let text = std::fs::read_to_string(&stamp)?;
    let kept: String = text
        .lines()
        .filter(|l| !l.starts_with("build: "))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&stamp, format!("{kept}build: {}\n", now_nanos()))?;
    ui::ok(&format!(
        "installed {what} at /{path} in {}",
        base.display()
    ));
    Ok(())
}

fn now_nanos() -> u128 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

pub fn default_dir() -> PathBuf {
    PathBuf::from("target/images")
}

/// The base tree with the git SSH shim in it.
pub fn build(out: &Path) -> anyhow::Result<()> {
    build_tree(out)?;
    let bins = crate::microvm_images::guest_bins()?;
    for ((path, what), bin) in GUEST_BINS.iter().zip([&bins.shim, &bins.supervisor]) {
        install_guest_bin(&out.join("base"), bin, path, what)?;
    }
    Ok(())
}

fn build_tree(out: &Path) -> anyhow::Result<()> {
    ui::heading("images: the sandboxes' base image (Debian packages, mmdebstrap)");
    let base = out.join("base");
    let suite = suite()?;
    let wanted = format!("suite: {suite}\npackages: {}\n", PACKAGES.join(","));
    let stamp = base.join("stamp");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s.starts_with(&wanted))
        && base.join("rootfs/usr/bin/tini").exists()
    {
        ui::ok(&format!("base image {} is current", base.display()));
        return Ok(());
    }
    let sources = sources()?;
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let new = base.join("rootfs.new");
    if new.exists() {
        std::fs::remove_dir_all(&new)?;
    }
    ui::info(&format!(
        "mmdebstrap {suite} minbase + {} from {} (about half a minute)",
        PACKAGES.join(", "),
        sources.display()
    ));
    let started = Instant::now();
    ui::run(
        Command::new("mmdebstrap")
            .args(["--quiet", "--variant=minbase", "--mode=root"])
            .arg(format!("--include={}", PACKAGES.join(",")))
            .arg(&suite)
            .arg(&new)
            .arg(&sources),
    )?;
    // Replace the old tree and every id-shifted copy svcd made of it.
    for entry in std::fs::read_dir(&base)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "rootfs"
            || (name.starts_with("rootfs.") && name != "rootfs.new")
            || name.starts_with(".rootfs.")
        {
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("removing the old {}", path.display()))?;
        }
    }
    std::fs::rename(&new, base.join("rootfs"))?;
    std::fs::write(&stamp, format!("{wanted}build: {}\n", now_nanos()))?;
    ui::ok(&format!(
        "base image {} built in {:.1} s",
        base.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// This machine's Debian suite (`VERSION_CODENAME` of /etc/os-release).
fn suite() -> anyhow::Result<String> {
    let text = std::fs::read_to_string("/etc/os-release").context("reading /etc/os-release")?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .filter(|v| !v.is_empty())
        .context("/etc/os-release names no VERSION_CODENAME: is this Debian?")
}

/// This machine's own Debian apt sources: `SVC_IMAGE_SOURCES` if set, else the Debian entry of
/// sources.list.d (deb822), else sources.list.
fn sources() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("SVC_IMAGE_SOURCES") {
        return Ok(PathBuf::from(p));
    }
    for p in [
        "/etc/apt/sources.list.d/debian.sources",
        "/etc/apt/sources.list",
    ] {
        let path = Path::new(p);
        if std::fs::read_to_string(path).is_ok_and(|t| {
            t.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        }) {
            return Ok(path.to_path_buf());
        }
    }
    bail!(
        "no apt sources found (/etc/apt/sources.list.d/debian.sources, /etc/apt/sources.list): \
         set SVC_IMAGE_SOURCES to a sources file mmdebstrap can use"
    )
}
