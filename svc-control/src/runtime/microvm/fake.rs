//! A fake [`Monitor`] for unit tests (aya's `sys/fake.rs` pattern): it records each call, and
//! each answer is what the test set. It runs no VM: a test that needs a monitor process gives
//! it one of its own (`running`).

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use super::{
    Microvm,
    images::Images,
    monitor::{Accel, Launch, Monitor},
    vm_dir::VmDir,
};
use crate::{config::host::MicrovmConfig, runtime::BoxFuture};

/// What the fake answers, and what it was asked.
#[derive(Debug, Default)]
pub(super) struct FakeMonitor {
    /// Each call: `pause <dir name>`, `quit <dir name>`, ...
    pub calls: Mutex<Vec<String>>,
    /// Why `pause`, `resume`, `snapshot`, `status` and `quit` fail, if they do.
    pub fails: Option<String>,
    /// The run state `status` answers (`running` when not set).
    pub status: Option<String>,
    /// What `console` answers.
    pub console: String,
    /// The monitor process `running` names (pid, start time).
    pub process: Option<(u32, u64)>,
    /// What `quit` does to that process before it answers (a monitor that obeys ends).
    pub on_quit: Option<nix::sys::signal::Signal>,
}

impl FakeMonitor {
    /// The calls so far.
    pub fn calls(&self) -> Vec<String> {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn answer(&self, call: &str, dir: &VmDir) -> Result<(), String> {
        let name = dir.0.file_name().unwrap_or_default().to_string_lossy();
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(format!("{call} {name}"));
        self.fails.clone().map_or(Ok(()), Err)
    }
}

impl Monitor for FakeMonitor {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn accel(&self) -> Accel {
        Accel::Tcg
    }

    fn launch<'a>(&'a self, vm: &'a Launch<'a>) -> BoxFuture<'a, Result<u32, String>> {
        Box::pin(async move {
            self.answer("launch", vm.dir)?;
            Err("the fake monitor launches nothing".to_owned())
        })
    }

    fn resume<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { self.answer("resume", dir) })
    }

    fn pause<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { self.answer("pause", dir) })
    }

    fn snapshot<'a>(
        &'a self,
        dir: &'a VmDir,
        _file: &'a Path,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { self.answer("snapshot", dir) })
    }

    fn quit<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            if let (Some(signal), Some((pid, _))) = (self.on_quit, self.process) {
                let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
                let _ = nix::sys::signal::kill(pid, signal);
            }
            self.answer("quit", dir)
        })
    }

    fn status<'a>(
        &'a self,
        dir: &'a VmDir,
        _limit: std::time::Duration,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            self.answer("status", dir)?;
            Ok(self.status.clone().unwrap_or_else(|| "running".into()))
        })
    }

    fn console<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            self.answer("console", dir)?;
            Ok(self.console.clone())
        })
    }

    fn running(&self, _dir: &VmDir) -> Option<(u32, u64)> {
        self.process
    }
}

/// A microvm backend over `monitor`, its sandboxes under `state`, in a memory cgroup parent
/// that does not exist (so stop finds no cgroup to remove).
pub(super) fn microvm(monitor: Arc<FakeMonitor>, state: &Path) -> Microvm {
    let config = MicrovmConfig {
        images: crate::config::host::ImagePaths::default(),
        qemu: PathBuf::from("/nonexistent/qemu"),
        memory_mib: 256,
        overhead_mib: 64,
        cpus: 1,
        accel: "tcg".into(),
        user: "svc-microvm-fake".into(),
        virtiofsd: PathBuf::from("/nonexistent/virtiofsd"),
        channel: "virtio-serial".into(),
        vhost_vsock: PathBuf::from("/nonexistent/vhost-device-vsock"),
        disk_mib: 0,
    };
    Microvm::over(
        monitor,
        "a test's fake monitor".into(),
        &config,
        state.join("sandboxes"),
        "svc-fake-monitor-test-none",
        Err::<Images, _>("no images in a test".into()),
    )
}
