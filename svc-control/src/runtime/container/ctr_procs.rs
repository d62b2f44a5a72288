//! The processes of a pod container: those of its sandbox's guest whose root directory is on
//! the container's tree (its overlay, at `/.svc/ctr/<id>` in the guest). Its removal ends them
//! all, as a container's removal does on any runtime: the shim kills the container's own
//! process and its execs, but a daemon they started in a session of its own (`setsid`), or one
//! re-parented to the guest's init, would otherwise go on running in the pod's sandbox on a
//! tree that was taken away, out of Kubernetes' sight. The ending itself is
//! [`svc_guest::procs`] (a process is the tree's by the mount id of its root, only those of the
//! guest's pid namespace), which the microvm agent uses for its own pod containers.

use crate::runtime::GuestHandle;

/// SIGKILL every process of `guest` (its init's pid namespace) whose root directory is on
/// container `ctr`'s tree, until a round finds none; how many were signalled. A tree that is
/// not mounted (its mount point on the mount of `/.svc/ctr`) ends nothing.
pub(super) fn end_processes(guest: &GuestHandle, ctr: &str) -> Result<usize, String> {
    let ctr_dir = std::path::PathBuf::from(format!("/proc/{}/root/.svc/ctr", guest.pid));
    let pid_ns = std::fs::read_link(format!("/proc/{}/ns/pid", guest.pid))
        .map_err(|_| "the guest is not running")?;
    let spared = svc_guest::procs::Spared::caller()?;
    // `/.svc` is svcd's read-only bind and `ctr/<id>` a directory svcd made in it: the guest
    // can put no link on the way.
    let mountinfo = std::path::PathBuf::from(format!("/proc/{}/mountinfo", guest.pid));
    let Some(tree) = svc_guest::procs::Rooted::at(
        &ctr_dir.join(ctr),
        &ctr_dir,
        &mountinfo,
        Some(pid_ns),
        &spared,
    )?
    else {
        return Ok(0);
    };
    tree.end_all(&spared)
        .map_err(|e| format!("container {ctr}: {e}"))
}
