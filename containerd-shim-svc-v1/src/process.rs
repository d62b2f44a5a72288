//! One process of a task (its first, or one `ctr task exec` added): an exec in the task's
//! sandbox through svcd, its output copied to containerd's FIFOs, its exit recorded for `wait`
//! and told to whoever asked ([`Proc::start`]'s `exited`). A pod's sandbox ("pause")
//! container has a placeholder instead: nothing runs; it stands for the sandbox until killed.

use std::{
    fs::OpenOptions,
    io::{Read as _, Write as _},
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
        let exec = svcd.exec(name, request).map_err(|e| e.to_string())?;
        let sender = exec.sender().map_err(|e| e.to_string())?;
        *self.lock() = (Status::Running, Some(sender.clone()));
        *self.hook() = Some(Box::new(exited));
        started();
        if !self.stdio.stdin.is_empty() {
            let path = self.stdio.stdin.clone();
            std::thread::spawn(move || feed_stdin(&path, &sender));
        }
        let me = std::sync::Arc::clone(self);
        std::thread::spawn(move || {
            let code = me.copy_output(exec);
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

    /// Copy svcd's frames to the FIFOs until the exit code: that code.
    fn copy_output(&self, mut exec: Exec) -> u32 {
        let open = |p: &str| {
            (!p.is_empty())
                .then(|| OpenOptions::new().write(true).open(p).ok())
                .flatten()
        };
        let (mut out, mut err) = (open(&self.stdio.stdout), open(&self.stdio.stderr));
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

/// Say on its standard error why the process could not run: [`CANNOT_RUN`].
fn write_error(err: &mut Option<std::fs::File>, message: &str) -> u32 {
    log::warn!("the task's process: {message}");
    write(
        err,
        format!("containerd-shim-svc-v1: {message}\n").as_bytes(),
    );
    CANNOT_RUN
}

/// Copy containerd's stdin FIFO to the process, then end its input.
fn feed_stdin(path: &str, sender: &Sender) {
    let b64 = base64::engine::general_purpose::STANDARD;
    if let Ok(mut f) = std::fs::File::open(path) {
        let mut buf = vec![0u8; 32 * 1024];
        while let Ok(n) = f.read(&mut buf) {
            if n == 0
                || sender
                    .send(&ExecInput::Stdin(b64.encode(&buf[..n])))
                    .is_err()
            {
                break;
            }
        }
    }
    let _ = sender.send(&ExecInput::Eof);
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
