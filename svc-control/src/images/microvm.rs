//! The microvm backend's images, from Debian packages only: the Debian cloud kernel
//! (`linux-image-cloud-amd64`), an initramfs (see `initramfs`), and an ext4 root file system
//! made from the base tree (`mkfs.ext4 -d`) with `svc-microvm-agent` (statically linked) at
//! `/usr/local/bin/svc-microvm-agent`. Their stamp, beside the root file system, holds the
//! module list, the agent's size and time, and the base tree's stamp.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use super::{ImagesError, Layout, Step, StepDone, Steps, host, initramfs, io};

/// The stamp current images have, from the base tree's stamp and the agent.
pub(super) fn wanted(layout: &Layout, agent: &Path) -> Result<String, ImagesError> {
    let base_stamp = layout.base.join("stamp");
    let base_stamp = std::fs::read_to_string(&base_stamp).map_err(|e| {
        ImagesError::Input(format!(
            "the base image has no stamp ({}: {e}): build it first (without --microvm)",
            base_stamp.display()
        ))
    })?;
    let meta =
        std::fs::metadata(agent).map_err(io(format!("reading the agent {}", agent.display())))?;
    let time = meta
        .modified()
        .map_err(io(format!("reading the agent's time {}", agent.display())))?;
    Ok(format!(
        "modules: {}\nagent: {} {time:?}\n{base_stamp}",
        initramfs::MODULES.join(","),
        meta.len()
    ))
}

/// Whether the images are there and their stamp is `wanted`.
pub(super) fn current(layout: &Layout, wanted: &str) -> bool {
    std::fs::read_to_string(layout.microvm_dir().join("stamp")).is_ok_and(|s| s == wanted)
        && [&layout.kernel, &layout.initrd, &layout.rootfs]
            .iter()
            .all(|f| f.exists())
}

/// The kernel, initramfs and root file system, made again unless current (or `force`).
pub(super) fn build(
    layout: &Layout,
    agent: &Path,
    force: bool,
    steps: &mut Steps<'_>,
) -> Result<(), ImagesError> {
    let wanted = wanted(layout, agent)?;
    let dir = layout.microvm_dir();
    if !force && current(layout, &wanted) {
        for step in [Step::Kernel, Step::Initramfs, Step::Rootfs] {
            steps.done(StepDone {
                step,
                built: false,
                detail: format!(
                    "the microvm {} in {} is current",
                    step.name(),
                    dir.display()
                ),
                secs: 0.0,
            });
        }
        return Ok(());
    }
    for d in [&dir, &parent(&layout.kernel), &parent(&layout.initrd)] {
        std::fs::create_dir_all(d).map_err(io(format!("creating {}", d.display())))?;
    }
    let work = dir.join("work");
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(io(format!("removing {}", work.display())))?;
    }
    std::fs::create_dir_all(&work).map_err(io(format!("creating {}", work.display())))?;
    let started = Instant::now();
    let (release, x) = kernel(&work, &layout.kernel, steps)?;
    steps.done(done(Step::Kernel, format!("kernel {release}"), started));
    let started = Instant::now();
    let initrd_new = new_path(&layout.initrd);
    initramfs::build(&x, &release, &work, &initrd_new)?;
    rename(&initrd_new, &layout.initrd)?;
    steps.done(done(Step::Initramfs, path_detail(&layout.initrd), started));
    let started = Instant::now();
    steps.line(&format!(
        "[{}] mkfs.ext4 from {}",
        Step::Rootfs.name(),
        layout.base.join("rootfs").display()
    ));
    rootfs(&layout.base, agent, &layout.rootfs)?;
    steps.done(done(Step::Rootfs, path_detail(&layout.rootfs), started));
    std::fs::remove_dir_all(&work).map_err(io(format!("removing {}", work.display())))?;
    let stamp = dir.join("stamp");
    std::fs::write(&stamp, wanted).map_err(io(format!("writing {}", stamp.display())))
}

fn done(step: Step, detail: String, started: Instant) -> StepDone {
    StepDone {
        step,
        built: true,
        detail,
        secs: started.elapsed().as_secs_f64(),
    }
}

fn path_detail(path: &Path) -> String {
    format!("{} built", path.display())
}

fn parent(path: &Path) -> PathBuf {
    path.parent().unwrap_or(Path::new("/")).to_owned()
}

/// `PATH.new`: where a file is made before it replaces `PATH`.
fn new_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".new");
    path.with_file_name(name)
}

fn rename(from: &Path, to: &Path) -> Result<(), ImagesError> {
    std::fs::rename(from, to).map_err(io(format!("moving {} to {}", from.display(), to.display())))
}

/// Download and unpack the kernel and busybox-static into `work/x`, put the kernel at `out`;
/// its release and the unpacked tree.
fn kernel(
    work: &Path,
    out: &Path,
    progress: &mut Steps<'_>,
) -> Result<(String, PathBuf), ImagesError> {
    let kernel_pkg = kernel_package()?;
    progress.line(&format!(
        "[{}] downloading {kernel_pkg} and busybox-static (apt-get download)",
        Step::Kernel.name()
    ));
    host::run(
        Command::new("apt-get")
            .current_dir(work)
            // The download lands in our own directory, which apt's sandbox user cannot enter.
            .args(["download", "-q", "-o", "APT::Sandbox::User=root"])
            .args([&kernel_pkg, "busybox-static"]),
    )?;
    let x = work.join("x");
    let listing = std::fs::read_dir(work).map_err(io(format!("listing {}", work.display())))?;
    for deb in listing.filter_map(Result::ok).map(|e| e.path()) {
        if deb.extension().is_some_and(|e| e == "deb") {
            host::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&x))?;
        }
    }
    let boot = x.join("boot");
    let vmlinuz = std::fs::read_dir(&boot)
        .map_err(io(format!("listing {}", boot.display())))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .ok_or_else(|| ImagesError::Input(format!("{kernel_pkg} holds no /boot/vmlinuz-*")))?;
    let release = vmlinuz
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .unwrap_or_default()
        .to_owned();
    let new = new_path(out);
    std::fs::copy(&vmlinuz, &new)
        .map_err(io(format!("copying the kernel to {}", new.display())))?;
    rename(&new, out)?;
    Ok((release, x))
}

/// The versioned package `linux-image-cloud-amd64` depends on.
fn kernel_package() -> Result<String, ImagesError> {
    let out = host::run(Command::new("apt-cache").args(["depends", "linux-image-cloud-amd64"]))?;
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .map(str::to_owned)
        .ok_or_else(|| {
            ImagesError::Input(
                "apt-cache knows no linux-image-cloud-amd64: run `apt-get update`".into(),
            )
        })
}

/// The ext4 root file system at `out`: the base tree with room to write, and the agent.
fn rootfs(base: &Path, agent: &Path, out: &Path) -> Result<(), ImagesError> {
    let tree = base.join("rootfs");
    let used: u64 = host::run(Command::new("du").args(["-sb"]).arg(&tree))?
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| ImagesError::Input(format!("du -sb {} printed no size", tree.display())))?;
    // Room for the guest's own writes: half again the tree, at least 512 MiB more.
    let size_mib = (used * 3 / 2) / (1 << 20) + 512;
    let tmp = new_path(out);
    let _ = std::fs::remove_file(&tmp);
    host::run(
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "svc-root", "-d"])
            .arg(&tree)
            .arg(&tmp)
            .arg(format!("{size_mib}M")),
    )?;
    let target = "/usr/local/bin/svc-microvm-agent";
    for request in [
        format!("write {} {target}", agent.display()),
        format!("set_inode_field {target} mode 0100755"),
        format!("set_inode_field {target} uid 0"),
        format!("set_inode_field {target} gid 0"),
    ] {
        host::run(
            Command::new("debugfs")
                .args(["-w", "-R", &request])
                .arg(&tmp),
        )?;
    }
    let check = host::run(
        Command::new("debugfs")
            .args(["-R", &format!("stat {target}")])
            .arg(&tmp),
    )?;
    if !check.contains("Mode:  0755") && !check.contains("Mode:  0100755") {
        return Err(ImagesError::Input(format!(
            "the agent in {} is not executable:\n{check}",
            tmp.display()
        )));
    }
    rename(&tmp, out)
}
