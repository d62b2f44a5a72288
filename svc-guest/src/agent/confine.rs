//! Who and where a command runs as: the user of [`Exec::user`] (its uid, gid and only its
//! supplementary groups) and the root of [`Exec::root`] (chrooted into, its working directory
//! inside it), set in the child between fork and exec.

use std::ffi::CString;

use crate::proto::{Exec, User};

/// What the child does before exec, prepared before the fork (the child allocates nothing).
#[derive(Debug, Default)]
pub(super) struct Confinement {
    /// Chroot here, then change into `cwd` inside it.
    root: Option<(CString, CString)>,
    user: Option<(
        rustix::process::Uid,
        rustix::process::Gid,
        Vec<rustix::process::Gid>,
    )>,
}

impl Confinement {
    /// The confinement `exec` asks for; what is wrong with it, named.
    pub(super) fn of(exec: &Exec) -> Result<Self, String> {
        let root = match &exec.root {
            None => None,
            Some(root) => {
                plain_absolute("root", root)?;
                let cwd = exec.cwd.as_deref().unwrap_or("/");
                plain_absolute("working directory", cwd)?;
                Some((c_string(root)?, c_string(cwd)?))
            }
        };
        let user = exec.user.as_ref().map(ids).transpose()?;
        Ok(Self { root, user })
    }

    /// Whether there is anything to do (else the command runs as the agent does).
    pub(super) fn is_empty(&self) -> bool {
        self.root.is_none() && self.user.is_none()
    }

    /// Whether the working directory is set here (inside the root), not by the command.
    pub(super) fn sets_cwd(&self) -> bool {
        self.root.is_some()
    }

    /// Have `cmd`'s child take this confinement just before it runs the program (after its
    /// terminal and session are set up, which need the agent's root and ids).
    pub(super) fn apply(self, cmd: &mut tokio::process::Command) {
        if self.is_empty() {
            return;
        }
        #[expect(unsafe_code, reason = "pre_exec: the command's root and ids")]
        // SAFETY: between fork and exec the closure makes only system calls (chroot, chdir,
        // setgroups, setgid, setuid) on data prepared before the fork; it allocates nothing and
        // takes no locks.
        unsafe {
            cmd.pre_exec(move || self.enter());
        }
    }

    /// In the child: the root first (chroot needs the agent's privilege), then the groups and
    /// ids, the uid last (after it nothing may change ids again).
    fn enter(&self) -> std::io::Result<()> {
        if let Some((root, cwd)) = &self.root {
            rustix::process::chroot(root.as_c_str())?;
            rustix::process::chdir(cwd.as_c_str())?;
        }
        if let Some((uid, gid, groups)) = &self.user {
            // The child is single-threaded: the per-thread calls are the process's.
            rustix::thread::set_thread_groups(groups)?;
            rustix::thread::set_thread_gid(*gid)?;
            rustix::thread::set_thread_uid(*uid)?;
        }
        Ok(())
    }
}

/// The working directory as the agent sees it: `cwd` inside `root` when there is one.
pub(super) fn seen_cwd(exec: &Exec) -> String {
    let cwd = exec.cwd.as_deref().unwrap_or("/");
    match &exec.root {
        Some(root) => format!(
            "{}/{}",
            root.trim_end_matches('/'),
            cwd.trim_start_matches('/')
        ),
        None => cwd.to_owned(),
    }
}

fn ids(
    user: &User,
) -> Result<
    (
        rustix::process::Uid,
        rustix::process::Gid,
        Vec<rustix::process::Gid>,
    ),
    String,
> {
    // The host checked the ids (`policy::exec_user`); the agent refuses what no user may be.
    if user.uid == u32::MAX || user.gid == u32::MAX || user.groups.contains(&u32::MAX) {
        return Err(format!(
            "user {}:{}: id 4294967295 is no user's (it means \"unchanged\")",
            user.uid, user.gid
        ));
    }
    if user.groups.len() > 64 {
        return Err(format!(
            "user {}:{}: {} supplementary groups, the limit is 64",
            user.uid,
            user.gid,
            user.groups.len()
        ));
    }
    Ok((
        rustix::process::Uid::from_raw(user.uid),
        rustix::process::Gid::from_raw(user.gid),
        user.groups
            .iter()
            .map(|g| rustix::process::Gid::from_raw(*g))
            .collect(),
    ))
}

/// `path` (called `what`) is absolute and has no `..`.
fn plain_absolute(what: &str, path: &str) -> Result<(), String> {
    let p = std::path::Path::new(path);
    if !p.is_absolute() || p.components().any(|c| c == std::path::Component::ParentDir) {
        return Err(format!(
            "{what} {path:?}: not an absolute path without `..`"
        ));
    }
    Ok(())
}

fn c_string(s: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("{s:?} has a NUL byte"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_root_or_user_is_named_before_anything_runs() {
        let exec = |root: Option<&str>, cwd: Option<&str>, uid: u32| Exec {
            argv: vec!["id".into()],
            root: root.map(str::to_owned),
            cwd: cwd.map(str::to_owned),
            user: Some(User {
                uid,
                gid: 1,
                groups: Vec::new(),
            }),
            ..Exec::default()
        };
        for (e, want) in [
            (exec(Some("pod/c1"), None, 1), "root \"pod/c1\""),
            (exec(Some("/pod/../etc"), None, 1), "without `..`"),
            (exec(Some("/pod/c1"), Some("../x"), 1), "working directory"),
            (exec(None, None, u32::MAX), "no user's"),
        ] {
            let err = Confinement::of(&e).expect_err(want);
            assert!(err.contains(want), "{err}");
        }
        let ok = Confinement::of(&exec(Some("/pod/c1"), Some("/srv"), 1000)).expect("ok");
        assert!(ok.sets_cwd() && !ok.is_empty());
        assert_eq!(
            seen_cwd(&exec(Some("/pod/c1/"), Some("/srv"), 1)),
            "/pod/c1/srv"
        );
        assert!(Confinement::of(&Exec::default()).expect("none").is_empty());
    }
}
