//! The files of one VM in its sandbox's directory: its disk, its sockets (monitor, agent,
//! vsock, virtio-fs) and the pid files of its monitor and helpers.

use std::path::PathBuf;

/// The files of a VM, in its sandbox's directory.
#[derive(Debug, Clone)]
pub struct VmDir(pub PathBuf);

impl VmDir {
    /// The guest's disk: a qcow2 overlay of the root file system image.
    pub fn disk(&self) -> PathBuf {
        self.0.join("disk.qcow2")
    }
    /// The monitor's control socket (QMP).
    pub fn qmp(&self) -> PathBuf {
        self.0.join("qmp.sock")
    }
    /// The agent's channel over virtio-serial (the monitor's end of the port).
    pub fn agent(&self) -> PathBuf {
        self.0.join("agent.sock")
    }
    /// The monitor's pid.
    pub fn pidfile(&self) -> PathBuf {
        self.0.join("qemu.pid")
    }
    /// The monitor's own messages.
    pub fn log(&self) -> PathBuf {
        self.0.join("qemu.log")
    }
    /// vhost-device-vsock's vhost-user socket (QEMU's side).
    pub fn vsock_device(&self) -> PathBuf {
        self.0.join("vhu-vsock.sock")
    }
    /// The hybrid vsock socket svcd connects to (`CONNECT <port>`).
    pub fn vsock(&self) -> PathBuf {
        self.0.join("vsock.sock")
    }
    /// vhost-device-vsock's pid.
    pub fn vsock_pidfile(&self) -> PathBuf {
        self.0.join("vsock.pid")
    }
    /// virtiofsd's socket for shared directory `i`.
    pub fn fs_socket(&self, i: usize) -> PathBuf {
        self.0.join(format!("fs{i}.sock"))
    }
    /// The trees share: where the host binds the trees it attaches to the running guest.
    pub fn trees(&self) -> PathBuf {
        self.0.join("trees")
    }
    /// The trees share's virtiofsd socket.
    pub fn trees_socket(&self) -> PathBuf {
        self.0.join("trees.sock")
    }
    /// The trees share's virtiofsd pid.
    pub fn trees_pidfile(&self) -> PathBuf {
        self.0.join("trees.pid")
    }
    /// virtiofsd's pid for shared directory `i`.
    pub fn fs_pidfile(&self, i: usize) -> PathBuf {
        self.0.join(format!("fs{i}.pid"))
    }
}
