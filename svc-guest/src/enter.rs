//! Entering a pod container's root file system for one command: chroot into the directory svcd
//! attached (`/.svc/ctr/<id>`), the working directory inside it, then the command's user. Used
//! by `svc-init`'s server for each command of a rooted exec, and by `svc-init --enter` (the
//! runtime-exec fallback: `runc exec` starts it as the guest's root, it enters and execs).
//!
//! The steps are made between fork and exec: everything they need is prepared before
//! ([`Enter::new`]), and [`Enter::enter`] only makes system calls.

use std::{ffi::CString, io};

use nix::unistd::{Gid, Uid};

/// Where svcd attaches the pod containers' root file systems in a guest; a root given to an
/// exec must be one of its entries (svcd checks, the guest checks again).
pub const ROOTS_DIR: &str = "/.svc/ctr";

/// A prepared entry: the root, the working directory inside it, the user.
#[derive(Debug)]
pub struct Enter {
    root: CString,
    cwd: CString,
    user: Option<(Uid, Gid, Vec<Gid>)>,
}

impl Enter {
    /// `root` (an entry of [`ROOTS_DIR`], nothing else), `cwd` (absolute, inside it) and the
    /// user (uid, gid, supplementary groups; none: the guest's root).
    pub fn new(root: &str, cwd: &str, user: Option<&(u32, u32, Vec<u32>)>) -> io::Result<Self> {
        let bad = |m: String| io::Error::new(io::ErrorKind::InvalidInput, m);
        let name = root
            .strip_prefix(ROOTS_DIR)
            .and_then(|r| r.strip_prefix('/'))
            .unwrap_or_default();
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(bad(format!(
                "root {root:?} is not a container root under {ROOTS_DIR}"
            )));
        }
        if !cwd.starts_with('/') {
            return Err(bad(format!("working directory {cwd:?} is not absolute")));
        }
        let c = |s: &str| CString::new(s).map_err(|_| bad(format!("{s:?} holds a NUL byte")));
        Ok(Self {
            root: c(root)?,
            cwd: c(cwd)?,
            user: user.map(|(u, g, groups)| {
                (
                    Uid::from_raw(*u),
                    Gid::from_raw(*g),
                    groups.iter().map(|g| Gid::from_raw(*g)).collect(),
                )
            }),
        })
    }

    /// Whether the working directory is missing in the root (for a command that did not
    /// start: which words say why). Not for use between fork and exec.
    pub fn cwd_missing(&self) -> bool {
        use std::os::unix::ffi::OsStrExt as _;
        let root = std::path::Path::new(std::ffi::OsStr::from_bytes(self.root.as_bytes()));
        let cwd = std::ffi::OsStr::from_bytes(self.cwd.as_bytes());
        let inside = std::path::Path::new(cwd)
            .strip_prefix("/")
            .unwrap_or(std::path::Path::new(cwd));
        !root.join(inside).is_dir()
    }

    /// chroot into the root, chdir to the working directory, then take the user (groups,
    /// gid, uid: the uid last, while the process may still change the others). Only system
    /// calls, no allocation: safe between fork and exec.
    pub fn enter(&self) -> io::Result<()> {
        nix::unistd::chroot(self.root.as_c_str())?;
        nix::unistd::chdir(c"/")?;
        nix::unistd::chdir(self.cwd.as_c_str())?;
        if let Some((uid, gid, groups)) = &self.user {
            nix::unistd::setgroups(groups)?;
            nix::unistd::setgid(*gid)?;
            nix::unistd::setuid(*uid)?;
        }
        Ok(())
    }
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
        assert!(e.to_string().contains("not absolute"), "{e}");
    }
}
