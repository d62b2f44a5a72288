//! Which host directory a workspace may share into its sandbox (`svc workspace up`).
//!
//! The project directory is shared read-write and its owner's files are the guest root's, so a
//! guest that runs hostile code can change anything its owner could in that tree (never above
//! it: the mount is the guest's root of it, `nosuid,nodev`). The rules keep that tree one the
//! asking user owns and away from the host's own files and svcd's:
//!
//! - an absolute path with no symbolic link or `..` in it (what is checked is what is shared);
//! - a directory;
//! - not `/`, not a system directory (`/etc`, `/usr`, `/boot`, … or anything under the virtual
//!   or system trees) and not a directory that holds every home (`/home`, `/root`);
//! - neither inside nor around svcd's state, audit or configuration directories;
//! - owned by the user who asks (root may share any directory that passes the rules above).

use std::path::{Component, Path};

/// Directories that are never a project, nor is anything under them.
const SYSTEM_TREES: &[&str] = &[
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/run",
    "/sbin", "/sys", "/usr",
];

/// Directories that are never a project themselves (their subdirectories may be).
const SYSTEM_DIRS: &[&str] = &[
    "/", "/home", "/root", "/var", "/var/lib", "/var/log", "/var/run", "/tmp", "/opt", "/srv",
    "/mnt", "/media",
];

/// The directory asked for, as the host shows it.
#[derive(Debug, Clone, Copy)]
pub struct ProjectDir<'a> {
    /// As the request gave it.
    pub asked: &'a str,
    /// Its canonical form (`realpath`), or `None` when it cannot be resolved.
    pub canonical: Option<&'a Path>,
    pub is_dir: bool,
    pub owner_uid: u32,
}

/// Why a directory may not be shared; each message says what to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProjectDirError {
    #[error("workspace directory {0:?}: expected an absolute path")]
    NotAbsolute(String),
    #[error("workspace directory {0:?} does not exist or cannot be read")]
    Missing(String),
    #[error(
        "workspace directory {asked:?} resolves to {canonical}: give the path without symbolic \
         links or '..'"
    )]
    NotCanonical { asked: String, canonical: String },
    #[error("workspace directory {0} is not a directory")]
    NotADirectory(String),
    #[error(
        "workspace directory {0} is a system directory: share a project's own directory (its \
         files become the sandbox root's)"
    )]
    System(String),
    #[error("workspace directory {dir} {relation} svcd's {what} directory {svcd_dir}")]
    Svcd {
        dir: String,
        relation: &'static str,
        what: &'static str,
        svcd_dir: String,
    },
    #[error(
        "workspace directory {dir} is owned by uid {owner}, not by you (uid {caller}): the \
         sandbox's root would act as its owner there; share a directory of your own"
    )]
    NotYours {
        dir: String,
        owner: u32,
        caller: u32,
    },
    #[error("workspace directory {0}: cannot tell who asked (no peer credentials)")]
    UnknownCaller(String),
}

/// Whether `dir` may be shared for `caller` (the API peer's uid). `svcd_dirs` are svcd's own
/// directories with what each is (`state`, `audit`, `configuration`).
pub fn check(
    dir: &ProjectDir<'_>,
    caller: Option<u32>,
    svcd_dirs: &[(&'static str, &Path)],
) -> Result<(), ProjectDirError> {
    let asked = Path::new(dir.asked);
    if !asked.is_absolute() {
        return Err(ProjectDirError::NotAbsolute(dir.asked.to_owned()));
    }
    let Some(canonical) = dir.canonical else {
        return Err(ProjectDirError::Missing(dir.asked.to_owned()));
    };
    // `a//b` and `a/b/` name the same directory; `.`, `..` and links do not pass.
    let plain = asked
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    let same = asked.components().eq(canonical.components());
    if !plain || !same {
        return Err(ProjectDirError::NotCanonical {
            asked: dir.asked.to_owned(),
            canonical: canonical.display().to_string(),
        });
    }
    let shown = canonical.display().to_string();
    if !dir.is_dir {
        return Err(ProjectDirError::NotADirectory(shown));
    }
    let system = SYSTEM_DIRS.iter().any(|s| canonical == Path::new(s))
        || SYSTEM_TREES.iter().any(|s| canonical.starts_with(s));
    if system {
        return Err(ProjectDirError::System(shown));
    }
    for (what, svcd) in svcd_dirs {
        let relation = if canonical.starts_with(svcd) {
            "is inside"
        } else if svcd.starts_with(canonical) {
            "holds"
        } else {
            continue;
        };
        return Err(ProjectDirError::Svcd {
            dir: shown,
            relation,
            what,
            svcd_dir: svcd.display().to_string(),
        });
    }
    match caller {
        None => Err(ProjectDirError::UnknownCaller(shown)),
        Some(0) => Ok(()),
        Some(c) if c == dir.owner_uid => Ok(()),
        Some(c) => Err(ProjectDirError::NotYours {
            dir: shown,
            owner: dir.owner_uid,
            caller: c,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn project_dir_cases() {
        struct Case {
            name: &'static str,
            asked: &'static str,
            canonical: Option<&'static str>,
            is_dir: bool,
            owner: u32,
            caller: Option<u32>,
            /// A fragment of the refusal, or `None` when allowed.
            refused: Option<&'static str>,
        }
        let ok = |name, asked, owner, caller| Case {
            name,
            asked,
            canonical: Some(asked),
            is_dir: true,
            owner,
            caller,
            refused: None,
        };
        let no = |name, asked, caller, refused| Case {
            name,
            asked,
            canonical: Some(asked),
            is_dir: true,
            owner: 1000,
            caller,
            refused: Some(refused),
        };
        let cases = [
            ok("own_project", "/home/dev/src/app", 1000, Some(1000)),
            ok("root_any_owner", "/home/dev/src/app", 1000, Some(0)),
            ok("tmp_subdir", "/tmp/work/app", 1000, Some(1000)),
            ok("var_lib_subdir", "/var/lib/builds/app", 1000, Some(1000)),
            Case {
                name: "trailing_slash_is_the_same_dir",
                asked: "/home/dev/app/",
                canonical: Some("/home/dev/app"),
                is_dir: true,
                owner: 1000,
                caller: Some(1000),
                refused: None,
            },
            no("relative", "src/app", Some(1000), "absolute"),
            Case {
                name: "missing",
                asked: "/home/dev/gone",
                canonical: None,
                is_dir: false,
                owner: 0,
                caller: Some(1000),
                refused: Some("does not exist"),
            },
            Case {
                name: "symlink_to_etc",
                asked: "/home/dev/link",
                canonical: Some("/etc"),
                is_dir: true,
                owner: 0,
                caller: Some(0),
                refused: Some("resolves to /etc"),
            },
            Case {
                name: "dot_dot",
                asked: "/home/dev/app/../../../etc",
                canonical: Some("/etc"),
                is_dir: true,
                owner: 0,
                caller: Some(0),
                refused: Some("without symbolic links or '..'"),
            },
            Case {
                name: "dot_segment_is_the_same_dir",
                asked: "/home/dev/./app",
                canonical: Some("/home/dev/app"),
                is_dir: true,
                owner: 1000,
                caller: Some(1000),
                refused: None,
            },
            Case {
                name: "symlinked_parent",
                asked: "/home/dev/link/app",
                canonical: Some("/srv/elsewhere/app"),
                is_dir: true,
                owner: 1000,
                caller: Some(1000),
                refused: Some("resolves to /srv/elsewhere/app"),
            },
            Case {
                name: "a_file",
                asked: "/home/dev/notes.txt",
                canonical: Some("/home/dev/notes.txt"),
                is_dir: false,
                owner: 1000,
                caller: Some(1000),
                refused: Some("is not a directory"),
            },
            no("root_dir", "/", Some(0), "system directory"),
            no("etc", "/etc", Some(0), "system directory"),
            no("under_etc", "/etc/svc", Some(0), "system directory"),
            no(
                "usr_local_src",
                "/usr/local/src/app",
                Some(0),
                "system directory",
            ),
            no("proc_self", "/proc/self/root", Some(0), "system directory"),
            no("sys_fs_bpf", "/sys/fs/bpf", Some(0), "system directory"),
            no("run", "/run/svc", Some(0), "system directory"),
            no("boot", "/boot", Some(0), "system directory"),
            no("all_homes", "/home", Some(0), "system directory"),
            no("root_home", "/root", Some(0), "system directory"),
            no("var_lib", "/var/lib", Some(0), "system directory"),
            no("tmp_itself", "/tmp", Some(0), "system directory"),
            no(
                "svcd_state",
                "/var/lib/svc",
                Some(0),
                "is inside svcd's state",
            ),
            no(
                "inside_svcd_state",
                "/var/lib/svc/sandboxes/a",
                Some(0),
                "is inside svcd's state",
            ),
            no("around_audit", "/srv/logs", Some(0), "holds svcd's audit"),
            no(
                "someone_elses",
                "/home/dev/app",
                Some(1001),
                "owned by uid 1000",
            ),
            no("no_peer", "/home/dev/app", None, "cannot tell who asked"),
        ];
        let svcd: [(&'static str, &Path); 2] = [
            ("state", Path::new("/var/lib/svc")),
            ("audit", Path::new("/srv/logs/svc-audit")),
        ];
        for c in &cases {
            let got = check(
                &ProjectDir {
                    asked: c.asked,
                    canonical: c.canonical.map(Path::new),
                    is_dir: c.is_dir,
                    owner_uid: c.owner,
                },
                c.caller,
                &svcd,
            );
            match (c.refused, got) {
                (None, Ok(())) => {}
                (None, Err(e)) => panic!("{}: refused: {e}", c.name),
                (Some(frag), Ok(())) => panic!("{}: allowed, expected {frag:?}", c.name),
                (Some(frag), Err(e)) => assert!(
                    e.to_string().contains(frag),
                    "{}: {e} does not say {frag:?}",
                    c.name
                ),
            }
        }
    }
}
