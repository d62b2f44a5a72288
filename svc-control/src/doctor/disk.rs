//! The disk probes: each directory's file system, with a warning when its free space is low.

use std::{path::Path, time::Instant};

use super::report::{CheckResult, host_result};

/// Free space under which `svc doctor` warns about the file system of the audit log or of the
/// state directory: less than 5% of it or less than 1 GiB, whichever is more. svcd keeps
/// writing both while a sandbox is full (each sandbox's disk is its own image), but an image
/// only takes host space as its guest writes, so many busy sandboxes can still fill the host.
pub const LOW_SPACE_PERCENT: u64 = 5;
/// See [`LOW_SPACE_PERCENT`].
pub const LOW_SPACE_BYTES: u64 = 1 << 30;

/// One warning probe per directory (`host:disk-NAME`): its file system's free space, failed
/// (not required: a warning) when it is low (see [`LOW_SPACE_PERCENT`]). A directory not made
/// yet is looked up through its nearest existing parent.
pub fn free_space_probes(dirs: &[(&str, &Path)]) -> Vec<CheckResult> {
    dirs.iter()
        .map(|(name, dir)| {
            let t0 = Instant::now();
            let outcome = free_space(dir).and_then(|(avail, total)| {
                let shown = format!(
                    "{}: {} MiB free of {} MiB",
                    dir.display(),
                    avail >> 20,
                    total >> 20
                );
                match low_space(avail, total) {
                    None => Ok(shown),
                    Some(why) => Err((
                        format!("{shown} ({why})"),
                        "free space there, or move it (svcd.toml state_dir / audit_dir) to a \
                         larger file system; lower container.disk_mib to bound each sandbox less",
                    )),
                }
            });
            host_result(&format!("disk-{name}"), false, t0, outcome)
        })
        .collect()
}

/// Why `avail` bytes free of `total` is low, if it is.
pub fn low_space(avail: u64, total: u64) -> Option<String> {
    let floor = (total / 100 * LOW_SPACE_PERCENT).max(LOW_SPACE_BYTES);
    (avail < floor).then(|| {
        format!(
            "under {LOW_SPACE_PERCENT}% or {} GiB, whichever is more",
            LOW_SPACE_BYTES >> 30
        )
    })
}

/// (bytes available to unprivileged writers, size) of the file system holding `dir`.
fn free_space(dir: &Path) -> Result<(u64, u64), (String, &'static str)> {
    let at = dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let st = nix::sys::statvfs::statvfs(at).map_err(|e| {
        (
            format!("statvfs {}: {e}", at.display()),
            "run the doctor as a user who can reach it",
        )
    })?;
    let frag = st.fragment_size();
    Ok((
        st.blocks_available().saturating_mul(frag),
        st.blocks().saturating_mul(frag),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_space_is_under_5_percent_or_1_gib_whichever_is_more() {
        const GIB: u64 = 1 << 30;
        // A 100 GiB file system: 5 GiB is the floor.
        assert!(low_space(4 * GIB, 100 * GIB).is_some());
        assert!(low_space(6 * GIB, 100 * GIB).is_none());
        // A 10 GiB one: 1 GiB is (5% would be 512 MiB).
        assert!(low_space(GIB - 1, 10 * GIB).is_some());
        assert!(low_space(GIB, 10 * GIB).is_none());
        assert!(low_space(0, 0).is_some());
        let r = free_space_probes(&[("state", Path::new("/nonexistent/svc/state"))]);
        assert_eq!(r[0].name, "host:disk-state");
        assert!(!r[0].required, "a warning, not a failure");
        assert!(
            r[0].output.starts_with("/nonexistent/svc/state: ")
                || r[0]
                    .reason
                    .as_deref()
                    .is_some_and(|w| w.contains("free of")),
            "{:?}",
            r[0]
        );
    }
}
