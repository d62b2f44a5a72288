//! The microvm initramfs: busybox-static and the virtio modules the cloud kernel builds as
//! modules (block, console, net, virtio-fs and vsock), loaded in dependency order, then the
//! root file system mounted and handed to its init (tini) with the agent as its child.

use std::{collections::BTreeMap, path::Path, process::Command};

use super::{ImagesError, host, io};

/// Modules the guest needs, by file name under the kernel's module tree; loaded in dependency
/// order (from each module's `depends=`).
pub(super) const MODULES: &[&str] = &[
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

/// Write the initramfs to `out` from the unpacked packages in `x` (kernel `release`), staged
/// in `work`.
pub(super) fn build(x: &Path, release: &str, work: &Path, out: &Path) -> Result<(), ImagesError> {
    let root = work.join("initramfs");
    for d in ["bin", "lib/modules", "proc", "sys", "dev", "newroot"] {
        let dir = root.join(d);
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
    }
    let busybox = x.join("bin/busybox");
    copy(&busybox, &root.join("bin/busybox"))?;
    let tree = x.join("lib/modules").join(release).join("kernel");
    let mut deps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in MODULES {
        let path = tree.join(m);
        let bytes =
            std::fs::read(&path).map_err(io(format!("reading module {}", path.display())))?;
        let name = file_stem(m);
        write(&root.join("lib/modules").join(format!("{name}.ko")), &bytes)?;
        deps.insert(name, module_depends(&bytes));
    }
    let order = load_order(&deps)?;
    let order: String = order.iter().map(|m| format!("{m}.ko\n")).collect();
    write(&root.join("lib/modules/order"), order.as_bytes())?;
    write(&root.join("init"), INIT.as_bytes())?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(root.join("init"), std::fs::Permissions::from_mode(0o755))
        .map_err(io("making the initramfs's init executable"))?;
    // busybox's own cpio (static, from the package just unpacked) writes the newc archive.
    let abs = |p: &Path| std::fs::canonicalize(p).map_err(io(format!("finding {}", p.display())));
    let script = format!(
        "cd '{}' && find . | '{}' cpio -o -H newc 2>/dev/null | gzip -6 > '{}'",
        abs(&root)?.display(),
        abs(&busybox)?.display(),
        std::path::absolute(out)
            .map_err(io(format!("finding {}", out.display())))?
            .display()
    );
    host::run(Command::new("sh").args(["-c", &script]))?;
    Ok(())
}

fn copy(from: &Path, to: &Path) -> Result<(), ImagesError> {
    std::fs::copy(from, to).map(|_| ()).map_err(io(format!(
        "copying {} to {}",
        from.display(),
        to.display()
    )))
}

fn write(to: &Path, bytes: &[u8]) -> Result<(), ImagesError> {
    std::fs::write(to, bytes).map_err(io(format!("writing {}", to.display())))
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
fn load_order(deps: &BTreeMap<String, Vec<String>>) -> Result<Vec<String>, ImagesError> {
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
                return Err(ImagesError::Input(format!(
                    "modules whose dependencies are not in the list: {}",
                    missing.join("; ")
                )));
            }
        }
    }
    Ok(order)
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
