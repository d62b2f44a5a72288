//! The git-over-SSH relay: a sandbox's `svc-git-ssh` shim sends git's SSH request
//! here; the relay decides it with `policy::ssh`, then runs the host's real `ssh` with the
//! host's agent and pumps the session. A push's command list is read whole, the way git's
//! receive-pack reads it (`policy::receive_pack`), and every ref git would update checked before
//! a byte of it reaches the server; a stream svc cannot read as git does is refused.
//!
//! The relay resolves the server's name itself and has ssh dial the address it chose (the
//! first answer `policy::destination::classify_dial` lets through), never letting ssh resolve
//! on its own: a hostile resolver's loopback, metadata or sandbox answer is never dialled. The
//! host key is still checked against the name (`HostKeyAlias`).
//!
//! The shim speaks `svc_guest::proto` on one stream: `Open` with a `GitSsh` request, `Data`/
//! `Eof` for git's input, and gets `Stdout`/`Stderr`/`Exit` back, with credit both ways.

mod carry;
mod client;
mod held;
mod serve;
mod session;
mod shim;
mod streams;

pub use carry::window_refusal;
pub use client::{RelayResolver, SshClient, dial_address};
pub use serve::{refuse, serve};
pub use session::{RelayPolicy, Session};

pub use crate::policy::ssh::{policy_refusal, ref_refusal};
