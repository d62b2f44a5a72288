//! One process of a task (its first, or one `ctr task exec` added): an exec in the task's
//! sandbox through svcd, its output copied to containerd's FIFOs, its exit recorded for `wait`
//! and told to whoever asked ([`Proc::start`]'s `exited`). A pod's sandbox ("pause")
//! container has a placeholder instead: nothing runs; it stands for the sandbox until killed.

use std::{
    fs::{File, OpenOptions},
    io::{Read as _, Write as _},
    os::unix::fs::OpenOptionsExt as _,
    sync::{Condvar, Mutex},
    time::SystemTime,
};

use base64::Engine as _;
use svc_control::api::{ExecFrame, ExecInput, ExecRequest, TermSize};

use crate::svcd::{Exec, Sender, Svcd};

/// containerd's FIFOs for a process (empty: none).
#[derive(Debug, Clone, Default)]
pub struct Stdio {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

/// Where a process is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    /// Its exit code (128 + N when signal N ended it) and when.
    Stopped(u32, SystemTime),
}

/// Told a process's exit code and when it stopped.
type OnExit = Box<dyn FnOnce(u32, SystemTime) + Send>;

/// A process: what it runs, its FIFOs, its status.
pub struct Proc {
    pub stdio: Stdio,
    /// What svcd runs; none for a placeholder.
    request: Option<ExecRequest>,
    state: Mutex<(Status, Option<Sender>)>,
    changed: Condvar,
    on_exit: Mutex<Option<OnExit>>,
}

/// The highest signal number Linux has (`SIGRTMAX`).
const MAX_SIGNAL: u32 = 64;

/// The exit code of a process svcd could not run (as `svc sandbox exec` reports it).
const CANNOT_RUN: u32 = 126;

impl Proc {
    /// A process not started yet; `request` none: a placeholder, which runs nothing and
    /// stops only when killed.
    pub fn new(stdio: Stdio, request: Option<ExecRequest>) -> Self {
        Self {
            stdio,
            request,
            state: Mutex::new((Status::Created, None)),
            changed: Condvar::new(),
            on_exit: Mutex::new(None),
        }
    }

    /// Its status now.
    pub fn status(&self) -> Status {
        self.lock().0
    }

    /// Start it in sandbox `name`: svcd runs it; a thread copies its output and records its
    /// exit, another feeds its standard input. `started` is called once it runs, before
    /// `exited` can be (with its exit code and when).
    pub fn start(
        self: &std::sync::Arc<Self>,
        svcd: &Svcd,
        name: &str,
        started: impl FnOnce(),
        exited: impl FnOnce(u32, SystemTime) + Send + 'static,
    ) -> Result<(), String> {
        match self.status() {
            Status::Created => {}
            Status::Running => return Err("the process was started already".into()),
            Status::Stopped(code, _) => {
                return Err(format!(
                    "the process was ended before it started (exit code {code}): it was \
                     killed, or its task's processes were when the task stopped"
                ));
            }
        }
        let Some(request) = &self.request else {
            *self.lock() = (Status::Running, None);
            *self.hook() = Some(Box::new(exited));
            started();
            return Ok(());
        };
        // Opened now, while containerd (or a detached `ctr run -d`, until it exits) holds
        // their reading ends: see `open_fifo`.
        let outputs = (open_fifo(&self.stdio.stdout), open_fifo(&self.stdio.stderr));
        let exec = svcd.exec(name, request).map_err(|e| e.to_string())?;
        let sender = exec.sender().map_err(|e| e.to_string())?;
        *self.lock() = (Status::Running, Some(sender.clone()));
        *self.hook() = Some(Box::new(exited));
        started();
        if !self.stdio.stdin.is_empty() {
            let path = self.stdio.stdin.clone();
            let me = std::sync::Arc::clone(self);
            std::thread::spawn(move || {
                feed_stdin(&path, &sender, || {
                    matches!(me.status(), Status::Stopped(..))
                });
            });
        }
        let me = std::sync::Arc::clone(self);
        std::thread::spawn(move || {
            let code = me.copy_output(exec, outputs);
            me.stopped(code);
        });
        Ok(())
    }

    /// Block until it has stopped: its exit code and when.
    pub fn wait(&self) -> (u32, SystemTime) {
        let mut state = self.lock();
        loop {
            if let Status::Stopped(code, at) = state.0 {
                return (code, at);
            }
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Send `signal` to it; one never started, or a placeholder, stops at once, as if the
    /// signal had ended it. A signal no process can be sent (0, or above [`MAX_SIGNAL`]) is
    /// refused, naming it.
    pub fn kill(&self, signal: u32) -> Result<(), String> {
        if !(1..=MAX_SIGNAL).contains(&signal) {
            return Err(format!("signal {signal}: not a signal (1 to {MAX_SIGNAL})"));
        }
        let sender = {
            let state = self.lock();
            match &state.0 {
                Status::Stopped(..) => return Ok(()),
                Status::Created => None,
                Status::Running => state.1.clone(),
            }
        };
        match sender {
            Some(s) => s
                // At most MAX_SIGNAL (checked above): it fits.
                .send(&ExecInput::Signal(i32::try_from(signal).unwrap_or(9)))
                .map_err(|e| format!("signalling the process: {e}")),
            None => {
                self.stopped(128 + signal);
                Ok(())
            }
        }
    }

    /// Resize its terminal.
    pub fn resize(&self, cols: u32, rows: u32) {
        let size = TermSize {
            rows: u16::try_from(rows).unwrap_or(u16::MAX),
            cols: u16::try_from(cols).unwrap_or(u16::MAX),
        };
        if let Some(s) = self.lock().1.clone() {
            let _ = s.send(&ExecInput::Resize(size));
        }
    }

    /// End its standard input.
    pub fn close_stdin(&self) {
        if let Some(s) = self.lock().1.clone() {
            let _ = s.send(&ExecInput::Eof);
        }
    }

    /// Copy svcd's frames to the FIFOs (`outputs`: stdout's, stderr's) until the exit code:
    /// that code.
    fn copy_output(&self, mut exec: Exec, outputs: (Option<File>, Option<File>)) -> u32 {
        let (mut out, mut err) = outputs;
        let b64 = base64::engine::general_purpose::STANDARD;
        loop {
            let frame = match exec.next_frame() {
                Ok(Some(f)) => f,
                Ok(None) => {
                    return write_error(&mut err, "svcd's stream ended without an exit code");
                }
                Err(e) => return write_error(&mut err, &e.to_string()),
            };
            match frame {
                ExecFrame::Stdout(d) => write(&mut out, &b64.decode(d).unwrap_or_default()),
                ExecFrame::Stderr(d) => write(&mut err, &b64.decode(d).unwrap_or_default()),
                ExecFrame::Exit(c) => return u32::try_from(c).unwrap_or(CANNOT_RUN),
                ExecFrame::Error(e) => return write_error(&mut err, &e),
            }
        }
    }

    fn stopped(&self, code: u32) {
        let at = SystemTime::now();
        {
            let mut state = self.lock();
            if matches!(state.0, Status::Stopped(..)) {
                return;
            }
            *state = (Status::Stopped(code, at), None);
        }
        self.changed.notify_all();
        if let Some(exited) = self.hook().take() {
            exited(code, at);
        }
    }

    fn hook(&self) -> std::sync::MutexGuard<'_, Option<OnExit>> {
        self.on_exit
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (Status, Option<Sender>)> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn write(to: &mut Option<std::fs::File>, bytes: &[u8]) {
    if let Some(f) = to
        && f.write_all(bytes).is_err()
    {
        // The reader went away: later output is dropped, the process goes on.
        *to = None;
    }
}

/// containerd's FIFO at `path`, opened for writing without waiting for a reader: a process
/// is started while its reader (containerd, or `ctr run -d` until it exits) holds the FIFO
/// open, and an open that waited for a reader once that one has gone would wait forever —
/// and with it the process's exit, which comes after its output. Writes then block as a pipe's
/// do; once the reader has gone they fail and later output is dropped ([`write`]). None: no
/// FIFO, or no reader now (said in the log; that output is dropped).
fn open_fifo(path: &str) -> Option<File> {
    if path.is_empty() {
        return None;
    }
    let opened = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .and_then(|f| {
            let flags = rustix::fs::fcntl_getfl(&f)? - rustix::fs::OFlags::NONBLOCK;
            rustix::fs::fcntl_setfl(&f, flags)?;
            Ok(f)
        });
    opened
        .inspect_err(|e| log::warn!("{path}: {e}: the process's output there is dropped"))
        .ok()
}

/// Say on its standard error why the process could not run: [`CANNOT_RUN`].
fn write_error(err: &mut Option<std::fs::File>, message: &str) -> u32 {
    log::warn!("the task's process: {message}");
    write(
        err,
        format!("containerd-shim-svc-v1: {message}\n").as_bytes(),
    );
    CANNOT_RUN
}

/// How long the stdin feeder waits for its FIFO before it looks again whether the process
/// has stopped.
const STDIN_LOOK: rustix::event::Timespec = rustix::event::Timespec {
    tv_sec: 0,
    tv_nsec: 500_000_000,
};

/// Copy containerd's stdin FIFO to the process, then end its input; the thread ends when the
/// FIFO's writer has gone, or when the process stops (`stopped`), whichever comes first. The
/// FIFO is opened without waiting for a writer: one may never come (`ctr run -d` makes the
/// FIFO and never opens it), and an open that waited would hold this thread for the shim's
/// life.
fn feed_stdin(path: &str, sender: &Sender, stopped: impl Fn() -> bool) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let _ = copy_fifo(path, stopped, |bytes| {
        sender.send(&ExecInput::Stdin(b64.encode(bytes))).is_ok()
    });
    let _ = sender.send(&ExecInput::Eof);
}

/// Read the FIFO at `path` without blocking on it, handing what comes to `take` (false: stop),
/// until its writer has gone (end of file) or `stopped()` says so. Before a writer first opens
/// it, Linux reports nothing on the FIFO (no hang-up), so a writer that comes late is read.
fn copy_fifo(
    path: &str,
    stopped: impl Fn() -> bool,
    mut take: impl FnMut(&[u8]) -> bool,
) -> std::io::Result<()> {
    use rustix::event::{PollFd, PollFlags};
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        if stopped() {
            return Ok(());
        }
        let mut fds = [PollFd::new(&f, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&STDIN_LOOK)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        match f.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                if !take(&buf[..n]) {
                    return Ok(());
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, mpsc};

    use super::*;

    #[test]
    fn a_placeholder_runs_nothing_and_stops_when_killed_telling_its_exit_once() {
        // No svcd: a placeholder never calls it.
        let svcd = Svcd::new(std::path::Path::new("/nonexistent/svcd.sock"));
        let p = Arc::new(Proc::new(Stdio::default(), None));
        let (tx, rx) = mpsc::channel();
        let started = tx.clone();
        p.start(
            &svcd,
            "pod",
            move || started.send("started".to_owned()).expect("send"),
            move |code, _| tx.send(format!("exited {code}")).expect("send"),
        )
        .expect("a placeholder starts");
        assert_eq!(p.status(), Status::Running);
        assert!(p.start(&svcd, "pod", || {}, |_, _| {}).is_err(), "once");
        p.kill(9).expect("kill");
        p.kill(15).expect("a stopped process takes signals quietly");
        assert_eq!(p.wait().0, 137);
        let told: Vec<String> = rx.try_iter().collect();
        assert_eq!(told, ["started", "exited 137"], "in order, each once");
    }

    /// A FIFO made in a fresh directory (the directory, kept alive with it).
    fn fifo() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("stdout");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
        (dir, path.to_str().expect("utf-8").to_owned())
    }

    #[test]
    fn a_fifo_whose_reader_has_gone_is_not_waited_for() {
        assert!(open_fifo("").is_none(), "no FIFO");
        let (_dir, path) = fifo();
        // No reader (a detached `ctr run -d` that has exited): not opened, and at once.
        let (tx, rx) = mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || tx.send(open_fifo(&p).is_none()).expect("send"));
        let none = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the open waited for a reader");
        assert!(none, "a FIFO with no reader is not written");
    }

    #[test]
    fn a_fifo_with_a_reader_is_written_blocking_until_the_reader_goes() {
        let (_dir, path) = fifo();
        let reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
            .expect("reader");
        let mut out = open_fifo(&path);
        let flags = rustix::fs::fcntl_getfl(out.as_ref().expect("opened")).expect("flags");
        assert!(
            !flags.contains(rustix::fs::OFlags::NONBLOCK),
            "writes block as a pipe's do"
        );
        write(&mut out, b"hello");
        let mut got = String::new();
        (&reader).read_to_string(&mut got).ok();
        assert_eq!(got, "hello");
        drop(reader);
        write(&mut out, b"nobody reads this");
        assert!(
            out.is_none(),
            "once the reader has gone, later output is dropped"
        );
    }

    /// [`copy_fifo`] of `path` on a thread of its own, ended by `stop`: what it read, sent
    /// once it returned.
    fn copy_in_background(
        path: String,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> mpsc::Receiver<(std::io::Result<()>, Vec<u8>)> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            let r = copy_fifo(
                &path,
                || stop.load(std::sync::atomic::Ordering::SeqCst),
                |b| {
                    got.extend_from_slice(b);
                    true
                },
            );
            tx.send((r, got)).expect("send");
        });
        rx
    }

    #[test]
    fn a_stdin_fifo_no_writer_opens_is_let_go_when_the_process_stops() {
        let (_dir, path) = fifo();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let rx = copy_in_background(path, Arc::clone(&stop));
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            rx.try_recv().is_err(),
            "no end of file before a writer came"
        );
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (r, got) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the feeder waited for a writer after its process stopped");
        r.expect("no error");
        assert!(got.is_empty());
    }

    #[test]
    fn a_stdin_fifo_is_read_from_a_late_writer_to_its_end() {
        let (_dir, path) = fifo();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let rx = copy_in_background(path.clone(), stop);
        std::thread::sleep(std::time::Duration::from_millis(700));
        {
            let mut w = OpenOptions::new().write(true).open(&path).expect("writer");
            w.write_all(b"late ").expect("write");
            std::thread::sleep(std::time::Duration::from_millis(50));
            w.write_all(b"input").expect("write");
        }
        let (r, got) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the writer's close ends the copy");
        r.expect("no error");
        assert_eq!(got, b"late input");
    }

    #[test]
    fn a_signal_out_of_range_is_refused_and_ends_nothing() {
        let p = Proc::new(Stdio::default(), None);
        for bad in [0, 65, 1 << 31, u32::MAX] {
            let e = p.kill(bad).expect_err("out of range");
            assert!(e.contains(&format!("signal {bad}: not a signal")), "{e}");
        }
        assert_eq!(
            p.status(),
            Status::Created,
            "never started, and not stopped"
        );
        p.kill(64).expect("SIGRTMAX");
        assert_eq!(p.wait().0, 192);
        let svcd = Svcd::new(std::path::Path::new("/nonexistent/svcd.sock"));
        let e = Arc::new(p)
            .start(&svcd, "pod", || {}, |_, _| {})
            .expect_err("killed before it started");
        assert!(e.contains("ended before it started (exit code 192)"), "{e}");
    }

    #[test]
    fn a_process_svcd_cannot_run_fails_to_start_and_tells_nothing() {
        let svcd = Svcd::new(std::path::Path::new("/nonexistent/svcd.sock"));
        let request = ExecRequest {
            argv: vec!["true".into()],
            ..ExecRequest::default()
        };
        let p = Arc::new(Proc::new(Stdio::default(), Some(request)));
        let (tx, rx) = mpsc::channel::<&str>();
        let started = tx.clone();
        let e = p
            .start(
                &svcd,
                "t",
                move || started.send("started").expect("send"),
                move |_, _| tx.send("exited").expect("send"),
            )
            .expect_err("no svcd");
        assert!(e.contains("/nonexistent/svcd.sock"), "{e}");
        assert_eq!(p.status(), Status::Created);
        assert_eq!(rx.try_iter().count(), 0);
    }
}
