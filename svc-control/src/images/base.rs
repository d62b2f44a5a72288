//! The base image: `BASE/rootfs`, a Debian tree made by mmdebstrap (minbase and
//! [`PACKAGES`]) from the host's apt sources, owned by real root (svcd shifts a copy into the
//! sandbox user's id range for the container backend), with the guest binaries in it;
//! `BASE/stamp` says what is in it (`suite:`, `packages:`, `build:`).

use std::{path::Path, process::Command, time::Instant};

use super::{GuestBins, ImagesError, Step, StepDone, Steps, host, io};

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

/// Where each guest binary goes in the tree, and what it is: the git SSH shim (what
/// `GIT_SSH_COMMAND` names), the workspace's service supervisor and the container guest's init.
/// (The microvm agent goes into the microvm root file system only.)
const IN_TREE: [(&str, &str); 3] = [
    ("usr/local/bin/svc-git-ssh", "the git SSH shim"),
    ("usr/local/bin/svc-supervise", "the service supervisor"),
    ("usr/local/bin/svc-init", "the container guest's init"),
];

/// The start of the stamp a current tree has: the suite and the package list.
pub(super) fn wanted() -> Result<String, ImagesError> {
    Ok(format!(
        "suite: {}\npackages: {}\n",
        host::suite()?,
        PACKAGES.join(",")
    ))
}

/// Whether the tree in `base` is current: its stamp starts with [`wanted`] and it has its init.
pub(super) fn tree_current(base: &Path, wanted: &str) -> bool {
    std::fs::read_to_string(base.join("stamp")).is_ok_and(|s| s.starts_with(wanted))
        && base.join("rootfs/usr/bin/tini").exists()
}

/// The tree, made again unless current (or `force`).
pub(super) fn tree(
    base: &Path,
    force: bool,
    progress: &mut Steps<'_>,
) -> Result<StepDone, ImagesError> {
    let started = Instant::now();
    let wanted = wanted()?;
    if !force && tree_current(base, &wanted) {
        return Ok(StepDone {
            step: Step::Mmdebstrap,
            built: false,
            detail: format!("base tree {} is current", base.display()),
            secs: started.elapsed().as_secs_f64(),
        });
    }
    let suite = host::suite()?;
    let sources = host::sources()?;
    std::fs::create_dir_all(base).map_err(io(format!("creating {}", base.display())))?;
    let new = base.join("rootfs.new");
    if new.exists() {
        std::fs::remove_dir_all(&new).map_err(io(format!("removing {}", new.display())))?;
    }
    progress.line(&format!(
        "[{}] {suite} minbase + {} from {} (a minute or two)",
        Step::Mmdebstrap.name(),
        PACKAGES.join(", "),
        sources.display()
    ));
    host::run(
        Command::new("mmdebstrap")
            .args(["--quiet", "--variant=minbase", "--mode=root"])
            .arg(format!("--include={}", PACKAGES.join(",")))
            .arg(&suite)
            .arg(&new)
            .arg(&sources),
    )?;
    replace_tree(base, &new)?;
    let stamp = base.join("stamp");
    std::fs::write(&stamp, format!("{wanted}build: {}\n", host::now_nanos()))
        .map_err(io(format!("writing {}", stamp.display())))?;
    Ok(StepDone {
        step: Step::Mmdebstrap,
        built: true,
        detail: format!("base tree {} built", base.display()),
        secs: started.elapsed().as_secs_f64(),
    })
}

/// Put `new` in place of the old tree, removing every id-shifted copy svcd made of it.
fn replace_tree(base: &Path, new: &Path) -> Result<(), ImagesError> {
    let entries = std::fs::read_dir(base).map_err(io(format!("listing {}", base.display())))?;
    for entry in entries {
        let path = entry
            .map_err(io(format!("listing {}", base.display())))?
            .path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "rootfs"
            || (name.starts_with("rootfs.") && name != "rootfs.new")
            || name.starts_with(".rootfs.")
        {
            std::fs::remove_dir_all(&path)
                .map_err(io(format!("removing the old {}", path.display())))?;
        }
    }
    let rootfs = base.join("rootfs");
    std::fs::rename(new, &rootfs).map_err(io(format!("moving the tree to {}", rootfs.display())))
}

/// The guest binaries in the tree whose bytes differ from `bins` (none: the tree is current).
pub(super) fn stale_bins(base: &Path, bins: &GuestBins) -> Vec<&'static str> {
    IN_TREE
        .iter()
        .zip([&bins.shim, &bins.supervisor, &bins.init])
        .filter(|((path, _), bin)| {
            let new = std::fs::read(bin);
            let old = std::fs::read(base.join("rootfs").join(path));
            !matches!((new, old), (Ok(n), Ok(o)) if n == o)
        })
        .map(|((path, _), _)| *path)
        .collect()
}

/// Put each guest binary into the tree unless the one there is the same; a new one is a new
/// build of the image (svcd shifts it again, the microvm root file system is made again).
pub(super) fn guest_bins(base: &Path, bins: &GuestBins) -> Result<StepDone, ImagesError> {
    let started = Instant::now();
    let stale = stale_bins(base, bins);
    for ((path, what), bin) in IN_TREE
        .iter()
        .zip([&bins.shim, &bins.supervisor, &bins.init])
    {
        if stale.contains(path) {
            install(base, bin, path, what)?;
        }
    }
    if !stale.is_empty() {
        bump_build(base)?;
    }
    Ok(StepDone {
        step: Step::GuestBinaries,
        built: !stale.is_empty(),
        detail: if stale.is_empty() {
            "the guest binaries in the base tree are current".to_owned()
        } else {
            format!("installed /{} in the base tree", stale.join(", /"))
        },
        secs: started.elapsed().as_secs_f64(),
    })
}

fn install(base: &Path, bin: &Path, path: &str, what: &str) -> Result<(), ImagesError> {
    use std::os::unix::fs::PermissionsExt as _;
    let target = base.join("rootfs").join(path);
    let new = std::fs::read(bin).map_err(io(format!("reading {what} {}", bin.display())))?;
    let dir = target.parent().unwrap_or(base);
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let tmp = dir.join(".svc-guest-bin.new");
    let failed = io(format!("installing {what} at {}", target.display()));
    std::fs::write(&tmp, &new)
        .and_then(|()| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)))
        .and_then(|()| std::fs::rename(&tmp, &target))
        .map_err(failed)
}

/// A new `build:` line in the stamp.
fn bump_build(base: &Path) -> Result<(), ImagesError> {
    let stamp = base.join("stamp");
    let text =
        std::fs::read_to_string(&stamp).map_err(io(format!("reading {}", stamp.display())))?;
    let kept: String = text
        .lines()
        .filter(|l| !l.starts_with("build: "))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&stamp, format!("{kept}build: {}\n", host::now_nanos()))
        .map_err(io(format!("writing {}", stamp.display())))
}
