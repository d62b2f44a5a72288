//! The seam between the microvm backend and the program that runs its VMs: the [`Monitor`]
//! trait a VMM driver implements (QEMU today, in the `qemu` module; Firecracker or
//! cloud-hypervisor would each be one more module), what it is asked to launch ([`Launch`])
//! and how guest code runs under it ([`Accel`]).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use super::{images::Images, vm_dir::VmDir};
use crate::runtime::BoxFuture;

/// What a virtual machine monitor must provide for the microvm backend. A VM lives in its
/// sandbox's directory ([`VmDir`]): the monitor keeps its control socket, pid file and log
/// there, so that every call below finds the VM again from the directory alone (also after an
/// svcd restart). The backend does the rest around it: the disk overlay, the tap and its
/// fence, the memory cgroup, the helper daemons (virtiofsd, vhost-device-vsock) and the
/// agent's channel.
///
/// A monitor must: start the VM paused with every device open, the tap attached and (for a
/// clone) the snapshot loaded, then drop to the ids in [`Launch::run_as`]; let it run, freeze
/// it, save a frozen VM's memory and device state to a file another launch restores from;
/// exit when asked; say what the guest last wrote on its console; and name its own process
/// for a VM, so the backend can kill it when asking was not enough.
pub trait Monitor: Send + Sync {
    /// The monitor's name (`qemu`).
    fn name(&self) -> &'static str;
    /// How guest code runs under this monitor.
    fn accel(&self) -> Accel;
    /// Start a VM, paused, with its devices open (the tap exists once this returns); the
    /// monitor's pid.
    fn launch<'a>(&'a self, vm: &'a Launch<'a>) -> BoxFuture<'a, Result<u32, String>>;
    /// Let the guest run (after launch or a pause).
    fn resume<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<(), String>>;
    /// Freeze the guest's CPUs.
    fn pause<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<(), String>>;
    /// Save a paused guest's memory and device state to `file`.
    fn snapshot<'a>(&'a self, dir: &'a VmDir, file: &'a Path) -> BoxFuture<'a, Result<(), String>>;
    /// Ask the monitor to exit (the guest ends with it).
    fn quit<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<(), String>>;
    /// The VM's run state as the monitor says it (QEMU's: `running`, `paused`, `io-error`, …),
    /// within `limit` (a monitor that does not answer in time is an error saying so).
    fn status<'a>(
        &'a self,
        dir: &'a VmDir,
        limit: Duration,
    ) -> BoxFuture<'a, Result<String, String>>;
    /// The last of what the guest wrote on its console (for an error that explains a boot).
    fn console<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<String, String>>;
    /// The monitor's process for the VM in `dir`, if it still runs: (pid, start time, as
    /// [`crate::runtime::start_time`] reads it).
    fn running(&self, dir: &VmDir) -> Option<(u32, u64)>;
}

/// One VM to launch.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    pub dir: &'a VmDir,
    pub images: &'a Images,
    /// The tap (the sandbox's link) the monitor makes and plugs the guest's NIC into.
    pub tap: &'a str,
    pub memory_mib: u64,
    pub cpus: u32,
    /// Restore from this snapshot instead of booting (a fork's clone). Given on the command
    /// line, so QEMU opens it before it drops to `run_as` (the snapshot is its source VM's).
    pub incoming: Option<&'a Path>,
    /// The uid and gid QEMU runs as once its devices are open: this VM's own.
    pub run_as: (u32, u32),
    /// virtio-fs devices: (the virtiofsd socket, the tag the guest mounts).
    pub shared: &'a [(PathBuf, String)],
    /// The agent's channel over vsock instead of virtio-serial: the vhost-user socket of its
    /// vhost-device-vsock.
    pub vsock: Option<&'a Path>,
}

/// How guest code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation.
    Kvm,
    /// QEMU's emulator: slower by an order of magnitude, but it runs anywhere.
    Tcg,
}

impl Accel {
    /// The name svcd reports (`kvm`, `tcg`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        }
    }

    /// `auto`: KVM where `/dev/kvm` opens and the CPU shows vmx or svm (a nested machine
    /// without them has `/dev/kvm` but cannot run a guest), else TCG.
    pub fn choose(asked: &str) -> (Self, String) {
        match asked {
            "kvm" => (Self::Kvm, "microvm.accel = \"kvm\"".into()),
            "tcg" => (Self::Tcg, "microvm.accel = \"tcg\"".into()),
            _ => {
                let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
                let flags = cpu
                    .lines()
                    .filter(|l| l.starts_with("flags"))
                    .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
                let kvm = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/kvm");
                match (flags, kvm) {
                    (true, Ok(_)) => (Self::Kvm, "/dev/kvm opens and the CPU has vmx/svm".into()),
                    (false, _) => (
                        Self::Tcg,
                        "the CPU shows no vmx/svm (nested without virtualisation?)".into(),
                    ),
                    (true, Err(e)) => (Self::Tcg, format!("/dev/kvm: {e}")),
                }
            }
        }
    }
}
