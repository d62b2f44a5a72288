//! Workspaces: the decisions of a workspace's lifecycle that need no sandbox — how a hook or
//! check runs under the guest's `timeout` and how its end reads, and which services make a
//! workspace ready. svcd's runner (`daemon/supervisor/workspace*.rs`, `spotlight.rs`) drives
//! them through the sandbox's exec and its events; it lives in the daemon because it needs
//! the supervisor's live sandboxes, and is documented in docs/workspaces.md.

pub mod readiness;

use std::time::Duration;

/// Seconds coreutils' `timeout` waits after its SIGTERM before SIGKILL.
pub const KILL_AFTER_S: u32 = 5;

/// `argv` run under coreutils' `timeout` in the guest: in a process group of its own, SIGTERM
/// to all of it at `timeout_ms`, SIGKILL [`KILL_AFTER_S`] later.
pub fn under_guest_timeout(timeout_ms: u64, argv: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = vec![
        "timeout".to_owned(),
        format!("--kill-after={KILL_AFTER_S}"),
        format!("{}.{:03}", timeout_ms / 1000, timeout_ms % 1000),
    ];
    out.extend(argv);
    out
}

/// Whether a command run by [`under_guest_timeout`] that exited with `code` after `elapsed`
/// was ended by its timeout (`timeout` answers 124 after its SIGTERM, 137 after its SIGKILL;
/// the same codes earlier are the command's own).
pub fn timed_out(code: i32, elapsed: Duration, timeout_ms: u64) -> bool {
    matches!(code, 124 | 137) && elapsed >= Duration::from_millis(timeout_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_timeout_wraps_the_command() {
        assert_eq!(
            under_guest_timeout(1500, ["sh".into(), "-c".into(), "x".into()]),
            ["timeout", "--kill-after=5", "1.500", "sh", "-c", "x"]
        );
        assert_eq!(under_guest_timeout(600_000, [])[2], "600.000");
    }

    #[test]
    fn timed_out_cases() {
        let ms = Duration::from_millis;
        for (name, code, elapsed, want) in [
            ("term_at_the_timeout", 124, ms(1000), true),
            ("kill_after_it", 137, ms(6000), true),
            ("own_124_early", 124, ms(10), false),
            ("own_137_early", 137, ms(999), false),
            ("failed_late", 1, ms(5000), false),
        ] {
            assert_eq!(timed_out(code, elapsed, 1000), want, "{name}");
        }
    }
}
