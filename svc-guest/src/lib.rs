//! In-guest binaries of svc: `svc-microvm-agent` (the microvm backend's agent) and, with the
//! SSH relay, the git SSH shim; and what the host needs to talk to them.
//!
//! The host↔guest channel is a virtio-serial port named [`PORT_NAME`] carrying one framed,
//! multiplexed protocol ([`proto`]); [`agent`] is the guest's side of it.
#![deny(unsafe_code)]

pub mod agent;
/// A command's capability sets and `no_new_privs`, as a pod container's spec asks them.
pub mod caps;
/// Entering a root and a user for one command (chroot, cwd, ids): the agent's execs and
/// `svc-init --enter` share it.
pub mod enter;
/// Ending the processes rooted on a pod container's tree at its removal (both backends).
pub mod procs;
pub mod proto;
pub mod services;

use std::path::{Path, PathBuf};

/// The virtio-serial port's name (QEMU `-device virtserialport,name=…`).
pub const PORT_NAME: &str = "svc.agent";

/// The vsock port the agent listens on when the guest has no virtio-serial port (the second
/// transport: VMs that are never snapshotted, Firecracker).
pub const VSOCK_PORT: u32 = 1024;

/// The reply to a Firecracker-style hybrid vsock `CONNECT <port>\n`: `OK <host port>\n`. The
/// host port, or what is wrong with the line.
pub fn parse_vsock_ok(line: &str) -> Result<u32, String> {
    let shown: String = line.chars().take(64).collect();
    let rest = line
        .strip_suffix('\n')
        .and_then(|l| l.strip_prefix("OK "))
        .ok_or_else(|| format!("expected `OK <port>`, got {shown:?}"))?;
    rest.parse::<u32>()
        .map_err(|_| format!("expected `OK <port>`, got {shown:?}"))
}

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
    fn the_hybrid_vsock_reply_is_parsed_strictly() {
        assert_eq!(parse_vsock_ok("OK 1073741824\n"), Ok(1_073_741_824));
        for bad in [
            "OK\n",
            "OK 12",
            "ok 12\n",
            "OK -1\n",
            "OK 12 13\n",
            "",
            "ERR\n",
        ] {
            let e = parse_vsock_ok(bad).expect_err(bad);
            assert!(e.starts_with("expected `OK <port>`"), "{bad:?}: {e}");
        }
        let long = format!("{}\n", "X".repeat(10_000));
        assert!(
            parse_vsock_ok(&long).expect_err("long").len() < 120,
            "not echoed whole"
        );
    }

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
