//! In-guest binaries of svc: `svc-microvm-agent` (the microvm backend's agent) and, with the
//! SSH relay, the git SSH shim; and what the host needs to talk to them.
//!
//! The host↔guest channel is a virtio-serial port named [`PORT_NAME`] carrying one framed,
//! multiplexed protocol ([`proto`]); [`agent`] is the guest's side of it.
#![deny(unsafe_code)]

pub mod agent;
pub mod proto;

use std::path::{Path, PathBuf};

/// The virtio-serial port's name (QEMU `-device virtserialport,name=…`).
pub const PORT_NAME: &str = "svc.agent";

/// What the agent answers a host's hello with (then a space and the hello's nonce).
pub const READY: &str = "svc-microvm-agent ready v1";

/// The device of the virtio-serial port named `name`: the entry of `ports`
/// (`/sys/class/virtio-ports`) whose `name` file says it, as `/dev/<entry>`.
pub fn find_port(ports: &Path, name: &str) -> Option<PathBuf> {
    std::fs::read_dir(ports)
        .ok()?
        .filter_map(Result::ok)
        .find(|e| std::fs::read_to_string(e.path().join("name")).is_ok_and(|n| n.trim() == name))
        .map(|e| Path::new("/dev").join(e.file_name()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_port_is_found_by_its_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (entry, name) in [("vport0p0", "other"), ("vport0p1", PORT_NAME)] {
            std::fs::create_dir_all(dir.path().join(entry)).expect("mkdir");
            std::fs::write(dir.path().join(entry).join("name"), format!("{name}\n"))
                .expect("write");
        }
        assert_eq!(
            find_port(dir.path(), PORT_NAME),
            Some(PathBuf::from("/dev/vport0p1"))
        );
        assert_eq!(find_port(dir.path(), "missing"), None);
        assert_eq!(find_port(&dir.path().join("absent"), PORT_NAME), None);
    }
}
