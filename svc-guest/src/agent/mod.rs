//! The agent's side of the channel ([`crate::proto`]): one host connection served until it
//! ends. Runs in the guest (`svc-microvm-agent`); the host's tests run it over a socket pair
//! with real processes.
//!
//! A command the host asks to hold ([`crate::proto::Exec::held`]) is prepared on its `Open`
//! and started on the host's `Go` only; a `Cancel`, or the host going away first, discards it
//! ([`start`]; the protocol's argument is in [`crate::proto`]).
//!
//! Every stream is independent: a command whose reader is slow waits for credit alone; a
//! request that fails is answered with an error on its own stream. When the host goes away
//! (end of file on the port: svcd restarting, the VM forked) the commands it started are
//! killed — their output has nowhere to go — and the agent waits for the next host.

use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt as _},
    sync::{Semaphore, mpsc},
};

use self::{
    command::run,
    start::Verdict,
    streams::{Out, StreamIn, Streams, error, lock},
};
use crate::proto::{
    self, FEATURES, Frame, GUEST_STREAM, GuestBind, HELD_EXEC, Kind, ProtoError, Request, Setup,
    WINDOW,
};

mod command;
mod confine;
pub mod relay;
mod start;
mod streams;
mod tree_binds;
pub mod trees;

/// Largest file the host may write with one request.
pub const MAX_FILE: usize = 16 << 20;

/// What the agent changes in the guest outside the processes it runs: the network, the host
/// name, the entropy pool. The guest's implementation is in the agent binary.
pub trait System: Send + Sync {
    fn setup(&self, setup: &Setup) -> Result<(), String>;
    /// Mount the virtio-fs file system `tag` at `path`.
    fn mount(&self, tag: &str, path: &str) -> Result<(), String>;
    /// Bind the tree the host attached as `tree` at `path`, the guest's `binds` inside it
    /// ([`trees::bind`]): the places skipped, each with why.
    fn bind_tree(
        &self,
        tree: &str,
        path: &str,
        binds: &[GuestBind],
    ) -> Result<Vec<String>, String> {
        let _ = (tree, path, binds);
        Err("this guest takes no trees from the host".into())
    }
    /// Unbind the tree `tree` bound at `path` ([`trees::unbind`]).
    fn unbind_tree(&self, tree: &str, path: &str) -> Result<(), String> {
        let _ = (tree, path);
        Err("this guest takes no trees from the host".into())
    }
    /// How commands are run: the microvm agent's way unless said otherwise.
    fn exec_style(&self) -> ExecStyle {
        ExecStyle::Agent
    }
}

/// How the agent runs a command, and says it could not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecStyle {
    /// The microvm agent's: each command leads a process group of its own, a signal goes to
    /// the command alone, and a command that cannot start is said as `svc-microvm-agent: …`.
    Agent,
    /// An OCI runtime's `exec` (the container guest's init, `svc-init`, standing in for
    /// `runc exec`): each command leads a session of its own, a signal goes to its process
    /// group, and a command that cannot start is said in runc's words.
    Runtime,
}

/// Serve one host connection until it ends. `Ok` at a clean end of file. The guest's
/// connections to the host's services (`hub`) go to this host while it is served.
pub async fn serve<R, W>(
    mut reader: R,
    writer: W,
    system: Arc<dyn System>,
    hub: Arc<relay::Hub>,
) -> Result<(), ProtoError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, out_rx) = mpsc::unbounded_channel();
    let current = Arc::new(AtomicU64::new(0));
    let writing = tokio::spawn(write_frames(writer, out_rx, current.clone()));
    let mut out = Out {
        tx,
        epoch: 0,
        current,
    };
    let streams: Streams = Arc::default();
    // The nonce of the host being served. The port does not always say end of file between
    // two hosts (one that reconnects at once finds the port still open), so a hello with a new
    // nonce is a new host.
    let mut host: Option<Vec<u8>> = None;
    let result = loop {
        let frame = match proto::read_frame(&mut reader).await {
            Ok(Some(f)) => f,
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        if frame.kind == Kind::Hello && host.as_ref() != Some(&frame.payload) {
            end_all(&streams);
            host = Some(frame.payload.clone());
            // What the previous host's commands still say is not for this one.
            out = out.next_host();
            hub.attach(out.clone());
        }
        if frame.stream & GUEST_STREAM != 0 {
            hub.deliver(frame);
            continue;
        }
        handle(frame, &out, &streams, &system);
    };
    // The host is gone: what it started has no one to report to.
    end_all(&streams);
    hub.detach();
    drop(out);
    writing.abort();
    result
}

/// Kill every command a previous host started, and forget its streams.
fn end_all(streams: &Streams) {
    for (_, s) in lock(streams).drain() {
        if let Some(pid) = s.pid.and_then(rustix::process::Pid::from_raw) {
            // Each command leads its own process group (or session, on a terminal).
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

async fn write_frames<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<(u64, Frame)>,
    current: Arc<AtomicU64>,
) {
    while let Some((epoch, f)) = rx.recv().await {
        if epoch != current.load(Ordering::Acquire) {
            continue;
        }
        if w.write_all(&f.encode()).await.is_err() || w.flush().await.is_err() {
            return;
        }
    }
}

fn handle(frame: Frame, out: &Out, streams: &Streams, system: &Arc<dyn System>) {
    let id = frame.stream;
    match frame.kind {
        Kind::Hello => {
            let nonce = String::from_utf8_lossy(&frame.payload);
            // What this agent can do, before the answer the host waits for (proto's docs).
            let _ = out.send(Frame::new(
                0,
                Kind::Hello,
                format!("{FEATURES} {nonce} {HELD_EXEC}"),
            ));
            let _ = out.send(Frame::new(
                0,
                Kind::Hello,
                format!("{} {nonce}", crate::READY),
            ));
        }
        Kind::Open => {
            if id == 0 || lock(streams).contains_key(&id) {
                let _ = out.send(error(
                    id,
                    format!("stream {id} cannot be opened (in use or reserved)"),
                ));
                return;
            }
            let request: Request = match serde_json::from_slice(&frame.payload) {
                Ok(r) => r,
                Err(e) => {
                    let _ = out.send(error(id, format!("bad request: {e}")));
                    return;
                }
            };
            open(id, request, out.clone(), streams.clone(), system.clone());
        }
        Kind::Data | Kind::Eof => {
            let streams = lock(streams);
            if let Some(input) = streams.get(&id).and_then(|s| s.input.as_ref()) {
                let _ = input.send((frame.kind == Kind::Data).then_some(frame.payload));
            }
        }
        Kind::Credit => {
            if let (Some(n), Some(s)) = (frame.as_u32(), lock(streams).get(&id)) {
                // Never more than a window outstanding, whatever the host claims.
                let room = (WINDOW as usize).saturating_sub(s.credit.available_permits());
                s.credit.add_permits((n as usize).min(room));
            }
        }
        Kind::Resize => {
            let streams = lock(streams);
            if let (Some(tty), [r0, r1, c0, c1]) = (
                streams.get(&id).and_then(|s| s.tty.clone()),
                frame.payload.as_slice(),
            ) {
                let _ = rustix::termios::tcsetwinsize(
                    &*tty,
                    rustix::termios::Winsize {
                        ws_row: u16::from_be_bytes([*r0, *r1]),
                        ws_col: u16::from_be_bytes([*c0, *c1]),
                        ws_xpixel: 0,
                        ws_ypixel: 0,
                    },
                );
            }
        }
        Kind::Signal => {
            let streams = lock(streams);
            if let (Some(pid), Some(sig)) = (streams.get(&id).and_then(|s| s.pid), frame.as_i32())
                && let (Some(pid), Some(sig)) = (
                    rustix::process::Pid::from_raw(pid),
                    rustix::process::Signal::from_named_raw(sig),
                )
            {
                let _ = match system.exec_style() {
                    ExecStyle::Agent => rustix::process::kill_process(pid, sig),
                    ExecStyle::Runtime => rustix::process::kill_process_group(pid, sig),
                };
            }
        }
        Kind::Go | Kind::Cancel => {
            if let Some(gate) = lock(streams).get_mut(&id).and_then(|s| s.gate.as_mut()) {
                gate.say(if frame.kind == Kind::Go {
                    Verdict::Go
                } else {
                    Verdict::Cancelled
                });
            }
        }
        // Only the agent sends these; a host that does is ignored.
        Kind::Stdout | Kind::Stderr | Kind::Exit | Kind::Error => {}
    }
}

fn open(id: u32, request: Request, out: Out, streams: Streams, system: Arc<dyn System>) {
    let (input_tx, input_rx) = mpsc::unbounded_channel();
    let credit = Arc::new(Semaphore::new(WINDOW as usize));
    let (gate, held) = match &request {
        Request::Exec(exec) if exec.held => {
            let (gate, held) = start::held();
            (Some(gate), Some(held))
        }
        _ => (None, None),
    };
    lock(&streams).insert(
        id,
        StreamIn {
            input: Some(input_tx),
            credit: credit.clone(),
            pid: None,
            tty: None,
            gate,
        },
    );
    tokio::spawn(async move {
        let end = match request {
            Request::Exec(exec) => {
                let verdict = match held {
                    Some(held) => held.verdict().await,
                    None => Verdict::Go,
                };
                match verdict.refusal(id) {
                    Some(refused) => refused,
                    None => {
                        let style = system.exec_style();
                        run(id, exec, style, input_rx, &out, &streams, credit).await
                    }
                }
            }
            Request::WriteFile { path, mode } => write_file(id, &path, mode, input_rx, &out).await,
            Request::Setup(setup) => blocking(id, "setup", move || system.setup(&setup)).await,
            Request::GitSsh { .. } => error(
                id,
                "git SSH requests go from the guest to the host, not to the agent".into(),
            ),
            Request::Mount { tag, path } => {
                blocking(id, "mount", move || {
                    if !crate::enter::is_plain_absolute(std::path::Path::new(&path)) {
                        return Err(format!("{path}: not an absolute path without `..`"));
                    }
                    system.mount(&tag, &path)
                })
                .await
            }
            Request::BindTree { tree, path, binds } => {
                // The places skipped go back to the host, one line each on the stream's
                // standard error, before its exit.
                let said = out.clone();
                blocking(id, "binding a tree", move || {
                    for skipped in system.bind_tree(&tree, &path, &binds)? {
                        let _ = said.send(Frame::new(id, Kind::Stderr, format!("{skipped}\n")));
                    }
                    Ok(())
                })
                .await
            }
            Request::UnbindTree { tree, path } => {
                blocking(id, "unbinding a tree", move || {
                    system.unbind_tree(&tree, &path)
                })
                .await
            }
        };
        lock(&streams).remove(&id);
        let _ = out.send(end);
    });
}

/// Run `work` (`what`, in messages) on a blocking thread: the stream's exit 0, or its error.
async fn blocking(
    id: u32,
    what: &str,
    work: impl FnOnce() -> Result<(), String> + Send + 'static,
) -> Frame {
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(())) => Frame::i32(id, Kind::Exit, 0),
        Ok(Err(e)) => error(id, format!("{what}: {e}")),
        Err(e) => error(id, format!("{what}: {e}")),
    }
}

/// Receive a file's content, then replace `path` with it whole.
async fn write_file(
    id: u32,
    path: &str,
    mode: u32,
    mut input: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    out: &Out,
) -> Frame {
    let path = std::path::PathBuf::from(path);
    if !crate::enter::is_plain_absolute(&path) {
        return error(
            id,
            format!("{}: not an absolute path without `..`", path.display()),
        );
    }
    let mut content = Vec::new();
    loop {
        match input.recv().await {
            Some(Some(chunk)) => {
                let _ = out.send(Frame::u32(id, Kind::Credit, chunk.len() as u32));
                content.extend_from_slice(&chunk);
                if content.len() > MAX_FILE {
                    return error(id, format!("{}: over {MAX_FILE} bytes", path.display()));
                }
            }
            Some(None) => break,
            None => return error(id, "the host went away".into()),
        }
    }
    let done = tokio::task::spawn_blocking(move || replace_file(&path, &content, mode)).await;
    match done {
        Ok(Ok(())) => Frame::i32(id, Kind::Exit, 0),
        Ok(Err(e)) => error(id, e),
        Err(e) => error(id, e.to_string()),
    }
}

/// Write `content` beside `path` and rename it over, so `path` is never partly written.
fn replace_file(path: &std::path::Path, content: &[u8], mode: u32) -> Result<(), String> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let said = |e: std::io::Error| format!("{}: {e}", path.display());
    let parent = path.parent().unwrap_or(std::path::Path::new("/"));
    std::fs::create_dir_all(parent).map_err(said)?;
    let tmp = parent.join(format!(
        ".{}.svc-tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file")
    ));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode & 0o7777)
        .open(&tmp)
        .map_err(said)?;
    // No fsync: these are the sandbox's configuration files, written again at every start;
    // the rename is what makes the replacement whole (ext4 flushes a file renamed over
    // another before the rename).
    std::io::Write::write_all(&mut f, content).map_err(said)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode & 0o7777)).map_err(said)?;
    std::fs::rename(&tmp, path).map_err(said)
}
