//! Pure decisions, no I/O. Every security rule of the spec lives here once; the config loader,
//! the fence, the DNS guard, the proxy and the relay ask this module.

/// Which creation flags combine, the mode they imply, which secrets fit.
pub mod creation;
pub mod credentials;
pub mod destination;
pub mod dns;
/// What of a project's git directory the sandbox sees read-only; what changes are reported.
pub mod gitdir;
pub mod graphql;
pub mod host;
/// AllowedBranches on smart-HTTP pushes, when a sandbox asks (the SSH relay's reader and line).
pub mod http_push;
pub mod mode;
/// Who may act on which sandbox and stored secret (API callers are not each other).
pub mod ownership;
pub mod paths;
/// Which host directory a workspace may share into its sandbox.
pub mod project;
/// A push's command list as git's receive-pack reads it (the relay and smart-HTTP both ask).
pub mod receive_pack;
pub mod request;
/// What a guest may leave on a host file through a shared directory (ids, mode bits, nodes).
pub mod shares;
pub mod ssh;
pub mod target;
/// Whether a project's perimeter (egress, runtime, capabilities) is one its owner approved.
pub mod trust;
