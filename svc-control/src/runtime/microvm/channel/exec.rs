//! A command in the guest as its caller sees it: its input sent within the stream's credit,
//! its output handed on (crediting the guest as it is read), and its control ([`Remote`]:
//! resize, signal, wait, kill) as frames on its stream.

use std::sync::{
    Arc,
    atomic::{AtomicU32, Ordering},
};

use svc_guest::proto::{self, Frame, Kind};
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _},
    sync::{Semaphore, mpsc, oneshot, watch},
};

use super::streams::{Event, Opened};
use crate::runtime::{BoxFuture, ExecControl, RuntimeError};

/// Send `input` on stream `id` within its credit.
pub(super) async fn send_input(
    out: &mpsc::UnboundedSender<Frame>,
    id: u32,
    credit: &Semaphore,
    input: &[u8],
) -> Result<(), String> {
    for chunk in proto::chunks(input) {
        credit
            .acquire_many(chunk.len() as u32)
            .await
            .map_err(|e| e.to_string())?
            .forget();
        out.send(Frame::new(id, Kind::Data, chunk.to_vec()))
            .map_err(|_| "the channel to the agent closed".to_owned())?;
    }
    Ok(())
}

/// Copy what the caller writes to the command's standard input, then end it.
pub(super) async fn forward_input<R: AsyncRead + Unpin>(
    id: u32,
    mut r: R,
    out: mpsc::UnboundedSender<Frame>,
    credit: Arc<Semaphore>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if send_input(&out, id, &credit, &buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
    let _ = out.send(Frame::new(id, Kind::Eof, Vec::new()));
}

/// Hand a command's output to its readers (crediting the guest as it goes) and its end to
/// its waiter.
pub(super) async fn deliver(
    opened: Opened,
    mut stdout: tokio::io::WriteHalf<tokio::io::SimplexStream>,
    mut stderr: Option<tokio::io::WriteHalf<tokio::io::SimplexStream>>,
    exit: oneshot::Sender<Result<i32, String>>,
) {
    let Opened {
        id,
        mut events,
        ended,
        out,
        unread,
        ..
    } = opened;
    let end = loop {
        match events.recv().await {
            Some(Event::Stdout(data)) => {
                // A reader that went away is not an error: the output is dropped.
                let _ = stdout.write_all(&data).await;
                credit(&out, id, &unread, data.len());
            }
            Some(Event::Stderr(data)) => {
                match &mut stderr {
                    Some(e) => {
                        let _ = e.write_all(&data).await;
                    }
                    None => {
                        let _ = stdout.write_all(&data).await;
                    }
                }
                credit(&out, id, &unread, data.len());
            }
            Some(Event::Exit(code)) => break Ok(code),
            Some(Event::Error(e)) => break Err(e),
            None => {
                break Err(ended
                    .borrow()
                    .clone()
                    .unwrap_or_else(|| "the channel to the guest's agent closed".to_owned()));
            }
        }
    };
    let _ = stdout.shutdown().await;
    if let Some(mut e) = stderr {
        let _ = e.shutdown().await;
    }
    let _ = exit.send(end);
}

fn credit(out: &mpsc::UnboundedSender<Frame>, id: u32, unread: &AtomicU32, n: usize) {
    unread.fetch_sub(n as u32, Ordering::AcqRel);
    let _ = out.send(Frame::u32(id, Kind::Credit, n as u32));
}

/// A command running in the guest, as its exec handle controls it.
pub(super) struct Remote {
    pub out: mpsc::UnboundedSender<Frame>,
    pub ended: watch::Receiver<Option<String>>,
    pub id: u32,
    pub exit: Option<oneshot::Receiver<Result<i32, String>>>,
    pub code: Option<i32>,
}

impl ExecControl for Remote {
    fn resize(&self, rows: u16, cols: u16) -> Result<(), RuntimeError> {
        let mut p = rows.to_be_bytes().to_vec();
        p.extend_from_slice(&cols.to_be_bytes());
        self.out
            .send(Frame::new(self.id, Kind::Resize, p))
            .map_err(|_| RuntimeError::Exec("the channel to the guest's agent closed".into()))
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let _ = self
            .out
            .send(Frame::i32(self.id, Kind::Signal, signal as i32));
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<i32, RuntimeError>> {
        Box::pin(async move {
            if let Some(code) = self.code {
                return Ok(code);
            }
            // Polled by reference: a wait that is dropped (a `select!` that chose otherwise)
            // loses nothing.
            let Some(rx) = self.exit.as_mut() else {
                return Err(RuntimeError::Exec(
                    "the command's end was already taken".into(),
                ));
            };
            let mut ended = self.ended.clone();
            let code = tokio::select! {
                biased;
                end = rx => end
                    .map_err(|_| RuntimeError::Exec("the channel to the guest's agent closed".into()))?
                    .map_err(|e| RuntimeError::Exec(format!("in the guest: {e}")))?,
                why = ended.wait_for(Option::is_some) => {
                    let why = why.map(|w| w.clone().unwrap_or_default()).unwrap_or_default();
                    return Err(RuntimeError::Exec(format!("in the guest: {why}")));
                }
            };
            self.code = Some(code);
            self.exit = None;
            Ok(code)
        })
    }

    fn kill(&mut self) -> BoxFuture<'_, ()> {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        Box::pin(async {})
    }
}
