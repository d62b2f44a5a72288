//! `containerd-shim-svc-v1`: containerd's runtime `io.containerd.svc.v1`. containerd starts it
//! per task (`start`, then the server it spawns; `delete` after one that died); each task is an
//! svc sandbox made through svcd's API socket (`SVC_SOCKET`, default `/run/svc/svcd.sock`) on
//! the root file system containerd unpacked, and its processes run in that sandbox as execs.
//! See docs/shim.md.

#![forbid(unsafe_code)]

mod process;
mod service;
mod spec;
mod svcd;

fn main() {
    containerd_shim::run::<service::Service>("io.containerd.svc.v1", None);
}
