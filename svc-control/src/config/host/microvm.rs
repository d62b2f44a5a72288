//! `[microvm]`: the microvm backend (QEMU `-M microvm`): its images, binaries, guest size,
//! accelerator, user range and agent channel.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{checks, defaults};

/// `[microvm]`: the microvm backend (QEMU `-M microvm`). The kernel, root file system and
/// initramfs come from `kernel`, `rootfs` and `initrd` here, or from `SVC_MICROVM_KERNEL`,
/// `SVC_MICROVM_ROOTFS` and `SVC_MICROVM_INITRD` in svcd's environment, which win over the
/// file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MicrovmFile {
    /// The guest kernel image (absolute path).
    pub kernel: Option<PathBuf>,
    /// The guest's root file system image, ext4 with the agent (absolute path).
    pub rootfs: Option<PathBuf>,
    /// The initramfs the kernel needs, if any (absolute path).
    pub initrd: Option<PathBuf>,
    /// The QEMU system emulator (a name is looked up on PATH).
    pub qemu: Option<PathBuf>,
    /// Guest memory in MiB (the guest's RAM; the ceiling on the QEMU process adds
    /// `overhead_mib`).
    pub memory_mib: Option<u64>,
    /// What QEMU itself may use beyond the guest's RAM, in MiB (its code cache, devices).
    pub overhead_mib: Option<u64>,
    /// Virtual CPUs per guest.
    pub cpus: Option<u32>,
    /// `auto` (KVM where the host can run guests with it, else TCG), `kvm` or `tcg`.
    pub accel: Option<String>,
    /// The system user whose `/etc/subuid` and `/etc/subgid` range QEMU runs in: sandbox id
    /// N's QEMU runs as the range's start + N once it has opened its devices (a uid per VM).
    pub user: Option<String>,
    /// virtiofsd (1.11 or later), which serves the coding agent's live mount.
    pub virtiofsd: Option<PathBuf>,
    /// The agent's channel: `virtio-serial` (default; survives fork) or `vsock` (a
    /// vhost-user vsock device with Firecracker's hybrid handshake; such VMs cannot fork).
    pub channel: Option<String>,
    /// vhost-device-vsock, for `channel = "vsock"`.
    pub vhost_vsock: Option<PathBuf>,
}

/// The images `[microvm]` names (each absolute when set); the environment's
/// `SVC_MICROVM_*` win over them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ImagePaths {
    pub kernel: Option<PathBuf>,
    pub rootfs: Option<PathBuf>,
    pub initrd: Option<PathBuf>,
}

/// The microvm backend's settings, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MicrovmConfig {
    /// The images the file names (`kernel`, `rootfs`, `initrd`).
    pub images: ImagePaths,
    pub qemu: PathBuf,
    pub memory_mib: u64,
    pub overhead_mib: u64,
    pub cpus: u32,
    /// `auto`, `kvm` or `tcg`.
    pub accel: String,
    pub user: String,
    pub virtiofsd: PathBuf,
    /// `virtio-serial` or `vsock`.
    pub channel: String,
    pub vhost_vsock: PathBuf,
    /// The guest's disk size in MiB (`[container] disk_mib`); 0: the image's own size.
    pub disk_mib: u64,
}

impl MicrovmFile {
    /// Check each key, reporting every error through `err`. `disk_mib` is left 0: it is
    /// `[container] disk_mib`, set by the caller.
    pub(super) fn validate(self, err: &mut impl FnMut(&str, String)) -> MicrovmConfig {
        let (memory_mib, overhead_mib, cpus) = self.size(err);
        for (key, path) in [
            ("microvm.kernel", &self.kernel),
            ("microvm.rootfs", &self.rootfs),
            ("microvm.initrd", &self.initrd),
        ] {
            if let Some(p) = path {
                checks::check_absolute(key, p, err);
            }
        }
        let accel = self.accel.unwrap_or_else(|| "auto".to_owned());
        if !["auto", "kvm", "tcg"].contains(&accel.as_str()) {
            err(
                "microvm.accel",
                format!("expected \"auto\", \"kvm\" or \"tcg\", got {accel:?}"),
            );
        }
        let user = self
            .user
            .unwrap_or_else(|| defaults::MICROVM_USER.to_owned());
        if !checks::is_plain_name(&user) {
            err(
                "microvm.user",
                format!("expected a user name, got {user:?}"),
            );
        }
        let channel = self.channel.unwrap_or_else(|| "virtio-serial".to_owned());
        if !["virtio-serial", "vsock"].contains(&channel.as_str()) {
            err(
                "microvm.channel",
                format!("expected \"virtio-serial\" or \"vsock\", got {channel:?}"),
            );
        }
        MicrovmConfig {
            images: ImagePaths {
                kernel: self.kernel,
                rootfs: self.rootfs,
                initrd: self.initrd,
            },
            qemu: self
                .qemu
                .unwrap_or_else(|| PathBuf::from("qemu-system-x86_64")),
            memory_mib,
            overhead_mib,
            cpus,
            accel,
            user,
            virtiofsd: self.virtiofsd.unwrap_or_else(|| PathBuf::from("virtiofsd")),
            channel,
            vhost_vsock: self
                .vhost_vsock
                .unwrap_or_else(|| PathBuf::from("vhost-device-vsock")),
            disk_mib: 0,
        }
    }

    /// (memory, QEMU's overhead, CPUs) of each guest, checked.
    fn size(&self, err: &mut impl FnMut(&str, String)) -> (u64, u64, u32) {
        let memory_mib = self.memory_mib.unwrap_or(defaults::MICROVM_MEMORY_MIB);
        if !(128..=1 << 20).contains(&memory_mib) {
            err(
                "microvm.memory_mib",
                format!("expected 128 MiB or more, got {memory_mib}"),
            );
        }
        let overhead_mib = self.overhead_mib.unwrap_or(defaults::MICROVM_OVERHEAD_MIB);
        if overhead_mib < 64 {
            err(
                "microvm.overhead_mib",
                format!("expected at least 64 MiB (QEMU needs it), got {overhead_mib}"),
            );
        }
        let cpus = self.cpus.unwrap_or(1);
        if !(1..=64).contains(&cpus) {
            err("microvm.cpus", format!("expected 1 to 64, got {cpus}"));
        }
        (memory_mib, overhead_mib, cpus)
    }
}
