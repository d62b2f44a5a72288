//! `GET /v1/sandboxes/{name}/stats`: what a sandbox uses, by the host's accounting (its
//! cgroups), and its processes as the host sees them.

use serde::{Deserialize, Serialize};

/// A sandbox's resource figures now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxStats {
    pub name: String,
    pub backend: String,
    /// `running`, `paused` (frozen) or `dead`.
    pub state: String,
    /// What the figures are of, in words: the sandbox's cgroup (container), or the VM's
    /// memory cgroup and QEMU's process (microvm).
    pub scope: String,
    /// The cgroup the memory figures are read from (its path in the hierarchy).
    pub cgroup: String,
    /// CPU time used since the sandbox started, in nanoseconds.
    pub cpu_ns: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_user_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_system_ns: Option<u64>,
    pub memory_bytes: u64,
    /// None: no limit.
    pub memory_limit_bytes: Option<u64>,
    /// Processes (tasks) counted by the pids controller; none where none counts them.
    pub pids_current: Option<u64>,
    /// None: no limit.
    pub pids_limit: Option<u64>,
    /// The host pids of the sandbox's processes (a microvm: its QEMU).
    pub pids: Vec<u32>,
}
