//! `POST /v1/sandboxes/{name}/exec`: a command in a sandbox, streamed to the caller.
//!
//! A plain call gets JSON lines of [`ExecFrame`] as the response body and no standard input.
//! An upgraded call (`Upgrade: svc-exec.v1`) gets `101 Switching Protocols`, then the
//! connection carries JSON lines both ways: [`ExecInput`] (stdin bytes, end of input, terminal
//! size, signals) from the caller and [`ExecFrame`] from svcd, ending with `exit`.

use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _},
    sync::mpsc,
};
use tracing::debug;

use super::{
    http::{Body, line, ndjson},
    supervisor::{Failure, Supervisor},
};
use crate::{
    api::{EXEC_UPGRADE, ExecFrame, ExecInput, ExecRequest, WORKSPACE_GUEST_DIR},
    runtime::ExecHandle,
};

/// Longest input line an upgraded caller may send (a base64 stdin chunk and its frame).
const MAX_INPUT_LINE: usize = 256 * 1024;

/// A plain exec: output as the response body, no standard input.
pub(super) async fn plain(
    sup: &Supervisor,
    name: &str,
    req: &ExecRequest,
) -> Result<Response<Body>, Failure> {
    let child = sup.exec(name, &in_workdir(sup, name, req), false).await?;
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(run(child, tx, None));
    Ok(ndjson(rx))
}

/// An upgraded exec: the command starts now (so a refusal is a plain error answer), and the
/// upgraded connection carries its input and output.
pub(super) async fn upgraded(
    sup: Arc<Supervisor>,
    name: &str,
    req: &ExecRequest,
    on_upgrade: hyper::upgrade::OnUpgrade,
) -> Result<Response<Body>, Failure> {
    let child = sup.exec(name, &in_workdir(&sup, name, req), true).await?;
    tokio::spawn(async move {
        let mut child = child;
        let io = match on_upgrade.await {
            Ok(io) => TokioIo::new(io),
            Err(e) => {
                debug!(error = %e, "the exec caller went away before the upgrade");
                child.kill().await;
                return;
            }
        };
        let (reader, mut writer) = tokio::io::split(io);
        let (tx, mut rx) = mpsc::channel::<Bytes>(64);
        let (in_tx, in_rx) = mpsc::channel::<ExecInput>(64);
        // Output: frames to the caller, then close the connection.
        let out = tokio::spawn(async move {
            while let Some(b) = rx.recv().await {
                if writer.write_all(&b).await.is_err() {
                    break;
                }
            }
            let _ = writer.shutdown().await;
        });
        // Input: the caller's frames; a bad one ends the command with an error frame.
        let err_tx = tx.clone();
        let input = tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(reader);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                let n = match (&mut lines)
                    .take(MAX_INPUT_LINE as u64 + 1)
                    .read_until(b'\n', &mut buf)
                    .await
                {
                    Ok(n) => n,
                    Err(_) => break,
                };
                if n == 0 {
                    break;
                }
                if buf.last() != Some(&b'\n') && n > MAX_INPUT_LINE {
                    let _ = err_tx
                        .send(line(&ExecFrame::Error(format!(
                            "an input frame is longer than {MAX_INPUT_LINE} bytes"
                        ))))
                        .await;
                    break;
                }
                match serde_json::from_slice::<ExecInput>(buf.trim_ascii_end()) {
                    Ok(frame) => {
                        if in_tx.send(frame).await.is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        let _ = err_tx
                            .send(line(&ExecFrame::Error(format!(
                                "a bad input frame ({e}); expected one of {{\"stdin\":BASE64}}, \
                                 \"eof\", {{\"resize\":{{\"rows\":R,\"cols\":C}}}}, \
                                 {{\"signal\":N}}"
                            ))))
                            .await;
                        break;
                    }
                }
            }
        });
        run(child, tx, Some(in_rx)).await;
        input.abort();
        let _ = out.await;
    });
    Ok(Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "upgrade")
        .header("upgrade", EXEC_UPGRADE)
        .body(Full::new(Bytes::new()).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed())))
}

/// `req` with its working directory decided here, for every client alike: the caller's, else
/// [`WORKSPACE_GUEST_DIR`] in a workspace's sandbox (where its project is shared, as
/// devcontainers do), else `/`. A sandbox that does not exist is left to the exec to refuse.
fn in_workdir(sup: &Supervisor, name: &str, req: &ExecRequest) -> ExecRequest {
    let mut req = req.clone();
    if req.cwd.is_none() && req.root.is_some() {
        // In a container's root file system: its `/`.
        req.cwd = Some("/".to_owned());
    } else if req.cwd.is_none() {
        let workspace = sup.show(name).is_ok_and(|v| {
            v.live_mounts.iter().any(|m| {
                m.rsplit_once(" -> ")
                    .is_some_and(|(_, guest)| guest == WORKSPACE_GUEST_DIR)
            })
        });
        req.cwd = Some(if workspace { WORKSPACE_GUEST_DIR } else { "/" }.to_owned());
    }
    req
}

/// Run the command to its end: its output as frames on `tx`, the caller's `input` (if any)
/// into it, then its exit frame. The command is killed when the caller goes away: `tx`
/// closed (its output cannot be delivered), or `input` ended.
async fn run(
    mut child: ExecHandle,
    tx: mpsc::Sender<Bytes>,
    input: Option<mpsc::Receiver<ExecInput>>,
) {
    let pumps: Vec<_> = [(child.stdout.take(), true), (child.stderr.take(), false)]
        .into_iter()
        .filter_map(|(r, out)| r.map(|r| tokio::spawn(pump(r, tx.clone(), out))))
        .collect();
    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(16);
    let stdin = child.stdin.take().map(|w| tokio::spawn(feed(w, stdin_rx)));
    let mut stdin_tx = stdin.is_some().then_some(stdin_tx);
    let mut input = input;
    let b64 = &base64::engine::general_purpose::STANDARD;
    let status = loop {
        tokio::select! {
            s = child.wait() => break s,
            () = tx.closed() => {
                // The caller went away: the command goes too.
                child.kill().await;
                return;
            }
            frame = async {
                match input.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            } => match frame {
                Some(ExecInput::Stdin(data)) => match b64.decode(data) {
                    Ok(bytes) => {
                        if let Some(s) = &stdin_tx {
                            let _ = s.send(Bytes::from(bytes)).await;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(line(&ExecFrame::Error(format!("stdin frame: {e}")))).await;
                        child.kill().await;
                        return;
                    }
                },
                Some(ExecInput::Eof) => stdin_tx = None,
                Some(ExecInput::Resize(size)) => {
                    if let Err(e) = child.resize(size.rows, size.cols) {
                        debug!(error = %e, "resizing an exec's terminal");
                    }
                }
                Some(ExecInput::Signal(n)) => match nix::sys::signal::Signal::try_from(n) {
                    Ok(sig) => child.signal(sig),
                    Err(_) => {
                        let _ = tx.send(line(&ExecFrame::Error(format!("no signal number {n}")))).await;
                    }
                },
                // The caller's side of the connection ended (it closed it, went away, or
                // sent a bad frame): the command goes too, even one that neither reads nor
                // writes. End of input is the `"eof"` frame, never a half-close.
                None => {
                    child.kill().await;
                    return;
                }
            }
        }
    };
    drop(stdin_tx);
    if let Some(s) = stdin {
        s.abort();
    }
    for p in pumps {
        let _ = p.await;
    }
    let frame = match status {
        Ok(code) => ExecFrame::Exit(code),
        Err(e) => ExecFrame::Error(e.to_string()),
    };
    let _ = tx.send(line(&frame)).await;
}

/// Copy one output stream into frames.
async fn pump(
    mut r: std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>>,
    tx: mpsc::Sender<Bytes>,
    stdout: bool,
) {
    let b64 = &base64::engine::general_purpose::STANDARD;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match r.read(&mut buf).await {
            // A terminal's master reads EIO once the command's side is closed: the end.
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let data = b64.encode(&buf[..n]);
                let frame = if stdout {
                    ExecFrame::Stdout(data)
                } else {
                    ExecFrame::Stderr(data)
                };
                if tx.send(line(&frame)).await.is_err() {
                    break;
                }
            }
        }
    }
}

/// Write the caller's input into the command; closing the channel closes its stdin.
async fn feed(
    mut w: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    mut rx: mpsc::Receiver<Bytes>,
) {
    while let Some(b) = rx.recv().await {
        if w.write_all(&b).await.is_err() || w.flush().await.is_err() {
            return;
        }
    }
    let _ = w.shutdown().await;
}
