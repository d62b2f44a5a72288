//! Egress modes and AllowAll windows.
//!
//! Curated iff AllowedHosts is non-empty; AllowAll iff empty. AllowAll is time-boxed: 24 hours
//! for builder VMs, 72 hours for `--file`/`--context-path` sandboxes, counted from the later of
//! the sandbox's start and the supervisor's start, so a supervisor restart resets the window
//! (intentional). When the window ends the sandbox falls back to Curated with the
//! built-in agent hosts only: the fence closes, nothing new is opened. AllowAll has no proxy
//! and no credential seeding.

use std::time::{Duration, SystemTime};

use serde::Serialize;

/// The two modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EgressMode {
    Curated,
    AllowAll,
}

/// What kind of sandbox asked for AllowAll.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllowAllKind {
    /// Builder VMs: 24 hours.
    Builder,
    /// Sandboxes created with `--file` / `--context-path`: 72 hours.
    ContextPath,
}

impl AllowAllKind {
    /// The window an AllowAll sandbox gets at creation: 72 hours when created for a context
    /// path (`--file` / `--context-path`), else the builder's 24 hours.
    pub const fn for_creation(context_path: bool) -> Self {
        if context_path {
            Self::ContextPath
        } else {
            Self::Builder
        }
    }

    pub const fn window(self) -> Duration {
        match self {
            Self::Builder => Duration::from_secs(24 * 3600),
            Self::ContextPath => Duration::from_secs(72 * 3600),
        }
    }
}

/// Curated iff the allowlist is non-empty.
pub const fn mode_for(allowed_hosts_empty: bool) -> EgressMode {
    if allowed_hosts_empty {
        EgressMode::AllowAll
    } else {
        EgressMode::Curated
    }
}

/// The mode in force now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ModeNow {
    pub mode: EgressMode,
    /// When an AllowAll window ends (`None` for Curated).
    pub window_ends: Option<SystemTime>,
    /// The window has ended and the sandbox fell back to Curated with the agent hosts.
    pub expired: bool,
    pub proxy: bool,
    pub seed_credentials: bool,
}

/// Decide the mode in force at `now`.
pub fn mode_now(
    allowed_hosts_empty: bool,
    kind: Option<AllowAllKind>,
    sandbox_started: SystemTime,
    supervisor_started: SystemTime,
    now: SystemTime,
) -> ModeNow {
    let curated = ModeNow {
        mode: EgressMode::Curated,
        window_ends: None,
        expired: false,
        proxy: true,
        seed_credentials: true,
    };
    if !allowed_hosts_empty {
        return curated;
    }
    let window = kind.unwrap_or(AllowAllKind::ContextPath).window();
    let start = sandbox_started.max(supervisor_started);
    let ends = start + window;
    if now >= ends {
        return ModeNow {
            expired: true,
            ..curated
        };
    }
    ModeNow {
        mode: EgressMode::AllowAll,
        window_ends: Some(ends),
        expired: false,
        proxy: false,
        seed_credentials: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Duration = Duration::from_secs(3600);

    #[test]
    fn creation_picks_the_window() {
        assert_eq!(AllowAllKind::for_creation(true).window(), 72 * H);
        assert_eq!(AllowAllKind::for_creation(false).window(), 24 * H);
    }

    #[test]
    fn mode_cases() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        struct Case {
            name: &'static str,
            empty: bool,
            kind: Option<AllowAllKind>,
            sandbox: SystemTime,
            supervisor: SystemTime,
            now: SystemTime,
            mode: EgressMode,
            expired: bool,
        }
        let cases = [
            Case {
                name: "non_empty_is_curated",
                empty: false,
                kind: None,
                sandbox: t0,
                supervisor: t0,
                now: t0,
                mode: EgressMode::Curated,
                expired: false,
            },
            Case {
                name: "empty_is_allow_all",
                empty: true,
                kind: Some(AllowAllKind::ContextPath),
                sandbox: t0,
                supervisor: t0,
                now: t0 + H,
                mode: EgressMode::AllowAll,
                expired: false,
            },
            Case {
                name: "context_path_open_at_71h",
                empty: true,
                kind: Some(AllowAllKind::ContextPath),
                sandbox: t0,
                supervisor: t0,
                now: t0 + 71 * H,
                mode: EgressMode::AllowAll,
                expired: false,
            },
            Case {
                name: "context_path_closed_at_72h",
                empty: true,
                kind: Some(AllowAllKind::ContextPath),
                sandbox: t0,
                supervisor: t0,
                now: t0 + 72 * H,
                mode: EgressMode::Curated,
                expired: true,
            },
            Case {
                name: "builder_open_at_23h",
                empty: true,
                kind: Some(AllowAllKind::Builder),
                sandbox: t0,
                supervisor: t0,
                now: t0 + 23 * H,
                mode: EgressMode::AllowAll,
                expired: false,
            },
            Case {
                name: "builder_closed_at_24h",
                empty: true,
                kind: Some(AllowAllKind::Builder),
                sandbox: t0,
                supervisor: t0,
                now: t0 + 24 * H,
                mode: EgressMode::Curated,
                expired: true,
            },
            Case {
                name: "supervisor_restart_resets_window",
                empty: true,
                kind: Some(AllowAllKind::Builder),
                sandbox: t0,
                supervisor: t0 + 20 * H,
                now: t0 + 30 * H,
                mode: EgressMode::AllowAll,
                expired: false,
            },
            Case {
                name: "restart_window_also_ends",
                empty: true,
                kind: Some(AllowAllKind::Builder),
                sandbox: t0,
                supervisor: t0 + 20 * H,
                now: t0 + 44 * H,
                mode: EgressMode::Curated,
                expired: true,
            },
        ];
        for c in cases {
            let m = mode_now(c.empty, c.kind, c.sandbox, c.supervisor, c.now);
            assert_eq!(m.mode, c.mode, "{}", c.name);
            assert_eq!(m.expired, c.expired, "{}", c.name);
            assert_eq!(
                m.proxy,
                c.mode == EgressMode::Curated,
                "{}: proxy only in Curated",
                c.name
            );
            assert_eq!(
                m.seed_credentials,
                c.mode == EgressMode::Curated,
                "{}: seeding only in Curated",
                c.name
            );
        }
    }
}
