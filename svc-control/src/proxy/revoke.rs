//! Live allowlist changes on open connections: until when a connection (or a relayed
//! WebSocket) may go on, by the address it dialled and by the host it serves, and the reset
//! (RST) that ends it. The sandbox's teardown ends its connections the same way.

use std::{future::Future, net::IpAddr, os::fd::OwnedFd, pin::Pin, sync::Arc};

use tokio::sync::broadcast::{Receiver, error::RecvError};

use super::sandboxes::{Revocation, Sandboxes};
use crate::{audit::Incarnation, hosts::HostKind};

/// The sandbox a connection serves: its id, and which creation of it (a later sandbox given
/// the same id is not this one).
pub(super) type Whose = (u32, Incarnation);

/// Whose a connection of `sandbox` (as it found it) is.
pub(super) fn whose(sandbox: &super::sandboxes::ProxySandbox) -> Whose {
    (sandbox.id, sandbox.incarnation.clone())
}

/// Until the sandbox a connection serves is torn down (its slot's [`crate::limits::Slot::ended`]).
pub(super) type Ended = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Why a connection was cut: its audit record's reason.
pub(super) const ALLOWLIST_CHANGE: &str = "allowlist-change";
/// The sandbox it served was destroyed (or taken from a pool, or svcd stopped).
pub(super) const SANDBOX_ENDED: &str = "sandbox-ended";

/// What cuts a served guest connection: revocations of its sandbox, subscribed before anything
/// was decided (a change after that is not missed), its sandbox's end, and a duplicate of its
/// socket to reset it.
pub(super) struct Cut {
    /// Addresses the sandbox lost.
    pub(super) revocations: Receiver<Revocation>,
    /// The same, to see whether the host served is still allowed.
    pub(super) host_revocations: Receiver<Revocation>,
    /// The sandbox's teardown (`None`: never).
    pub(super) ended: Option<Ended>,
    pub(super) fd: Option<OwnedFd>,
}

impl Cut {
    /// Serve (`serve`) until it ends, or sandbox `whose` loses `dialled` or the host `host()`
    /// names, or is torn down; then reset the connection. Why it was cut, if it was
    /// ([`ALLOWLIST_CHANGE`], [`SANDBOX_ENDED`]).
    pub(super) async fn serve(
        self,
        serve: impl Future<Output = ()>,
        sandboxes: Arc<dyn Sandboxes>,
        whose: Whose,
        dialled: Option<IpAddr>,
        host: impl Fn() -> Option<String>,
    ) -> Option<&'static str> {
        let id = whose.0;
        let by_name = served_host_revoked(self.host_revocations, sandboxes, whose, host);
        let by_address = revoked(self.revocations, id, dialled);
        let ended = until_ended(self.ended);
        let why = async {
            tokio::select! {
                () = either_revoked(by_address, by_name) => ALLOWLIST_CHANGE,
                () = ended => SANDBOX_ENDED,
            }
        };
        serve_until_revoked(serve, why, self.fd).await
    }
}

/// Until `ended` (never, for `None`).
pub(super) async fn until_ended(ended: Option<Ended>) {
    match ended {
        Some(ended) => ended.await,
        None => std::future::pending().await,
    }
}

/// Until sandbox `whose`'s allowlist no longer allows `host` (checked at each change of it).
pub(super) async fn host_revoked(
    rx: Receiver<Revocation>,
    sandboxes: Arc<dyn Sandboxes>,
    whose: Whose,
    host: String,
) {
    served_host_revoked(rx, sandboxes, whose, move || Some(host.clone())).await;
}

/// Until sandbox `whose`'s allowlist no longer allows the host a connection serves (`host()`
/// at each change; `None`: none yet). A connection to an address shared with a host still
/// allowed is not revoked by address: this ends it by name (its open HTTP/2 streams, a
/// response still streaming). A sandbox gone, or its id now another's, allows nothing.
async fn served_host_revoked(
    mut rx: Receiver<Revocation>,
    sandboxes: Arc<dyn Sandboxes>,
    (id, of): Whose,
    host: impl Fn() -> Option<String>,
) {
    loop {
        match rx.recv().await {
            Ok(r) if r.sandbox == id => {
                let Some(host) = host() else { continue };
                let kind = HostKind::Exact(host);
                let allowed = sandboxes.policy_of(id).is_some_and(|p| {
                    p.incarnation == of && p.policy.allowed.find_name(&kind).is_some()
                });
                if !allowed {
                    return;
                }
            }
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => {
                return std::future::pending().await;
            }
        }
    }
}

/// Until `sandbox` loses `dialled` (never, for a connection without a dialled address).
async fn revoked(mut rx: Receiver<Revocation>, sandbox: u32, dialled: Option<IpAddr>) {
    let Some(dialled) = dialled else {
        return std::future::pending().await;
    };
    loop {
        match rx.recv().await {
            Ok(r) if r.sandbox == sandbox && r.addrs.contains(&dialled) => return,
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => {
                return std::future::pending().await;
            }
        }
    }
}

/// Serve a guest connection until it ends or its address is revoked; then reset it (RST, so
/// the guest's client sees the cut at once) through `cut`, a duplicate of its socket. Why it
/// was cut, if it was.
async fn serve_until_revoked(
    serve: impl Future<Output = ()>,
    revoked: impl Future<Output = &'static str>,
    cut: Option<OwnedFd>,
) -> Option<&'static str> {
    let was_cut = tokio::select! {
        () = serve => None,
        why = revoked => {
            if let Some(fd) = &cut {
                let _ = nix::sys::socket::setsockopt(
                    fd,
                    nix::sys::socket::sockopt::Linger,
                    &libc::linger { l_onoff: 1, l_linger: 0 },
                );
            }
            Some(why)
        }
    };
    // The serve future (and the connection's own descriptor) is gone; the duplicate goes last.
    drop(cut);
    was_cut
}

/// Until either revocation.
async fn either_revoked(a: impl Future<Output = ()>, b: impl Future<Output = ()>) {
    tokio::select! {
        () = a => {}
        () = b => {}
    }
}
