//! A sandbox's resource figures, read from the cgroups its guest's processes are in: CPU time,
//! memory use and limit, process count and limit, and the processes themselves, as the host
//! sees them; and whether they are frozen (paused). Each controller is read where
//! `/proc/PID/cgroup` puts the process: on a v1 hierarchy of its own
//! (`ROOT/<controllers>/<path>`), or on the v2 one (`ROOT/<path>`, or `ROOT/unified/<path>` on
//! a hybrid host), so a v1, a v2 and a hybrid host are read alike.
//!
//! A container sandbox's init is in the sandbox's own cgroup (`/<cgroup_parent>/<name>` in
//! each controller), so every figure is the sandbox's. A microvm's QEMU is in a memory cgroup
//! of its own only: its memory figures are the VM's (guest RAM and QEMU), its CPU time is
//! QEMU's process's (`/proc/PID/stat`), its only host process is QEMU (the guest's processes
//! are the guest kernel's, not the host's), and it has no process limit.

use std::path::{Path, PathBuf};

/// What a sandbox uses, by the host's accounting.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Figures {
    /// CPU time used, in nanoseconds.
    pub cpu_ns: u64,
    /// Of it, in user mode and in the kernel (where the host tells them apart).
    pub cpu_user_ns: Option<u64>,
    pub cpu_system_ns: Option<u64>,
    pub memory_bytes: u64,
    /// None: no limit.
    pub memory_limit: Option<u64>,
    /// Processes (tasks) in the cgroup; none where no pids controller counts them.
    pub pids_current: Option<u64>,
    /// None: no limit.
    pub pids_limit: Option<u64>,
    /// Host pids of the processes.
    pub pids: Vec<u32>,
    /// The cgroup the figures are of (its path in the memory hierarchy).
    pub cgroup: String,
}

/// Where the cgroup file systems and `/proc` are (the host's: `/sys/fs/cgroup`, `/proc`).
#[derive(Debug, Clone)]
pub struct Host {
    pub cgroup_root: PathBuf,
    pub proc_root: PathBuf,
}

impl Default for Host {
    fn default() -> Self {
        Self {
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// The cgroup directories of a process, per controller.
#[derive(Debug, Default)]
struct Dirs {
    memory: Option<(PathBuf, Version)>,
    cpu: Option<(PathBuf, Version)>,
    pids: Option<(PathBuf, Version)>,
    memory_path: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// Where a cgroup version keeps the figures: one reader serves both.
struct Files {
    /// The memory controller's usage and limit files.
    memory: (&'static str, &'static str),
    cpu: CpuFiles,
}

/// CPU time in all, in user mode and in the kernel.
struct CpuFiles {
    total: Field,
    user: Field,
    system: Field,
}

/// A figure in a controller's directory: a file holding one number, or the value of a key in
/// a `key value` file; `scale` turns its unit into nanoseconds.
struct Field {
    file: &'static str,
    key: Option<&'static str>,
    scale: u64,
}

impl Version {
    fn files(self) -> Files {
        match self {
            Self::V1 => Files {
                memory: ("memory.usage_in_bytes", "memory.limit_in_bytes"),
                cpu: CpuFiles {
                    total: Field::whole("cpuacct.usage"),
                    user: Field::whole("cpuacct.usage_user"),
                    system: Field::whole("cpuacct.usage_sys"),
                },
            },
            Self::V2 => Files {
                memory: ("memory.current", "memory.max"),
                cpu: CpuFiles {
                    total: Field::cpu_stat_usec("usage_usec"),
                    user: Field::cpu_stat_usec("user_usec"),
                    system: Field::cpu_stat_usec("system_usec"),
                },
            },
        }
    }
}

impl Field {
    /// A file holding one number of nanoseconds (v1's `cpuacct.*`).
    const fn whole(file: &'static str) -> Self {
        Self {
            file,
            key: None,
            scale: 1,
        }
    }

    /// A key of v2's `cpu.stat`, in microseconds.
    const fn cpu_stat_usec(key: &'static str) -> Self {
        Self {
            file: "cpu.stat",
            key: Some(key),
            scale: 1000,
        }
    }

    /// The figure in `dir`: an error where its file cannot be read (or a whole-file figure is
    /// not a number), none where a keyed file has no such key.
    fn read(&self, dir: &Path) -> Result<Option<u64>, String> {
        let path = dir.join(self.file);
        let value = match self.key {
            None => Some(read_u64(&path)?),
            Some(key) => keyed(&read(&path)?, key),
        };
        Ok(value.map(|v| v.saturating_mul(self.scale)))
    }
}

impl Host {
    /// A container sandbox whose init is `pid`: every figure of its cgroup.
    pub fn container(&self, pid: u32) -> Result<Figures, String> {
        let dirs = self.dirs(pid)?;
        let mut f = Figures {
            cgroup: dirs.memory_path.clone(),
            ..Figures::default()
        };
        self.memory(&dirs, &mut f)?;
        if let Some((dir, v)) = &dirs.cpu {
            let cpu = v.files().cpu;
            f.cpu_ns = cpu.total.read(dir)?.unwrap_or(0);
            f.cpu_user_ns = cpu.user.read(dir).ok().flatten();
            f.cpu_system_ns = cpu.system.read(dir).ok().flatten();
        }
        if let Some((dir, _)) = &dirs.pids {
            f.pids_current = Some(read_u64(&dir.join("pids.current"))?);
            f.pids_limit = limit(&read(&dir.join("pids.max"))?);
        }
        let procs_dir = dirs
            .pids
            .as_ref()
            .or(dirs.memory.as_ref())
            .map(|(d, _)| d.clone());
        f.pids = match procs_dir {
            Some(d) => procs(&d)?,
            None => vec![pid],
        };
        Ok(f)
    }

    /// A microvm whose QEMU is `pid`: its memory cgroup's figures, QEMU's CPU time, QEMU.
    pub fn vm(&self, pid: u32) -> Result<Figures, String> {
        let dirs = self.dirs(pid)?;
        let mut f = Figures {
            cgroup: dirs.memory_path.clone(),
            pids: vec![pid],
            ..Figures::default()
        };
        self.memory(&dirs, &mut f)?;
        let stat_file = self.proc_root.join(pid.to_string()).join("stat");
        let stat = read(&stat_file)?;
        // Fields after the command (which may hold spaces), from field 3 on.
        let rest = stat
            .rsplit_once(") ")
            .map(|(_, r)| r)
            .ok_or_else(|| format!("{}: not a stat line", stat_file.display()))?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
        // utime is field 14, stime 15: the 12th and 13th after the command.
        let (user, system) = ticks(11)
            .zip(ticks(12))
            .ok_or_else(|| format!("{}: no utime/stime", stat_file.display()))?;
        let ns = |t: u64| t.saturating_mul(1_000_000_000 / clock_ticks());
        f.cpu_user_ns = Some(ns(user));
        f.cpu_system_ns = Some(ns(system));
        f.cpu_ns = ns(user + system);
        Ok(f)
    }

    /// Whether the processes of the cgroup `pid` is in are frozen (or being frozen), as the
    /// OCI runtime's `pause` leaves them: cgroup v1's freezer (`freezer.state` other than
    /// `THAWED`) where a v1 freezer hierarchy holds the process, else v2's `cgroup.freeze`. A
    /// cgroup without the file (the root, a kernel without the v2 freezer) is not frozen.
    pub fn frozen(&self, pid: u32) -> Result<bool, String> {
        let text = read(&self.proc_root.join(pid.to_string()).join("cgroup"))?;
        let mut v2_path = None;
        for (id, controllers, path) in cgroup_lines(&text) {
            let rel = path.trim_start_matches('/');
            if id == "0" && controllers.is_empty() {
                v2_path = Some(rel.to_owned());
            } else if controllers.split(',').any(|c| c == "freezer") {
                let file = self.cgroup_root.join(controllers).join(rel);
                return Ok(read_if_there(&file.join("freezer.state"))?
                    .is_some_and(|state| state.trim() != "THAWED"));
            }
        }
        let Some(rel) = v2_path else {
            return Ok(false);
        };
        let freeze = self.v2_root().join(rel).join("cgroup.freeze");
        Ok(read_if_there(&freeze)?.is_some_and(|v| v.trim() == "1"))
    }

    fn memory(&self, dirs: &Dirs, f: &mut Figures) -> Result<(), String> {
        if let Some((dir, v)) = &dirs.memory {
            let (usage, max) = v.files().memory;
            f.memory_bytes = read_u64(&dir.join(usage))?;
            f.memory_limit = limit(&read(&dir.join(max))?);
        }
        Ok(())
    }

    /// The v2 hierarchy's root: the cgroup root itself on a v2 host, `unified/` under it on a
    /// hybrid one.
    fn v2_root(&self) -> PathBuf {
        let root = &self.cgroup_root;
        if root.join("cgroup.controllers").exists() {
            root.clone()
        } else {
            root.join("unified")
        }
    }

    /// Where `pid`'s memory, cpu accounting and pids controllers are.
    fn dirs(&self, pid: u32) -> Result<Dirs, String> {
        let file = self.proc_root.join(pid.to_string()).join("cgroup");
        let text = read(&file)?;
        let root = &self.cgroup_root;
        let mut dirs = Dirs::default();
        let mut v2_path = None;
        for (id, controllers, path) in cgroup_lines(&text) {
            let rel = path.trim_start_matches('/');
            if id == "0" && controllers.is_empty() {
                v2_path = Some(path.to_owned());
                continue;
            }
            let dir = root.join(controllers).join(rel);
            for c in controllers.split(',') {
                match c {
                    "memory" => {
                        dirs.memory = Some((dir.clone(), Version::V1));
                        dirs.memory_path = path.to_owned();
                    }
                    "cpuacct" => dirs.cpu = Some((dir.clone(), Version::V1)),
                    "pids" => dirs.pids = Some((dir.clone(), Version::V1)),
                    _ => {}
                }
            }
        }
        // A controller on no v1 hierarchy is the v2 one's, where it is enabled there.
        if let Some(path) = v2_path {
            let dir = self.v2_root().join(path.trim_start_matches('/'));
            let on = |file: &str| dir.join(file).exists();
            if dirs.memory.is_none() && on("memory.current") {
                dirs.memory = Some((dir.clone(), Version::V2));
                dirs.memory_path = path.clone();
            }
            if dirs.cpu.is_none() && on("cpu.stat") {
                dirs.cpu = Some((dir.clone(), Version::V2));
            }
            if dirs.pids.is_none() && on("pids.current") {
                dirs.pids = Some((dir.clone(), Version::V2));
            }
        }
        Ok(dirs)
    }
}

/// The pids in the cgroup at `dir` and in those below it.
fn procs(dir: &Path) -> Result<Vec<u32>, String> {
    let mut pids: Vec<u32> = read(&dir.join("cgroup.procs"))?
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                pids.extend(procs(&e.path()).unwrap_or_default());
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    Ok(pids)
}

/// A limit file's value: `max` (v2) or the kernel's "no limit" (v1: a page-rounded
/// `i64::MAX`) is none.
fn limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|v| *v < (1 << 62))
}

/// `/proc/PID/cgroup`'s lines as (hierarchy id, controllers, path); a malformed line is
/// passed over.
fn cgroup_lines(text: &str) -> impl Iterator<Item = (&str, &str, &str)> {
    text.lines().filter_map(|line| {
        let mut parts = line.splitn(3, ':');
        Some((parts.next()?, parts.next()?, parts.next()?))
    })
}

/// `key value` lines: the value of `key`.
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

/// `path`'s text, or none when there is no such file.
fn read_if_there(path: &Path) -> Result<Option<String>, String> {
    match std::fs::read_to_string(path) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

fn read_u64(path: &Path) -> Result<u64, String> {
    let t = read(path)?;
    t.trim()
        .parse()
        .map_err(|_| format!("{}: not a number: {:?}", path.display(), t.trim()))
}

/// The kernel's clock ticks a second (`/proc/PID/stat`'s unit).
fn clock_ticks() -> u64 {
    // SAFETY: sysconf reads a constant of the system; no memory is touched.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(t).ok().filter(|t| *t > 0).unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    }

    /// A hybrid host (v1 controllers, v2 at `unified/`), as this project's CI host is.
    #[test]
    fn a_container_on_a_hybrid_host_is_read_from_its_v1_controllers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cg, proc) = (dir.path().join("cg"), dir.path().join("proc"));
        write(
            &proc,
            "42/cgroup",
            "9:name=systemd:/\n8:pids:/svc/dev\n4:memory:/svc/dev\n2:cpuacct:/svc/dev\n0::/\n",
        );
        write(&cg, "unified/cgroup.controllers", "hugetlb\n");
        write(&cg, "memory/svc/dev/memory.usage_in_bytes", "1048576\n");
        write(&cg, "memory/svc/dev/memory.limit_in_bytes", "1073741824\n");
        write(&cg, "memory/svc/dev/cgroup.procs", "42\n43\n");
        write(&cg, "cpuacct/svc/dev/cpuacct.usage", "5000000\n");
        write(&cg, "pids/svc/dev/pids.current", "2\n");
        write(&cg, "pids/svc/dev/pids.max", "max\n");
        write(&cg, "pids/svc/dev/cgroup.procs", "43\n42\n");
        let host = Host {
            cgroup_root: cg,
            proc_root: proc,
        };
        let f = host.container(42).expect("figures");
        assert_eq!(
            f,
            Figures {
                cpu_ns: 5_000_000,
                cpu_user_ns: None,
                cpu_system_ns: None,
                memory_bytes: 1 << 20,
                memory_limit: Some(1 << 30),
                pids_current: Some(2),
                pids_limit: None,
                pids: vec![42, 43],
                cgroup: "/svc/dev".into(),
            }
        );
    }

    #[test]
    fn a_container_on_a_v2_host_is_read_from_its_unified_cgroup() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cg, proc) = (dir.path().join("cg"), dir.path().join("proc"));
        write(&proc, "7/cgroup", "0::/svc/ci\n");
        write(&cg, "cgroup.controllers", "cpu memory pids\n");
        write(&cg, "svc/ci/memory.current", "4096\n");
        write(&cg, "svc/ci/memory.max", "max\n");
        write(
            &cg,
            "svc/ci/cpu.stat",
            "usage_usec 30\nuser_usec 20\nsystem_usec 10\n",
        );
        write(&cg, "svc/ci/pids.current", "3\n");
        write(&cg, "svc/ci/pids.max", "512\n");
        write(&cg, "svc/ci/cgroup.procs", "7\n");
        write(&cg, "svc/ci/sub/cgroup.procs", "9\n8\n");
        let host = Host {
            cgroup_root: cg,
            proc_root: proc,
        };
        let f = host.container(7).expect("figures");
        assert_eq!(
            (f.cpu_ns, f.cpu_user_ns, f.cpu_system_ns),
            (30_000, Some(20_000), Some(10_000))
        );
        assert_eq!((f.memory_bytes, f.memory_limit), (4096, None));
        assert_eq!((f.pids_current, f.pids_limit), (Some(3), Some(512)));
        assert_eq!(f.pids, [7, 8, 9], "the cgroup's and those below it");
    }

    #[test]
    fn a_process_that_is_gone_is_an_error_naming_its_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = Host {
            cgroup_root: dir.path().join("cg"),
            proc_root: dir.path().join("proc"),
        };
        let e = host.container(5).expect_err("no process");
        assert!(e.contains("proc/5/cgroup"), "{e}");
    }

    #[test]
    fn a_frozen_cgroup_is_read_from_v1s_freezer_on_a_hybrid_host_and_v2s_freeze_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cg, proc) = (dir.path().join("cg"), dir.path().join("proc"));
        let host = Host {
            cgroup_root: cg.clone(),
            proc_root: proc.clone(),
        };
        // Hybrid: the v1 freezer decides, whatever the v2 side says.
        write(
            &proc,
            "42/cgroup",
            "6:freezer:/svc/dev\n4:memory:/svc/dev\n0::/svc/dev\n",
        );
        write(&cg, "unified/cgroup.controllers", "");
        write(&cg, "unified/svc/dev/cgroup.freeze", "0\n");
        for (state, frozen) in [("FROZEN", true), ("FREEZING", true), ("THAWED", false)] {
            write(&cg, "freezer/svc/dev/freezer.state", &format!("{state}\n"));
            assert_eq!(host.frozen(42), Ok(frozen), "{state}");
        }
        // v2 only.
        write(&proc, "7/cgroup", "0::/svc/ci\n");
        write(&cg, "cgroup.controllers", "cpu memory pids\n");
        write(&cg, "svc/ci/cgroup.freeze", "1\n");
        assert_eq!(host.frozen(7), Ok(true));
        write(&cg, "svc/ci/cgroup.freeze", "0\n");
        assert_eq!(host.frozen(7), Ok(false));
        // The root cgroup has no freeze file: never frozen.
        write(&proc, "8/cgroup", "0::/\n");
        assert_eq!(host.frozen(8), Ok(false));
        let gone = host.frozen(5).expect_err("no process");
        assert!(gone.contains("proc/5/cgroup"), "{gone}");
    }

    #[test]
    fn limits_without_a_value_are_none() {
        assert_eq!(limit("max\n"), None);
        assert_eq!(limit("9223372036854771712\n"), None);
        assert_eq!(limit("536870912\n"), Some(536_870_912));
    }
}
