//! The agent's side of the channel ([`crate::proto`]): one host connection served until it
//! ends. Runs in the guest (`svc-microvm-agent`); the host's tests run it over a socket pair
//! with real processes.
//!
//! Every stream is independent: a command whose reader is slow waits for credit alone; a
//! request that fails is answered with an error on its own stream. When the host goes away
//! (end of file on the port: svcd restarting, the VM forked) the commands it started are
//! killed — their output has nowhere to go — and the agent waits for the next host.

use std::{
    collections::HashMap,
    os::fd::OwnedFd,
    process::Stdio,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    sync::{Semaphore, mpsc, watch},
};

use crate::proto::{self, Exec, Frame, GUEST_STREAM, Kind, ProtoError, Request, Setup, WINDOW};

pub mod relay;

/// Largest file the host may write with one request.
pub const MAX_FILE: usize = 16 << 20;

/// How long output may keep coming after a command exited before its stream is closed (a
/// background process that kept the command's stdout open would hold it forever).
const DRAIN_IDLE: Duration = Duration::from_millis(500);

/// What the agent changes in the guest outside the processes it runs: the network, the host
/// name, the entropy pool. The guest's implementation is in the agent binary.
pub trait System: Send + Sync {
    fn setup(&self, setup: &Setup) -> Result<(), String>;
    /// Mount the virtio-fs file system `tag` at `path`.
    fn mount(&self, tag: &str, path: &str) -> Result<(), String>;
}

/// What the agent knows of one open stream, for the frames that follow its `Open`.
struct StreamIn {
    /// Standard input or file content (`None` = end of file).
    input: Option<mpsc::UnboundedSender<Option<Vec<u8>>>>,
    /// Credit for what the agent sends on this stream.
    credit: Arc<Semaphore>,
    /// The command's process (for signals, and to kill it when the host goes away).
    pid: Option<i32>,
    /// The command's terminal (for resizes).
    tty: Option<Arc<OwnedFd>>,
}

type Streams = Arc<Mutex<HashMap<u32, StreamIn>>>;

fn lock(s: &Streams) -> std::sync::MutexGuard<'_, HashMap<u32, StreamIn>> {
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

/// Where a stream's frames go: to the host it was opened by, and nowhere once another host
/// took over the channel.
#[derive(Clone)]
struct Out {
    tx: mpsc::UnboundedSender<(u64, Frame)>,
    /// The host this sender is for.
    epoch: u64,
    /// The host being served now.
    current: Arc<AtomicU64>,
}

impl Out {
    fn send(&self, frame: Frame) -> Result<(), ()> {
        self.tx.send((self.epoch, frame)).map_err(|_| ())
    }

    fn next_host(&self) -> Self {
        let epoch = self.current.fetch_add(1, Ordering::AcqRel) + 1;
        Self {
            tx: self.tx.clone(),
            epoch,
            current: self.current.clone(),
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
                let _ = rustix::process::kill_process(pid, sig);
            }
        }
        // Only the agent sends these; a host that does is ignored.
        Kind::Stdout | Kind::Stderr | Kind::Exit | Kind::Error => {}
    }
}

fn error(id: u32, message: String) -> Frame {
    Frame::new(id, Kind::Error, message)
}

fn open(id: u32, request: Request, out: Out, streams: Streams, system: Arc<dyn System>) {
    let (input_tx, input_rx) = mpsc::unbounded_channel();
    let credit = Arc::new(Semaphore::new(WINDOW as usize));
    lock(&streams).insert(
        id,
        StreamIn {
            input: Some(input_tx),
            credit: credit.clone(),
            pid: None,
            tty: None,
        },
    );
    tokio::spawn(async move {
        let end = match request {
            Request::Exec(exec) => run(id, exec, input_rx, &out, &streams, credit).await,
            Request::WriteFile { path, mode } => write_file(id, &path, mode, input_rx, &out).await,
            Request::Setup(setup) => {
                let system = system.clone();
                match tokio::task::spawn_blocking(move || system.setup(&setup)).await {
                    Ok(Ok(())) => Frame::i32(id, Kind::Exit, 0),
                    Ok(Err(e)) => error(id, format!("setup: {e}")),
                    Err(e) => error(id, format!("setup: {e}")),
                }
            }
            Request::GitSsh { .. } => error(
                id,
                "git SSH requests go from the guest to the host, not to the agent".into(),
            ),
            Request::Mount { tag, path } => {
                let system = system.clone();
                let done = tokio::task::spawn_blocking(move || {
                    let p = std::path::Path::new(&path);
                    if !p.is_absolute()
                        || p.components().any(|c| c == std::path::Component::ParentDir)
                    {
                        return Err(format!("{path}: not an absolute path without `..`"));
                    }
                    system.mount(&tag, &path)
                })
                .await;
                match done {
                    Ok(Ok(())) => Frame::i32(id, Kind::Exit, 0),
                    Ok(Err(e)) => error(id, format!("mount: {e}")),
                    Err(e) => error(id, format!("mount: {e}")),
                }
            }
        };
        lock(&streams).remove(&id);
        let _ = out.send(end);
    });
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
    if !path.is_absolute()
        || path
            .components()
            .any(|c| c == std::path::Component::ParentDir)
    {
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

/// Run a command; its output on the stream, then its exit code.
async fn run(
    id: u32,
    exec: Exec,
    input: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    out: &Out,
    streams: &Streams,
    credit: Arc<Semaphore>,
) -> Frame {
    let Some(program) = exec.argv.first() else {
        return error(id, "exec needs a command".into());
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&exec.argv[1..])
        .env_clear()
        .envs(exec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(exec.cwd.as_deref().unwrap_or("/"));
    let tty = match exec.tty {
        Some((rows, cols)) => match terminal(&mut cmd, rows, cols) {
            Ok(master) => Some(Arc::new(master)),
            Err(e) => return error(id, format!("opening a terminal: {e}")),
        },
        None => {
            cmd.stdin(if exec.stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
            None
        }
    };
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            // As a shell says it: 127 not found, 126 found but not runnable.
            let code = if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            };
            let _ = out.send(Frame::new(
                id,
                Kind::Stderr,
                format!("svc-microvm-agent: {program}: {e}\n"),
            ));
            return Frame::i32(id, Kind::Exit, code);
        }
    };
    let pid = child.id().and_then(|p| i32::try_from(p).ok());
    if let Some(s) = lock(streams).get_mut(&id) {
        s.pid = pid;
        s.tty = tty.clone();
    }
    let (exited_tx, exited) = watch::channel(false);
    let mut pumps = Vec::new();
    match &tty {
        Some(master) => {
            let file = |m: &OwnedFd| m.try_clone().map(|fd| tokio::fs::File::from_std(fd.into()));
            match (file(master), file(master)) {
                (Ok(r), Ok(w)) => {
                    pumps.push(tokio::spawn(pump(
                        id,
                        Kind::Stdout,
                        r,
                        out.clone(),
                        credit.clone(),
                        exited.clone(),
                    )));
                    tokio::spawn(feed(id, w, input, out.clone()));
                }
                (Err(e), _) | (_, Err(e)) => {
                    let _ = child.start_kill();
                    return error(id, format!("the terminal: {e}"));
                }
            }
        }
        None => {
            if let Some(stdout) = child.stdout.take() {
                pumps.push(tokio::spawn(pump(
                    id,
                    Kind::Stdout,
                    stdout,
                    out.clone(),
                    credit.clone(),
                    exited.clone(),
                )));
            }
            if let Some(stderr) = child.stderr.take() {
                pumps.push(tokio::spawn(pump(
                    id,
                    Kind::Stderr,
                    stderr,
                    out.clone(),
                    credit.clone(),
                    exited.clone(),
                )));
            }
            if let Some(stdin) = child.stdin.take() {
                tokio::spawn(feed(id, stdin, input, out.clone()));
            }
        }
    }
    let code = match child.wait().await {
        Ok(status) => status.code().unwrap_or_else(|| {
            128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
        }),
        Err(e) => return error(id, format!("waiting for {program}: {e}")),
    };
    let _ = exited_tx.send(true);
    for p in pumps {
        let _ = p.await;
    }
    Frame::i32(id, Kind::Exit, code)
}

/// Give `cmd` a new terminal of `rows`×`cols` as its controlling terminal and all of its
/// standard streams; the terminal's master end.
fn terminal(cmd: &mut tokio::process::Command, rows: u16, cols: u16) -> std::io::Result<OwnedFd> {
    let pty = nix::pty::openpty(
        Some(&nix::pty::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        }),
        None,
    )
    .map_err(std::io::Error::from)?;
    cmd.stdin(Stdio::from(pty.slave.try_clone()?))
        .stdout(Stdio::from(pty.slave.try_clone()?))
        .stderr(Stdio::from(pty.slave));
    #[expect(
        unsafe_code,
        reason = "pre_exec: a new session whose controlling terminal is the command's stdin"
    )]
    // SAFETY: between fork and exec the closure only makes two system calls (setsid and the
    // TIOCSCTTY ioctl on fd 0, which the stdio set-up above made the terminal); it allocates
    // nothing and takes no locks.
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()?;
            rustix::process::ioctl_tiocsctty(std::os::fd::BorrowedFd::borrow_raw(0))?;
            Ok(())
        });
    }
    Ok(pty.master)
}

/// Copy a command's output to the host as `kind` frames, within the stream's credit. Ends at
/// end of file (a terminal says EIO when its last writer closed) or once the command exited
/// and nothing came for [`DRAIN_IDLE`].
async fn pump<R: AsyncRead + Unpin>(
    id: u32,
    kind: Kind,
    mut r: R,
    out: Out,
    credit: Arc<Semaphore>,
    mut exited: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let read = tokio::select! {
            r = r.read(&mut buf) => r,
            () = idle_after_exit(&mut exited) => return,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        match credit.acquire_many(n as u32).await {
            Ok(p) => p.forget(),
            Err(_) => return,
        }
        if out.send(Frame::new(id, kind, &buf[..n])).is_err() {
            return;
        }
    }
}

async fn idle_after_exit(exited: &mut watch::Receiver<bool>) {
    if exited.wait_for(|e| *e).await.is_err() {
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(DRAIN_IDLE).await;
}

/// Copy the host's input to the command, returning credit as it is written.
async fn feed<W: AsyncWrite + Unpin>(
    id: u32,
    mut w: W,
    mut input: mpsc::UnboundedReceiver<Option<Vec<u8>>>,
    out: Out,
) {
    while let Some(Some(chunk)) = input.recv().await {
        if w.write_all(&chunk).await.is_err() || w.flush().await.is_err() {
            return;
        }
        let _ = out.send(Frame::u32(id, Kind::Credit, chunk.len() as u32));
    }
    // End of input: on a terminal, say it the way a terminal does (^D at line start).
    let _ = w.shutdown().await;
}
