//! Which OCI runtime binary svcd runs (`container.runtime`): the one svcd.toml names, checked,
//! or by default the crun on PATH when it is 1.21 or later (svc's build: `cargo xtask setup`
//! installs it as `/usr/local/sbin/crun`), else the Debian package's `/usr/lib/svc/crun`, else
//! runc on PATH. crun is CLI-compatible with every runc
//! call svcd makes and starts a sandbox in about half runc's time (docs/isolation.md,
//! "Runtime choice").

use std::path::{Path, PathBuf};

use super::advisory::{self, CRUN_MINIMUM, Identity, Kind};

/// The runtime chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chosen {
    /// The binary.
    pub path: PathBuf,
    /// What its `--version` says (none when unreadable: the advisory check warns).
    pub identity: Option<Identity>,
    /// Runtimes passed over on the way (a crun older than 1.21), to log.
    pub passed_over: Vec<String>,
}

impl Chosen {
    /// `crun 1.21 (…) at /usr/local/sbin/crun`.
    pub fn describe(&self) -> String {
        match &self.identity {
            Some(id) => format!("{} at {}", id.shown(), self.path.display()),
            None => format!("{} (version unreadable)", self.path.display()),
        }
    }
}

/// The runtime for `configured` (svcd.toml's `container.runtime`; `None`: the default), or an
/// error naming the key and what to install.
pub fn choose(configured: Option<&Path>) -> Result<Chosen, String> {
    match configured {
        Some(p) => configured_runtime(p),
        None => default_runtime(&path_dirs()),
    }
}

fn configured_runtime(program: &Path) -> Result<Chosen, String> {
    let path = find_program(program, &path_dirs()).ok_or_else(|| {
        format!(
            "container.runtime: the OCI runtime {} is not installed (svc's crun: `cargo xtask \
             setup`; or apt-get install runc and set container.runtime = \"runc\")",
            program.display()
        )
    })?;
    let identity = identity(&path);
    if let Some(old) = identity.as_ref().and_then(too_old) {
        return Err(format!(
            "container.runtime: {} at {}: {old}",
            old_name(identity.as_ref()),
            path.display()
        ));
    }
    Ok(Chosen {
        path,
        identity,
        passed_over: Vec::new(),
    })
}

fn old_name(id: Option<&Identity>) -> String {
    id.map_or_else(String::new, Identity::shown)
}

/// Where the Debian package puts svc's crun.
pub const PACKAGED_CRUN: &str = "/usr/lib/svc/crun";

/// The first crun on `dirs` when it is new enough, else the package's crun, else the first
/// runc.
fn default_runtime(dirs: &[PathBuf]) -> Result<Chosen, String> {
    default_runtime_with(dirs, Path::new(PACKAGED_CRUN))
}

fn default_runtime_with(dirs: &[PathBuf], packaged: &Path) -> Result<Chosen, String> {
    let mut passed_over = Vec::new();
    let candidates = find_program(Path::new("crun"), dirs)
        .into_iter()
        .chain(packaged.is_file().then(|| packaged.to_path_buf()));
    for path in candidates {
        let identity = identity(&path);
        match identity.as_ref().map(|id| (id.kind, too_old(id))) {
            Some((Kind::Crun, None)) => {
                return Ok(Chosen {
                    path,
                    identity,
                    passed_over,
                });
            }
            Some((_, Some(old))) => passed_over.push(format!(
                "{} at {}: {old}",
                old_name(identity.as_ref()),
                path.display()
            )),
            _ => passed_over.push(format!(
                "{}: not a crun whose version svcd can read",
                path.display()
            )),
        }
    }
    let path = find_program(Path::new("runc"), dirs).ok_or_else(|| {
        format!(
            "no OCI runtime: neither crun {}.{} or later nor runc is on PATH{}; install svc's \
             crun (`cargo xtask setup`) or runc (apt-get install runc), or set \
             container.runtime",
            CRUN_MINIMUM.0,
            CRUN_MINIMUM.1,
            if passed_over.is_empty() {
                String::new()
            } else {
                format!(" ({})", passed_over.join("; "))
            }
        )
    })?;
    Ok(Chosen {
        identity: identity(&path),
        path,
        passed_over,
    })
}

fn identity(path: &Path) -> Option<Identity> {
    advisory::version_output(path)
        .ok()
        .and_then(|out| advisory::identify(&out))
}

/// Why a runtime is too old for svcd, if it is.
fn too_old(id: &Identity) -> Option<String> {
    (id.kind == Kind::Crun && id.triple < CRUN_MINIMUM).then(|| {
        format!(
            "older than crun {}.{}, the oldest svcd runs (older ones cannot mount the base \
             image idmapped, which per-sandbox id ranges need, and Debian 12's 1.8 failed \
             svcd's exec on this layout); install svc's build (`cargo xtask setup`) or set \
             container.runtime = \"runc\"",
            CRUN_MINIMUM.0, CRUN_MINIMUM.1
        )
    })
}

/// `program` as given if it is a path, else the first match on PATH.
pub(super) fn on_path(program: &Path) -> Option<PathBuf> {
    find_program(program, &path_dirs())
}

fn path_dirs() -> Vec<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default()
}

/// `program` as given if it is a path, else the first match in `dirs`.
fn find_program(program: &Path, dirs: &[PathBuf]) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return program.exists().then(|| program.to_path_buf());
    }
    dirs.iter().map(|d| d.join(program)).find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// A script in `dir` named `name` that says `version` as its `--version`.
    fn fake(dir: &Path, name: &str, version: &str) -> PathBuf {
        std::fs::create_dir_all(dir).expect("dir");
        let path = dir.join(name);
        std::fs::write(
            &path,
            format!("#!/bin/sh\necho '{name} version {version}'\necho 'commit: c'\n"),
        )
        .expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    #[test]
    fn the_default_is_the_crun_on_path_when_new_enough_else_runc() {
        let t = tempfile::tempdir().expect("tempdir");
        let (old, new, runc) = (
            t.path().join("old"),
            t.path().join("new"),
            t.path().join("runc"),
        );
        fake(&old, "crun", "1.8.1");
        fake(&runc, "runc", "1.1.5+ds1");
        let none = t.path().join("no-packaged-crun");
        let chosen =
            default_runtime_with(&[old.clone(), new.clone(), runc.clone()], &none).expect("runc");
        assert_eq!(chosen.path, runc.join("runc"));
        assert_eq!(chosen.passed_over.len(), 1, "{chosen:?}");
        assert!(
            chosen.passed_over[0].starts_with("crun 1.8.1 (c) at ")
                && chosen.passed_over[0].contains("older than crun 1.21"),
            "{chosen:?}"
        );
        let crun = fake(&new, "crun", "1.21");
        let chosen = default_runtime(&[new, old.clone(), runc]).expect("crun");
        assert_eq!(chosen.path, crun);
        assert!(
            chosen.describe().starts_with("crun 1.21 (c) at "),
            "{chosen:?}"
        );
        let err = default_runtime(&[old]).expect_err("no runtime");
        assert!(
            err.starts_with(
                "no OCI runtime: neither crun 1.21 or later nor runc is on PATH (crun 1.8.1"
            ),
            "{err}"
        );
    }

    #[test]
    fn a_configured_runtime_missing_or_too_old_names_the_key() {
        let t = tempfile::tempdir().expect("tempdir");
        let missing = configured_runtime(&t.path().join("nope")).expect_err("missing");
        assert!(
            missing.starts_with("container.runtime: the OCI runtime ")
                && missing.contains("is not installed"),
            "{missing}"
        );
        let old = fake(t.path(), "crun", "1.8.1");
        let err = configured_runtime(&old).expect_err("too old");
        assert!(
            err.starts_with("container.runtime: crun 1.8.1 (c) at ")
                && err.contains("older than crun 1.21"),
            "{err}"
        );
        let runc = fake(t.path(), "runc", "1.1.5");
        assert_eq!(configured_runtime(&runc).expect("runc").path, runc);
    }
}
