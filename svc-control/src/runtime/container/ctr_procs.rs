//! The processes of a pod container: those of its sandbox's guest whose root directory is on
//! the container's tree (its overlay, at `/.svc/ctr/<id>` in the guest). Its removal ends them
//! all, as a container's removal does on any runtime: the shim kills the container's own
//! process and its execs, but a daemon they started in a session of its own (`setsid`), or one
//! re-parented to the guest's init, would otherwise go on running in the pod's sandbox on a
//! tree that was taken away, out of Kubernetes' sight.

use std::os::unix::fs::MetadataExt as _;

use crate::runtime::GuestHandle;

/// How many times the guest's processes are looked through: a process may fork while it is
/// looked at, and its child is found in the next round.
const ROUNDS: usize = 50;

/// SIGKILL every process of `guest` (its init's pid namespace) whose root directory is on
/// container `ctr`'s tree, until a round finds none; how many were signalled. A tree that is
/// not mounted (its mount point on the file system of `/.svc/ctr`) ends nothing.
pub(super) fn end_processes(guest: &GuestHandle, ctr: &str) -> Result<usize, String> {
    let ctr_dir = format!("/proc/{}/root/.svc/ctr", guest.pid);
    let point = format!("{ctr_dir}/{ctr}");
    // `/.svc` is svcd's read-only bind and `ctr/<id>` a directory svcd made in it: the guest
    // can put no link on the way.
    let dev = |p: &str| std::fs::symlink_metadata(p).map(|m| m.dev());
    let tree = dev(&point).map_err(|e| format!("{point}: {e}"))?;
    if dev(&ctr_dir).map_err(|e| format!("{ctr_dir}: {e}"))? == tree {
        return Ok(0);
    }
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok();
    let guest_ns = ns(&guest.pid.to_string()).ok_or("the guest is not running")?;
    let mut ended = 0;
    for _ in 0..ROUNDS {
        let mut found = 0;
        let entries = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
        for name in entries.flatten().map(|e| e.file_name()) {
            let Some(pid) = name
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
                .and_then(rustix::process::Pid::from_raw)
            else {
                continue;
            };
            // Held by a pidfd before it is looked at: a pid reused meanwhile is never signalled.
            let Ok(fd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            else {
                continue;
            };
            let raw = pid.as_raw_nonzero().to_string();
            let rooted = ns(&raw).as_ref() == Some(&guest_ns)
                && dev(&format!("/proc/{raw}/root/.")).is_ok_and(|d| d == tree);
            if rooted
                && rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::KILL).is_ok()
            {
                found += 1;
            }
        }
        if found == 0 {
            return Ok(ended);
        }
        ended += found;
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Err(format!(
        "container {ctr}'s processes kept coming after {ROUNDS} rounds ({ended} ended)"
    ))
}
