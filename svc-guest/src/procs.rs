//! Ending the processes rooted on a tree: those whose root directory is on a pod container's
//! root file system. A container's removal ends them all, as on any runtime: a daemon its
//! processes started in a session of their own (`setsid`), or one re-parented to the guest's
//! init, would otherwise go on running on a tree that was taken away, out of Kubernetes'
//! sight. Both backends use it: svcd on the host for a container guest (its processes seen in
//! the host's `/proc`, those of the guest's pid namespace only), the microvm agent in the VM.
//!
//! A process is the tree's when the **mount** its root directory is on is the tree's own mount
//! or one mounted below it (mount ids, `statx(STATX_MNT_ID)`: unique on the whole kernel, so
//! neither a bind mount of the same file system elsewhere nor another container's tree on the
//! same virtio-fs share matches; a device number would). A tree that is the caller's own root
//! mount, or that of `/`, is refused outright; pid 1 of a pid namespace, the caller and its
//! ancestors are never signalled. The choosing is a pure function ([`Rooted::doomed`]) over
//! what `/proc` shows ([`Seen`]); only the thin sender reads `/proc` and signals.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use rustix::{
    fs::{AtFlags, CWD, StatxFlags},
    process::{Pid, PidfdFlags, Signal},
};

/// How many times the processes are looked through: a process may fork while it is looked
/// at, and its child is found in the next round.
pub const ROUNDS: usize = 50;

/// Which processes are a tree's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rooted {
    /// The mount ids of the tree and of every mount below it.
    pub mounts: BTreeSet<u64>,
    /// Only processes of this pid namespace (the link `/proc/<pid>/ns/pid` reads); none: all.
    pub pid_ns: Option<PathBuf>,
}

/// What `/proc` shows of one process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// Its pid as the caller sees it.
    pub pid: i32,
    /// Its pid in its own (innermost) pid namespace (the last of `NSpid:`); none: unread.
    pub ns_pid: Option<i32>,
    /// The mount id of its root directory.
    pub root_mount: u64,
    /// Its pid namespace (the link `/proc/<pid>/ns/pid`); none: unread.
    pub pid_ns: Option<PathBuf>,
}

/// What is never signalled, whatever its root: the caller, its ancestors, and any process
/// whose root is on one of `roots` (the caller's own root mount and that of `/`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spared {
    /// Pids as the caller sees them.
    pub pids: BTreeSet<i32>,
    /// Mount ids.
    pub roots: BTreeSet<u64>,
}

impl Rooted {
    /// The tree mounted at `point`, a directory below `above`, with the mounts below it that
    /// `mountinfo` (the caller's view of the tree's mount namespace) lists. None when `point`
    /// is no mount of its own (on `above`'s mount, or a link: its last component is not
    /// followed; `above` is), so nothing is ended. An error when the tree's mount is one of `spared.roots`.
    pub fn at(
        point: &Path,
        above: &Path,
        mountinfo: &Path,
        pid_ns: Option<PathBuf>,
        spared: &Spared,
    ) -> Result<Option<Rooted>, String> {
        let tree = mount_id(point, AtFlags::SYMLINK_NOFOLLOW)?;
        if tree == mount_id(above, AtFlags::empty())? {
            return Ok(None);
        }
        let table = std::fs::read_to_string(mountinfo)
            .map_err(|e| format!("{}: {e}", mountinfo.display()))?;
        Rooted::over(tree, &table, pid_ns, spared).map(Some)
    }

    /// The tree of mount `tree`, with the mounts below it in `mountinfo` (its text); refused
    /// when `tree` or a mount below it is one of `spared.roots`.
    pub fn over(
        tree: u64,
        mountinfo: &str,
        pid_ns: Option<PathBuf>,
        spared: &Spared,
    ) -> Result<Rooted, String> {
        let mounts = below(tree, mountinfo);
        if let Some(root) = mounts.iter().find(|m| spared.roots.contains(m)) {
            return Err(format!(
                "refusing to end the processes of mount {tree}: mount {root} is the caller's own root or /"
            ));
        }
        Ok(Rooted { mounts, pid_ns })
    }

    /// Whether `p` is to be ended: its root on the tree, its pid namespace the tree's (when
    /// one is asked, and read), and none of `spared` nor pid 1 of its namespace.
    pub fn doomed(&self, spared: &Spared, p: &Seen) -> bool {
        let in_ns = match &self.pid_ns {
            None => true,
            Some(ns) => p.pid_ns.as_ref() == Some(ns),
        };
        in_ns
            && self.mounts.contains(&p.root_mount)
            && !spared.roots.contains(&p.root_mount)
            && !spared.pids.contains(&p.pid)
            && p.pid > 1
            && p.ns_pid.is_some_and(|n| n > 1)
    }

    /// SIGKILL every process seen in `/proc` that is the tree's, until a round finds none; how
    /// many were signalled. Each is held by a pidfd before it is looked at. More than
    /// [`ROUNDS`] rounds finding some: an error.
    pub fn end_all(&self, spared: &Spared) -> Result<usize, String> {
        let mut ended = 0;
        for _ in 0..ROUNDS {
            let found = self.round(spared)?;
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
    fn round(&self, spared: &Spared) -> Result<usize, String> {
        let mut found = 0;
        let entries = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
        for name in entries.flatten().map(|e| e.file_name()) {
            let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else {
                continue;
            };
            let Some(raw) = Pid::from_raw(pid) else {
                continue;
            };
            let Ok(fd) = rustix::process::pidfd_open(raw, PidfdFlags::empty()) else {
                continue;
            };
            let Some(seen) = seen(pid) else {
                continue;
            };
            if self.doomed(spared, &seen)
                && rustix::process::pidfd_send_signal(&fd, Signal::KILL).is_ok()
            {
                found += 1;
            }
        }
        Ok(found)
    }
}

impl Spared {
    /// The caller (this process), its ancestors, and the mounts of its own root and of `/`.
    pub fn caller() -> Result<Spared, String> {
        let mut pids = BTreeSet::new();
        let mut pid = std::process::id().cast_signed();
        // Up the parents until pid 0 (the kernel) or one that cannot be read; bounded.
        for _ in 0..4096 {
            if pid <= 0 || !pids.insert(pid) {
                break;
            }
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                break;
            };
            pid = field(&status, "PPid:")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
        }
        let roots = [
            mount_id(Path::new("/"), AtFlags::empty())?,
            mount_id(Path::new("/proc/self/root/."), AtFlags::empty())?,
        ];
        Ok(Spared {
            pids,
            roots: roots.into_iter().collect(),
        })
    }
}

/// `tree` and the mounts below it: those whose parent (the second field of a `mountinfo`
/// line) is one of them, transitively.
pub fn below(tree: u64, mountinfo: &str) -> BTreeSet<u64> {
    let edges: Vec<(u64, u64)> = mountinfo
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace().map(str::parse::<u64>);
            Some((f.next()?.ok()?, f.next()?.ok()?))
        })
        .collect();
    let mut mounts = BTreeSet::from([tree]);
    loop {
        let before = mounts.len();
        for (id, parent) in &edges {
            if mounts.contains(parent) && *id != *parent {
                mounts.insert(*id);
            }
        }
        if mounts.len() == before {
            return mounts;
        }
    }
}

/// What `/proc` shows of `pid`; none when its root cannot be read (gone, or a kernel thread).
fn seen(pid: i32) -> Option<Seen> {
    let root_mount = mount_id(Path::new(&format!("/proc/{pid}/root/.")), AtFlags::empty()).ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok();
    let ns_pid = status
        .as_deref()
        .and_then(|s| field(s, "NSpid:"))
        .and_then(|v| v.split_whitespace().last()?.parse().ok());
    Some(Seen {
        pid,
        ns_pid,
        root_mount,
        pid_ns: std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok(),
    })
}

/// The mount id of what `path` names.
fn mount_id(path: &Path, flags: AtFlags) -> Result<u64, String> {
    let st = rustix::fs::statx(CWD, path, flags, StatxFlags::MNT_ID)
        .map_err(|e| format!("statx {}: {e}", path.display()))?;
    if !StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::MNT_ID) {
        return Err(format!("statx {}: no mount id", path.display()));
    }
    Ok(st.stx_mnt_id)
}

/// The value of the line of `status` that starts with `key`.
fn field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
}

#[cfg(test)]
#[path = "procs_tests.rs"]
mod tests;
