//! The host's side of the channel to a microvm's agent ([`svc_guest::proto`]): one connection
//! to the VM's virtio-serial socket, many streams over it.
//!
//! The guest is untrusted: every frame it sends is checked. A stream that sends more than its
//! credit allows, or a frame that does not parse, ends the channel (its commands fail with the
//! reason; the next exec connects again). Nothing the guest says is buffered beyond a window
//! per stream.

mod ack;
mod connect;
mod exec;
mod frames;
mod guest;
mod streams;

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU32, Ordering},
    },
};

use svc_guest::proto::{Exec, Frame, Kind, MAX_PAYLOAD, Request, WINDOW};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    sync::{Semaphore, mpsc, oneshot, watch},
};

pub use self::ack::{NoAck, START};
use self::{
    exec::{Remote, deliver, forward_input, send_input},
    frames::{read_frames, write_frames},
    guest::{Guest, lock_guest},
    streams::{Event, Opened, StreamOut, Streams, lock},
};
use crate::runtime::{ExecHandle, GuestService};

/// The most of an agent's standard error a [`Channel::call_said`] keeps.
const MAX_SAID: usize = 16 << 10;

/// A connected channel.
pub struct Channel {
    out: mpsc::UnboundedSender<Frame>,
    streams: Streams,
    guest: Guest,
    next: AtomicU32,
    /// The agent said it holds a command until this host's `Go` (its hello, [`svc_guest::proto`]).
    held_exec: AtomicBool,
    /// Why the channel ended, once it has.
    ended: watch::Receiver<Option<String>>,
    ended_tx: Arc<watch::Sender<Option<String>>>,
    /// The task that reads the connection: dropping the channel ends it, and ends the writer
    /// (after what was queued, within [`frames::LAST_WORDS`]), which closes the connection
    /// (the agent then ends what this host started).
    reading: tokio::task::AbortHandle,
}

impl Drop for Channel {
    fn drop(&mut self) {
        end(
            &self.ended_tx,
            "svcd closed the channel to the agent".into(),
        );
        self.reading.abort();
    }
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("ended", &*self.ended.borrow())
            .finish_non_exhaustive()
    }
}

/// The channel ended for `why`, unless it had already: the first reason is the one told
/// (a write that fails after the reader saw the guest's end says less).
fn end(ended: &watch::Sender<Option<String>>, why: String) {
    ended.send_if_modified(|now| {
        if now.is_some() {
            return false;
        }
        *now = Some(why);
        true
    });
}

impl Channel {
    /// A channel over any byte stream (the tests run the agent over a socket pair); the
    /// receiver of the agent's hello answers.
    pub fn over<R, W>(reader: R, writer: W) -> (Arc<Self>, mpsc::UnboundedReceiver<String>)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (out, out_rx) = mpsc::unbounded_channel();
        let (ended_tx, ended) = watch::channel(None);
        let (hello_tx, hello_rx) = mpsc::unbounded_channel();
        let streams: Streams = Arc::default();
        let guest: Guest = Arc::default();
        let ended_tx = Arc::new(ended_tx);
        tokio::spawn({
            let (ended_tx, ended) = (ended_tx.clone(), ended.clone());
            async move {
                if let Err(e) = write_frames(writer, out_rx, ended).await {
                    // The guest's end went (a killed agent or init): it ended, it broke nothing.
                    let why = match e.kind() {
                        std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset => {
                            "the agent's channel closed (the guest's end went away)".to_owned()
                        }
                        _ => format!("writing to the agent: {e}"),
                    };
                    end(&ended_tx, why);
                }
            }
        });
        let reading = tokio::spawn({
            let (streams, guest, out) = (streams.clone(), guest.clone(), out.clone());
            let ended_tx = ended_tx.clone();
            async move {
                let why = read_frames(reader, &streams, &hello_tx, &guest, &out).await;
                end(&ended_tx, why);
                // Every stream still open learns that the channel ended.
                lock(&streams).clear();
                lock_guest(&guest).streams.clear();
            }
        });
        (
            Arc::new(Self {
                out,
                streams,
                guest,
                next: AtomicU32::new(1),
                held_exec: AtomicBool::new(false),
                ended,
                ended_tx,
                reading: reading.abort_handle(),
            }),
            hello_rx,
        )
    }

    /// Hand the streams the guest opens from now on to `service` (until then they are
    /// refused).
    pub fn serve_guest(&self, service: GuestService) {
        lock_guest(&self.guest).service = Some(service);
    }

    /// Take no stream the guest opens: a frame on one ends the channel (a container's init,
    /// whose guest reaches svcd's services through a socket of their own).
    pub fn refuse_guest_streams(&self) {
        lock_guest(&self.guest).refused = true;
    }

    /// Whether the channel still works.
    pub fn is_open(&self) -> bool {
        self.ended.borrow().is_none() && !self.out.is_closed()
    }

    /// Why the channel ended (or that it closed, when it has not said).
    pub fn ended_reason(&self) -> String {
        self.ended
            .borrow()
            .clone()
            .unwrap_or_else(|| "the channel to the agent closed".into())
    }

    /// Whether the agent holds a command until this host says `Go` (it said so in its hello):
    /// else the `Open` starts it.
    pub fn holds_exec(&self) -> bool {
        self.held_exec.load(Ordering::Relaxed)
    }

    /// Give the channel up: every stream on it ends with `why`, and so does the connection,
    /// once what was queued for it (a cancel) is written, within [`frames::LAST_WORDS`] (the
    /// agent then ends what this host started, once it reads again).
    pub fn abandon(&self, why: String) {
        end(&self.ended_tx, why);
        self.reading.abort();
        lock(&self.streams).clear();
        lock_guest(&self.guest).streams.clear();
    }

    /// Open a stream for `request`.
    fn open(&self, request: &Request) -> Result<Opened, String> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, events) = mpsc::unbounded_channel();
        let credit = Arc::new(Semaphore::new(WINDOW as usize));
        let unread = Arc::new(AtomicU32::new(0));
        lock(&self.streams).insert(
            id,
            StreamOut {
                events: tx,
                credit: credit.clone(),
                unread: unread.clone(),
            },
        );
        let json = serde_json::to_vec(request).map_err(|e| e.to_string())?;
        if json.len() > MAX_PAYLOAD {
            lock(&self.streams).remove(&id);
            return Err(format!("the request is over {MAX_PAYLOAD} bytes"));
        }
        self.out
            .send(Frame::new(id, Kind::Open, json))
            .map_err(|_| self.ended_reason())?;
        Ok(Opened {
            id,
            events,
            credit,
            unread,
            ended: self.ended.clone(),
            out: self.out.clone(),
        })
    }

    /// Run a request that takes `input` and answers with success or an error: a file write,
    /// the guest's setup.
    pub async fn call(&self, request: &Request, input: &[u8]) -> Result<(), String> {
        self.call_said(request, input).await.map(drop)
    }

    /// [`Channel::call`], and what the agent said on the stream's standard error (kept up to
    /// 16 KiB: the agent is the guest's).
    pub async fn call_said(&self, request: &Request, input: &[u8]) -> Result<String, String> {
        let mut opened = self.open(request)?;
        let id = opened.id;
        send_input(&self.out, id, &opened.credit, input).await?;
        let _ = self.out.send(Frame::new(id, Kind::Eof, Vec::new()));
        let mut said = Vec::new();
        loop {
            match opened.events.recv().await {
                Some(Event::Exit(0)) => return Ok(String::from_utf8_lossy(&said).into_owned()),
                Some(Event::Exit(code)) => return Err(format!("the agent ended it with {code}")),
                Some(Event::Error(e)) => return Err(e),
                Some(Event::Stderr(b)) => {
                    let room = MAX_SAID.saturating_sub(said.len());
                    said.extend_from_slice(&b[..b.len().min(room)]);
                }
                Some(Event::Stdout(_)) => {}
                None => return Err(self.ended_reason()),
            }
        }
    }

    /// Run a command in the guest: its streams and how it ends (started by its `Open`, or
    /// held until [`Channel::start`]'s `Go` when it asks to be).
    pub fn exec(self: &Arc<Self>, exec: Exec) -> Result<ExecHandle, String> {
        self.exec_stream(exec).map(|(_, handle)| handle)
    }

    /// [`Channel::exec`], and the command's stream.
    fn exec_stream(self: &Arc<Self>, exec: Exec) -> Result<(u32, ExecHandle), String> {
        let stdin = exec.stdin;
        let tty = exec.tty.is_some();
        let opened = self.open(&Request::Exec(exec))?;
        let (id, credit) = (opened.id, opened.credit.clone());
        let (stdout_r, stdout_w) = tokio::io::simplex(64 * 1024);
        let (stderr_r, stderr_w) = tokio::io::simplex(64 * 1024);
        let (exit_tx, exit_rx) = oneshot::channel();
        tokio::spawn(deliver(
            opened,
            stdout_w,
            (!tty).then_some(stderr_w),
            exit_tx,
        ));
        let stdin = stdin.then(|| {
            let (r, w) = tokio::io::simplex(64 * 1024);
            tokio::spawn(forward_input(id, r, self.out.clone(), credit));
            Box::pin(w) as Pin<Box<dyn AsyncWrite + Send>>
        });
        let handle = ExecHandle {
            stdin,
            stdout: Some(Box::pin(stdout_r)),
            stderr: (!tty).then(|| Box::pin(stderr_r) as Pin<Box<dyn AsyncRead + Send>>),
            control: Box::new(Remote {
                out: self.out.clone(),
                ended: self.ended.clone(),
                id,
                exit: Some(exit_rx),
                code: None,
            }),
        };
        Ok((id, handle))
    }
}
