//! The only place that wires the parts together: start-up, the unix-socket API server,
//! reconciliation after a restart, graceful shutdown, `supervisor-upgrade`.

mod api_socket;
mod audit_read;
mod backends_route;
mod callers;
mod exec;
mod explain;
mod failure;
mod http;
mod named_audit;
mod notify;
mod routes;
mod server;
mod streams;
mod supervisor;
mod wiring;

pub use api_socket::Ended;
pub use named_audit::NamedAudit;
pub use server::{RunOptions, guardian_once, instance_lock, run};
pub use supervisor::{DEFAULT_BRANCHES, Failure, Supervisor, SupervisorConfig};
pub use wiring::{FenceCommit, IfindexOf, RecordingCommit, Registered, Registry, UpstreamResolver};
