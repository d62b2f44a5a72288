//! Which cgroup layout the host has and whether the controllers the limits need are there. The
//! runtime creates and removes each sandbox's cgroup; svcd only checks at start, so a missing
//! controller is a clear error then rather than a failed creation later.

use std::path::Path;

use super::oci::Limits;

/// The host's cgroup layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// cgroup v2 only (`/sys/fs/cgroup` is cgroup2).
    Unified,
    /// v1 controllers, with or without a v2 hierarchy beside them (hybrid).
    Legacy,
}

/// The controllers `limits` needs, by name, and the file that shows its v1 hierarchy is
/// mounted.
fn needed(limits: &Limits) -> Vec<(&'static str, &'static str, &'static str)> {
    let mut v = Vec::new();
    if limits.memory_bytes > 0 {
        v.push(("memory", "memory/cgroup.procs", "container.memory_mib"));
    }
    if limits.pids_max > 0 {
        v.push(("pids", "pids/cgroup.procs", "container.pids_max"));
    }
    if limits.cpu_millis > 0 {
        v.push(("cpu", "cpu/cgroup.procs", "container.cpus"));
    }
    v
}

/// The layout under `root` (normally `/sys/fs/cgroup`), or an error naming each controller a
/// limit needs and the host lacks.
pub fn check(root: &Path, limits: &Limits) -> Result<Layout, String> {
    let v2 = root.join("cgroup.controllers");
    let (layout, missing): (Layout, Vec<_>) = if v2.exists() {
        let have = std::fs::read_to_string(&v2).map_err(|e| format!("{}: {e}", v2.display()))?;
        let have: Vec<&str> = have.split_whitespace().collect();
        (
            Layout::Unified,
            needed(limits)
                .into_iter()
                .filter(|(c, _, _)| !have.contains(c))
                .collect(),
        )
    } else {
        (
            Layout::Legacy,
            needed(limits)
                .into_iter()
                .filter(|(_, file, _)| !root.join(file).exists())
                .collect(),
        )
    };
    if missing.is_empty() {
        return Ok(layout);
    }
    Err(missing
        .iter()
        .map(|(c, _, key)| {
            format!(
                "the cgroup controller {c:?} is not available under {} ({}), so the limit {key} \
                 cannot be applied; enable the controller, or set {key} = 0 to run without it",
                root.display(),
                match layout {
                    Layout::Unified => "cgroup v2",
                    Layout::Legacy => "cgroup v1",
                }
            )
        })
        .collect::<Vec<_>>()
        .join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: Limits = Limits {
        memory_bytes: 1 << 30,
        pids_max: 100,
        cpu_millis: 1000,
    };

    #[test]
    fn a_v2_host_without_the_memory_controller_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("cgroup.controllers"), "cpu pids io\n").expect("write");
        let err = check(dir.path(), &ALL).expect_err("memory is missing");
        assert!(
            err.contains("\"memory\"") && err.contains("container.memory_mib"),
            "{err}"
        );
        assert!(!err.contains("\"pids\""), "{err}");
        let none = Limits {
            memory_bytes: 0,
            ..ALL
        };
        assert_eq!(check(dir.path(), &none), Ok(Layout::Unified));
    }

    #[test]
    fn a_v1_host_is_checked_by_its_controller_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        for f in ["memory/cgroup.procs", "cpu/cgroup.procs"] {
            let p = dir.path().join(f);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, "").expect("write");
        }
        let err = check(dir.path(), &ALL).expect_err("pids is missing");
        assert!(
            err.contains("\"pids\"") && err.contains("cgroup v1"),
            "{err}"
        );
        std::fs::create_dir_all(dir.path().join("pids")).expect("mkdir");
        std::fs::write(dir.path().join("pids/cgroup.procs"), "").expect("write");
        assert_eq!(check(dir.path(), &ALL), Ok(Layout::Legacy));
    }
}
