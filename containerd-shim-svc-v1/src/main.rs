//! `containerd-shim-svc-v1`: containerd's runtime `io.containerd.svc.v1`. containerd starts it
//! per task, or per pod for the CRI plugin's containers (`start`, then the server it spawns;
//! `delete` after one that died); a task of its own, or a pod, is an svc sandbox made through
//! svcd's API socket (`SVC_SOCKET`, default `/run/svc/svcd.sock`) on the root file system
//! containerd unpacked (or, with `svc.dev/backend=microvm`, a VM of the node's microvm image),
//! and its processes (a pod's containers') run in that sandbox as execs.
//! See docs/shim.md.

#![forbid(unsafe_code)]

mod events;
mod process;
mod service;
mod spec;
mod svcd;

fn main() {
    containerd_shim::run::<service::Service>("io.containerd.svc.v1", None);
}
