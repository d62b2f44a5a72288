//! The channel's two tasks over its connection: this host's frames written out in order, and
//! the agent's frames read, checked and routed to the stream each names (this host's, or one
//! the guest opened).

use std::{sync::atomic::Ordering, time::Duration};

use svc_guest::proto::{self, Frame, GUEST_STREAM, Kind, WINDOW};
use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt as _},
    sync::{mpsc, watch},
};

use super::{
    guest::{Guest, from_guest},
    streams::{Event, Streams, lock},
};

/// How long the writer may take, once the channel ended, to write what was queued before
/// (a cancel: `ack.rs`) before it closes the connection anyway.
pub(super) const LAST_WORDS: Duration = Duration::from_secs(1);

/// Write this host's frames to the connection, in order, until the channel ends (`ended`) or
/// drops; then what was already queued, within [`LAST_WORDS`]. Returning drops the writing
/// half: the agent reads the end of the channel after those frames.
pub(super) async fn write_frames<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<Frame>,
    mut ended: watch::Receiver<Option<String>>,
) -> std::io::Result<()> {
    loop {
        let f = tokio::select! {
            biased;
            _ = ended.wait_for(Option::is_some) => break,
            f = rx.recv() => match f {
                Some(f) => f,
                None => return Ok(()),
            },
        };
        // A guest that reads nothing blocks the write until the channel ends: then nothing
        // more can follow a frame cut short.
        tokio::select! {
            biased;
            written = write_one(&mut w, &f) => written?,
            _ = ended.wait_for(Option::is_some) => return Ok(()),
        }
    }
    let queued = async {
        while let Ok(f) = rx.try_recv() {
            write_one(&mut w, &f).await?;
        }
        Ok(())
    };
    tokio::time::timeout(LAST_WORDS, queued)
        .await
        .unwrap_or(Ok(()))
}

async fn write_one<W: AsyncWrite + Unpin>(w: &mut W, f: &Frame) -> std::io::Result<()> {
    w.write_all(&f.encode()).await?;
    w.flush().await
}

/// Route the guest's frames to their streams until the channel ends; why it ended.
pub(super) async fn read_frames<R: AsyncRead + Unpin>(
    mut r: R,
    streams: &Streams,
    hello: &mpsc::UnboundedSender<String>,
    guest: &Guest,
    out: &mpsc::UnboundedSender<Frame>,
) -> String {
    loop {
        let frame = match proto::read_frame(&mut r).await {
            Ok(Some(f)) => f,
            Ok(None) => return "the agent's channel closed".into(),
            // The guest's end went with bytes of ours unread (a killed agent or init): it
            // ended, it broke nothing.
            Err(proto::ProtoError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return "the agent's channel closed (reset by the guest's end)".into();
            }
            Err(e) => return format!("the agent broke the protocol: {e}"),
        };
        let routed = if frame.stream & GUEST_STREAM != 0 {
            from_guest(frame, guest, out)
        } else {
            to_host_stream(frame, streams, hello)
        };
        if let Err(why) = routed {
            return format!("the agent broke the protocol: {why}");
        }
    }
}

/// A frame on a stream this host opened (or the agent's hello): handed to its stream's
/// reader, within the stream's window.
fn to_host_stream(
    frame: Frame,
    streams: &Streams,
    hello: &mpsc::UnboundedSender<String>,
) -> Result<(), String> {
    let id = frame.stream;
    match frame.kind {
        Kind::Hello => {
            let _ = hello.send(String::from_utf8_lossy(&frame.payload).into_owned());
        }
        Kind::Stdout | Kind::Stderr => {
            let streams = lock(streams);
            let Some(s) = streams.get(&id) else {
                return Ok(());
            };
            let len = frame.payload.len() as u32;
            let unread = s.unread.fetch_add(len, Ordering::AcqRel) + len;
            if unread > WINDOW {
                return Err(format!(
                    "stream {id} sent {unread} bytes on a window of {WINDOW}"
                ));
            }
            let event = if frame.kind == Kind::Stdout {
                Event::Stdout(frame.payload)
            } else {
                Event::Stderr(frame.payload)
            };
            let _ = s.events.send(event);
        }
        Kind::Exit | Kind::Error => {
            let Some(s) = lock(streams).remove(&id) else {
                return Ok(());
            };
            let event = if frame.kind == Kind::Exit {
                Event::Exit(frame.as_i32().unwrap_or(255))
            } else {
                Event::Error(
                    String::from_utf8_lossy(&frame.payload)
                        .chars()
                        .take(1024)
                        .collect(),
                )
            };
            let _ = s.events.send(event);
        }
        Kind::Credit => {
            if let (Some(n), Some(s)) = (frame.as_u32(), lock(streams).get(&id)) {
                let room = (WINDOW as usize).saturating_sub(s.credit.available_permits());
                s.credit.add_permits((n as usize).min(room));
            }
        }
        // Only the host sends these.
        Kind::Open
        | Kind::Data
        | Kind::Eof
        | Kind::Resize
        | Kind::Signal
        | Kind::Go
        | Kind::Cancel => {}
    }
    Ok(())
}
