//! In-guest binaries of svc: `svc-microvm-agent` (the microvm backend's agent) and, with the
//! SSH relay, the git SSH shim; and what the host needs to talk to them.
//!
//! The host↔guest channel is a virtio-serial port named [`PORT_NAME`]. Its bootstrap is line
//! based: the agent writes [`READY`] each time the host side opens, then answers one line per
//! request line ([`handshake`]). The multiplexed protocol (exec streams, the SSH relay, port
//! forwards) is carried on the same port after the bootstrap.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

/// The virtio-serial port's name (QEMU `-device virtserialport,name=…`).
pub const PORT_NAME: &str = "svc.agent";

/// What the agent says when it is up, with the protocol version.
pub const READY: &str = "svc-microvm-agent ready v1";

/// The answer to one bootstrap request line.
pub fn handshake(request: &str) -> String {
    match request {
        "ping" => "pong".to_owned(),
        "version" => format!("{READY} {}", env!("CARGO_PKG_VERSION")),
        other => format!(
            "error: unknown request {:?} (known: ping, version)",
            other.chars().take(64).collect::<String>()
        ),
    }
}

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

    #[test]
    fn bootstrap_requests_are_answered_and_unknown_ones_named() {
        assert_eq!(handshake("ping"), "pong");
        assert!(handshake("version").starts_with(READY));
        let bad = handshake(&"x".repeat(500));
        assert!(bad.starts_with("error: unknown request"), "{bad}");
        assert!(bad.len() < 200, "a hostile request is not echoed whole");
    }
}
