//! The two directions of a session's bytes: git's input to ssh ([`Input`], held to the shim's
//! window) and the server's output to git ([`Output`], within the shim's credit).

use std::sync::{
    Arc,
    atomic::{AtomicU64, AtomicUsize, Ordering},
};

use svc_guest::proto::{self, Frame, Kind, WINDOW};
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _},
    process::{ChildStderr, ChildStdin, ChildStdout},
    sync::{Semaphore, mpsc},
    task::JoinHandle,
};

/// git's input going to ssh from a task of its own, credited back as it is written: the relay
/// never waits on the server, so git's credit for the server's output always gets through (a
/// server that writes while it does not read cannot stall both ways). Held bytes were credited
/// when they arrived.
///
/// The shim is held to its window: `unread` counts the bytes of git's input svcd holds that the
/// shim has not had credit back for, and a shim that sends past WINDOW is cut, so svcd never
/// holds more than a window per session whatever the server does (a server that does not read
/// stalls only this session).
pub(super) struct Input {
    /// Bytes for ssh, and whether to credit them back once written; `None` once git's input
    /// has ended (dropping it ends ssh's).
    pub feed: Option<mpsc::UnboundedSender<(Vec<u8>, bool)>>,
    pub unread: Arc<AtomicUsize>,
    pub writer: JoinHandle<()>,
}

impl Input {
    /// Start writing to ssh's `stdin`, crediting stream `id` on `out`.
    pub fn start(id: u32, stdin: ChildStdin, out: &mpsc::UnboundedSender<Frame>) -> Self {
        let (feed, mut fed) = mpsc::unbounded_channel::<(Vec<u8>, bool)>();
        let unread = Arc::new(AtomicUsize::new(0));
        let writer = tokio::spawn({
            let out = out.clone();
            let mut stdin = stdin;
            let unread = unread.clone();
            async move {
                while let Some((bytes, credit)) = fed.recv().await {
                    if stdin.write_all(&bytes).await.is_err() {
                        return;
                    }
                    if credit {
                        unread.fetch_sub(bytes.len(), Ordering::SeqCst);
                        let _ = out.send(Frame::u32(id, Kind::Credit, bytes.len() as u32));
                    }
                }
                // Dropping stdin here: git's end of input, ssh closes the server's.
            }
        });
        Self {
            feed: Some(feed),
            unread,
            writer,
        }
    }
}

/// The server's output (ssh's stdout and stderr) to git, within the shim's credit.
pub(super) struct Output {
    credit: Arc<Semaphore>,
    /// Bytes handed to git.
    pub down: Arc<AtomicU64>,
    pumps: [JoinHandle<()>; 2],
}

impl Output {
    /// Start pumping ssh's output to stream `id` on `out`.
    pub fn start(
        id: u32,
        stdout: ChildStdout,
        stderr: ChildStderr,
        out: &mpsc::UnboundedSender<Frame>,
    ) -> Self {
        let credit = Arc::new(Semaphore::new(WINDOW as usize));
        let down = Arc::new(AtomicU64::new(0));
        let pumps = [
            tokio::spawn(pump(
                id,
                Kind::Stdout,
                stdout,
                out.clone(),
                credit.clone(),
                down.clone(),
            )),
            tokio::spawn(pump(
                id,
                Kind::Stderr,
                stderr,
                out.clone(),
                credit.clone(),
                down.clone(),
            )),
        ];
        Self {
            credit,
            down,
            pumps,
        }
    }

    /// git's credit frame: more of the server's output may go to it (never past a window).
    pub fn add_credit(&self, frame: &Frame) {
        add_credit(&self.credit, frame);
    }

    /// Stop pumping at once.
    pub fn abort(&self) {
        for p in &self.pumps {
            p.abort();
        }
    }

    /// ssh has ended, but the server's last output may still wait in the pumps for git's
    /// credit: keep taking git's credit from `reader` until both have handed everything on
    /// (or the shim goes away).
    pub async fn drain<R: AsyncRead + Unpin>(self, reader: &mut R) {
        let Self { credit, pumps, .. } = self;
        let aborts: Vec<_> = pumps.iter().map(JoinHandle::abort_handle).collect();
        let mut drained = std::pin::pin!(futures::future::join_all(pumps));
        loop {
            tokio::select! {
                _ = &mut drained => break,
                f = proto::read_frame(reader) => match f {
                    Ok(Some(f)) if f.kind == Kind::Credit => add_credit(&credit, &f),
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => {
                        for a in &aborts {
                            a.abort();
                        }
                        break;
                    }
                },
            }
        }
    }
}

/// git's credit frame on `credit`, never past a window.
fn add_credit(credit: &Semaphore, frame: &Frame) {
    if let Some(n) = frame.as_u32() {
        let room = (WINDOW as usize).saturating_sub(credit.available_permits());
        credit.add_permits((n as usize).min(room));
    }
}

async fn pump<R: AsyncRead + Unpin>(
    id: u32,
    kind: Kind,
    mut r: R,
    out: mpsc::UnboundedSender<Frame>,
    credit: Arc<Semaphore>,
    count: Arc<AtomicU64>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        match credit.acquire_many(n as u32).await {
            Ok(p) => p.forget(),
            Err(_) => return,
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
        if out.send(Frame::new(id, kind, &buf[..n])).is_err() {
            return;
        }
    }
}
