//! Booting a guest (or restoring a fork's clone): its disk, its helper daemons, its monitor
//! launched paused beside its fenced tap, its memory cgroup, then run until its agent answers
//! and is set up ([`super::setup`]).

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    Microvm, channel::Channel, images::Images, monitor::Launch, setup::set_up_guest, vm_dir::VmDir,
};
use crate::runtime::{GuestHandle, GuestLinks, GuestSpec, HostEnd, Started, start_time};

/// How long a guest may take from launch to its agent's hello (TCG on a busy host is slow).
const BOOT_LIMIT: Duration = Duration::from_secs(120);

/// How many of the console's last lines a failed boot reports.
const CONSOLE_TAIL: usize = 8;

impl Microvm {
    /// Launch, fence, boot and set up a guest.
    pub(super) async fn boot(
        &self,
        spec: &GuestSpec,
        links: &dyn GuestLinks,
        images: &Images,
    ) -> Result<Started, String> {
        let t0 = Instant::now();
        let dir = VmDir(spec.dir.clone());
        make_dir(&dir)?;
        let run_as = self.make_disk(spec, &dir, images).await?;
        // The live mounts: one virtiofsd each, up before QEMU connects to it; then the spare
        // share the trees attached later go in (`trees`), last.
        let shared = self.serve_shared(&dir, &spec.shared).await?;
        let mut devices = shared.clone();
        let trees = self.trees_available();
        if trees {
            devices.push(self.serve_trees(&dir).await?);
        }
        let vsock = self.vsock() && spec.restore.is_none();
        if vsock {
            self.serve_vsock(&dir).await?;
        }
        let vsock_device = dir.vsock_device();
        // The tap is made and fenced while QEMU starts; QEMU opens it, and the guest runs
        // only once both are done.
        let launch = Launch {
            dir: &dir,
            images,
            tap: links.link(),
            memory_mib: self.config.memory_mib,
            cpus: self.config.cpus,
            incoming: spec.restore.as_ref().map(|s| s.memory.as_path()),
            run_as,
            shared: &devices,
            vsock: vsock.then_some(vsock_device.as_path()),
        };
        // QEMU attaches to the tap by name: it exists first.
        links.make_tap().await.map_err(|e| e.to_string())?;
        let (ifindex, pid) = tokio::try_join!(
            async { links.prepare(HostEnd::Tap).await.map_err(|e| e.to_string()) },
            self.monitor.launch(&launch)
        )?;
        let t1 = Instant::now();
        let start = start_time(pid).ok_or("QEMU exited as it started")?;
        self.limit_memory(&spec.name, pid)
            .map_err(|e| format!("the memory cgroup: {e}"))?;
        self.monitor.resume(&dir).await?;
        let t2 = Instant::now();
        let channel = self.agent(&dir).await?;
        let t3 = Instant::now();
        if trees && spec.restore.is_none() {
            // A clone's came with its memory. First: the set-up's last step flushes the
            // guest's writes (`set_up_guest`), and the mount point is one.
            super::trees::mount_share(&channel).await?;
        }
        set_up_guest(&channel, spec, links, &shared, self.config.disk_mib).await?;
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        tracing::debug!(
            disk_and_launch_ms = ms(t1 - t0),
            cgroup_fence_cont_ms = ms(t2 - t1),
            to_agent_ms = ms(t3 - t2),
            setup_ms = ms(t3.elapsed()),
            restored = spec.restore.is_some(),
            "microvm started"
        );
        self.channels().insert(spec.name.clone(), channel);
        Ok(Started {
            guest: GuestHandle {
                name: spec.name.clone(),
                pid,
                start,
            },
            ifindex,
        })
    }

    /// The guest's disk: a copy of the snapshot's (a clone) or a new overlay of the image,
    /// owned by the VM's own ids; those ids (uid, gid), which QEMU runs as.
    async fn make_disk(
        &self,
        spec: &GuestSpec,
        dir: &VmDir,
        images: &Images,
    ) -> Result<(u32, u32), String> {
        match &spec.restore {
            // A clone's disk is its source's as it was at the snapshot.
            Some(snap) => {
                tokio::fs::copy(&snap.disk, dir.disk())
                    .await
                    .map_err(|e| format!("copying the snapshot's disk: {e}"))?;
            }
            None => overlay(&images.rootfs, &dir.disk(), self.config.disk_mib).await?,
        }
        // QEMU reopens its disk as the unprivileged user it runs as (after a restore, and on
        // `cont` after a snapshot): this VM's own ids own its overlay.
        let (uid, gid) = self.vm_ids(spec.id)?;
        std::os::unix::fs::chown(dir.disk(), Some(uid), Some(gid))
            .and_then(|()| {
                std::fs::set_permissions(
                    dir.disk(),
                    std::os::unix::fs::PermissionsExt::from_mode(0o600),
                )
            })
            .map_err(|e| format!("{}: {e}", dir.disk().display()))?;
        Ok((uid, gid))
    }

    /// The channel to the agent of the guest just let run, once it answers; else what the
    /// guest said on its console.
    async fn agent(&self, dir: &VmDir) -> Result<Arc<Channel>, String> {
        match self.connect(dir, BOOT_LIMIT).await {
            Ok(c) => Ok(c),
            Err(e) => Err(self.did_not_come_up(dir, &e).await),
        }
    }

    /// Why a boot failed: `e`, and the console's last lines (what the guest said).
    pub(super) async fn did_not_come_up(&self, dir: &VmDir, e: &str) -> String {
        let console = self.monitor.console(dir).await.unwrap_or_default();
        let tail: Vec<&str> = console.lines().rev().take(CONSOLE_TAIL).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "the guest did not come up: {e}; its console ends:\n{}",
            tail.join("\n")
        )
    }
}

/// The VM's directory, its sockets' paths checked for length.
fn make_dir(dir: &VmDir) -> Result<(), String> {
    std::fs::create_dir_all(&dir.0).map_err(|e| format!("{}: {e}", dir.0.display()))?;
    for sock in [dir.agent(), dir.qmp()] {
        if sock.as_os_str().len() >= 108 {
            return Err(format!(
                "{}: too long for a unix socket (108 bytes); use a shorter state_dir",
                sock.display()
            ));
        }
    }
    Ok(())
}

/// A qcow2 overlay at `disk` over the raw image `rootfs`: the guest writes only its own copy,
/// and at most `mib` MiB of it (`[container] disk_mib`; the image's own size if that is more,
/// or if `mib` is 0): the disk's virtual size, which bounds what its file can grow to.
async fn overlay(rootfs: &Path, disk: &Path, mib: u64) -> Result<(), String> {
    let image = std::fs::metadata(rootfs)
        .map_err(|e| format!("{}: {e}", rootfs.display()))?
        .len();
    let size = mib.saturating_mul(1 << 20).max(image);
    let out = tokio::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(rootfs)
        .arg(disk)
        .arg(size.to_string())
        .output()
        .await
        .map_err(|e| format!("running qemu-img: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "qemu-img create: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{
        fake::{FakeMonitor, microvm},
        vm_dir::VmDir,
    };

    #[tokio::test]
    async fn a_failed_boot_says_the_consoles_last_lines() {
        let state = tempfile::tempdir().expect("tempdir");
        let console: Vec<String> = (1..=20).map(|i| format!("line {i}")).collect();
        let fake = Arc::new(FakeMonitor {
            console: console.join("\n"),
            ..FakeMonitor::default()
        });
        let vm = microvm(fake.clone(), state.path());
        let dir = VmDir(state.path().join("sandboxes").join("a"));
        let said = vm.did_not_come_up(&dir, "no answer to hello in time").await;
        let want = (13..=20)
            .map(|i| format!("line {i}"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(
            said,
            format!(
                "the guest did not come up: no answer to hello in time; its console ends:\n{want}"
            )
        );
        assert_eq!(fake.calls(), ["console a"]);
    }
}
