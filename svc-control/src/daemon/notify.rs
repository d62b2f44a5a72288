//! systemd's readiness protocol (`sd_notify`): svcd tells the service manager that it serves
//! its API (`READY=1`), that it is re-executing itself (`RELOADING=1`), or that it is stopping
//! (`STOPPING=1`), with a datagram to `$NOTIFY_SOCKET` when it was started with one
//! (`Type=notify` in the unit). Without the variable nothing is sent.

use std::{ffi::OsStr, os::unix::ffi::OsStrExt as _, os::unix::net::UnixDatagram};

use tracing::warn;

/// The variable the service manager names its socket in.
const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Tell the service manager `state` (newline-separated `KEY=VALUE` assignments). A failure is
/// logged, never fatal: svcd works the same without a service manager.
pub(super) fn notify(state: &str) {
    let Some(socket) = std::env::var_os(NOTIFY_SOCKET) else {
        return;
    };
    if let Err(e) = send(&socket, state) {
        warn!(
            error = %e,
            socket = %socket.to_string_lossy(),
            state,
            "telling the service manager"
        );
    }
}

/// One datagram with `state` to `socket`: a path, or `@name` for an abstract socket.
fn send(socket: &OsStr, state: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    match socket.as_bytes().strip_prefix(b"@") {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt as _;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            sock.send_to(state.as_bytes(), socket)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(sock: &UnixDatagram) -> String {
        let mut buf = [0u8; 256];
        let n = sock.recv(&mut buf).expect("a datagram");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn a_state_reaches_a_socket_named_by_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("notify");
        let sock = UnixDatagram::bind(&path).expect("bind");
        send(path.as_os_str(), "READY=1\nSTATUS=serving").expect("sent");
        assert_eq!(received(&sock), "READY=1\nSTATUS=serving");
    }

    #[test]
    fn a_state_reaches_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("svc-notify-test-{}", std::process::id());
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("address");
        let sock = UnixDatagram::bind_addr(&addr).expect("bind");
        send(OsStr::new(&format!("@{name}")), "STOPPING=1").expect("sent");
        assert_eq!(received(&sock), "STOPPING=1");
    }

    #[test]
    fn a_missing_socket_is_an_error_for_the_caller_to_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(send(dir.path().join("absent").as_os_str(), "READY=1").is_err());
    }
}
