//! An OCI runtime's `exec` that could not start its command, told apart from a command that
//! ran: the runtime wrote no pid file and ended with its own failure status. Its status then
//! says why, as a shell says it (127 not found, 126 cannot be run), read from the runtime's
//! JSON log.

use std::path::Path;

/// The status the OCI runtime's `exec` ends with when it could not start the command.
const RUNTIME_FAILED: i32 = 255;

/// When the runtime's exec ended with `code` without starting the command (no `pid_file`),
/// the status that says why: 127 the command was not found, 126 it cannot be run (not
/// executable, permission denied, no such working directory), 125 the runtime failed
/// otherwise; the reason is the last error of `log`. `None`: the command ran, and `code` is
/// its own.
pub(super) fn status(pid_file: &Path, log: &Path, code: i32) -> Option<i32> {
    if code != RUNTIME_FAILED || pid_file.exists() {
        return None;
    }
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let message = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["level"] == "error" || v["level"] == "fatal")
        .filter_map(|v| v["msg"].as_str().map(str::to_owned))
        .next_back()
        .unwrap_or_default();
    Some(from_message(&message))
}

/// The status for an exec the runtime could not start, from its error `message` (runc:
/// `exec failed: unable to start container process: exec: "NAME": executable file not found
/// in $PATH`; crun: `executable file `NAME` not found in $PATH: No such file or directory`).
fn from_message(message: &str) -> i32 {
    if let Some(code) = from_crun_message(message) {
        return code;
    }
    let Some((_, why)) = message.split_once("unable to start container process: ") else {
        return 125;
    };
    let not_found =
        why.contains("executable file not found") || why.contains("no such file or directory");
    if why.starts_with("exec: ") && not_found {
        127
    } else {
        126
    }
}

/// crun's messages (`find_executable` and the working directory's `chdir`), if `message` is
/// one.
fn from_crun_message(message: &str) -> Option<i32> {
    if message.starts_with("executable file `") && message.contains("` not found") {
        return Some(127);
    }
    ["the path `", "cannot open `", "chdir to `"]
        .iter()
        .any(|p| message.starts_with(p))
        .then_some(126)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_runtime_that_could_not_start_the_command_says_not_found_or_cannot_run() {
        let start = "exec failed: unable to start container process: ";
        for (why, code) in [
            (r#"exec: "nope": executable file not found in $PATH"#, 127),
            (
                r#"exec: "/nope/x": stat /nope/x: no such file or directory"#,
                127,
            ),
            (r#"exec: "/etc/passwd": permission denied"#, 126),
            (
                r#"chdir to cwd ("/nope") set in config.json failed: no such file or directory"#,
                126,
            ),
        ] {
            assert_eq!(from_message(&format!("{start}{why}")), code, "{why}");
        }
        for (crun, code) in [
            (
                "executable file `nope` not found in $PATH: No such file or directory",
                127,
            ),
            (
                "executable file `/nope/x` not found: No such file or directory",
                127,
            ),
            (
                "the path `/etc/passwd` exists but it is not executable: Operation not permitted",
                126,
            ),
            ("chdir to `/nope`: No such file or directory", 126),
        ] {
            assert_eq!(from_message(crun), code, "{crun}");
        }
        assert_eq!(from_message("exec failed: container does not exist"), 125);
        assert_eq!(from_message(""), 125);
    }

    #[test]
    fn a_command_that_ran_keeps_its_own_status() {
        let dir = std::env::temp_dir().join(format!("svc-not-started-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tempdir");
        let (pid, log) = (dir.join("pid"), dir.join("log"));
        std::fs::write(
            &log,
            "{\"level\":\"error\",\"msg\":\"exec failed: unable to start container process: \
             exec: \\\"x\\\": executable file not found in $PATH\"}\n",
        )
        .expect("log");
        assert_eq!(
            status(&pid, &log, 255),
            Some(127),
            "no pid file: not started"
        );
        assert_eq!(
            status(&pid, &log, 3),
            None,
            "not the runtime's failure status"
        );
        std::fs::write(&pid, "42").expect("pid");
        assert_eq!(status(&pid, &log, 255), None, "it ran, and ended with 255");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
