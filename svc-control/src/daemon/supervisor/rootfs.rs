//! `--rootfs DIR`: who may hand a sandbox its root file system, and what it must be.
//!
//! Root callers only (the containerd shim runs as root, as containerd does). The tree is the
//! guest's lower layer for as long as the guest runs: a tree its caller owns could be changed
//! under the running guest, swapped for a link to a host directory between the check and the
//! mount, or hold ids the caller was never given. svcd never writes it (the guest's writes go
//! to its own layer) and never follows a link on the way to it: the path given must be the
//! directory's own, canonical one.

use std::path::{Path, PathBuf};

use super::Failure;
use crate::policy::ownership::Principal;

/// The root file system `asked` for a sandbox of `backend` made by `who` (a directory, or
/// layer directories top first, separated by `:`), checked; none asked: the base image.
pub(super) fn check(
    asked: Option<&str>,
    who: &Principal,
    backend: &str,
) -> Result<Vec<PathBuf>, Failure> {
    let Some(dir) = asked else {
        return Ok(Vec::new());
    };
    if backend != "container" {
        return Err(Failure::unsupported(format!(
            "--rootfs {dir}: a handed root file system runs on the container backend only (the \
             {backend} backend boots its own disk image)"
        )));
    }
    if !who.is_root() {
        return Err(Failure::forbidden(format!(
            "--rootfs {dir}: only root may hand a sandbox its root file system (it stays the \
             guest's lower layer while the guest runs; a tree its caller can change is refused)"
        )));
    }
    dir.split(':')
        .map(|d| check_dir(d).map_err(Failure::bad))
        .collect()
}

/// `dir` is an absolute, canonical path (no link on the way) to a directory.
pub(super) fn check_dir(dir: &str) -> Result<PathBuf, String> {
    let path = Path::new(dir);
    if !path.is_absolute() || dir.contains('\0') {
        return Err(format!(
            "--rootfs {dir}: give the directory's absolute path"
        ));
    }
    let meta = std::fs::symlink_metadata(path).map_err(|e| format!("--rootfs {dir}: {e}"))?;
    if meta.file_type().is_symlink() {
        return Err(format!(
            "--rootfs {dir} is a symbolic link: give the directory itself"
        ));
    }
    if !meta.is_dir() {
        return Err(format!("--rootfs {dir} is not a directory"));
    }
    let canonical = std::fs::canonicalize(path).map_err(|e| format!("--rootfs {dir}: {e}"))?;
    if canonical != path {
        return Err(format!(
            "--rootfs {dir} passes through a symbolic link or a relative step: give its canonical \
             path, {}",
            canonical.display()
        ));
    }
    Ok(canonical)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user() -> Principal {
        Principal {
            uid: 1000,
            groups: Vec::new(),
        }
    }

    #[test]
    fn no_rootfs_is_the_base_image() {
        assert_eq!(check(None, &user(), "microvm").ok(), Some(Vec::new()));
    }

    #[test]
    fn a_directory_handed_by_root_is_taken() {
        let dir = tempfile::tempdir().expect("tempdir");
        let canonical = std::fs::canonicalize(dir.path()).expect("canonical");
        let asked = canonical.display().to_string();
        let got = check(Some(&asked), &Principal::ROOT, "container").map_err(|f| f.message);
        assert_eq!(got, Ok(vec![canonical.clone()]));
        let layers = format!("{asked}:{asked}");
        let got = check(Some(&layers), &Principal::ROOT, "container").map_err(|f| f.message);
        assert_eq!(got, Ok(vec![canonical.clone(), canonical]));
    }

    #[test]
    fn refusals_name_the_directory_and_the_reason() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = std::fs::canonicalize(dir.path()).expect("canonical");
        std::fs::write(root.join("file"), "").expect("file");
        std::os::unix::fs::symlink(&root, root.join("link")).expect("link");
        std::fs::create_dir(root.join("sub")).expect("sub");
        let at = |p: &str| root.join(p).display().to_string();
        let cases = [
            (
                "a user",
                at("sub"),
                user(),
                "container",
                "only root may hand",
            ),
            (
                "microvm",
                at("sub"),
                Principal::ROOT,
                "microvm",
                "container backend only",
            ),
            (
                "relative",
                "sub".to_owned(),
                Principal::ROOT,
                "container",
                "absolute path",
            ),
            (
                "missing",
                at("none"),
                Principal::ROOT,
                "container",
                "No such file",
            ),
            (
                "a file",
                at("file"),
                Principal::ROOT,
                "container",
                "is not a directory",
            ),
            (
                "a link",
                at("link"),
                Principal::ROOT,
                "container",
                "is a symbolic link",
            ),
            (
                "through a link",
                at("link/sub"),
                Principal::ROOT,
                "container",
                "canonical",
            ),
            (
                "a dot-dot step",
                at("sub/../sub"),
                Principal::ROOT,
                "container",
                "canonical",
            ),
        ];
        for (case, asked, who, backend, says) in cases {
            let e = check(Some(&asked), &who, backend).expect_err(case).message;
            assert!(e.contains(&asked) && e.contains(says), "{case}: {e}");
        }
    }
}
