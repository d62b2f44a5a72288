//! A running VM's lifecycle through its monitor: pause and resume, the snapshot a fork's
//! clones start from, and stop (the monitor asked to quit, killed if slow, then its helpers
//! and memory cgroup).

use std::{path::Path, time::Duration};

use super::{Microvm, host, vm_dir::VmDir};
use crate::runtime::{GuestHandle, RuntimeError, Snapshot, gone_within};

impl Microvm {
    /// Freeze the guest's CPUs.
    pub(super) async fn pause_vm(&self, guest: &GuestHandle) -> Result<(), RuntimeError> {
        let dir = self.dir(&guest.name);
        self.monitor
            .pause(&dir)
            .await
            .map_err(failed("pausing", guest))
    }

    /// Let the guest run again.
    pub(super) async fn resume_vm(&self, guest: &GuestHandle) -> Result<(), RuntimeError> {
        let dir = self.dir(&guest.name);
        self.monitor
            .resume(&dir)
            .await
            .map_err(failed("resuming", guest))
    }

    /// Stop the VM of sandbox `name` in `dir`; what was removed.
    pub(super) async fn stop_vm(
        &self,
        name: &str,
        dir: &Path,
    ) -> Result<Vec<String>, RuntimeError> {
        // A pooled VM's QEMU and helpers were given its files under its runtime name (still a
        // link to the claimer's directory): they are found by the paths they were given.
        let first = self.dir(name);
        let dir = if first.0.exists() {
            first
        } else {
            VmDir(dir.to_path_buf())
        };
        // First, whatever fails after: the sandbox's files are removed once this returns, and
        // no removal may reach into an attached tree (the host's directory, bound in the VM's).
        let mut removed: Vec<String> = super::trees::release(&dir).into_iter().collect();
        self.channels().remove(name);
        self.services().remove(name);
        if let Some(monitor) =
            self.stop_monitor(&dir)
                .await
                .map_err(|message| RuntimeError::Stop {
                    name: name.to_owned(),
                    message,
                })?
        {
            removed.push(monitor);
        }
        removed.extend(host::kill_helpers(&dir));
        // The pod containers' overlays and disk, once no virtiofsd holds them.
        removed.extend(super::ctr_root::release(&dir.0).await);
        removed.extend(self.remove_cgroup(name).await);
        Ok(removed)
    }

    /// End the VM's monitor process: asked first (QEMU then removes its tap and sockets
    /// itself), killed if slow. What was ended, if it ran.
    async fn stop_monitor(&self, dir: &VmDir) -> Result<Option<String>, String> {
        let Some((pid, start)) = self.monitor.running(dir) else {
            return Ok(None);
        };
        let asked = self.monitor.quit(dir).await.is_ok()
            && gone_within(pid, start, Duration::from_secs(2)).await;
        if !asked {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)),
                nix::sys::signal::Signal::SIGKILL,
            );
            if !gone_within(pid, start, Duration::from_secs(5)).await {
                return Err(format!("QEMU (pid {pid}) did not die"));
            }
        }
        Ok(Some(format!("QEMU (pid {pid})")))
    }

    /// Pause the guest and save its memory, devices and disk under `into`.
    pub(super) async fn snapshot_vm(
        &self,
        guest: &GuestHandle,
        into: &Path,
    ) -> Result<Snapshot, RuntimeError> {
        let err = failed("snapshotting", guest);
        let dir = self.dir(&guest.name);
        if self.vsock() {
            return Err(RuntimeError::Unsupported {
                backend: "microvm",
                operation: "fork",
                hint: " whose agent channel is vsock (QEMU cannot migrate a vhost-user vsock \
                       device): set microvm.channel = \"virtio-serial\" for sandboxes that fork",
            });
        }
        // QEMU writes the memory file as the unprivileged ids it runs as (this VM's own;
        // its clones' QEMUs open the file before they drop to theirs).
        let (uid, gid) = self
            .monitor
            .running(&dir)
            .and_then(|(pid, _)| host::process_ids(pid))
            .ok_or_else(|| err("its QEMU is not running".to_owned()))?;
        std::fs::create_dir_all(into)
            .and_then(|()| std::os::unix::fs::chown(into, Some(uid), Some(gid)))
            .and_then(|()| {
                std::fs::set_permissions(into, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            })
            .map_err(|e| err(format!("{}: {e}", into.display())))?;
        self.monitor.pause(&dir).await.map_err(&err)?;
        let snap = Snapshot {
            dir: into.to_path_buf(),
            memory: into.join("memory"),
            disk: into.join("disk.qcow2"),
        };
        self.monitor
            .snapshot(&dir, &snap.memory)
            .await
            .map_err(&err)?;
        // Paused and flushed: the overlay is the disk as the memory knows it.
        tokio::fs::copy(dir.disk(), &snap.disk)
            .await
            .map_err(|e| err(format!("copying the disk: {e}")))?;
        Ok(snap)
    }
}

/// A lifecycle `operation` on `guest` that failed, saying why.
fn failed(operation: &'static str, guest: &GuestHandle) -> impl Fn(String) -> RuntimeError {
    move |message| RuntimeError::Lifecycle {
        operation,
        name: guest.name.clone(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::fake::{FakeMonitor, microvm};
    use crate::runtime::{Backend as _, GuestHandle, start_time};

    fn guest(name: &str) -> GuestHandle {
        GuestHandle {
            name: name.into(),
            pid: 0,
            start: 0,
        }
    }

    /// A process standing in for a VM's monitor: (the child, its pid and start time).
    fn monitor_process() -> (std::process::Child, (u32, u64)) {
        let child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let pid = child.id();
        let start = start_time(pid).expect("its start time");
        (child, (pid, start))
    }

    #[tokio::test]
    async fn pause_and_resume_go_to_the_guests_monitor() {
        let state = tempfile::tempdir().expect("tempdir");
        let fake = Arc::new(FakeMonitor::default());
        let vm = microvm(fake.clone(), state.path());
        vm.pause(&guest("a")).await.expect("paused");
        vm.resume(&guest("a")).await.expect("resumed");
        assert_eq!(fake.calls(), ["pause a", "resume a"]);
    }

    #[tokio::test]
    async fn a_monitor_that_fails_is_named_with_the_operation() {
        let state = tempfile::tempdir().expect("tempdir");
        let fake = Arc::new(FakeMonitor {
            fails: Some("QMP: connection refused".into()),
            ..FakeMonitor::default()
        });
        let vm = microvm(fake, state.path());
        let err = vm.pause(&guest("a")).await.expect_err("pause fails");
        assert_eq!(
            err.to_string(),
            "pausing the guest of a: QMP: connection refused"
        );
        let err = vm.resume(&guest("a")).await.expect_err("resume fails");
        assert_eq!(
            err.to_string(),
            "resuming the guest of a: QMP: connection refused"
        );
    }

    #[tokio::test]
    async fn stop_asks_the_monitor_to_quit_first() {
        let state = tempfile::tempdir().expect("tempdir");
        let (mut child, process) = monitor_process();
        let fake = Arc::new(FakeMonitor {
            process: Some(process),
            on_quit: Some(nix::sys::signal::Signal::SIGTERM),
            ..FakeMonitor::default()
        });
        let vm = microvm(fake.clone(), state.path());
        let dir = state.path().join("sandboxes").join("a");
        let removed = vm.stop("a", &dir).await.expect("stopped");
        assert_eq!(removed, [format!("QEMU (pid {})", process.0)]);
        assert_eq!(fake.calls(), ["quit a"]);
        let status = child.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGTERM),
            "it went when asked"
        );
    }

    #[tokio::test]
    async fn stop_kills_a_monitor_that_cannot_be_asked() {
        let state = tempfile::tempdir().expect("tempdir");
        let (mut child, process) = monitor_process();
        let fake = Arc::new(FakeMonitor {
            process: Some(process),
            fails: Some("QMP: no such file".into()),
            ..FakeMonitor::default()
        });
        let vm = microvm(fake.clone(), state.path());
        let dir = state.path().join("sandboxes").join("a");
        let removed = vm.stop("a", &dir).await.expect("stopped");
        assert_eq!(removed, [format!("QEMU (pid {})", process.0)]);
        let status = child.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL),
            "killed"
        );
    }

    #[tokio::test]
    async fn stopping_a_guest_that_is_gone_removes_nothing() {
        let state = tempfile::tempdir().expect("tempdir");
        let fake = Arc::new(FakeMonitor::default());
        let vm = microvm(fake.clone(), state.path());
        let dir = state.path().join("sandboxes").join("a");
        let removed = vm.stop("a", &dir).await.expect("stopped");
        assert!(removed.is_empty(), "{removed:?}");
        assert!(fake.calls().is_empty(), "no monitor to ask");
    }

    #[tokio::test]
    async fn a_guest_whose_monitor_is_gone_is_not_snapshotted() {
        let state = tempfile::tempdir().expect("tempdir");
        let fake = Arc::new(FakeMonitor::default());
        let vm = microvm(fake.clone(), state.path());
        let into = state.path().join("snap");
        let err = vm
            .snapshot(&guest("a"), &into)
            .await
            .expect_err("no monitor");
        assert_eq!(
            err.to_string(),
            "snapshotting the guest of a: its QEMU is not running"
        );
        assert!(fake.calls().is_empty(), "not paused: {:?}", fake.calls());
        assert!(!into.exists());
    }
}
