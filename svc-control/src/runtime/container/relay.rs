//! The socket in a container guest's `/run/svc` (a directory of the sandbox's, bound
//! read-only) through which the guest reaches svcd's services for it (the git SSH relay):
//! svcd binds it and hands each connection to the service.

use std::{
    fs::Permissions,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use super::Container;
use crate::runtime::{GUEST_RELAY_SOCKET, GuestConn, GuestHandle, GuestService, RuntimeError};

/// The directory of a sandbox's relay socket (`<dir>/run`, the guest's `/run/svc`, read-only).
pub(super) fn relay_dir(dir: &Path) -> PathBuf {
    dir.join("run")
}

impl Container {
    /// Bind the relay socket of `guest` (in its sandbox's `dir`) and hand each connection to
    /// `service` until stop (a listener bound before is ended).
    pub(super) fn serve_relay(
        &self,
        guest: &GuestHandle,
        dir: &Path,
        service: GuestService,
    ) -> Result<(), RuntimeError> {
        let socket = relay_dir(dir).join(
            Path::new(GUEST_RELAY_SOCKET)
                .file_name()
                .unwrap_or_default(),
        );
        let err = |e: std::io::Error| {
            RuntimeError::Exec(format!("the relay socket {}: {e}", socket.display()))
        };
        match std::fs::remove_file(&socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(err(e)),
            _ => {}
        }
        let listener = tokio::net::UnixListener::bind(&socket).map_err(err)?;
        // Guest root is an unprivileged host id: the socket is open to all, in a directory
        // only the guest (through its mount) and root can reach.
        std::fs::set_permissions(&socket, Permissions::from_mode(0o666)).map_err(err)?;
        let task = tokio::spawn(accept(listener, service));
        if let Some(old) = self
            .relays()
            .insert(guest.name.clone(), task.abort_handle())
        {
            old.abort();
        }
        Ok(())
    }
}

/// Hand each connection on `listener` to `service`, forever.
async fn accept(listener: tokio::net::UnixListener, service: GuestService) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let (r, w) = stream.into_split();
                service(GuestConn {
                    reader: Box::pin(r),
                    writer: Box::pin(w),
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting on a sandbox's relay socket");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}
