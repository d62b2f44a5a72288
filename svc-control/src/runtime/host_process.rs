//! A command run by a host process (the OCI runtime's `exec`): its control, and the guest
//! process it started, killed with it.

use super::{BoxFuture, ExecControl, RuntimeError};

/// A command run by a host process (the OCI runtime's `exec`), maybe on a host terminal.
pub(super) struct HostProcess {
    pub(super) child: tokio::process::Child,
    /// The terminal's master end, when the command has one.
    pub(super) tty: Option<std::os::fd::OwnedFd>,
    /// The command's own process in the guest: killing the runtime's exec alone would leave it
    /// running.
    pub(super) guest: Option<GuestProcess>,
}

/// Which guest process a runtime's exec started: the pid the runtime writes to `pid_file`
/// once the command runs, in the pid namespace of the guest whose init is `init`; `log`: where
/// the runtime writes its own errors (`--log-format json`). The files are removed with it.
#[derive(Debug)]
pub struct GuestProcess {
    pub pid_file: std::path::PathBuf,
    pub init: u32,
    pub log: std::path::PathBuf,
}

impl GuestProcess {
    /// SIGKILL the command's process if it is still in the guest's pid namespace (a pid reused
    /// by a host process is never signalled: the process is held by a pidfd before its
    /// namespace is checked). `Ok(false)`: the runtime has not said which process it is yet.
    fn kill(&self) -> Result<bool, String> {
        let text = match std::fs::read_to_string(&self.pid_file) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(format!("{}: {e}", self.pid_file.display())),
        };
        let pid = text
            .trim()
            .parse::<i32>()
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or_else(|| format!("{}: not a pid: {text:?}", self.pid_file.display()))?;
        let raw = pid.as_raw_nonzero();
        let fd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .map_err(|e| format!("pid {raw}: {e}"))?;
        let ns = |p: String| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
        let theirs = ns(raw.to_string());
        if theirs.is_none() || theirs != ns(self.init.to_string()) {
            return Err(format!("pid {raw} is no longer the guest's"));
        }
        rustix::process::pidfd_send_signal(&fd, rustix::process::Signal::KILL)
            .map_err(|e| format!("pid {raw}: {e}"))?;
        Ok(true)
    }
}

impl Drop for GuestProcess {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.pid_file);
        let _ = std::fs::remove_file(&self.log);
        // crun's `exec --process` file, when there was one.
        let _ = std::fs::remove_file(self.log.with_extension("process.json"));
    }
}

impl ExecControl for HostProcess {
    /// The runtime's exec copies the new size into the guest's terminal when told by SIGWINCH.
    fn resize(&self, rows: u16, cols: u16) -> Result<(), RuntimeError> {
        let Some(master) = &self.tty else {
            return Ok(());
        };
        rustix::termios::tcsetwinsize(
            master,
            rustix::termios::Winsize {
                ws_row: rows,
                ws_col: cols,
                ws_xpixel: 0,
                ws_ypixel: 0,
            },
        )
        .map_err(|e| RuntimeError::Exec(format!("setting the terminal size: {e}")))?;
        self.signal(nix::sys::signal::Signal::SIGWINCH);
        Ok(())
    }

    /// The runtime's exec forwards signals into the guest: crun's and runc's (not detached)
    /// pass each signal they get to the command's process (crun's was seen to by a test through
    /// `ctr task exec --user`, before containerd's default capability sets sent such execs
    /// through the init; no test reaches this path through containerd now).
    fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<i32, RuntimeError>> {
        Box::pin(async move {
            let status = self
                .child
                .wait()
                .await
                .map_err(|e| RuntimeError::Exec(format!("waiting for the command: {e}")))?;
            let code = status.code().unwrap_or_else(|| {
                128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
            });
            Ok(self
                .guest
                .as_ref()
                .and_then(|g| super::not_started::status(&g.pid_file, &g.log, code))
                .unwrap_or(code))
        })
    }

    /// The command's guest process first, then (if it is not gone with it in two seconds) the
    /// runtime's exec. An exec still starting is let start (up to ten seconds): killed then,
    /// the runtime could leave its command running with no one to end it.
    fn kill(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let Some(guest) = &self.guest {
                let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
                loop {
                    match guest.kill() {
                        Ok(true) => {
                            let gone = tokio::time::timeout(
                                std::time::Duration::from_secs(2),
                                self.child.wait(),
                            );
                            if gone.await.is_ok() {
                                return;
                            }
                            break;
                        }
                        Ok(false) => {
                            let started = tokio::time::timeout(
                                std::time::Duration::from_millis(50),
                                self.child.wait(),
                            );
                            // The runtime ended without starting it: nothing runs.
                            if started.await.is_ok() {
                                return;
                            }
                            if tokio::time::Instant::now() >= deadline {
                                break;
                            }
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "killing an exec's guest process");
                            break;
                        }
                    }
                }
            }
            let _ = self.child.kill().await;
        })
    }
}
