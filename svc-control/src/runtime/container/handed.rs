//! A sandbox on a root file system handed to it (`--rootfs`, the containerd shim's image)
//! instead of the base image: the tree is attached idmapped to the guest's ids, read-only, as
//! the overlay's lower layer (the same as the base image with a range per sandbox), and the
//! guest's init comes from the base image, since the handed tree need not hold one.

use std::{
    fs::Permissions,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
};

use super::{INIT, OLD_INIT, rootfs::Lower};

/// Where the init of a sandbox on a handed root file system appears in its guest: a read-only
/// bind of the base image's statically linked tini, on the guest's own /dev (never a path of
/// the handed tree, which stays unwritten).
pub const HANDED_INIT: &str = "/dev/.svc-init";

/// The base image's statically linked tini (it runs whatever C library the handed tree has),
/// for an image built before `svc-init`.
const STATIC_TINI: &str = "usr/bin/tini-static";

/// The base image's `svc-init` ([`INIT`]), statically linked too.
const STATIC_SVC_INIT: &str = "usr/local/bin/svc-init";

/// What the guest waits in, in the handed tree: tini runs it as the guest's only child.
const SLEEP: &str = "/bin/sleep";

/// The guest's root file system: the handed tree or layers, else the base image `base`.
pub(super) fn lower(base: &Lower, handed: &[PathBuf]) -> Lower {
    if handed.is_empty() {
        base.clone()
    } else {
        Lower::Layers(handed.to_vec())
    }
}

/// The guest's init and its arguments: the base image's (`svc-init` when the image has it,
/// else tini), or on a handed tree the same init bound at [`HANDED_INIT`].
pub(super) fn init(handed: &[PathBuf], svc_init: bool) -> Vec<String> {
    let base: &[&str] = if svc_init { &INIT } else { &OLD_INIT };
    let mut init: Vec<String> = base.iter().map(|s| (*s).to_owned()).collect();
    if !handed.is_empty() {
        HANDED_INIT.clone_into(&mut init[0]);
    }
    init
}

/// For a sandbox on the handed tree (or layers) `dirs`: the base image's static init (`svc-init`
/// when `svc_init`, else tini) copied
/// into the sandbox's directory `sandbox_dir` (readable by the guest's ids, which bind it) and
/// the read-only bind that shows it at [`HANDED_INIT`]. An error names what is missing.
pub(super) fn init_bind(
    base: &Lower,
    dirs: &[PathBuf],
    sandbox_dir: &Path,
    svc_init: bool,
) -> Result<(PathBuf, PathBuf, bool), String> {
    // In a layer (a layer above could hide it with a whiteout; the init then fails to start).
    if !dirs.iter().any(|d| has_in_root(d, SLEEP).is_ok()) {
        let shown: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        return Err(format!(
            "the root file system {} has no {SLEEP} (the guest's init waits in it)",
            shown.join(":")
        ));
    }
    let tini = base.path().join(if svc_init {
        STATIC_SVC_INIT
    } else {
        STATIC_TINI
    });
    let copy = sandbox_dir.join("init");
    std::fs::copy(&tini, &copy)
        .and_then(|_| std::fs::set_permissions(&copy, Permissions::from_mode(0o755)))
        .map_err(|e| {
            format!(
                "copying the base image's {} (the init of a sandbox on a handed root file \
                 system; rebuild the image with `svcd images build`): {e}",
                tini.display()
            )
        })?;
    Ok((copy, PathBuf::from(HANDED_INIT), true))
}

/// Whether `path` resolves to a file in the tree `root` as the guest will see it (links
/// resolved inside the tree, never on the host's).
fn has_in_root(root: &Path, path: &str) -> Result<(), String> {
    use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
    let dir = std::fs::File::open(root).map_err(|e| e.to_string())?;
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    openat2(&dir, path.trim_start_matches('/'), how)
        .map(drop)
        .map_err(|e| e.desc().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_in_a_handed_tree_resolve_inside_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("usr/bin")).expect("usr/bin");
        // An absolute link, as merged-/usr trees have: inside the tree, not the host's /usr.
        std::os::unix::fs::symlink("/usr/bin", root.join("bin")).expect("bin");
        let e = has_in_root(root, SLEEP).expect_err("no sleep yet");
        assert!(e.contains("No such file"), "{e}");
        std::fs::write(root.join("usr/bin/sleep"), "").expect("sleep");
        has_in_root(root, SLEEP).expect("found through the tree's own link");
    }

    #[test]
    fn only_a_handed_tree_changes_the_init_and_the_lower_layer() {
        let base = Lower::Shifted(PathBuf::from("/base"));
        assert_eq!(init(&[], true), INIT.to_vec());
        assert_eq!(init(&[], false), OLD_INIT.to_vec());
        assert_eq!(lower(&base, &[]), base);
        let dirs = [PathBuf::from("/images/app")];
        assert_eq!(init(&dirs, true), [HANDED_INIT]);
        assert_eq!(init(&dirs, false)[0], HANDED_INIT);
        assert_eq!(init(&dirs, false)[1..], OLD_INIT[1..]);
        assert_eq!(lower(&base, &dirs), Lower::Layers(dirs.to_vec()));
    }
}
