//! The shim's side of a connection (`svc_guest::proto` frames): its request, the frames
//! written back to it, and the refusal it gets (git's stderr and exit status 1).

use std::time::{Duration, Instant};

use svc_guest::proto::{self, Frame, Kind, Request};
use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt as _},
    sync::mpsc,
    task::JoinHandle,
};

use super::session::Session;

/// How long a connection may take to send its request.
const REQUEST_LIMIT: Duration = Duration::from_secs(30);

/// The shim's request: what its `Open` asked.
pub(super) struct ShimRequest {
    /// The stream every frame of the session is on.
    pub id: u32,
    /// ssh's arguments, as git gave them to the shim.
    pub args: Vec<String>,
    /// git's `GIT_PROTOCOL`, if it set one.
    pub git_protocol: Option<String>,
}

/// The frames going back to the shim: queued on `out`, written by a task of their own.
pub(super) struct ToShim {
    pub out: mpsc::UnboundedSender<Frame>,
    writing: JoinHandle<()>,
}

impl ToShim {
    /// Start writing frames to `writer`.
    pub fn start<W: AsyncWrite + Unpin + Send + 'static>(writer: W) -> Self {
        let (out, out_rx) = mpsc::unbounded_channel::<Frame>();
        let writing = tokio::spawn(write_frames(writer, out_rx));
        Self { out, writing }
    }

    /// Refuse on stream `id`: `line` on git's stderr and exit status 1.
    pub fn refuse(&self, id: u32, line: &str) {
        let _ = self
            .out
            .send(Frame::new(id, Kind::Stderr, format!("{line}\n")));
        let _ = self.out.send(Frame::i32(id, Kind::Exit, 1));
    }

    /// [`Self::refuse`] `session` with `line`: the session as the audit then has it.
    pub fn deny(&self, id: u32, started: Instant, session: Session, line: String) -> Session {
        self.refuse(id, &line);
        Session {
            decision: "deny",
            reason: Some(line),
            exit: 1,
            duration: started.elapsed(),
            ..session
        }
    }

    /// No more frames: the queued ones are written (for at most 5 s).
    pub async fn finish(self) {
        drop(self.out);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.writing).await;
    }
}

/// The shim's request: its first `Open` (stream id, ssh arguments, `GIT_PROTOCOL`). Anything
/// else is answered with an error on the stream and ends the connection.
pub(super) async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut R,
    out: &mpsc::UnboundedSender<Frame>,
) -> Result<ShimRequest, String> {
    let first = async {
        loop {
            let f = proto::read_frame(reader)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("the shim closed before its request")?;
            if f.kind == Kind::Open {
                return Ok::<_, String>(f);
            }
        }
    };
    let f = tokio::time::timeout(REQUEST_LIMIT, first)
        .await
        .map_err(|_| format!("no request within {} s", REQUEST_LIMIT.as_secs()))??;
    match serde_json::from_slice::<Request>(&f.payload) {
        Ok(Request::GitSsh { args, git_protocol }) => Ok(ShimRequest {
            id: f.stream,
            args,
            git_protocol,
        }),
        Ok(_) => {
            let _ = out.send(Frame::new(
                f.stream,
                Kind::Error,
                "only git SSH requests here",
            ));
            Err("not a git SSH request".into())
        }
        Err(e) => {
            let _ = out.send(Frame::new(
                f.stream,
                Kind::Error,
                format!("bad request: {e}"),
            ));
            Err(format!("bad request: {e}"))
        }
    }
}

async fn write_frames<W: AsyncWrite + Unpin>(mut w: W, mut rx: mpsc::UnboundedReceiver<Frame>) {
    while let Some(f) = rx.recv().await {
        if w.write_all(&f.encode()).await.is_err() || w.flush().await.is_err() {
            return;
        }
    }
}
