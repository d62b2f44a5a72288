//! Which cgroup layout the host has and whether the controllers the limits need are there. The
//! runtime creates and removes each sandbox's cgroup; svcd only checks at start, so a missing
//! controller is a clear error then rather than a failed creation later. For crun, a hybrid
//! layout's v2 side is emptied of controllers first ([`hybrid_for_crun`]).

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

/// crun refuses a hybrid layout (v1 controllers, a v2 hierarchy at `unified/`) while the v2
/// side holds any controller ("cgroups in hybrid mode not supported": crun applies limits on
/// the v1 side only, and checks this before any cgroup manager, even `disabled`, runs). A
/// systemd host in hybrid mode mounts every controller on v1; a host whose init left one
/// unmounted has it on v2 (this one: hugetlb). Each such controller gets a v1 hierarchy of
/// its own at `root`/NAME, as systemd would mount it: nothing changes for cgroups that exist
/// (the kernel moves a controller only while no v2 cgroup below the root enables it), and
/// runc works on either. A pure v2 host, or a v1 host without `unified/`, is left alone.
pub fn hybrid_for_crun(root: &Path) -> Result<(), String> {
    let unified = root.join("unified");
    if root.join("cgroup.controllers").exists() || !unified.join("cgroup.controllers").exists() {
        return Ok(());
    }
    for controller in v2_controllers(&unified)? {
        let at = root.join(&controller);
        let mounted = std::fs::create_dir_all(&at)
            .map_err(|e| e.to_string())
            .and_then(|()| {
                let out = std::process::Command::new("mount")
                    .args(["-t", "cgroup", "-o", &controller, "cgroup"])
                    .arg(&at)
                    .output()
                    .map_err(|e| format!("running mount: {e}"))?;
                if out.status.success() {
                    Ok(())
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
                }
            });
        if let Err(e) = mounted {
            return Err(format!(
                "crun refuses this host's hybrid cgroup layout while its cgroup v2 hierarchy {} \
                 holds a controller, and moving {controller:?} to a v1 hierarchy at {} failed: \
                 {e}; set container.runtime = \"runc\" (runc runs on this layout)",
                unified.display(),
                at.display()
            ));
        }
        tracing::info!(
            controller,
            "moved the cgroup controller from the v2 hierarchy {} to a v1 hierarchy of its own \
             at {}: crun refuses a hybrid layout whose v2 side holds controllers",
            unified.display(),
            at.display()
        );
    }
    Ok(())
}

/// The controllers of the v2 hierarchy at `unified`.
fn v2_controllers(unified: &Path) -> Result<Vec<String>, String> {
    let file = unified.join("cgroup.controllers");
    std::fs::read_to_string(&file)
        .map(|t| t.split_whitespace().map(str::to_owned).collect())
        .map_err(|e| format!("{}: {e}", file.display()))
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
