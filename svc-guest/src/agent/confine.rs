//! Who and where a command runs as: the user of [`Exec::user`] (its uid, gid and only its
//! supplementary groups) and the root of [`Exec::root`] (chrooted into, its working directory
//! inside it), set in the child between fork and exec by the shared [`crate::enter::Entry`].

use super::ExecStyle;
use crate::{
    enter::{Entry, container_root},
    proto::Exec,
};

/// What the child does before exec, prepared before the fork (the child allocates nothing):
/// the shared [`Entry`], as the exec asks for it.
#[derive(Debug, Default)]
pub(super) struct Confinement(Entry);

impl Confinement {
    /// The confinement `exec` asks for, run in `style`; what is wrong with it, named. A
    /// container guest's (`svc-init`'s, [`ExecStyle::Runtime`]) root must be a pod
    /// container's, as `svc-init --enter` requires.
    pub(super) fn of(exec: &Exec, style: ExecStyle) -> Result<Self, String> {
        let root = match &exec.root {
            None => None,
            Some(root) => {
                if style == ExecStyle::Runtime {
                    container_root(root)?;
                }
                Some((root.as_str(), exec.cwd.as_deref().unwrap_or("/")))
            }
        };
        let user = exec
            .user
            .as_ref()
            .map(|u| (u.uid, u.gid, u.groups.as_slice()));
        let hardening = crate::caps::Hardening {
            caps: exec.caps,
            no_new_privs: exec.no_new_privs,
        };
        Entry::new(root, user).map(|e| Self(e.hardened(hardening)))
    }

    /// Whether the working directory is set here (inside the root), not by the command.
    pub(super) fn sets_cwd(&self) -> bool {
        self.0.sets_cwd()
    }

    /// Have `cmd`'s child take this confinement just before it runs the program (after its
    /// terminal and session are set up, which need the agent's root and ids).
    pub(super) fn apply(self, cmd: &mut tokio::process::Command) {
        if self.0.is_empty() {
            return;
        }
        #[expect(unsafe_code, reason = "pre_exec: the command's root and ids")]
        // SAFETY: between fork and exec the closure makes only system calls (chroot, chdir,
        // prctl, setgroups, setgid, setuid, capget, capset) on data prepared before the fork; it allocates nothing and
        // takes no locks.
        unsafe {
            cmd.pre_exec(move || self.0.enter());
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::User;

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
            let err = Confinement::of(&e, ExecStyle::Agent).expect_err(want);
            assert!(err.contains(want), "{err}");
        }
        let ok = Confinement::of(&exec(Some("/pod/c1"), Some("/srv"), 1000), ExecStyle::Agent)
            .expect("ok");
        assert!(ok.sets_cwd() && !ok.0.is_empty());
        assert_eq!(
            seen_cwd(&exec(Some("/pod/c1/"), Some("/srv"), 1)),
            "/pod/c1/srv"
        );
        assert!(
            Confinement::of(&Exec::default(), ExecStyle::Agent)
                .expect("none")
                .0
                .is_empty()
        );
        // A container guest's root is a pod container's, nothing else.
        let e = Confinement::of(&exec(Some("/pod/c1"), None, 1), ExecStyle::Runtime)
            .expect_err("not a container root");
        assert!(e.contains("is not a container root"), "{e}");
        assert!(Confinement::of(&exec(Some("/.svc/ctr/c1"), None, 1), ExecStyle::Runtime).is_ok());
    }
}
