//! A workspace binary older than a source it is built from: a test would run the old code.
//! `cargo test --workspace` builds every binary first; `cargo test -p svc-tests` alone does not
//! rebuild the ones it only runs (svcd, the shim, …), and a test then silently tries the last
//! build. Said loudly on standard error (shown with a failing test's output). The sources are
//! those cargo's dep-info file beside the binary (`<bin>.d`) names.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::Mutex,
};

/// The first source named in `<bin>.d` that changed after `bin` was built.
fn newer_source(bin: &Path) -> Option<PathBuf> {
    let built = std::fs::metadata(bin).and_then(|m| m.modified()).ok()?;
    let info = std::fs::read_to_string(bin.with_extension("d")).ok()?;
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

/// Warn on standard error (once per binary) when `bin` was built before one of its sources
/// changed.
pub fn warn_if_stale(bin: &Path) {
    static WARNED: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());
    let mut warned = WARNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if warned.contains(bin) {
        return;
    }
    if let Some(source) = newer_source(bin) {
        eprintln!(
            "WARNING: {} was built before {} changed: this test runs the old build \
             (`cargo build --bins` first, or run `cargo test --workspace`)",
            bin.display(),
            source.display()
        );
    }
    warned.insert(bin.to_owned());
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
        assert_eq!(newer_source(&bin), Some(new.clone()));
        at(&bin, now + Duration::from_secs(10));
        assert_eq!(newer_source(&bin), None, "built after every source");
        at(&old, now + Duration::from_secs(20));
        assert_eq!(newer_source(&bin), Some(old), "a path with a space");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
