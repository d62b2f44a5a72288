//! Running a command for the host: its process (on pipes, or on a terminal of its own), its
//! output sent within the stream's credit, the host's input fed to it, then its exit code.

use std::{os::fd::OwnedFd, process::Stdio, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    sync::{Semaphore, mpsc, watch},
};

use super::{
    ExecStyle,
    confine::{Confinement, seen_cwd},
    streams::{Out, Streams, error, lock},
};
use crate::proto::{Exec, Frame, Kind};

/// How long output may keep coming after a command exited before its stream is closed (a
/// background process that kept the command's stdout open would hold it forever).
const DRAIN_IDLE: Duration = Duration::from_millis(500);

/// Run a command; its output on the stream, then its exit code.
pub(super) async fn run(
    id: u32,
    exec: Exec,
    style: ExecStyle,
    input: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    out: &Out,
    streams: &Streams,
    credit: Arc<Semaphore>,
) -> Frame {
    let Some(program) = exec.argv.first() else {
        return error(id, "exec needs a command".into());
    };
    let confinement = match Confinement::of(&exec, style) {
        Ok(c) => c,
        Err(e) => return error(id, e),
    };
    let (mut cmd, tty) = match command(program, &exec, style, confinement) {
        Ok(c) => c,
        Err(e) => return error(id, format!("opening a terminal: {e}")),
    };
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // Whether the working directory is missing, as the agent sees it (inside the root
            // when there is one); the words name it as the command was given it.
            let no_cwd = !std::path::Path::new(&seen_cwd(&exec)).is_dir();
            return not_started(id, program, exec.cwd.as_deref(), no_cwd, &e, style, out);
        }
    };
    let pid = child.id().and_then(|p| i32::try_from(p).ok());
    if let Some(s) = lock(streams).get_mut(&id) {
        s.pid = pid;
        s.tty = tty.clone();
    }
    let (exited_tx, exited) = watch::channel(false);
    let io = Io {
        id,
        out,
        credit: &credit,
        exited: &exited,
    };
    let pumps = match &tty {
        Some(master) => match io.terminal(master, input) {
            Ok(pumps) => pumps,
            Err(e) => {
                let _ = child.start_kill();
                return error(id, format!("the terminal: {e}"));
            }
        },
        None => io.pipes(&mut child, input),
    };
    let code = match child.wait().await {
        Ok(status) => status.code().unwrap_or_else(|| {
            128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
        }),
        Err(e) => return error(id, format!("waiting for {program}: {e}")),
    };
    let _ = exited_tx.send(true);
    for p in pumps {
        let _ = p.await;
    }
    Frame::i32(id, Kind::Exit, code)
}

/// The command `exec` asks for (`program`: its first word), run in `style` under
/// `confinement`, and its terminal's master end if it runs on one.
fn command(
    program: &str,
    exec: &Exec,
    style: ExecStyle,
    confinement: Confinement,
) -> std::io::Result<(tokio::process::Command, Option<Arc<OwnedFd>>)> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&exec.argv[1..])
        .env_clear()
        .envs(exec.env.iter().map(|(k, v)| (k, v)));
    if !confinement.sets_cwd() {
        cmd.current_dir(exec.cwd.as_deref().unwrap_or("/"));
    }
    let tty = match exec.tty {
        Some((rows, cols)) => Some(Arc::new(terminal(&mut cmd, rows, cols)?)),
        None => {
            cmd.stdin(if exec.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
            match style {
                ExecStyle::Agent => {
                    cmd.process_group(0);
                }
                ExecStyle::Runtime => new_session(&mut cmd),
            }
            None
        }
    };
    // Last: the terminal and session above are set up with the agent's root and ids.
    confinement.apply(&mut cmd);
    Ok((cmd, tty))
}

/// Make `cmd` lead a session of its own (as `runc exec` does).
fn new_session(cmd: &mut tokio::process::Command) {
    #[expect(unsafe_code, reason = "pre_exec: the command in a session of its own")]
    // SAFETY: between fork and exec the closure makes two system calls (setsid, sigprocmask); it allocates
    // nothing and takes no locks.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()?;
            // No signal blocked, whatever the server's threads had (as a runtime's exec).
            nix::sys::signal::sigprocmask(
                nix::sys::signal::SigmaskHow::SIG_SETMASK,
                Some(&nix::sys::signal::SigSet::empty()),
                None,
            )?;
            Ok(())
        });
    }
}

/// A command that did not start: said on its stderr (in `style`'s words), and its exit code as
/// a shell says it (127 not found, 126 found but not runnable, or no such working directory
/// `cwd`).
fn not_started(
    id: u32,
    program: &str,
    cwd: Option<&str>,
    no_cwd: bool,
    e: &std::io::Error,
    style: ExecStyle,
    out: &Out,
) -> Frame {
    let cwd = cwd.unwrap_or("/");
    let code = if no_cwd || e.kind() != std::io::ErrorKind::NotFound {
        126
    } else {
        127
    };
    let said = match style {
        ExecStyle::Agent if no_cwd => format!("svc-microvm-agent: working directory {cwd}: {e}"),
        ExecStyle::Agent => format!("svc-microvm-agent: {program}: {e}"),
        ExecStyle::Runtime => runtime_words(program, cwd, no_cwd, e),
    };
    let _ = out.send(Frame::new(id, Kind::Stderr, format!("{said}\n")));
    Frame::i32(id, Kind::Exit, code)
}

/// What `runc exec` says of a command it could not start (`program` in `cwd`; `no_cwd`: that
/// directory is missing), word for word.
fn runtime_words(program: &str, cwd: &str, no_cwd: bool, e: &std::io::Error) -> String {
    let why = if no_cwd {
        format!("chdir to cwd ({cwd:?}) set in config.json failed: no such file or directory")
    } else if e.kind() == std::io::ErrorKind::NotFound && !program.contains('/') {
        format!("exec: {program:?}: executable file not found in $PATH")
    } else if e.kind() == std::io::ErrorKind::NotFound {
        format!("exec: {program:?}: stat {program}: no such file or directory")
    } else {
        let text = e.to_string();
        let text = text.split(" (os error").next().unwrap_or(&text);
        format!("exec: {program:?}: {}", text.to_lowercase())
    };
    format!("exec failed: unable to start container process: {why}")
}

/// What a running command's streams are connected with: its stream, the host, the stream's
/// credit and whether the command has exited.
struct Io<'a> {
    id: u32,
    out: &'a Out,
    credit: &'a Arc<Semaphore>,
    exited: &'a watch::Receiver<bool>,
}

impl Io<'_> {
    /// Copy a stream of the command's output to the host as `kind` frames.
    fn pump<R: AsyncRead + Unpin + Send + 'static>(
        &self,
        kind: Kind,
        r: R,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(pump(
            self.id,
            kind,
            r,
            self.out.clone(),
            self.credit.clone(),
            self.exited.clone(),
        ))
    }

    /// The command on its terminal `master`: its output from it, the host's input to it.
    fn terminal(
        &self,
        master: &OwnedFd,
        input: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    ) -> std::io::Result<Vec<tokio::task::JoinHandle<()>>> {
        let file = |m: &OwnedFd| m.try_clone().map(|fd| tokio::fs::File::from_std(fd.into()));
        let (r, w) = (file(master)?, file(master)?);
        let pumps = vec![self.pump(Kind::Stdout, r)];
        tokio::spawn(feed(self.id, w, input, self.out.clone()));
        Ok(pumps)
    }

    /// The command on pipes: its stdout and stderr to the host, the host's input to its
    /// stdin (when it has one).
    fn pipes(
        &self,
        child: &mut tokio::process::Child,
        input: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut pumps = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            pumps.push(self.pump(Kind::Stdout, stdout));
        }
        if let Some(stderr) = child.stderr.take() {
            pumps.push(self.pump(Kind::Stderr, stderr));
        }
        if let Some(stdin) = child.stdin.take() {
            tokio::spawn(feed(self.id, stdin, input, self.out.clone()));
        }
        pumps
    }
}

/// Give `cmd` a new terminal of `rows`×`cols` as its controlling terminal and all of its
/// standard streams; the terminal's master end.
fn terminal(cmd: &mut tokio::process::Command, rows: u16, cols: u16) -> std::io::Result<OwnedFd> {
    let pty = nix::pty::openpty(
        Some(&nix::pty::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        }),
        None,
    )
    .map_err(std::io::Error::from)?;
    cmd.stdin(Stdio::from(pty.slave.try_clone()?))
        .stdout(Stdio::from(pty.slave.try_clone()?))
        .stderr(Stdio::from(pty.slave));
    #[expect(
        unsafe_code,
        reason = "pre_exec: a new session whose controlling terminal is the command's stdin"
    )]
    // SAFETY: between fork and exec the closure only makes two system calls (setsid and the
    // TIOCSCTTY ioctl on fd 0, which the stdio set-up above made the terminal); it allocates
    // nothing and takes no locks.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()?;
            rustix::process::ioctl_tiocsctty(std::os::fd::BorrowedFd::borrow_raw(0))?;
            Ok(())
        });
    }
    Ok(pty.master)
}

/// Copy a command's output to the host as `kind` frames, within the stream's credit. Ends at
/// end of file (a terminal says EIO when its last writer closed) or once the command exited
/// and nothing came for [`DRAIN_IDLE`].
async fn pump<R: AsyncRead + Unpin>(
    id: u32,
    kind: Kind,
    mut r: R,
    out: Out,
    credit: Arc<Semaphore>,
    mut exited: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let read = tokio::select! {
            r = r.read(&mut buf) => r,
            () = idle_after_exit(&mut exited) => return,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        match credit.acquire_many(n as u32).await {
            Ok(p) => p.forget(),
            Err(_) => return,
        }
        if out.send(Frame::new(id, kind, &buf[..n])).is_err() {
            return;
        }
    }
}

async fn idle_after_exit(exited: &mut watch::Receiver<bool>) {
    if exited.wait_for(|e| *e).await.is_err() {
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(DRAIN_IDLE).await;
}

/// Copy the host's input to the command, returning credit as it is written.
async fn feed<W: AsyncWrite + Unpin>(
    id: u32,
    mut w: W,
    mut input: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    out: Out,
) {
    while let Some(Some(chunk)) = input.recv().await {
        if w.write_all(&chunk).await.is_err() || w.flush().await.is_err() {
            return;
        }
        let _ = out.send(Frame::u32(id, Kind::Credit, chunk.len() as u32));
    }
    // End of input: on a terminal, say it the way a terminal does (^D at line start).
    let _ = w.shutdown().await;
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, atomic::AtomicU64};

    use super::*;

    /// What `not_started` answers for `program` run in `cwd`, spawned for real: its exit code
    /// and what it said on stderr.
    fn refused(program: &str, cwd: &str) -> (i32, String) {
        refused_in(ExecStyle::Agent, program, cwd)
    }

    /// [`refused`] in `style`.
    fn refused_in(style: ExecStyle, program: &str, cwd: &str) -> (i32, String) {
        let e = std::process::Command::new(program)
            .current_dir(cwd)
            .spawn()
            .expect_err("the command must not start");
        let (tx, mut rx) = mpsc::unbounded_channel();
        let out = Out {
            tx,
            epoch: 0,
            current: Arc::new(AtomicU64::new(0)),
        };
        let no_cwd = !std::path::Path::new(cwd).is_dir();
        let exit = not_started(7, program, Some(cwd), no_cwd, &e, style, &out);
        let (_, said) = rx.try_recv().expect("a stderr frame");
        let code = i32::from_be_bytes(exit.payload.try_into().expect("an i32"));
        (code, String::from_utf8_lossy(&said.payload).into_owned())
    }

    #[test]
    fn a_command_that_cannot_start_gets_the_shells_status() {
        let (code, said) = refused("no-such-program-of-svc", "/");
        assert_eq!(code, 127, "{said}");
        assert!(said.contains("no-such-program-of-svc"), "{said}");
        let (code, said) = refused("/etc/passwd", "/");
        assert_eq!(code, 126, "{said}");
        let (code, said) = refused("true", "/no/such/dir/of/svc");
        assert_eq!(
            code, 126,
            "a missing working directory is not a missing command: {said}"
        );
        assert!(
            said.contains("working directory /no/such/dir/of/svc"),
            "{said}"
        );
    }

    #[test]
    fn as_a_runtime_a_command_that_cannot_start_is_said_in_runcs_words() {
        let start = "exec failed: unable to start container process: ";
        for (program, cwd, code, said) in [
            (
                "no-such-program-of-svc",
                "/",
                127,
                r#"exec: "no-such-program-of-svc": executable file not found in $PATH"#,
            ),
            (
                "/no/such/file",
                "/",
                127,
                r#"exec: "/no/such/file": stat /no/such/file: no such file or directory"#,
            ),
            (
                "/etc/passwd",
                "/",
                126,
                r#"exec: "/etc/passwd": permission denied"#,
            ),
            (
                "true",
                "/no/such/dir",
                126,
                r#"chdir to cwd ("/no/such/dir") set in config.json failed: no such file or directory"#,
            ),
        ] {
            let (got, text) = refused_in(ExecStyle::Runtime, program, cwd);
            assert_eq!(got, code, "{program}: {text}");
            assert_eq!(text, format!("{start}{said}\n"), "{program}");
        }
    }
}
