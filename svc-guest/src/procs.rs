//! Ending the processes rooted on a tree: those whose root directory is on a pod container's
//! root file system. A container's removal ends them all, as on any runtime: a daemon its
//! processes started in a session of their own (`setsid`), or one re-parented to the guest's
//! init, would otherwise go on running on a tree that was taken away, out of Kubernetes'
//! sight. Both backends use it: svcd on the host for a container guest (its processes seen in
//! the host's `/proc`, those of the guest's pid namespace only), the microvm agent in the VM.

use std::{os::unix::fs::MetadataExt as _, path::PathBuf};

use rustix::process::{Pid, PidfdFlags, Signal};

/// How many times the processes are looked through: a process may fork while it is looked
/// at, and its child is found in the next round.
pub const ROUNDS: usize = 50;

/// Which processes are a tree's.
#[derive(Debug, Clone)]
pub struct Rooted {
    /// The device number of the tree's file system.
    pub tree: u64,
    /// Only processes of this pid namespace (the link `/proc/<pid>/ns/pid` reads); none: all.
    pub pid_ns: Option<PathBuf>,
}

impl Rooted {
    /// The tree mounted at `point`, a directory below `above`: none when `point` is on
    /// `above`'s file system (nothing mounted there, or a link: its last component is not
    /// followed), so nothing is ended.
    pub fn at(point: &std::path::Path, above: &std::path::Path) -> Result<Option<u64>, String> {
        let dev = |p: &std::path::Path| {
            std::fs::symlink_metadata(p)
                .map(|m| m.dev())
                .map_err(|e| format!("{}: {e}", p.display()))
        };
        let tree = dev(point)?;
        Ok((tree != dev(above)?).then_some(tree))
    }

    /// SIGKILL every process seen in `/proc` that is the tree's, until a round finds none; how
    /// many were signalled. Each is held by a pidfd before it is looked at: a pid reused
    /// meanwhile is never signalled. More than [`ROUNDS`] rounds finding some: an error.
    pub fn end_all(&self) -> Result<usize, String> {
        let mut ended = 0;
        for _ in 0..ROUNDS {
            let found = self.round()?;
            if found == 0 {
                return Ok(ended);
            }
            ended += found;
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Err(format!(
            "the tree's processes kept coming after {ROUNDS} rounds ({ended} ended)"
        ))
    }

    /// One look through `/proc`: how many were signalled.
    fn round(&self) -> Result<usize, String> {
        let me = std::process::id();
        let mut found = 0;
        let entries = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
        for name in entries.flatten().map(|e| e.file_name()) {
            let Some(raw) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            let Some(pid) = Pid::from_raw(raw).filter(|_| raw.unsigned_abs() != me) else {
                continue;
            };
            let Ok(fd) = rustix::process::pidfd_open(pid, PidfdFlags::empty()) else {
                continue;
            };
            if self.holds(raw) && rustix::process::pidfd_send_signal(&fd, Signal::KILL).is_ok() {
                found += 1;
            }
        }
        Ok(found)
    }

    /// Whether process `pid` is the tree's: its pid namespace, its root on the tree.
    fn holds(&self, pid: i32) -> bool {
        let in_ns = match &self.pid_ns {
            None => true,
            Some(ns) => std::fs::read_link(format!("/proc/{pid}/ns/pid")).is_ok_and(|l| l == *ns),
        };
        in_ns
            && std::fs::metadata(format!("/proc/{pid}/root/.")).is_ok_and(|m| m.dev() == self.tree)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_on_its_parents_file_system_ends_nothing() {
        let t = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(t.path().join("c1")).expect("c1");
        assert_eq!(Rooted::at(&t.path().join("c1"), t.path()), Ok(None));
        std::os::unix::fs::symlink("/proc", t.path().join("link")).expect("link");
        assert_eq!(
            Rooted::at(&t.path().join("link"), t.path()),
            Ok(None),
            "a link is not followed"
        );
        let e = Rooted::at(&t.path().join("absent"), t.path()).expect_err("absent");
        assert!(e.contains("absent"), "{e}");
    }

    #[test]
    fn a_tree_no_process_is_rooted_on_ends_none() {
        // No process's root is on the device u64::MAX.
        let r = Rooted {
            tree: u64::MAX,
            pid_ns: None,
        };
        assert_eq!(r.end_all(), Ok(0));
    }
}
