//! Running a command in a container guest: `runc exec`, its pid file naming the guest's
//! process (to kill the command itself, not only runc), on pipes or on a terminal of svcd's.

use std::process::Stdio;

use super::Container;
use crate::runtime::{ExecHandle, GuestCommand, GuestHandle, GuestProcess, RuntimeError};

impl Container {
    /// Run `cmd` in `guest` (checked to be running).
    pub(super) fn exec_in(
        &self,
        guest: &GuestHandle,
        cmd: &GuestCommand,
    ) -> Result<ExecHandle, RuntimeError> {
        let Some(first) = cmd.argv.first() else {
            return Err(RuntimeError::Exec("no command given".into()));
        };
        if first.is_empty() {
            return Err(RuntimeError::Exec("the command name is empty".into()));
        }
        // Which guest process the command is, so that ending it kills the command and not
        // only the runtime's exec; and the runtime's own errors, to tell a command it could not
        // start (127, 126) from one that ran.
        static EXECS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = EXECS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let process = GuestProcess {
            pid_file: self.execs.join(format!("{}.{n}.pid", guest.name)),
            init: guest.pid,
            log: self.execs.join(format!("{}.{n}.log", guest.name)),
        };
        let mut c = self.runc();
        c.arg("--log")
            .arg(&process.log)
            .arg("--log-format")
            .arg("json")
            .arg("exec")
            .arg("--cwd")
            .arg(cmd.cwd.as_deref().unwrap_or("/"));
        for (k, v) in &cmd.env {
            c.arg("--env").arg(format!("{k}={v}"));
        }
        if cmd.tty.is_some() {
            c.arg("--tty");
        }
        c.arg("--pid-file").arg(&process.pid_file);
        c.arg(&guest.name).args(&cmd.argv).env_clear();
        match cmd.tty {
            None => on_pipes(c, cmd.stdin, process),
            Some((rows, cols)) => on_terminal(c, (rows, cols), process),
        }
    }
}

fn fail(m: String) -> RuntimeError {
    RuntimeError::Exec(m)
}

/// Run the exec on pipes (standard input only when `stdin`).
fn on_pipes(
    mut c: tokio::process::Command,
    stdin: bool,
    process: GuestProcess,
) -> Result<ExecHandle, RuntimeError> {
    c.stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = c
        .spawn()
        .map_err(|e| fail(format!("running runc exec: {e}")))?;
    Ok(ExecHandle::from_child(child, Some(process)))
}

/// Run the exec on a terminal of `size` (rows, columns). runc makes the command's terminal
/// inside the container and copies between it and its own standard streams: give it a
/// terminal of svcd's (of the caller's size) whose master end carries the caller's bytes.
fn on_terminal(
    mut c: tokio::process::Command,
    (rows, cols): (u16, u16),
    process: GuestProcess,
) -> Result<ExecHandle, RuntimeError> {
    let pty = nix::pty::openpty(
        Some(&nix::pty::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        }),
        None,
    )
    .map_err(|e| fail(format!("opening a terminal: {e}")))?;
    let slave = |fd: &std::os::fd::OwnedFd| {
        fd.try_clone()
            .map(Stdio::from)
            .map_err(|e| fail(format!("the terminal: {e}")))
    };
    c.stdin(slave(&pty.slave)?)
        .stdout(slave(&pty.slave)?)
        .stderr(slave(&pty.slave)?);
    let child = c
        .spawn()
        .map_err(|e| fail(format!("running runc exec: {e}")))?;
    // Only runc holds the terminal's slave end now, so the master reads the end of
    // the output when the command and runc are gone.
    drop(c);
    drop(pty.slave);
    ExecHandle::from_tty(child, pty.master, Some(process))
        .map_err(|e| fail(format!("the terminal: {e}")))
}
