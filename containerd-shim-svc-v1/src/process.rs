//! One process of a task (its first, or one `ctr task exec` added): an exec in the task's
//! sandbox through svcd, its output copied to containerd's FIFOs, its exit recorded for `wait`
//! and told to whoever asked ([`Proc::start`]'s `exited`). A pod's sandbox ("pause")
//! container has a placeholder instead: nothing runs; it stands for the sandbox until killed.

use std::{
    fs::{File, OpenOptions},
    io::{Read as _, Write as _},
    os::{fd::OwnedFd, unix::fs::OpenOptionsExt as _},
    sync::{Arc, Condvar, Mutex},
    time::SystemTime,
};

use base64::Engine as _;
use rustix::event::{EventfdFlags, eventfd};
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
    /// Told when its standard input is to end (containerd's `CloseIO`) or it stopped: the
    /// stdin feeder then takes what is left in the FIFO and ends the input. None: no feeder.
    stdin_end: Mutex<Option<Arc<OwnedFd>>>,
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
            stdin_end: Mutex::new(None),
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
        // The stdin FIFO is opened now too, before the client can write it: what a client
        // writes into a FIFO no reader has open is lost when it closes its end. The feeder's
        // end is known from now on: a client that has written its input can ask for its end
        // (`CloseIO`) before this call returns, and that must not be lost either.
        let input = (!self.stdio.stdin.is_empty()).then(|| {
            Ok::<_, std::io::Error>((open_stdin(&self.stdio.stdin)?, Arc::new(new_end()?)))
        });
        if let Some(Ok((_, end))) = &input {
            *self.end_lock() = Some(Arc::clone(end));
        }
        let exec = match svcd.exec(name, request) {
            Ok(exec) => exec,
            Err(e) => {
                *self.end_lock() = None;
                return Err(e.to_string());
            }
        };
        let sender = exec.sender().map_err(|e| e.to_string())?;
        *self.lock() = (Status::Running, Some(sender.clone()));
        *self.hook() = Some(Box::new(exited));
        started();
        match input {
            Some(Ok((fifo, end))) => {
                let path = self.stdio.stdin.clone();
                std::thread::spawn(move || feed_stdin(&path, fifo, &sender, &end));
            }
            Some(Err(e)) => {
                log::warn!("{}: {e}: the process's input is ended", self.stdio.stdin);
                let _ = sender.send(&ExecInput::Eof);
            }
            None => {}
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
        // With a feeder, it ends the input once it has passed on what the client wrote
        // before asking (the FIFO may still hold it): an end sent from here could overtake it.
        if self.tell_stdin_end() {
            return;
        }
        if let Some(s) = self.lock().1.clone() {
            let _ = s.send(&ExecInput::Eof);
        }
    }

    /// Tell the stdin feeder, if there is one, that the input is to end: whether there was.
    fn tell_stdin_end(&self) -> bool {
        let Some(end) = self.end_lock().clone() else {
            return false;
        };
        let _ = tell(&end);
        true
    }

    fn end_lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<OwnedFd>>> {
        self.stdin_end
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
        self.tell_stdin_end();
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

/// How long a process's start waits for the reader of an output FIFO to open it.
const READER_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// containerd's FIFO at `path`, opened for writing once its reader has opened it, waiting
/// at most [`READER_WAIT`]: the client opens its reading end on a thread of its own
/// (`ctr task exec`'s can come after the process's start), and an open that waited for a
/// reader that has gone (a `ctr run -d` that has exited) would wait forever — and with it
/// the process's exit, which comes after its output. Writes then block as a pipe's do; once
/// the reader has gone they fail and later output is dropped ([`write`]). None: no FIFO, or
/// no reader in time (said in the log; that output is dropped).
fn open_fifo(path: &str) -> Option<File> {
    if path.is_empty() {
        return None;
    }
    let deadline = std::time::Instant::now() + READER_WAIT;
    let opened = loop {
        let opened = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path);
        match opened {
            // ENXIO: no reader yet.
            Err(e)
                if e.raw_os_error() == Some(libc::ENXIO)
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => break other,
        }
    };
    opened
        .and_then(|f| {
            let flags = rustix::fs::fcntl_getfl(&f)? - rustix::fs::OFlags::NONBLOCK;
            rustix::fs::fcntl_setfl(&f, flags)?;
            Ok(f)
        })
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

/// Copy containerd's stdin FIFO to the process, then end its input; the thread ends when the
/// FIFO's writer has gone, or when `end` is told (containerd's `CloseIO`, or the process
/// stopped) and what the FIFO held then is passed on. The FIFO is opened without waiting for a
/// writer: one may never come (`ctr run -d` makes the FIFO and never opens it), and an open
/// that waited would hold this thread for the shim's life.
fn feed_stdin(path: &str, fifo: File, sender: &Sender, end: &OwnedFd) {
    let b64 = base64::engine::general_purpose::STANDARD;
    if let Err(e) = copy_fifo(fifo, end, |bytes| {
        sender.send(&ExecInput::Stdin(b64.encode(bytes))).is_ok()
    }) {
        log::warn!("{path}: {e}: the process's input is ended");
    }
    let _ = sender.send(&ExecInput::Eof);
}

/// containerd's stdin FIFO at `path`, opened for reading without waiting for a writer
/// ([`copy_fifo`] reads it without blocking).
fn open_stdin(path: &str) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
}

/// A stdin feeder's end: an eventfd [`copy_fifo`] polls beside the FIFO, told by [`tell`].
fn new_end() -> std::io::Result<OwnedFd> {
    Ok(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?)
}

/// Tell a feeder's `end` that the input is to end.
fn tell(end: &OwnedFd) -> std::io::Result<()> {
    rustix::io::write(end, &1u64.to_ne_bytes())?;
    Ok(())
}

/// Read the FIFO `f` (opened by [`open_stdin`]) without blocking on it, handing what comes to
/// `take` (false: stop), until its writer has gone (end of file), or until `end` (an eventfd) is
/// readable: then what the FIFO holds is taken too (a client writes its input, then asks for
/// its end). Before a writer first opens it, Linux reports nothing on the FIFO (no hang-up), so
/// a writer that comes late is read.
fn copy_fifo(
    mut f: File,
    end: &OwnedFd,
    mut take: impl FnMut(&[u8]) -> bool,
) -> std::io::Result<()> {
    use rustix::event::{PollFd, PollFlags};
    let mut buf = vec![0u8; 32 * 1024];
    let mut ending = false;
    loop {
        if !ending {
            let mut fds = [
                PollFd::new(&f, PollFlags::IN),
                PollFd::new(end, PollFlags::IN),
            ];
            match rustix::event::poll(&mut fds, None) {
                Ok(_) => ending = !fds[1].revents().is_empty(),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        match f.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => {
                if !take(&buf[..n]) {
                    return Ok(());
                }
            }
            // Nothing more now: once the end was told, that is all there is.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && ending => return Ok(()),
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
    fn a_fifo_no_reader_opens_is_waited_for_only_a_while() {
        assert!(open_fifo("").is_none(), "no FIFO");
        let (_dir, path) = fifo();
        // No reader (a detached `ctr run -d` that has exited): not opened, after READER_WAIT.
        let (tx, rx) = mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || tx.send(open_fifo(&p).is_none()).expect("send"));
        let none = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the open waited for a reader");
        assert!(none, "a FIFO with no reader is not written");
    }

    #[test]
    fn a_reader_that_opens_the_fifo_late_gets_the_output() {
        // `ctr task exec` opens its reading end on a thread of its own: it can come after
        // the process's start.
        let (_dir, path) = fifo();
        let p = path.clone();
        let reader = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            let mut got = String::new();
            File::open(&p)
                .expect("reader")
                .read_to_string(&mut got)
                .expect("read");
            got
        });
        let mut out = open_fifo(&path);
        assert!(out.is_some(), "the late reader was waited for");
        write(&mut out, b"for the late reader");
        drop(out);
        assert_eq!(reader.join().expect("reader"), "for the late reader");
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

    /// How a [`copy_fifo`] went, and what it read.
    type Copied = (std::io::Result<()>, Vec<u8>);

    /// [`copy_fifo`] of `path` on a thread of its own, told to end through the eventfd it
    /// returns: what it read, sent once it returned.
    fn copy_in_background(path: String) -> (Arc<OwnedFd>, mpsc::Receiver<Copied>) {
        let end = Arc::new(new_end().expect("eventfd"));
        let told = Arc::clone(&end);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            let r = copy_fifo(open_stdin(&path).expect("stdin"), &told, |b| {
                got.extend_from_slice(b);
                true
            });
            tx.send((r, got)).expect("send");
        });
        (end, rx)
    }

    fn copied(rx: &mpsc::Receiver<Copied>, why: &str) -> Vec<u8> {
        let (r, got) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{why}"));
        r.expect("no error");
        got
    }

    #[test]
    fn a_stdin_fifo_no_writer_opens_is_let_go_when_told() {
        let (_dir, path) = fifo();
        let (end, rx) = copy_in_background(path);
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert!(
            rx.try_recv().is_err(),
            "no end of file before a writer came"
        );
        tell(&end).expect("eventfd write");
        let got = copied(
            &rx,
            "the feeder waited for a writer after it was told to end",
        );
        assert!(got.is_empty());
    }

    #[test]
    fn a_stdin_fifo_is_read_from_a_late_writer_to_its_end() {
        let (_dir, path) = fifo();
        let (_end, rx) = copy_in_background(path.clone());
        std::thread::sleep(std::time::Duration::from_millis(700));
        {
            let mut w = OpenOptions::new().write(true).open(&path).expect("writer");
            w.write_all(b"late ").expect("write");
            std::thread::sleep(std::time::Duration::from_millis(50));
            w.write_all(b"input").expect("write");
        }
        let got = copied(&rx, "the writer's close ends the copy");
        assert_eq!(got, b"late input");
    }

    #[test]
    fn input_written_before_the_end_is_told_is_passed_on_first() {
        // A client writes its input, then asks for its end (containerd's `CloseIO`) with its
        // writer still open: what the FIFO holds then still goes to the process.
        let (_dir, path) = fifo();
        let stalled = Arc::new(Mutex::new(()));
        let held = stalled.lock().expect("lock");
        let end = Arc::new(new_end().expect("eventfd"));
        let (told, p, gate) = (Arc::clone(&end), path.clone(), Arc::clone(&stalled));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            let r = copy_fifo(open_stdin(&p).expect("stdin"), &told, |b| {
                // The first bytes wait until the end has been told: the rest is then
                // in the FIFO beside the told end.
                drop(gate.lock().expect("lock"));
                got.extend_from_slice(b);
                true
            });
            tx.send((r, got)).expect("send");
        });
        let mut w = OpenOptions::new().write(true).open(&path).expect("writer");
        w.write_all(b"first ").expect("write");
        std::thread::sleep(std::time::Duration::from_millis(200));
        w.write_all(b"then the rest").expect("write");
        tell(&end).expect("eventfd write");
        drop(held);
        let got = copied(&rx, "the told end ends the copy, the writer still open");
        assert_eq!(got, b"first then the rest");
        drop(w);
    }

    /// One exec on `socket` answered as svcd's exec endpoint answers it (101, then lines of
    /// frames), held before its answer until `answer` is told: the input frames read until
    /// `"eof"`, sent on the returned channel; then exit code 0.
    fn one_held_exec(
        socket: &std::path::Path,
        answer: mpsc::Receiver<()>,
    ) -> (mpsc::Receiver<()>, mpsc::Receiver<Vec<ExecInput>>) {
        use std::io::BufRead as _;
        let listener = std::os::unix::net::UnixListener::bind(socket).expect("bind");
        let (asked_tx, asked) = mpsc::channel();
        let (frames_tx, frames) = mpsc::channel();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().expect("accept");
            let mut reader = std::io::BufReader::new(stream.try_clone().expect("clone"));
            let mut length = 0;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).expect("head");
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().expect("length");
                }
                if line == "\r\n" {
                    break;
                }
            }
            reader.read_exact(&mut vec![0; length]).expect("body");
            asked_tx.send(()).expect("send");
            answer.recv().expect("told to answer");
            let mut w = stream;
            w.write_all(b"HTTP/1.1 101 Switching Protocols\r\n\r\n")
                .expect("answer");
            let mut got = Vec::new();
            for line in reader.lines() {
                let frame: ExecInput = serde_json::from_str(&line.expect("line")).expect("frame");
                let eof = frame == ExecInput::Eof;
                got.push(frame);
                if eof {
                    break;
                }
            }
            frames_tx.send(got).expect("send");
            w.write_all(b"{\"exit\":0}\n").expect("exit");
        });
        (asked, frames)
    }

    #[test]
    fn an_end_asked_for_while_the_process_starts_still_ends_its_input() {
        // A client writes its input and asks for its end (`CloseIO`) while the shim's start
        // is still waiting for svcd, its FIFO writer left open: the input, then its end, still
        // reach the process (the end was dropped when it came before the feeder).
        let (dir, stdin) = fifo();
        let socket = dir.path().join("svcd.sock");
        let (answer_tx, answer) = mpsc::channel();
        let (asked, frames) = one_held_exec(&socket, answer);
        let p = Arc::new(Proc::new(
            Stdio {
                stdin: stdin.clone(),
                ..Stdio::default()
            },
            Some(ExecRequest {
                argv: vec!["cat".into()],
                ..ExecRequest::default()
            }),
        ));
        let starting = Arc::clone(&p);
        let start =
            std::thread::spawn(move || starting.start(&Svcd::new(&socket), "t", || {}, |_, _| {}));
        asked
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the exec reached svcd");
        // The shim holds the FIFO's reading end by now: this open does not wait.
        let mut w = OpenOptions::new().write(true).open(&stdin).expect("writer");
        w.write_all(b"written early").expect("write");
        p.close_stdin();
        answer_tx.send(()).expect("answer");
        start.join().expect("start").expect("started");
        let got = frames
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the input's end was lost: the writer is still open");
        let b64 = base64::engine::general_purpose::STANDARD;
        assert_eq!(
            got,
            [
                ExecInput::Stdin(b64.encode("written early")),
                ExecInput::Eof
            ]
        );
        assert_eq!(p.wait().0, 0);
        drop(w);
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
