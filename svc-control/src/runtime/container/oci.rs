//! The OCI runtime bundle's `config.json` (runtime-spec 1.0), as typed values: only the fields
//! svc sets. [`sandbox`] builds a sandbox's whole configuration; nothing else writes one.

use std::path::PathBuf;

use serde::Serialize;

use super::seccomp;

/// Capabilities a sandbox's processes keep (all inside its user namespace, so none of them
/// reaches a host object the guest's ids do not own). What an unprivileged build needs: no
/// CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF, CAP_PERFMON, CAP_SYS_PTRACE,
/// CAP_SYS_MODULE, CAP_MKNOD, ... and no CAP_SETFCAP: a file capability the guest set on a
/// shared directory's file would be the host's (`policy::shares`: a share owned by root maps
/// the guest's root to host root, and the kernel stores the capability for that root).
pub const CAPABILITIES: [&str; 10] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
];

/// The environment of the container's process (its init), and so of each command run in it
/// before the command's own.
pub const BASE_ENV: [&str; 3] = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "LANG=C.UTF-8",
];

/// /proc and /sys paths hidden from the guest (an empty file or directory over them), as OCI
/// runtimes hide them by default, plus the ones that name host hardware and kernel state.
pub const MASKED_PATHS: [&str; 12] = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/proc/kallsyms",
    "/proc/sysrq-trigger",
    "/proc/config.gz",
];

/// /proc paths the guest may read but not write.
pub const READONLY_PATHS: [&str; 4] = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys"];

/// An id mapping: guest ids `container_id..+size` are host ids `host_id..+size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct IdMapping {
    #[serde(rename = "containerID")]
    pub container_id: u32,
    #[serde(rename = "hostID")]
    pub host_id: u32,
    pub size: u32,
}

/// Per-sandbox cgroup limits (0: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub memory_bytes: u64,
    pub pids_max: u64,
    pub cpu_millis: u64,
}

/// What [`sandbox`] needs.
#[derive(Debug, Clone)]
pub struct SandboxBundle<'a> {
    pub hostname: &'a str,
    pub uid_map: IdMapping,
    pub gid_map: IdMapping,
    /// Host files the guest sees read-only: (host file, guest path).
    pub files: &'a [(PathBuf, PathBuf)],
    /// Host directories the guest sees read-write: (attachment, guest path).
    pub shared: &'a [(PathBuf, PathBuf)],
    /// Binds inside those, in order: (host path, guest path, read-only). A read-write one
    /// pins a path (a mount point cannot be renamed); a read-only one keeps the guest from
    /// changing it (without CAP_SYS_ADMIN it cannot remount it, and in a user namespace of
    /// its own the mount is locked).
    pub sub_binds: &'a [(PathBuf, PathBuf, bool)],
    /// The guest's init and its arguments.
    pub init: Vec<String>,
    pub cgroups_path: String,
    pub limits: Limits,
}

/// The whole configuration of one sandbox's bundle (root file system at `rootfs/`).
pub fn sandbox(b: &SandboxBundle<'_>) -> Spec {
    Spec {
        oci_version: "1.0.2",
        process: process(b.init.clone()),
        root: Root {
            path: "rootfs".into(),
            readonly: false,
        },
        hostname: b.hostname.to_owned(),
        mounts: mounts(b),
        linux: linux(b),
    }
}

/// The guest's init: root of its user namespace, no new privileges, [`CAPABILITIES`] only.
fn process(init: Vec<String>) -> Process {
    let caps: Vec<String> = CAPABILITIES.iter().map(|c| (*c).to_owned()).collect();
    Process {
        terminal: false,
        user: User { uid: 0, gid: 0 },
        args: init,
        env: BASE_ENV.iter().map(|e| (*e).to_owned()).collect(),
        cwd: "/".into(),
        no_new_privileges: true,
        capabilities: Capabilities {
            bounding: caps.clone(),
            effective: caps.clone(),
            permitted: caps,
            inheritable: Vec::new(),
            ambient: Vec::new(),
        },
    }
}

/// The guest's mounts: its own /proc, /dev, /sys and /tmp, then the host's read-only files,
/// the shared directories and the binds inside them, in that order.
fn mounts(b: &SandboxBundle<'_>) -> Vec<Mount> {
    let mut mounts = system_mounts();
    for (host, guest) in b.files {
        mounts.push(Mount::bind(
            host,
            guest,
            &["rbind", "ro", "nosuid", "nodev", "noexec"],
        ));
    }
    for (host, guest) in b.shared {
        mounts.push(Mount::bind(host, guest, &["rbind", "nosuid", "nodev"]));
    }
    for (host, guest, read_only) in b.sub_binds {
        let options: &[&str] = if *read_only {
            &["bind", "ro", "nosuid", "nodev"]
        } else {
            &["bind", "nosuid", "nodev"]
        };
        mounts.push(Mount::bind(host, guest, options));
    }
    mounts
}

/// The guest's own /proc, /dev (with pts, shm and mqueue), /sys and /tmp.
fn system_mounts() -> Vec<Mount> {
    vec![
        Mount::new("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"]),
        Mount::new(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        ),
        Mount::new(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        ),
        Mount::new(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        ),
        Mount::new(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        ),
        // No sysfs: the host's would show host devices and the bpffs and cgroup mount points,
        // and a fresh one cannot be mounted from the guest's user namespace. An empty,
        // read-only /sys keeps programs that probe it from failing oddly.
        Mount::new(
            "/sys",
            "tmpfs",
            "tmpfs",
            &["ro", "nosuid", "noexec", "nodev", "size=4k", "mode=555"],
        ),
        Mount::new("/tmp", "tmpfs", "tmpfs", &["nosuid", "nodev", "mode=1777"]),
    ]
}

/// The guest's namespaces, id maps, cgroup limits, hidden paths and seccomp filter.
fn linux(b: &SandboxBundle<'_>) -> Linux {
    let l = b.limits;
    Linux {
        uid_mappings: vec![b.uid_map],
        gid_mappings: vec![b.gid_map],
        namespaces: ["pid", "ipc", "uts", "mount", "user", "cgroup", "network"]
            .iter()
            .map(|k| Namespace { kind: k })
            .collect(),
        cgroups_path: b.cgroups_path.clone(),
        resources: Resources {
            memory: (l.memory_bytes > 0).then_some(Memory {
                limit: l.memory_bytes,
            }),
            pids: (l.pids_max > 0).then_some(Pids { limit: l.pids_max }),
            cpu: (l.cpu_millis > 0).then_some(Cpu {
                quota: l.cpu_millis * 100,
                period: 100_000,
            }),
        },
        masked_paths: MASKED_PATHS.iter().map(|p| (*p).to_owned()).collect(),
        readonly_paths: READONLY_PATHS.iter().map(|p| (*p).to_owned()).collect(),
        seccomp: seccomp::profile(),
        rootfs_propagation: "rprivate",
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub oci_version: &'static str,
    pub process: Process,
    pub root: Root,
    pub hostname: String,
    pub mounts: Vec<Mount>,
    pub linux: Linux,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Process {
    pub terminal: bool,
    pub user: User,
    pub args: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    pub no_new_privileges: bool,
    pub capabilities: Capabilities,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct Capabilities {
    pub bounding: Vec<String>,
    pub effective: Vec<String>,
    pub permitted: Vec<String>,
    pub inheritable: Vec<String>,
    pub ambient: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Root {
    pub path: String,
    pub readonly: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Mount {
    pub destination: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub source: String,
    pub options: Vec<String>,
}

impl Mount {
    fn new(destination: &str, kind: &str, source: &str, options: &[&str]) -> Self {
        Self {
            destination: destination.into(),
            kind: kind.into(),
            source: source.into(),
            options: options.iter().map(|o| (*o).to_owned()).collect(),
        }
    }

    /// A bind of host path `host` at guest path `guest`.
    fn bind(host: &std::path::Path, guest: &std::path::Path, options: &[&str]) -> Self {
        Self {
            destination: guest.display().to_string(),
            kind: "bind".into(),
            source: host.display().to_string(),
            options: options.iter().map(|o| (*o).to_owned()).collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Linux {
    pub uid_mappings: Vec<IdMapping>,
    pub gid_mappings: Vec<IdMapping>,
    pub namespaces: Vec<Namespace>,
    pub cgroups_path: String,
    pub resources: Resources,
    pub masked_paths: Vec<String>,
    pub readonly_paths: Vec<String>,
    pub seccomp: seccomp::Seccomp,
    pub rootfs_propagation: &'static str,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Namespace {
    #[serde(rename = "type")]
    pub kind: &'static str,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Resources {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids: Option<Pids>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Memory {
    pub limit: u64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Pids {
    pub limit: u64,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Cpu {
    pub quota: u64,
    pub period: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle() -> Spec {
        sandbox(&SandboxBundle {
            hostname: "dev",
            uid_map: IdMapping {
                container_id: 0,
                host_id: 200_000,
                size: 65536,
            },
            gid_map: IdMapping {
                container_id: 0,
                host_id: 200_000,
                size: 65536,
            },
            files: &[(
                PathBuf::from("/s/resolv.conf"),
                PathBuf::from("/etc/resolv.conf"),
            )],
            shared: &[(PathBuf::from("/s/live/0"), PathBuf::from("/workspace"))],
            sub_binds: &[
                (
                    PathBuf::from("/s/live/0/.git"),
                    PathBuf::from("/workspace/.git"),
                    false,
                ),
                (
                    PathBuf::from("/s/live/0/.git/config"),
                    PathBuf::from("/workspace/.git/config"),
                    true,
                ),
            ],
            init: vec!["/usr/bin/tini".into()],
            cgroups_path: "/svc/dev".into(),
            limits: Limits {
                memory_bytes: 1 << 30,
                pids_max: 512,
                cpu_millis: 1500,
            },
        })
    }

    #[test]
    fn a_sandbox_maps_root_to_the_unprivileged_range_and_gets_every_namespace() {
        let v = serde_json::to_value(bundle()).expect("serialises");
        assert_eq!(v["linux"]["uidMappings"][0]["hostID"], 200_000);
        assert_eq!(v["linux"]["uidMappings"][0]["containerID"], 0);
        let ns: Vec<&str> = v["linux"]["namespaces"]
            .as_array()
            .expect("namespaces")
            .iter()
            .filter_map(|n| n["type"].as_str())
            .collect();
        for k in ["user", "network", "pid", "mount", "ipc", "uts", "cgroup"] {
            assert!(ns.contains(&k), "{k} namespace missing: {ns:?}");
        }
        assert_eq!(v["process"]["noNewPrivileges"], true);
    }

    #[test]
    fn git_paths_are_bound_after_the_workspace_and_config_read_only() {
        let v = serde_json::to_value(bundle()).expect("json");
        let mounts = v["mounts"].as_array().expect("mounts");
        let at = |dest: &str| {
            mounts
                .iter()
                .position(|m| m["destination"] == dest)
                .unwrap_or_else(|| panic!("no mount at {dest}"))
        };
        assert!(at("/workspace") < at("/workspace/.git"));
        assert!(at("/workspace/.git") < at("/workspace/.git/config"));
        let opts = |dest: &str| mounts[at(dest)]["options"].to_string();
        assert!(opts("/workspace/.git/config").contains("\"ro\""));
        assert!(!opts("/workspace/.git").contains("\"ro\""));
    }

    #[test]
    fn no_capability_that_reaches_the_kernel_or_the_network_is_kept() {
        for forbidden in [
            "CAP_SYS_ADMIN",
            "CAP_NET_ADMIN",
            "CAP_NET_RAW",
            "CAP_BPF",
            "CAP_PERFMON",
            "CAP_SYS_PTRACE",
            "CAP_SYS_MODULE",
            "CAP_MKNOD",
            "CAP_SYS_RAWIO",
            "CAP_SYS_TIME",
            "CAP_SETFCAP",
        ] {
            assert!(!CAPABILITIES.contains(&forbidden), "{forbidden} is kept");
        }
    }

    #[test]
    fn limits_become_cgroup_resources_and_zero_means_none() {
        let v = serde_json::to_value(bundle()).expect("serialises");
        let r = &v["linux"]["resources"];
        assert_eq!(r["memory"]["limit"], 1u64 << 30);
        assert_eq!(r["pids"]["limit"], 512);
        assert_eq!(r["cpu"]["quota"], 150_000);
        assert_eq!(r["cpu"]["period"], 100_000);
        let mut none = bundle();
        none.linux.resources = Resources {
            memory: None,
            pids: None,
            cpu: None,
        };
        let v = serde_json::to_value(none).expect("serialises");
        assert_eq!(v["linux"]["resources"], serde_json::json!({}));
    }

    #[test]
    fn host_files_are_read_only_binds_and_sys_is_an_empty_read_only_tmpfs() {
        let v = serde_json::to_value(bundle()).expect("serialises");
        let mounts = v["mounts"].as_array().expect("mounts");
        let resolv = mounts
            .iter()
            .find(|m| m["destination"] == "/etc/resolv.conf")
            .expect("resolv.conf bind");
        let opts: Vec<&str> = resolv["options"]
            .as_array()
            .expect("options")
            .iter()
            .filter_map(|o| o.as_str())
            .collect();
        assert!(opts.contains(&"ro") && opts.contains(&"rbind"), "{opts:?}");
        let sys = mounts
            .iter()
            .find(|m| m["destination"] == "/sys")
            .expect("/sys");
        assert_eq!(sys["type"], "tmpfs");
        assert!(
            !mounts
                .iter()
                .any(|m| m["type"] == "sysfs" || m["type"] == "cgroup" || m["type"] == "bpf"),
            "no sysfs, cgroupfs or bpffs in the guest"
        );
    }
}
