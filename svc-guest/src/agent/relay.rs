//! Connections the guest opens to the host's services for its sandbox (the git SSH relay),
//! carried over the agent's channel as guest-opened streams ([`proto::GUEST_STREAM`]).
//!
//! The agent listens on [`SOCKET`]; `svc-git-ssh` connects and speaks the channel's protocol
//! on a stream of its own. The agent gives each connection a guest stream id and passes its
//! frames through, rewriting the id: `Open`, `Data`, `Eof` and `Credit` towards the host;
//! `Stdout`, `Stderr`, `Exit`, `Error` and `Credit` back. The agent decides nothing: the host
//! checks every request and every frame. A connection lives as long as the host that took it:
//! when another host takes over the channel (svcd restarted, the VM forked) its connections
//! are closed.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt as _},
    sync::mpsc,
};

use super::streams::Out;
use crate::proto::{self, Frame, GUEST_STREAM, Kind};

/// Where the git SSH relay is reached inside a sandbox (both backends).
pub const SOCKET: &str = "/run/svc/git-ssh.sock";

/// Connections in flight per guest (beyond them a new one is told to wait for others).
const MAX_CONNECTIONS: usize = 64;

/// The agent's guest-opened streams: which connection each id belongs to, and the host they
/// go to.
#[derive(Default)]
pub struct Hub {
    state: Mutex<HubState>,
}

#[derive(Default)]
struct HubState {
    /// The host being served (none between hosts).
    out: Option<Out>,
    conns: HashMap<u32, mpsc::UnboundedSender<Frame>>,
    next: u32,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").finish_non_exhaustive()
    }
}

impl Hub {
    fn state(&self) -> std::sync::MutexGuard<'_, HubState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new host serves the channel: the previous host's connections end.
    pub(super) fn attach(&self, out: Out) {
        let mut s = self.state();
        s.conns.clear();
        s.out = Some(out);
    }

    /// No host any more: every connection ends.
    pub(super) fn detach(&self) {
        let mut s = self.state();
        s.conns.clear();
        s.out = None;
    }

    /// A frame from the host on a guest-opened stream.
    pub(super) fn deliver(&self, frame: Frame) {
        if !matches!(
            frame.kind,
            Kind::Stdout | Kind::Stderr | Kind::Exit | Kind::Error | Kind::Credit
        ) {
            return;
        }
        let mut s = self.state();
        let end = matches!(frame.kind, Kind::Exit | Kind::Error);
        let id = frame.stream;
        if let Some(tx) = s.conns.get(&id) {
            let _ = tx.send(frame);
        }
        if end {
            s.conns.remove(&id);
        }
    }

    fn register(&self) -> Result<(u32, Out, mpsc::UnboundedReceiver<Frame>), &'static str> {
        let mut s = self.state();
        let Some(out) = s.out.clone() else {
            return Err("no host is connected to the sandbox's agent");
        };
        if s.conns.len() >= MAX_CONNECTIONS {
            return Err("too many connections to the host in flight");
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let id = loop {
            s.next = s.next.wrapping_add(1);
            let id = GUEST_STREAM | (s.next & !GUEST_STREAM);
            if !s.conns.contains_key(&id) {
                break id;
            }
        };
        s.conns.insert(id, tx);
        Ok((id, out, rx))
    }

    fn forget(&self, id: u32) {
        self.state().conns.remove(&id);
    }

    /// Accept connections on `listener` for as long as the agent runs.
    pub async fn listen(self: Arc<Self>, listener: tokio::net::UnixListener) {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let (r, w) = stream.into_split();
                    tokio::spawn(self.clone().connection(r, w));
                }
                Err(e) => {
                    eprintln!("svc-microvm-agent: {SOCKET}: accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Pass one connection's frames through until either end is done.
    pub async fn connection<R, W>(self: Arc<Self>, mut r: R, mut w: W)
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        // The connection's own stream id, from its first frame (which must open it).
        let first = match proto::read_frame(&mut r).await {
            Ok(Some(f)) if f.kind == Kind::Open => f,
            _ => return,
        };
        let local = first.stream;
        let (id, out, mut rx) = match self.register() {
            Ok(r) => r,
            Err(why) => {
                let _ = w
                    .write_all(&Frame::new(local, Kind::Error, why).encode())
                    .await;
                return;
            }
        };
        if out
            .send(Frame {
                stream: id,
                ..first
            })
            .is_err()
        {
            self.forget(id);
            return;
        }
        let back = tokio::spawn(async move {
            while let Some(f) = rx.recv().await {
                let end = matches!(f.kind, Kind::Exit | Kind::Error);
                if w.write_all(&Frame { stream: local, ..f }.encode())
                    .await
                    .is_err()
                    || end
                {
                    break;
                }
            }
            let _ = w.shutdown().await;
        });
        loop {
            match proto::read_frame(&mut r).await {
                Ok(Some(f))
                    if f.stream == local
                        && matches!(f.kind, Kind::Data | Kind::Eof | Kind::Credit) =>
                {
                    if out.send(Frame { stream: id, ..f }).is_err() {
                        break;
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        // The guest's end is gone: the host ends the session (nothing if it already has).
        self.forget(id);
        let _ = out.send(Frame::new(id, Kind::Error, "the guest's end closed"));
        let _ = back.await;
    }
}
