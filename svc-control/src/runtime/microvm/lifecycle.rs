//! A running VM's lifecycle through its monitor: pause and resume, its run state (read when
//! svcd adopts it, and to explain an agent that took no command), the snapshot a fork's clones
//! start from, and stop (the monitor asked to quit, killed if slow, then its helpers and memory
//! cgroup).

use std::{path::Path, time::Duration};

use super::{Microvm, RECONNECT_LIMIT, host, vm_dir::VmDir};
use crate::runtime::{GuestHandle, RuntimeError, Snapshot, gone_within};

/// How long QEMU's monitor has to say a VM's run state: svcd's start (which asks it of every
/// VM it adopts) waits no longer for a monitor that is held or hung.
pub const STATUS_LIMIT: Duration = Duration::from_secs(3);

impl Microvm {
    /// Freeze the guest's CPUs.
    pub(super) async fn pause_vm(&self, guest: &GuestHandle) -> Result<(), RuntimeError> {
        let dir = self.dir(&guest.name);
        self.monitor
            .pause(&dir)
            .await
            .map_err(failed("pausing", guest))
    }

    /// Let the guest run again. A guest whose own connections have a service but no channel
    /// (adopted while paused: its agent could not answer) gets its channel now.
    pub(super) async fn resume_vm(&self, guest: &GuestHandle) -> Result<(), RuntimeError> {
        let dir = self.dir(&guest.name);
        self.monitor
            .resume(&dir)
            .await
            .map_err(failed("resuming", guest))?;
        let unserved = self.services().contains_key(&guest.name)
            && !self
                .channels()
                .get(&guest.name)
                .is_some_and(|c| c.is_open());
        if unserved && let Err(e) = self.channel(&guest.name, RECONNECT_LIMIT).await {
            tracing::warn!(guest = %guest.name, error = %e, "no channel to the resumed guest's agent yet: its next command connects again");
        }
        Ok(())
    }

    /// Whether the guest's CPUs are stopped: its monitor's run state is other than `running`
    /// (an earlier svcd's pause, or QEMU's own stop on a disk error), asked within
    /// [`STATUS_LIMIT`].
    pub(super) async fn paused_vm(&self, guest: &GuestHandle) -> Result<bool, RuntimeError> {
        let status = self
            .monitor
            .status(&self.dir(&guest.name), STATUS_LIMIT)
            .await
            .map_err(failed("reading the run state of", guest))?;
        if status != "running" && status != "paused" {
            tracing::warn!(guest = %guest.name, status, "the VM is stopped in a state of QEMU's own: taken as paused");
        }
        Ok(status != "running")
    }

    /// What the host sees of a guest whose agent did not answer: its VM's run state.
    pub(super) async fn unanswered(&self, guest: &GuestHandle) -> String {
        match self
            .monitor
            .status(&self.dir(&guest.name), STATUS_LIMIT)
            .await
        {
            Ok(s) if s == "running" => {
                "its VM runs but its agent does not answer (stopped or stuck)".to_owned()
            }
            Ok(s) => format!("its VM is paused (QEMU's run state: {s})"),
            Err(e) => format!("its VM's run state is unknown: {e}"),
        }
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
        self.adopted().remove(name);
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
    async fn paused_is_qemus_run_state_and_a_silent_monitor_is_an_error() {
        let state = tempfile::tempdir().expect("tempdir");
        for (status, paused) in [("running", false), ("paused", true), ("io-error", true)] {
            let fake = Arc::new(FakeMonitor {
                status: Some(status.into()),
                ..FakeMonitor::default()
            });
            let vm = microvm(fake.clone(), state.path());
            assert_eq!(vm.paused(&guest("a")).await.ok(), Some(paused), "{status}");
            assert_eq!(fake.calls(), ["status a"]);
        }
        let fake = Arc::new(FakeMonitor {
            fails: Some("QEMU's monitor (qmp.sock) did not answer within 3 s".into()),
            ..FakeMonitor::default()
        });
        let vm = microvm(fake, state.path());
        let err = vm.paused(&guest("a")).await.expect_err("no answer");
        assert_eq!(
            err.to_string(),
            "reading the run state of the guest of a: QEMU's monitor (qmp.sock) did not answer \
             within 3 s"
        );
    }

    /// An agent that reads nothing (a peer that never answers) fails the command within the
    /// start limit, naming the VM's run state, and its channel is given up.
    #[tokio::test]
    async fn an_exec_the_agent_does_not_take_fails_naming_the_vms_state() {
        let state = tempfile::tempdir().expect("tempdir");
        let fake = Arc::new(FakeMonitor {
            status: Some("paused".into()),
            ..FakeMonitor::default()
        });
        let vm = microvm(fake, state.path());
        let (host, silent) = tokio::net::UnixStream::pair().expect("pair");
        let (r, w) = host.into_split();
        let (channel, _hellos) = super::super::channel::Channel::over(r, w);
        vm.channels().insert("a".into(), channel.clone());
        // The test's own process stands in for the VM's (alive).
        let me = std::process::id();
        let guest = GuestHandle {
            name: "a".into(),
            pid: me,
            start: start_time(me).expect("start time"),
        };
        let cmd = crate::runtime::GuestCommand {
            argv: vec!["true".into()],
            ..Default::default()
        };
        let started = std::time::Instant::now();
        let Err(err) = vm.exec(&guest, &cmd).await else {
            panic!("the exec was taken");
        };
        assert!(started.elapsed() < std::time::Duration::from_secs(15));
        assert_eq!(
            err.to_string(),
            "the guest's agent took no command within 10 s: its VM is paused (QEMU's run \
             state: paused); the channel to it was given up (its next command connects again)"
        );
        assert!(!channel.is_open(), "given up");
        assert!(vm.channels().get("a").is_none(), "forgotten");
        drop(silent);
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
