//! A workspace binary or image older than a source it is built from: a test would run the old
//! code. `cargo test --workspace` builds every binary first and `cargo xtask test` the images;
//! `cargo test -p svc-tests` alone rebuilds neither the binaries it only runs (svcd, the shim,
//! …) nor the images' guest programs (svc-init, the microvm agent, …), and a test then
//! silently tries the last build. Said loudly on standard error (shown with a failing test's
//! output). The sources are those cargo's dep-info files (`<bin>.d`) name.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::Mutex,
    time::SystemTime,
};

/// The guest programs an image carries (`cargo xtask images` builds them into `target/guest`).
const GUEST_PROGRAMS: [&str; 4] = [
    "svc-init",
    "svc-microvm-agent",
    "svc-supervise",
    "svc-git-ssh",
];

/// The first source the dep-info file `info` names that changed after `built`.
fn newer_source(built: SystemTime, info: &Path) -> Option<PathBuf> {
    let info = std::fs::read_to_string(info).ok()?;
    // `TARGET: SOURCE SOURCE …`, a space inside a path escaped with `\`.
    let (_, sources) = info.lines().next()?.split_once(": ")?;
    let sources = sources.replace("\\ ", "\u{0}");
    sources
        .split(' ')
        .map(|s| PathBuf::from(s.replace('\u{0}', " ")))
        .find(|s| {
            std::fs::metadata(s)
                .and_then(|m| m.modified())
                .is_ok_and(|at| at > built)
        })
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Say `what` once per `key` (a process may look many times).
fn once(key: &Path, what: impl FnOnce() -> Option<String>) {
    static WARNED: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());
    let mut warned = WARNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if warned.insert(key.to_owned())
        && let Some(what) = what()
    {
        eprintln!("WARNING: {what}");
    }
}

/// Warn when `bin` was built before one of its sources changed.
pub fn warn_if_stale(bin: &Path) {
    once(bin, || {
        let source = newer_source(modified(bin)?, &bin.with_extension("d"))?;
        Some(format!(
            "{} was built before {} changed: this test runs the old build (`cargo build \
             --bins` first, or run `cargo test --workspace`)",
            bin.display(),
            source.display()
        ))
    });
}

/// Warn when `image` (under `target`) carries guest programs built before one of their
/// sources changed: `cargo xtask images` rebuilds them (under `target/guest`) before it looks
/// at the images, so such programs mean it has not run since.
pub fn warn_if_image_stale(image: &Path, target: &Path) {
    once(image, || {
        let release = target.join("guest/x86_64-unknown-linux-gnu/release");
        let source = GUEST_PROGRAMS.iter().find_map(|p| {
            let bin = release.join(p);
            newer_source(modified(&bin)?, &bin.with_extension("d"))
        })?;
        Some(format!(
            "the guest programs of {} were built before {} changed: this test runs the old \
             ones (`cargo xtask images` first)",
            image.display(),
            source.display()
        ))
    });
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;

    fn at(path: &Path, when: SystemTime) {
        std::fs::File::options()
            .write(true)
            .open(path)
            .and_then(|f| f.set_modified(when))
            .expect("set mtime");
    }

    #[test]
    fn a_binary_older_than_one_of_its_sources_is_found_and_a_fresh_one_is_not() {
        let dir = crate::fresh_dir("stale");
        let (bin, old, new) = (dir.join("bin"), dir.join("old src.rs"), dir.join("new.rs"));
        for f in [&bin, &old, &new] {
            std::fs::write(f, "").expect("write");
        }
        let info = format!(
            "{}: {} {}\n",
            bin.display(),
            old.display().to_string().replace(' ', "\\ "),
            new.display()
        );
        std::fs::write(bin.with_extension("d"), info).expect("dep-info");
        let now = SystemTime::now();
        at(&old, now - Duration::from_secs(20));
        at(&bin, now - Duration::from_secs(10));
        at(&new, now);
        let newer = || newer_source(modified(&bin).expect("mtime"), &bin.with_extension("d"));
        assert_eq!(newer(), Some(new.clone()));
        at(&bin, now + Duration::from_secs(10));
        assert_eq!(newer(), None, "built after every source");
        at(&old, now + Duration::from_secs(20));
        assert_eq!(newer(), Some(old), "a path with a space");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
