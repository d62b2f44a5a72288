//! `[limits]`: what one guest (one sandbox) may hold open in svcd at once, per channel it can
//! open. The defaults fit 1,000 sandboxes in the shipped unit's `LimitNOFILE=1048576`; the
//! arithmetic is in `docs/host-config.md`.

use serde::{Deserialize, Serialize};

/// The table as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsFile {
    /// DNS-over-TCP connections to the guard.
    pub dns_tcp_connections: Option<u32>,
    /// Guest connections to the proxy (TLS and plain HTTP), upgraded WebSockets included.
    pub proxy_connections: Option<u32>,
    /// Requests the proxy reads and decides at once for one sandbox (each may hold a body
    /// prefix of up to 64 KiB while it does; HTTP/2 multiplexes many on one connection).
    pub proxy_requests: Option<u32>,
    /// Exec streams (`svc sandbox exec`, the API's exec).
    pub exec_streams: Option<u32>,
    /// Spotlight (forwarded port) connections.
    pub spotlight_streams: Option<u32>,
    /// Git sessions through the SSH relay (also `[git_ssh] max_sessions`).
    pub git_ssh_sessions: Option<u32>,
    /// Audit records one sandbox may have written a second, on average (its DNS questions,
    /// HTTPS requests, relay sessions and dropped packets); the rest are counted, not written.
    pub audit_records_per_sec: Option<u32>,
    /// How many records above that rate a sandbox may have written at once.
    pub audit_burst: Option<u32>,
    /// Seconds between two log lines about the same sandbox at the same limit.
    pub log_interval_secs: Option<u64>,
}

/// Defaults of the table's keys.
pub mod defaults {
    pub const DNS_TCP_CONNECTIONS: u32 = 16;
    pub const PROXY_CONNECTIONS: u32 = 192;
    pub const PROXY_REQUESTS: u32 = 128;
    pub const EXEC_STREAMS: u32 = 32;
    pub const SPOTLIGHT_STREAMS: u32 = 16;
    pub const GIT_SSH_SESSIONS: u32 = 8;
    pub const AUDIT_RECORDS_PER_SEC: u32 = 50;
    pub const AUDIT_BURST: u32 = 2_000;
    pub const LOG_INTERVAL_SECS: u64 = 60;
}

/// The per-guest caps, validated: each at least 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LimitsConfig {
    pub dns_tcp_connections: u32,
    pub proxy_connections: u32,
    pub proxy_requests: u32,
    pub exec_streams: u32,
    pub spotlight_streams: u32,
    pub git_ssh_sessions: u32,
    pub audit_records_per_sec: u32,
    pub audit_burst: u32,
    pub log_interval: std::time::Duration,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            dns_tcp_connections: defaults::DNS_TCP_CONNECTIONS,
            proxy_connections: defaults::PROXY_CONNECTIONS,
            proxy_requests: defaults::PROXY_REQUESTS,
            exec_streams: defaults::EXEC_STREAMS,
            spotlight_streams: defaults::SPOTLIGHT_STREAMS,
            git_ssh_sessions: defaults::GIT_SSH_SESSIONS,
            audit_records_per_sec: defaults::AUDIT_RECORDS_PER_SEC,
            audit_burst: defaults::AUDIT_BURST,
            log_interval: std::time::Duration::from_secs(defaults::LOG_INTERVAL_SECS),
        }
    }
}

/// Most of any one channel a sandbox may hold (a guard against a typo that would let one
/// sandbox hold the host's descriptors).
const MAX_CAP: u32 = 65_536;
/// Most relay sessions (each is an ssh process on the host).
const MAX_GIT_SSH_SESSIONS: u32 = 256;
/// Most audit records a second, and at once, one sandbox may be allowed.
const MAX_AUDIT_RATE: u32 = 100_000;
const MAX_AUDIT_BURST: u32 = 10_000_000;

impl LimitsFile {
    /// Validate `[limits]`; `legacy_git_ssh` is `[git_ssh] max_sessions`, the older spelling
    /// of `git_ssh_sessions` (both may be given only with the same value).
    pub(super) fn validate(
        self,
        legacy_git_ssh: Option<u32>,
        err: &mut impl FnMut(&str, String),
    ) -> LimitsConfig {
        // The older name counts only when the new one is absent; both, differing, is an error.
        let conflict = self
            .git_ssh_sessions
            .zip(legacy_git_ssh)
            .filter(|(new, old)| new != old);
        let limits = self.caps(legacy_git_ssh, err);
        if let Some((new, old)) = conflict {
            err(
                "limits.git_ssh_sessions",
                format!(
                    "{new} differs from git_ssh.max_sessions = {old} (the older name of this \
                     key): set one of them"
                ),
            );
        }
        limits.check_together(err);
        limits
    }

    /// Each cap within its range (`git_ssh_sessions` first, under the name it was given).
    fn caps(
        &self,
        legacy_git_ssh: Option<u32>,
        err: &mut impl FnMut(&str, String),
    ) -> LimitsConfig {
        let (git_ssh_key, git_ssh_value) = match self.git_ssh_sessions {
            Some(v) => ("limits.git_ssh_sessions", Some(v)),
            None => ("git_ssh.max_sessions", legacy_git_ssh),
        };
        let mut cap = |key: &str, value: Option<u32>, default: u32, max: u32| -> u32 {
            let v = value.unwrap_or(default);
            if !(1..=max).contains(&v) {
                err(key, format!("expected 1 to {max}, got {v}"));
            }
            v
        };
        let git_ssh_sessions = cap(
            git_ssh_key,
            git_ssh_value,
            defaults::GIT_SSH_SESSIONS,
            MAX_GIT_SSH_SESSIONS,
        );
        LimitsConfig {
            dns_tcp_connections: cap(
                "limits.dns_tcp_connections",
                self.dns_tcp_connections,
                defaults::DNS_TCP_CONNECTIONS,
                MAX_CAP,
            ),
            proxy_connections: cap(
                "limits.proxy_connections",
                self.proxy_connections,
                defaults::PROXY_CONNECTIONS,
                MAX_CAP,
            ),
            proxy_requests: cap(
                "limits.proxy_requests",
                self.proxy_requests,
                defaults::PROXY_REQUESTS,
                MAX_CAP,
            ),
            exec_streams: cap(
                "limits.exec_streams",
                self.exec_streams,
                defaults::EXEC_STREAMS,
                MAX_CAP,
            ),
            spotlight_streams: cap(
                "limits.spotlight_streams",
                self.spotlight_streams,
                defaults::SPOTLIGHT_STREAMS,
                MAX_CAP,
            ),
            git_ssh_sessions,
            audit_records_per_sec: cap(
                "limits.audit_records_per_sec",
                self.audit_records_per_sec,
                defaults::AUDIT_RECORDS_PER_SEC,
                MAX_AUDIT_RATE,
            ),
            audit_burst: cap(
                "limits.audit_burst",
                self.audit_burst,
                defaults::AUDIT_BURST,
                MAX_AUDIT_BURST,
            ),
            log_interval: std::time::Duration::from_secs(
                self.log_interval_secs
                    .unwrap_or(defaults::LOG_INTERVAL_SECS),
            ),
        }
    }
}

impl LimitsConfig {
    /// The rules between keys: a burst holds at least a second's records; the log interval
    /// is 1 s to a day.
    fn check_together(&self, err: &mut impl FnMut(&str, String)) {
        if self.audit_burst < self.audit_records_per_sec {
            err(
                "limits.audit_burst",
                format!(
                    "{} is less than limits.audit_records_per_sec = {} (a burst holds at least \
                     one second's records)",
                    self.audit_burst, self.audit_records_per_sec
                ),
            );
        }
        if !(1..=86_400).contains(&self.log_interval.as_secs()) {
            err(
                "limits.log_interval_secs",
                format!(
                    "expected 1 to 86400 seconds, got {}",
                    self.log_interval.as_secs()
                ),
            );
        }
    }
}
