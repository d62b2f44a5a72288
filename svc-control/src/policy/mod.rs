//! Pure decisions, no I/O. Every security rule of the perimeter lives here once; the config loader,
//! the fence, the DNS guard, the proxy and the relay ask this module.

/// The proxy's name ↔ dialled-address binding (TLS server names and plain-HTTP `Host`s).
pub mod binding;
/// The request body past its prefix, examined for placeholders as it streams.
pub mod body_scan;
/// The code-host family's rules of the request decision.
mod code_host;
/// Which creation flags combine, the mode they imply, which secrets fit.
pub mod creation;
pub mod credentials;
/// Which pod containers' root file systems a sandbox takes, and from whom.
pub mod ctr_root;
/// What the request decision reads and answers (its input, outcome, rule).
mod decision;
pub mod destination;
pub mod dns;
/// Which commands an exec can be given at all (no NUL in what goes to `execve`).
pub mod exec_args;
/// What an exec keeps of its capabilities, and its `no_new_privs`.
pub mod exec_caps;
/// Which guest user an exec may run as.
pub mod exec_user;
/// `svc egress explain`: one request as a person writes it, decided as the proxy decides it.
pub mod explain;
/// What of a project's git directory the sandbox sees read-only; what changes are reported.
pub mod gitdir;
pub mod graphql;
/// AllowedBranches on smart-HTTP pushes, when a sandbox asks (the SSH relay's reader and line).
pub mod http_push;
pub mod mode;
/// Who may act on which sandbox and stored secret (API callers are not each other).
pub mod ownership;
pub mod paths;
/// A Kubernetes pod's `svc.dev/*` annotations as a creation request, checked as one.
pub mod pod;
/// A pod's namespace and name (from containerd's CRI annotations), checked as Kubernetes does.
pub mod pod_identity;
/// Which stored secrets a pod may name: those allowed for its namespace.
pub mod pod_secrets;
/// Which host directory a workspace may share into its sandbox.
pub mod project;
/// A push's command list as git's receive-pack reads it (the relay and smart-HTTP both ask).
pub mod receive_pack;
pub mod request;
/// A sandbox's request policy, as svcd builds it at creation.
mod sandbox_policy;
/// What a guest may leave on a host file through a shared directory (ids, mode bits, nodes).
pub mod shares;
/// The proxy's SNI gate: which ClientHello server names a sandbox's connection may be served.
pub mod sni;
pub mod ssh;
pub mod target;
/// Whether a project's perimeter (egress, runtime, capabilities) is one its owner approved.
pub mod trust;
/// Which protocol upgrades pass the proxy.
pub mod upgrade;
