//! A guest's host process as svcd watches it: its start time (so a reused pid is never
//! mistaken for it), whether it died, and waiting for it to go.

/// `/proc/PID/stat` field 22 (start time), if the process exists.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether process `pid` has exited and waits to be reaped (state `Z` or `X`).
pub fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X")
    })
}

/// Wait until process `pid` (started at `start`) is gone or dead (a zombie waiting for the
/// host's init to reap it); whether it went in time.
pub(crate) async fn gone_within(pid: u32, start: u64, limit: std::time::Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while start_time(pid) == Some(start) && !is_zombie(pid) {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    true
}
