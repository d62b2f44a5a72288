//! `[container]`: the container backend (the embedded default): its OCI runtime, image,
//! user range and cgroup, and what one sandbox may use.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{checks, defaults};

/// `[container]` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerFile {
    /// The OCI runtime binary: crun 1.21 or later, or runc 1.1 or later (a name is looked up
    /// on PATH); unset: the crun on PATH when it is 1.21 or later, else the package's
    /// `/usr/lib/svc/crun`, else runc.
    pub runtime: Option<PathBuf>,
    /// The base image: a directory holding `rootfs/` (made by `svcd images build`).
    pub image: Option<PathBuf>,
    /// The system user whose `/etc/subuid` and `/etc/subgid` range the guests' ids map to.
    pub user: Option<String>,
    /// The cgroup (relative to the hierarchy root) every sandbox's cgroup is made under.
    pub cgroup_parent: Option<String>,
    /// Memory limit per sandbox in MiB (0: no limit).
    pub memory_mib: Option<u64>,
    /// Process (task) limit per sandbox (0: no limit).
    pub pids_max: Option<u64>,
    /// CPU limit per sandbox, in CPUs (e.g. 1.5; 0: no limit).
    pub cpus: Option<f64>,
    /// Disk per sandbox in MiB: the size of its writable layer (an ext4 image of its own),
    /// and of a microvm guest's disk (0: no limit for containers, the image's size for VMs).
    pub disk_mib: Option<u64>,
    /// Where the guests' ids map: `per-sandbox` (the default: a 65,536-id slice of the user's
    /// range each) or `shared` (one range for every sandbox).
    pub id_ranges: Option<String>,
}

/// Where container guests' ids map on the host (`container.id_ranges`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IdRanges {
    /// Every sandbox's guest ids 0..65535 map to the same range: the user's first range of
    /// 65,536 ids (the base image is copied once, shifted into it).
    Shared,
    /// The default: sandbox id N's guest ids map to its own slice of the user's largest range:
    /// the range's start + N × 65,536 (the base image is mounted idmapped to each slice, never
    /// copied).
    #[default]
    PerSandbox,
}

impl IdRanges {
    /// The setting's spelling in svcd.toml.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shared => "shared",
            Self::PerSandbox => "per-sandbox",
        }
    }
}

/// The container backend's settings, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerConfig {
    /// `container.runtime`; none: the default (see [`ContainerFile::runtime`]).
    pub runtime: Option<PathBuf>,
    pub image: PathBuf,
    pub user: String,
    pub cgroup_parent: String,
    /// Bytes; 0: no limit.
    pub memory_bytes: u64,
    /// 0: no limit.
    pub pids_max: u64,
    /// Thousandths of a CPU; 0: no limit.
    pub cpu_millis: u64,
    /// The writable layer's size in MiB; 0: no limit (a directory on the state file system).
    pub disk_mib: u64,
    /// Where the guests' ids map.
    pub id_ranges: IdRanges,
}

/// The largest `container.disk_mib`: 16 TiB, ext4's file system limit with 4 KiB blocks.
const MAX_DISK_MIB: u64 = 16 << 20;

/// What one sandbox may use, as written (after defaults), checked.
struct Resources {
    memory_mib: u64,
    pids_max: u64,
    cpus: f64,
    disk_mib: u64,
}

impl ContainerFile {
    /// Check each key, reporting every error through `err`.
    pub(super) fn validate(self, err: &mut impl FnMut(&str, String)) -> ContainerConfig {
        let image = self
            .image
            .unwrap_or_else(|| PathBuf::from(defaults::CONTAINER_IMAGE));
        checks::check_absolute("container.image", &image, err);
        let user = self
            .user
            .unwrap_or_else(|| defaults::CONTAINER_USER.to_owned());
        if !checks::is_plain_name(&user) {
            err(
                "container.user",
                format!("expected a user name, got {user:?}"),
            );
        }
        let cgroup_parent = cgroup_parent(self.cgroup_parent, err);
        let r = resources(
            self.memory_mib,
            self.pids_max,
            self.cpus,
            self.disk_mib,
            err,
        );
        let id_ranges = match self.id_ranges.as_deref() {
            Some("shared") => IdRanges::Shared,
            None | Some("per-sandbox") => IdRanges::PerSandbox,
            Some(other) => {
                err(
                    "container.id_ranges",
                    format!("expected \"shared\" or \"per-sandbox\", got {other:?}"),
                );
                IdRanges::PerSandbox
            }
        };
        ContainerConfig {
            disk_mib: r.disk_mib,
            id_ranges,
            runtime: self.runtime,
            image,
            user,
            cgroup_parent,
            memory_bytes: r.memory_mib.saturating_mul(1024 * 1024),
            pids_max: r.pids_max,
            cpu_millis: cpu_millis(r.cpus),
        }
    }
}

/// A relative cgroup path of plain components.
fn cgroup_parent(value: Option<String>, err: &mut impl FnMut(&str, String)) -> String {
    let cgroup_parent = value.unwrap_or_else(|| defaults::CGROUP_PARENT.to_owned());
    if cgroup_parent.is_empty()
        || cgroup_parent.starts_with('/')
        || cgroup_parent
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        || !cgroup_parent
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./".contains(&b))
    {
        err(
            "container.cgroup_parent",
            format!(
                "expected a relative cgroup path of letters, digits, '-', '_' and '.' such as \
                 {:?}, got {cgroup_parent:?}",
                defaults::CGROUP_PARENT
            ),
        );
    }
    cgroup_parent
}

/// Memory, tasks, CPUs and disk, each 0 (no limit) or within its range.
fn resources(
    memory_mib: Option<u64>,
    pids_max: Option<u64>,
    cpus: Option<f64>,
    disk_mib: Option<u64>,
    err: &mut impl FnMut(&str, String),
) -> Resources {
    let memory_mib = memory_mib.unwrap_or(defaults::MEMORY_MIB);
    if memory_mib != 0 && memory_mib < 64 {
        err(
            "container.memory_mib",
            format!("expected 0 (no limit) or at least 64 MiB, got {memory_mib}"),
        );
    }
    let pids_max = pids_max.unwrap_or(defaults::PIDS_MAX);
    if pids_max != 0 && pids_max < 16 {
        err(
            "container.pids_max",
            format!("expected 0 (no limit) or at least 16, got {pids_max}"),
        );
    }
    let cpus = cpus.unwrap_or(defaults::CPUS);
    if !cpus.is_finite() || !(cpus == 0.0 || (0.01..=4096.0).contains(&cpus)) {
        err(
            "container.cpus",
            format!("expected 0 (no limit) or a number of CPUs from 0.01, got {cpus}"),
        );
    }
    let disk_mib = disk_mib.unwrap_or(defaults::DISK_MIB);
    if disk_mib != 0 && !(64..=MAX_DISK_MIB).contains(&disk_mib) {
        err(
            "container.disk_mib",
            format!(
                "expected 0 (no limit) or 64 MiB to {MAX_DISK_MIB} MiB (16 TiB), got {disk_mib}"
            ),
        );
    }
    Resources {
        memory_mib,
        pids_max,
        cpus,
        disk_mib,
    }
}

/// CPUs as thousandths of a CPU (0 for a value the checks refused).
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "checked in `resources`: finite, 0 or 0.01..=4096"
)]
fn cpu_millis(cpus: f64) -> u64 {
    if cpus.is_finite() && cpus >= 0.0 {
        (cpus * 1000.0).round() as u64
    } else {
        0
    }
}
