//! In-guest binaries of svc: `svc-microvm-agent` and the git SSH shim. They arrive with the
//! microvm backend and the SSH relay; this crate holds their place in the workspace.
#![forbid(unsafe_code)]
