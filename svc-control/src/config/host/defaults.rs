//! Defaults of every key of svcd.toml (documented in `docs/host-config.md`).

pub const STATE_DIR: &str = "/var/lib/svc";
pub const SOCKET: &str = "/run/svc/svcd.sock";
pub const PIN_DIR: &str = "/sys/fs/bpf/svc";
pub const AUDIT_DIR: &str = "/var/log/svc";
pub const API_GROUP: &str = "svc";
pub const IPV4_POOL: &str = "10.203.0.0/16";
pub const IPV6_POOL: &str = "fd73:7663:7663::/48";
pub const AGENT_HOSTS: [&str; 2] = ["api.anthropic.com", "console.anthropic.com"];
pub const CODE_HOST: &str = "github.com";
pub const CODE_API_HOST: &str = "api.github.com";
pub const CODE_UPLOADS_HOST: &str = "uploads.github.com";
pub const CODE_ARCHIVE_HOST: &str = "codeload.github.com";
pub const RESOLV_CONF: &str = "/etc/resolv.conf";
pub const GUARD_PORT: u16 = 15353;
pub const PROXY_PORT: u16 = 15443;
pub const CONTAINER_IMAGE: &str = "/var/lib/svc/images/base";
pub const CONTAINER_USER: &str = "svc-sandbox";
pub const MICROVM_USER: &str = "svc-vm";
pub const CGROUP_PARENT: &str = "svc";
pub const MEMORY_MIB: u64 = 4096;
pub const MICROVM_MEMORY_MIB: u64 = 512;
pub const MICROVM_OVERHEAD_MIB: u64 = 256;
pub const PIDS_MAX: u64 = 4096;
/// Disk per sandbox: 10 GiB.
pub const DISK_MIB: u64 = 10 * 1024;
pub const CPUS: f64 = 2.0;
pub const KEY_FILE: &str = "/etc/svc/secrets.key";
pub const CODE_HOST_CLI: &str = "gh";
/// The credential guardian's poll interval (once per minute).
pub const REFRESH_POLL_SECS: u64 = 60;
/// The credential guardian's refresh lead time (30 minutes before expiry).
pub const REFRESH_LEAD_SECS: u64 = 1800;
pub const GIT_SSH: &str = "/usr/bin/ssh";
pub const GIT_SSH_KNOWN_HOSTS: &str = "/etc/svc/known_hosts";
/// The audit file's size at which it is rotated, in MiB.
pub const AUDIT_MAX_MIB: u64 = 256;
/// Rotated audit files kept beside it.
pub const AUDIT_KEEP: u32 = 1;
