//! The only place that wires the parts together: start-up, the unix-socket API server,
//! reconciliation after a restart, graceful shutdown, `supervisor-upgrade`.

mod audit_read;
mod callers;
mod exec;
mod failure;
mod http;
mod routes;
mod server;
mod streams;
mod supervisor;
mod wiring;

pub use server::{Ended, RunOptions, guardian_once, run};
pub use supervisor::{DEFAULT_BRANCHES, Failure, Supervisor, SupervisorConfig};
pub use wiring::{
    FenceCommit, IfindexOf, NamedAudit, RecordingCommit, Registered, Registry, UpstreamResolver,
};
