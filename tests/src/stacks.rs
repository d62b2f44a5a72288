//! What a hung test says about the processes it waited on: each thread's stack, from gdb
//! (`thread apply all bt`), cut to the frames of our own code and of the locks and channels
//! they wait on. A test that times out calling the shim or svcd prints it before it fails, so
//! a hang seen once in CI names where it stood.

use std::{path::Path, process::Command};

/// The most lines one process's report keeps.
const MOST_LINES: usize = 160;

/// The most frames kept of one thread: where it waits, and what of ours called it.
const FRAMES_PER_THREAD: usize = 5;

/// The stacks of every running process whose executable is named `exe` and whose command line
/// holds `mark` (a socket or directory of the test's own world, so another test's processes
/// are not shown): a report of them, or why there is none.
pub fn of_processes(exe: &str, mark: &Path) -> String {
    let mark = mark.display().to_string();
    let mut report = String::new();
    for pid in pids_of(exe, &mark) {
        report.push_str(&format!("--- {exe} pid {pid}: its threads' stacks\n"));
        report.push_str(&of_pid(pid));
    }
    if report.is_empty() {
        report = format!("(no running {exe} holding {mark} in its command line)\n");
    }
    report
}

fn pids_of(exe: &str, mark: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|pid: &u32| {
            let named = std::fs::read_link(format!("/proc/{pid}/exe"))
                .is_ok_and(|p| p.file_name().is_some_and(|n| n == exe));
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            named && String::from_utf8_lossy(&cmdline).contains(mark)
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// Process `pid`'s threads' stacks, cut to what says where each waits.
fn of_pid(pid: u32) -> String {
    let out = Command::new("timeout")
        .args(["60", "gdb", "-p", &pid.to_string(), "-batch", "-nx"])
        .args(["-ex", "set pagination off", "-ex", "thread apply all bt 40"])
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => return format!("(gdb: {e})\n"),
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let kept = cut(&text);
    if kept.is_empty() {
        return format!(
            "(gdb gave no stacks: {})\n",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    kept
}

/// From gdb's `thread apply all bt`: each thread's line and its first [`FRAMES_PER_THREAD`]
/// frames of our crates or of what blocks (locks, condition variables, channels, reads,
/// polls), at most [`MOST_LINES`] lines.
fn cut(bt: &str) -> String {
    const TELLING: [&str; 11] = [
        "svc_",
        "containerd_shim",
        "ttrpc",
        "Mutex",
        "Condvar",
        "mpsc",
        "::wait",
        "::read",
        "::recv",
        "poll",
        "::park",
    ];
    let mut lines = Vec::new();
    let mut frames = 0;
    for l in bt.lines() {
        if l.starts_with("Thread ") {
            frames = 0;
        } else if l.starts_with('#') && TELLING.iter().any(|t| l.contains(t)) {
            frames += 1;
            if frames > FRAMES_PER_THREAD {
                continue;
            }
        } else {
            continue;
        }
        lines.push(l.get(..l.len().min(220)).unwrap_or(l));
    }
    let mut kept = String::new();
    for l in lines.iter().take(MOST_LINES) {
        kept.push_str(l);
        kept.push('\n');
    }
    if lines.len() > MOST_LINES {
        kept.push_str(&format!("({} more lines)\n", lines.len() - MOST_LINES));
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::cut;

    #[test]
    fn a_backtrace_is_cut_to_its_threads_and_telling_frames() {
        let bt = "[New LWP 12]\n\
                  Thread 2 (Thread 0x7f (LWP 12) \"shim\"):\n\
                  #0  0x1 in syscall () from libc.so.6\n\
                  #1  0x2 in std::sys::sync::condvar::futex::Condvar::wait ()\n\
                  #2  0x3 in containerd_shim_svc_v1::process::Proc::wait ()\n\
                  #3  0x4 in core::ops::function::FnOnce::call_once ()\n\
                  Thread 1 (Thread 0x7e (LWP 11) \"shim\"):\n\
                  #0  0x5 in svc_a ()\n#1  0x5 in svc_b ()\n#2  0x5 in svc_c ()\n\
                  #3  0x5 in svc_d ()\n#4  0x5 in svc_e ()\n#5  0x5 in svc_f ()\n";
        assert_eq!(
            cut(bt),
            "Thread 2 (Thread 0x7f (LWP 12) \"shim\"):\n\
             #1  0x2 in std::sys::sync::condvar::futex::Condvar::wait ()\n\
             #2  0x3 in containerd_shim_svc_v1::process::Proc::wait ()\n\
             Thread 1 (Thread 0x7e (LWP 11) \"shim\"):\n\
             #0  0x5 in svc_a ()\n#1  0x5 in svc_b ()\n#2  0x5 in svc_c ()\n\
             #3  0x5 in svc_d ()\n#4  0x5 in svc_e ()\n"
        );
    }

    #[test]
    fn a_long_report_says_what_it_left_out() {
        let bt: String = (0..200).map(|i| format!("Thread {i} (x):\n")).collect();
        let kept = cut(&bt);
        assert_eq!(kept.lines().count(), super::MOST_LINES + 1);
        assert!(kept.ends_with("(40 more lines)\n"), "{kept}");
    }
}
