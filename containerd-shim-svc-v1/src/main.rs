//! `containerd-shim-svc-v1`: containerd's runtime `io.containerd.svc.v1`. containerd starts it
//! per task, or per pod for the CRI plugin's containers (`start`, then the server it spawns;
//! `delete` after one that died); a task of its own, or a pod, is an svc sandbox made through
//! svcd's API socket (`SVC_SOCKET`, default `/run/svc/svcd.sock`) on the root file system
//! containerd unpacked (or, with `svc.dev/backend=microvm`, a VM of the node's microvm image),
//! and its processes (a pod's containers') run in that sandbox as execs.
//! See docs/shim.md.

#![forbid(unsafe_code)]

mod events;
mod ops;
mod process;
mod service;
mod spec;
mod svcd;

fn main() {
    // `-v` alone: the version, as containerd's own shims print it (`svc doctor --kubernetes`
    // reads it); the shim library would refuse it for want of a namespace.
    if std::env::args().skip(1).eq(["-v"]) {
        println!(
            "containerd-shim-svc-v1:\n  Runtime: io.containerd.svc.v1\n  Version: {}",
            env!("CARGO_PKG_VERSION")
        );
        return;
    }
    containerd_shim::run::<service::Service>("io.containerd.svc.v1", None);
}
