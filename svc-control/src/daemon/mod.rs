//! The only place that wires the parts together. The supervisor loop (API socket, sandboxes,
//! reconciliation) arrives with the svcd issue; what is here now is the wiring the parts
//! already need.

mod wiring;

pub use wiring::FenceCommit;
