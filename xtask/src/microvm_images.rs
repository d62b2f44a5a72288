//! The microvm backend's images, from Debian packages only: the Debian cloud kernel
//! (`linux-image-cloud-amd64`), an initramfs (busybox-static and the virtio modules the cloud
//! kernel builds as modules — block, console, net, virtio-fs and vsock — loaded in dependency order), and an ext4 root file system made from
//! the same base tree as the container backend's image (`mkfs.ext4 -d`) with
//! `svc-microvm-agent` (statically linked) at `/usr/local/bin/svc-microvm-agent`.
//!
//! `OUT/microvm/vmlinuz`, `initrd.img`, `rootfs.ext4` and `stamp`; `SVC_MICROVM_KERNEL`,
//! `SVC_MICROVM_INITRD` (our addition: Debian's kernel needs its modules) and
//! `SVC_MICROVM_ROOTFS` point at them.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{Context as _, bail};

use crate::ui;

/// Modules the guest needs, by file name under the kernel's module tree; loaded in dependency
/// order (from each module's `depends=`).
const MODULES: &[&str] = &[
    "drivers/virtio/virtio_ring.ko",
    "drivers/virtio/virtio.ko",
    "drivers/virtio/virtio_mmio.ko",
    "drivers/block/virtio_blk.ko",
    "drivers/char/virtio_console.ko",
    "net/core/failover.ko",
    "drivers/net/net_failover.ko",
    "drivers/net/virtio_net.ko",
    "fs/fuse/fuse.ko",
    "fs/fuse/virtiofs.ko",
    "net/vmw_vsock/vsock.ko",
    "net/vmw_vsock/vmw_vsock_virtio_transport_common.ko",
    "net/vmw_vsock/vmw_vsock_virtio_transport.ko",
];

/// The guest's first program: load the modules, mount the root file system, hand over to the
/// root's init (tini) with the agent as its child.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /lib/modules/order); do
  insmod "/lib/modules/$m" || echo "svc initramfs: insmod $m failed"
done
mount -t ext4 -o rw /dev/vda /newroot || { echo "svc initramfs: no root file system on /dev/vda"; poweroff -f; }
mkdir -p /newroot/proc /newroot/sys /newroot/dev
mount --move /proc /newroot/proc
mount --move /sys /newroot/sys
mount --move /dev /newroot/dev
exec switch_root /newroot /usr/bin/tini -s -- /usr/local/bin/svc-microvm-agent
"#;

pub fn build(out: &Path, base: &Path, agent: &Path) -> anyhow::Result<()> {
    ui::heading("images: the microvm kernel, initramfs and ext4 root file system");
    let dir = out.join("microvm");
    std::fs::create_dir_all(&dir)?;
    let base_stamp = std::fs::read_to_string(base.join("stamp"))
        .context("the base image has no stamp: build it first")?;
    let agent_len = std::fs::metadata(agent)
        .with_context(|| format!("the agent {}", agent.display()))?
        .len();
    let agent_time = std::fs::metadata(agent)?.modified()?;
    let wanted = format!(
        "modules: {}\nagent: {agent_len} {agent_time:?}\n{base_stamp}",
        MODULES.join(",")
    );
    let stamp = dir.join("stamp");
    if std::fs::read_to_string(&stamp).is_ok_and(|s| s == wanted)
        && ["vmlinuz", "initrd.img", "rootfs.ext4"]
            .iter()
            .all(|f| dir.join(f).exists())
    {
        ui::ok(&format!("microvm images in {} are current", dir.display()));
        return Ok(());
    }
    let started = Instant::now();
    let work = dir.join("work");
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(&work)?;
    let kernel_pkg = kernel_package()?;
    ui::info(&format!(
        "downloading {kernel_pkg} and busybox-static (apt-get download)"
    ));
    ui::run(
        Command::new("apt-get")
            .current_dir(&work)
            // The download lands in our own directory, which apt's sandbox user cannot enter.
            .args(["download", "-q", "-o", "APT::Sandbox::User=root"])
            .args([&kernel_pkg, "busybox-static"]),
    )?;
    for deb in std::fs::read_dir(&work)? {
        let deb = deb?.path();
        if deb.extension().is_some_and(|e| e == "deb") {
            ui::run(
                Command::new("dpkg-deb")
                    .arg("-x")
                    .arg(&deb)
                    .arg(work.join("x")),
            )?;
        }
    }
    let x = work.join("x");
    let vmlinuz = std::fs::read_dir(x.join("boot"))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .context("the kernel package holds no /boot/vmlinuz-*")?;
    let release = vmlinuz
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("vmlinuz-"))
        .context("kernel file name")?
        .to_owned();
    std::fs::copy(&vmlinuz, dir.join("vmlinuz"))?;
    initramfs(&x, &release, &work, &dir.join("initrd.img"))?;
    rootfs(base, agent, &dir.join("rootfs.ext4"))?;
    std::fs::remove_dir_all(&work)?;
    std::fs::write(&stamp, wanted)?;
    ui::ok(&format!(
        "microvm images in {} (kernel {release}) built in {:.1} s",
        dir.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// The versioned package `linux-image-cloud-amd64` depends on.
fn kernel_package() -> anyhow::Result<String> {
    let out = ui::output(Command::new("apt-cache").args(["depends", "linux-image-cloud-amd64"]))?;
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .map(str::to_owned)
        .context("apt-cache knows no linux-image-cloud-amd64 (apt-get update?)")
}

fn initramfs(x: &Path, release: &str, work: &Path, out: &Path) -> anyhow::Result<()> {
    let root = work.join("initramfs");
    for d in ["bin", "lib/modules", "proc", "sys", "dev", "newroot"] {
        std::fs::create_dir_all(root.join(d))?;
    }
    let busybox = x.join("bin/busybox");
    std::fs::copy(&busybox, root.join("bin/busybox"))?;
    let tree = x.join("lib/modules").join(release).join("kernel");
    let mut deps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in MODULES {
        let path = tree.join(m);
        let bytes = std::fs::read(&path).with_context(|| format!("module {}", path.display()))?;
        let name = file_stem(m);
        std::fs::write(root.join("lib/modules").join(format!("{name}.ko")), &bytes)?;
        deps.insert(name, module_depends(&bytes));
    }
    let order = load_order(&deps)?;
    std::fs::write(
        root.join("lib/modules/order"),
        order
            .iter()
            .map(|m| format!("{m}.ko\n"))
            .collect::<String>(),
    )?;
    std::fs::write(root.join("init"), INIT)?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(root.join("init"), std::fs::Permissions::from_mode(0o755))?;
    // busybox's own cpio (static, from the package just unpacked) writes the newc archive.
    let abs = |p: &Path| std::fs::canonicalize(p).with_context(|| format!("{}", p.display()));
    let out_abs = abs(out.parent().context("initrd path")?)?.join("initrd.img");
    let script = format!(
        "cd {} && find . | {} cpio -o -H newc 2>/dev/null | gzip -6 > {}",
        abs(&root)?.display(),
        abs(&busybox)?.display(),
        out_abs.display()
    );
    ui::output(Command::new("sh").args(["-c", &script]))?;
    Ok(())
}

fn file_stem(path: &str) -> String {
    Path::new(path)
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default()
        .to_owned()
}

/// The `depends=` entry of a module's `.modinfo` (NUL-separated `key=value` strings).
fn module_depends(ko: &[u8]) -> Vec<String> {
    ko.split(|b| *b == 0)
        .filter_map(|s| s.strip_prefix(b"depends="))
        .flat_map(|d| {
            String::from_utf8_lossy(d)
                .split(',')
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|d| !d.is_empty())
        .collect()
}

/// Dependencies first; a dependency outside the list is an error (it would not load).
fn load_order(deps: &BTreeMap<String, Vec<String>>) -> anyhow::Result<Vec<String>> {
    let mut order: Vec<String> = Vec::new();
    while order.len() < deps.len() {
        let next = deps
            .iter()
            .find(|(m, d)| !order.contains(m) && d.iter().all(|x| order.contains(x)))
            .map(|(m, _)| m.clone());
        match next {
            Some(m) => order.push(m),
            None => {
                let missing: Vec<String> = deps
                    .iter()
                    .filter(|(m, _)| !order.contains(m))
                    .map(|(m, d)| format!("{m} (needs {})", d.join(", ")))
                    .collect();
                bail!(
                    "modules whose dependencies are not in the list: {}",
                    missing.join("; ")
                );
            }
        }
    }
    Ok(order)
}

fn rootfs(base: &Path, agent: &Path, out: &Path) -> anyhow::Result<()> {
    let tree = base.join("rootfs");
    let used: u64 = ui::output(Command::new("du").args(["-sb"]).arg(&tree))?
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .context("du")?;
    // Room for the guest's own writes: half again the tree, at least 512 MiB more.
    let size_mib = (used * 3 / 2) / (1 << 20) + 512;
    let tmp = out.with_extension("ext4.new");
    let _ = std::fs::remove_file(&tmp);
    ui::run(
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
        ui::output(
            Command::new("debugfs")
                .args(["-w", "-R", &request])
                .arg(&tmp),
        )?;
    }
    let check = ui::output(
        Command::new("debugfs")
            .args(["-R", &format!("stat {target}")])
            .arg(&tmp),
    )?;
    if !check.contains("Mode:  0755") && !check.contains("Mode:  0100755") {
        bail!("the agent in {} is not executable:\n{check}", tmp.display());
    }
    std::fs::rename(&tmp, out)?;
    Ok(())
}

/// The in-guest binaries, statically linked.
pub struct GuestBins {
    pub agent: PathBuf,
    pub shim: PathBuf,
    pub supervisor: PathBuf,
}

/// Build the agent, the git SSH shim and the service supervisor statically linked for the
/// guest.
pub fn guest_bins() -> anyhow::Result<GuestBins> {
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
                "--target",
                "x86_64-unknown-linux-gnu",
                "--target-dir",
                "target/guest",
            ])
            .env("RUSTFLAGS", "-C target-feature=+crt-static"),
    )?;
    let dir = PathBuf::from("target/guest/x86_64-unknown-linux-gnu/release");
    Ok(GuestBins {
        agent: dir.join("svc-microvm-agent"),
        shim: dir.join("svc-git-ssh"),
        supervisor: dir.join("svc-supervise"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_load_after_their_dependencies() {
        let mut deps = BTreeMap::new();
        deps.insert("virtio".to_owned(), vec!["virtio_ring".to_owned()]);
        deps.insert("virtio_ring".to_owned(), vec![]);
        deps.insert(
            "virtio_blk".to_owned(),
            vec!["virtio".to_owned(), "virtio_ring".to_owned()],
        );
        let order = load_order(&deps).expect("ordered");
        assert_eq!(order, ["virtio_ring", "virtio", "virtio_blk"]);
        deps.insert("virtio_net".to_owned(), vec!["net_failover".to_owned()]);
        let err = load_order(&deps).expect_err("net_failover is missing");
        assert!(
            err.to_string().contains("virtio_net (needs net_failover)"),
            "{err}"
        );
    }

    #[test]
    fn depends_is_read_from_modinfo() {
        let ko = b"\0license=GPL\0depends=virtio_ring,virtio\0vermagic=6.1\0";
        assert_eq!(module_depends(ko), ["virtio_ring", "virtio"]);
        assert!(module_depends(b"\0depends=\0").is_empty());
    }
}
