//! What the host holds for each VM beside its monitor: the memory cgroup its monitor runs in,
//! the host ids it runs as, and the helper daemons stop ends by their pid files.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use super::{Microvm, vm_dir::VmDir};
use crate::runtime::ids;

impl Microvm {
    /// The memory cgroup of VM `name`: (directory, the file its limit goes in).
    pub(super) fn cgroup(&self, name: &str) -> (PathBuf, &'static str) {
        let root = Path::new("/sys/fs/cgroup");
        if root.join("cgroup.controllers").exists() {
            (root.join(&self.cgroup_parent).join(name), "memory.max")
        } else {
            (
                root.join("memory").join(&self.cgroup_parent).join(name),
                "memory.limit_in_bytes",
            )
        }
    }

    /// Put QEMU (`pid`) in a cgroup whose memory ceiling is the guest's RAM plus QEMU's own
    /// overhead: the guest's RAM size alone is not a host limit.
    pub(super) fn limit_memory(&self, name: &str, pid: u32) -> Result<(), String> {
        let (dir, limit_file) = self.cgroup(name);
        if limit_file == "memory.max" {
            self.enable_memory_controller()?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| said(&dir, e))?;
        let bytes = (self.config.memory_mib + self.config.overhead_mib) << 20;
        let limit = dir.join(limit_file);
        std::fs::write(&limit, bytes.to_string()).map_err(|e| said(&limit, e))?;
        let procs = dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string()).map_err(|e| said(&procs, e))
    }

    /// cgroup v2: the memory controller must be on for every level above a VM's cgroup.
    fn enable_memory_controller(&self) -> Result<(), String> {
        let root = Path::new("/sys/fs/cgroup");
        let mut at = root.to_path_buf();
        for part in Path::new(&self.cgroup_parent).components() {
            let control = at.join("cgroup.subtree_control");
            std::fs::write(&control, "+memory").map_err(|e| said(&control, e))?;
            at.push(part);
            std::fs::create_dir_all(&at).map_err(|e| said(&at, e))?;
        }
        let control = at.join("cgroup.subtree_control");
        std::fs::write(&control, "+memory").map_err(|e| said(&control, e))
    }

    /// Remove VM `name`'s memory cgroup (empty once QEMU is gone); what was removed.
    pub(super) async fn remove_cgroup(&self, name: &str) -> Option<String> {
        let (cgroup, _) = self.cgroup(name);
        if cgroup.exists() {
            // Empty once QEMU is gone; the kernel may take a moment to say so.
            for _ in 0..100 {
                if std::fs::remove_dir(&cgroup).is_ok() {
                    return Some(format!("memory cgroup {}", cgroup.display()));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        None
    }

    /// The uid and gid sandbox `id`'s QEMU runs as: its own, the microvm user's range start +
    /// `id`. A QEMU that a guest broke out of shares no id with another sandbox's QEMU, disk
    /// or snapshot, nor with any container guest (their user's range is another).
    pub(super) fn vm_ids(&self, id: u32) -> Result<(u32, u32), String> {
        let range = ids::id_range(
            &self.config.user,
            Path::new("/etc/subuid"),
            Path::new("/etc/subgid"),
            "microvm.user",
        )
        .map_err(|e| e.to_string())?;
        if id == 0 || id >= ids::ID_COUNT {
            return Err(format!(
                "sandbox id {id} is outside the microvm user {}'s range of {} ids (one per \
                 sandbox): use a smaller ipv4_pool in svcd.toml",
                self.config.user,
                ids::ID_COUNT
            ));
        }
        Ok((range.uid + id, range.gid + id))
    }
}

fn said(p: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", p.display())
}

/// SIGKILL the VM's helper daemons (virtiofsd, vhost-device-vsock) still running from its
/// directory; what was killed.
pub(super) fn kill_helpers(dir: &VmDir) -> Vec<String> {
    let helpers = (0..)
        .map(|i| dir.fs_pidfile(i))
        .take_while(|p| p.exists())
        .chain(
            [dir.trees_pidfile(), dir.vsock_pidfile()]
                .into_iter()
                .filter(|p| p.exists()),
        )
        .collect::<Vec<_>>();
    let mut removed = Vec::new();
    for pidfile in helpers {
        let Ok(pid) = std::fs::read_to_string(&pidfile) else {
            continue;
        };
        if let Ok(pid) = pid.trim().parse::<i32>()
            && std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&dir.0.display().to_string()))
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            removed.push(format!(
                "{} (pid {pid})",
                if pidfile == dir.vsock_pidfile() {
                    "vhost-device-vsock"
                } else {
                    "virtiofsd"
                }
            ));
        }
    }
    removed
}

/// The effective uid and gid of process `pid` (`/proc/PID/status`).
pub(super) fn process_ids(pid: u32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let effective = |key: &str| -> Option<u32> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(2)?.parse().ok()
    };
    Some((effective("Uid:")?, effective("Gid:")?))
}
