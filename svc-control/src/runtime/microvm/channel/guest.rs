//! The streams the guest opens on its channel ([`GUEST_STREAM`] ids): each is a connection to
//! one of svcd's services for the sandbox (the git SSH relay), handed to the service set with
//! [`super::Channel::serve_guest`]; the guest's frames are written into it, the service's read
//! out of it, each direction within its window.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
};

use svc_guest::proto::{self, Frame, Kind, MAX_PAYLOAD, WINDOW};
use tokio::{io::AsyncWriteExt as _, sync::mpsc};

#[cfg(doc)]
use svc_guest::proto::GUEST_STREAM;

use crate::runtime::{GuestConn, GuestService};

/// Guest-opened streams at most at once (the service limits its own sessions further).
const MAX_GUEST_STREAMS: usize = 64;

/// The streams the guest opened ([`GUEST_STREAM`] ids), each a [`GuestConn`] handed to the
/// service: the guest's frames are written into it, the service's frames read out of it.
#[derive(Default)]
pub(super) struct GuestSide {
    pub service: Option<GuestService>,
    /// The guest may open no stream at all (a container's init: its services are reached
    /// otherwise): a frame on one breaks the protocol.
    pub refused: bool,
    pub streams: HashMap<u32, GuestIn>,
}

/// A guest-opened stream, as the reading side feeds it.
pub(super) struct GuestIn {
    frames: mpsc::UnboundedSender<Frame>,
    /// `Data` bytes the guest sent that are not yet handed to the service.
    unread: Arc<AtomicU32>,
}

pub(super) type Guest = Arc<Mutex<GuestSide>>;

/// The guest's side, whatever a panicking holder left.
pub(super) fn lock_guest(g: &Guest) -> std::sync::MutexGuard<'_, GuestSide> {
    g.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A frame on a stream the guest opened.
pub(super) fn from_guest(
    frame: Frame,
    guest: &Guest,
    out: &mpsc::UnboundedSender<Frame>,
) -> Result<(), String> {
    let id = frame.stream;
    let mut g = lock_guest(guest);
    if g.refused {
        return Err(format!(
            "a frame on stream {id:#x}: this guest may open no streams"
        ));
    }
    match frame.kind {
        Kind::Open => {
            if g.streams.contains_key(&id) {
                return Err(format!("stream {id:#x} opened twice"));
            }
            let refuse = |why: &str| {
                let _ = out.send(Frame::new(id, Kind::Error, why));
            };
            let Some(service) = g.service.clone() else {
                refuse("no host service is set up for this sandbox");
                return Ok(());
            };
            if g.streams.len() >= MAX_GUEST_STREAMS {
                refuse("too many connections to the host in flight");
                return Ok(());
            }
            let (frames, unread) = open_guest_stream(id, guest.clone(), out.clone(), &service);
            let _ = frames.send(frame);
            g.streams.insert(id, GuestIn { frames, unread });
        }
        Kind::Data | Kind::Eof | Kind::Credit => {
            let Some(s) = g.streams.get(&id) else {
                return Ok(());
            };
            if frame.kind == Kind::Data {
                let len = frame.payload.len() as u32;
                let unread = s.unread.fetch_add(len, Ordering::AcqRel) + len;
                if unread > WINDOW {
                    return Err(format!(
                        "stream {id:#x} sent {unread} bytes on a window of {WINDOW}"
                    ));
                }
            }
            let _ = s.frames.send(frame);
        }
        // The guest's end went away: the service reads the end of its input.
        Kind::Error => {
            g.streams.remove(&id);
        }
        Kind::Hello
        | Kind::Stdout
        | Kind::Stderr
        | Kind::Exit
        | Kind::Resize
        | Kind::Signal
        | Kind::Go
        | Kind::Cancel => {}
    }
    Ok(())
}

/// Start a guest-opened stream: a connection handed to `service`, the guest's frames written
/// into it, the service's answers sent on to the guest. The sender of the guest's frames and
/// its unread count.
fn open_guest_stream(
    id: u32,
    guest: Guest,
    out: mpsc::UnboundedSender<Frame>,
    service: &GuestService,
) -> (mpsc::UnboundedSender<Frame>, Arc<AtomicU32>) {
    // Room for two whole frames: what the guest sends beyond that waits (counted in
    // `unread`) until the service reads, within the window the service's credit allows.
    let (ours, theirs) = tokio::io::duplex(2 * (MAX_PAYLOAD + proto::HEADER));
    let (mut from_service, mut to_service) = tokio::io::split(ours);
    let (frames, mut rx) = mpsc::unbounded_channel::<Frame>();
    let unread = Arc::new(AtomicU32::new(0));
    tokio::spawn({
        let unread = unread.clone();
        async move {
            while let Some(f) = rx.recv().await {
                let n = if f.kind == Kind::Data {
                    f.payload.len() as u32
                } else {
                    0
                };
                if to_service.write_all(&f.encode()).await.is_err() {
                    break;
                }
                unread.fetch_sub(n, Ordering::AcqRel);
            }
            let _ = to_service.shutdown().await;
        }
    });
    tokio::spawn(async move {
        loop {
            match proto::read_frame(&mut from_service).await {
                Ok(Some(f))
                    if f.stream == id
                        && matches!(
                            f.kind,
                            Kind::Stdout | Kind::Stderr | Kind::Exit | Kind::Error | Kind::Credit
                        ) =>
                {
                    let end = matches!(f.kind, Kind::Exit | Kind::Error);
                    if out.send(f).is_err() || end {
                        break;
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    let _ = out.send(Frame::new(id, Kind::Error, "the host's service ended"));
                    break;
                }
            }
        }
        lock_guest(&guest).streams.remove(&id);
    });
    let (r, w) = tokio::io::split(theirs);
    service(GuestConn {
        reader: Box::pin(r),
        writer: Box::pin(w),
    });
    (frames, unread)
}
