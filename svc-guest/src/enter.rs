//! Entering a root file system and a user for one command: chroot into the root, the working
//! directory inside it, then the command's user (groups, gid, uid) and its hardening (the
//! capability sets and `no_new_privs` a pod container's spec asks for, [`crate::caps`]). One [`Entry`] serves both
//! guests: the agent's rooted and non-root execs (the microvm agent's and `svc-init`'s server,
//! `agent::confine`), and `svc-init --enter` ([`Enter`]: the runtime-exec fallback, which
//! `runc exec` starts as the guest's root, and which takes only a pod container's root under
//! [`ROOTS_DIR`]).
//!
//! The steps are made between fork and exec (or, for `--enter`, just before exec):
//! everything they need is checked and prepared before ([`Entry::new`]), and
//! [`Entry::enter`] only makes system calls.

use std::{
    ffi::CString,
    io,
    path::{Component, Path},
};

use rustix::process::{Gid, Uid};

use crate::caps::Hardening;

/// Where svcd attaches the pod containers' root file systems in a container guest; a root
/// given to a container guest's exec must be one of its entries (svcd checks, the guest
/// checks again: [`container_root`]).
pub const ROOTS_DIR: &str = "/.svc/ctr";

/// The most supplementary groups a command's user may have.
pub const MAX_GROUPS: usize = 64;

/// What a command's process takes before it runs: a root (chrooted into, its working
/// directory inside it) and a user, each optional.
#[derive(Debug, Default)]
pub struct Entry {
    /// Chroot here, then change into `cwd` inside it.
    root: Option<(CString, CString)>,
    user: Option<(Uid, Gid, Vec<Gid>)>,
    hardening: Hardening,
}

impl Entry {
    /// `root` (absolute, no `..`) with `cwd` inside it (the same), and the user (uid, gid,
    /// supplementary groups); what is wrong with them, named.
    pub fn new(
        root: Option<(&str, &str)>,
        user: Option<(u32, u32, &[u32])>,
    ) -> Result<Self, String> {
        let root = match root {
            None => None,
            Some((root, cwd)) => {
                plain_absolute("root", root)?;
                plain_absolute("working directory", cwd)?;
                Some((c_string(root)?, c_string(cwd)?))
            }
        };
        let user = user.map(|(u, g, groups)| ids(u, g, groups)).transpose()?;
        Ok(Self {
            root,
            user,
            hardening: Hardening::default(),
        })
    }

    /// The same entry, the command hardened with `hardening` too.
    #[must_use]
    pub fn hardened(self, hardening: Hardening) -> Self {
        Self { hardening, ..self }
    }

    /// Whether there is anything to do (else the command runs as its parent does).
    pub fn is_empty(&self) -> bool {
        self.root.is_none() && self.user.is_none() && self.hardening.is_empty()
    }

    /// Whether the working directory is set here (inside the root), not by the command.
    pub fn sets_cwd(&self) -> bool {
        self.root.is_some()
    }

    /// Whether the working directory is missing in the root (for a command that did not
    /// start: which words say why). Not for use between fork and exec.
    pub fn cwd_missing(&self) -> bool {
        use std::os::unix::ffi::OsStrExt as _;
        let Some((root, cwd)) = &self.root else {
            return false;
        };
        let root = Path::new(std::ffi::OsStr::from_bytes(root.as_bytes()));
        let cwd = Path::new(std::ffi::OsStr::from_bytes(cwd.as_bytes()));
        !root.join(cwd.strip_prefix("/").unwrap_or(cwd)).is_dir()
    }

    /// chroot into the root, chdir to `/` and then the working directory inside it, narrow the
    /// bounding and ambient sets, then take the user (groups, gid, uid: the uid last, while the
    /// process may still change the others), then the other capability sets and
    /// `no_new_privs` ([`Hardening`]). Only system calls, no allocation: safe between fork and
    /// exec. The ids are set
    /// with the per-thread calls: both callers are single-threaded here (a child between
    /// fork and exec; `svc-init --enter` before it starts anything), so they are the
    /// process's.
    pub fn enter(&self) -> io::Result<()> {
        if let Some((root, cwd)) = &self.root {
            rustix::process::chroot(root.as_c_str())?;
            rustix::process::chdir(c"/")?;
            rustix::process::chdir(cwd.as_c_str())?;
        }
        self.hardening.before_ids()?;
        if let Some((uid, gid, groups)) = &self.user {
            rustix::thread::set_thread_groups(groups)?;
            rustix::thread::set_thread_gid(*gid)?;
            rustix::thread::set_thread_uid(*uid)?;
        }
        self.hardening.after_ids()
    }
}

/// `svc-init --enter`'s entry: a pod container's root (an entry of [`ROOTS_DIR`], nothing
/// else), the working directory inside it, the user.
#[derive(Debug)]
pub struct Enter(Entry);

impl Enter {
    /// `root` (an entry of [`ROOTS_DIR`]), `cwd` (absolute, no `..`, inside it) and the user
    /// (uid, gid, supplementary groups; none: the guest's root).
    pub fn new(root: &str, cwd: &str, user: Option<&(u32, u32, Vec<u32>)>) -> io::Result<Self> {
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
        container_root(root).map_err(bad)?;
        let user = user.map(|(u, g, groups)| (*u, *g, groups.as_slice()));
        Entry::new(Some((root, cwd)), user).map(Self).map_err(bad)
    }

    /// The same entry, the command hardened with `hardening` too.
    #[must_use]
    pub fn hardened(self, hardening: Hardening) -> Self {
        Self(self.0.hardened(hardening))
    }

    /// [`Entry::cwd_missing`].
    pub fn cwd_missing(&self) -> bool {
        self.0.cwd_missing()
    }

    /// [`Entry::enter`].
    pub fn enter(&self) -> io::Result<()> {
        self.0.enter()
    }
}

/// `root` is a pod container's root in a container guest: an entry of [`ROOTS_DIR`].
pub fn container_root(root: &str) -> Result<(), String> {
    let name = root
        .strip_prefix(ROOTS_DIR)
        .and_then(|r| r.strip_prefix('/'))
        .unwrap_or_default();
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(format!(
            "root {root:?} is not a container root under {ROOTS_DIR}"
        ));
    }
    Ok(())
}

/// Whether `path` is absolute and has no `..`.
pub fn is_plain_absolute(path: &Path) -> bool {
    path.is_absolute() && !path.components().any(|c| c == Component::ParentDir)
}

/// `path` (called `what`) is absolute and has no `..`.
fn plain_absolute(what: &str, path: &str) -> Result<(), String> {
    if !is_plain_absolute(Path::new(path)) {
        return Err(format!(
            "{what} {path:?}: not an absolute path without `..`"
        ));
    }
    Ok(())
}

/// The user's ids, refusing what no user may be (the host checked them too:
/// `policy::exec_user`).
fn ids(uid: u32, gid: u32, groups: &[u32]) -> Result<(Uid, Gid, Vec<Gid>), String> {
    if uid == u32::MAX || gid == u32::MAX || groups.contains(&u32::MAX) {
        return Err(format!(
            "user {uid}:{gid}: id 4294967295 is no user's (it means \"unchanged\")"
        ));
    }
    if groups.len() > MAX_GROUPS {
        return Err(format!(
            "user {uid}:{gid}: {} supplementary groups, the limit is {MAX_GROUPS}",
            groups.len()
        ));
    }
    Ok((
        Uid::from_raw(uid),
        Gid::from_raw(gid),
        groups.iter().map(|g| Gid::from_raw(*g)).collect(),
    ))
}

fn c_string(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} has a NUL byte"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_entry_of_the_roots_dir_is_a_root() {
        for ok in ["/.svc/ctr/abc", "/.svc/ctr/0123456789abcdef"] {
            assert!(Enter::new(ok, "/", None).is_ok(), "{ok}");
        }
        for bad in [
            "/",
            "/.svc/ctr",
            "/.svc/ctr/",
            "/.svc/ctr/..",
            "/.svc/ctr/a/b",
            "/.svc/ctrx",
            "/etc",
            "relative",
        ] {
            let e = Enter::new(bad, "/", None).expect_err(bad).to_string();
            assert!(e.contains("is not a container root"), "{bad}: {e}");
        }
        let e = Enter::new("/.svc/ctr/a", "tmp", None).expect_err("relative cwd");
        assert!(e.to_string().contains("not an absolute path"), "{e}");
    }

    #[test]
    fn enter_refuses_what_the_agent_refuses() {
        let e = Enter::new("/.svc/ctr/a", "/srv/../..", None).expect_err("`..` in cwd");
        assert!(e.to_string().contains("without `..`"), "{e}");
        for user in [
            (u32::MAX, 0, Vec::new()),
            (0, 0, vec![u32::MAX]),
            (1000, 1000, (1..=65).collect()),
        ] {
            let e = Enter::new("/.svc/ctr/a", "/", Some(&user)).expect_err("bad user");
            assert!(e.to_string().starts_with("user "), "{user:?}: {e}");
        }
        assert!(Enter::new("/.svc/ctr/a", "/", Some(&(1000, 1000, vec![4, 27]))).is_ok());
    }
}
