//! Seccomp filters on a helper svcd starts (virtiofsd): installed in the child between fork
//! and exec, so the program runs under them from its first instruction and cannot take them
//! off (filters only ever add up; its own filter stacks on top).

use std::sync::Arc;

/// One compiled classic-BPF seccomp program.
pub type Program = seccompiler::BpfProgram;

/// Make `cmd`'s child install each of `programs` (in order) before it executes; the spawn
/// fails if one cannot be installed.
pub fn install_before_exec(cmd: &mut tokio::process::Command, programs: Arc<Vec<Program>>) {
    // SAFETY: the closure runs in the forked child of a possibly multi-threaded svcd, where
    // only async-signal-safe work is allowed: it makes two system calls per program (prctl
    // NO_NEW_PRIVS and seccomp) over memory prepared before the fork, and allocates nothing
    // (on failure it reads errno into an `io::Error`, which does not allocate).
    unsafe {
        cmd.pre_exec(move || {
            for p in programs.iter() {
                if seccompiler::apply_filter(p).is_err() {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
}
