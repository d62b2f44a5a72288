//! The host's side of the channel to a microvm's agent ([`svc_guest::proto`]): one connection
//! to the VM's virtio-serial socket, many streams over it.
//!
//! The guest is untrusted: every frame it sends is checked. A stream that sends more than its
//! credit allows, or a frame that does not parse, ends the channel (its commands fail with the
//! reason; the next exec connects again). Nothing the guest says is buffered beyond a window
//! per stream.

use std::{
    collections::HashMap,
    path::Path,
    pin::Pin,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use svc_guest::proto::{self, Exec, Frame, GUEST_STREAM, Kind, MAX_PAYLOAD, Request, WINDOW};
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    net::UnixStream,
    sync::{Semaphore, mpsc, oneshot, watch},
};

use super::super::{BoxFuture, ExecControl, ExecHandle, GuestConn, GuestService, RuntimeError};

/// How long one hello waits for its answer before it is sent again.
const HELLO_RETRY: Duration = Duration::from_millis(500);

/// How long one hybrid vsock `CONNECT` waits for its `OK` before it is made again.
const VSOCK_ATTEMPT: Duration = Duration::from_secs(2);

/// What the guest sent on one stream.
enum Event {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(i32),
    Error(String),
}

/// The host's record of an open stream.
struct StreamOut {
    events: mpsc::UnboundedSender<Event>,
    /// Credit the guest gave for what the host sends (standard input, file content).
    credit: Arc<Semaphore>,
    /// Bytes the guest sent that the host has not yet handed on (and credited back).
    unread: Arc<AtomicU32>,
}

type Streams = Arc<Mutex<HashMap<u32, StreamOut>>>;

/// Guest-opened streams at most at once (the service limits its own sessions further).
const MAX_GUEST_STREAMS: usize = 64;

/// The streams the guest opened ([`GUEST_STREAM`] ids), each a [`GuestConn`] handed to the
/// service: the guest's frames are written into it, the service's frames read out of it.
#[derive(Default)]
struct GuestSide {
    service: Option<GuestService>,
    streams: HashMap<u32, GuestIn>,
}

struct GuestIn {
    frames: mpsc::UnboundedSender<Frame>,
    /// `Data` bytes the guest sent that are not yet handed to the service.
    unread: Arc<AtomicU32>,
}

type Guest = Arc<Mutex<GuestSide>>;

fn lock_guest(g: &Guest) -> std::sync::MutexGuard<'_, GuestSide> {
    g.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A stream just opened: what the host needs to send on it and to hear from it.
struct Opened {
    id: u32,
    events: mpsc::UnboundedReceiver<Event>,
    credit: Arc<Semaphore>,
    unread: Arc<AtomicU32>,
    ended: watch::Receiver<Option<String>>,
    out: mpsc::UnboundedSender<Frame>,
}

fn lock(s: &Streams) -> std::sync::MutexGuard<'_, HashMap<u32, StreamOut>> {
    s.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A connected channel.
pub struct Channel {
    out: mpsc::UnboundedSender<Frame>,
    streams: Streams,
    guest: Guest,
    next: AtomicU32,
    /// Why the channel ended, once it has.
    ended: watch::Receiver<Option<String>>,
    /// The tasks that read and write the connection: dropping the channel ends them, which
    /// closes the connection (the agent then ends what this host started).
    tasks: [tokio::task::AbortHandle; 2],
}

impl Drop for Channel {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("ended", &*self.ended.borrow())
            .finish_non_exhaustive()
    }
}

impl Channel {
    /// Connect to the agent at `socket` (QEMU's end of the virtio-serial port) and say hello
    /// until it answers, within `limit`.
    pub async fn connect(socket: &Path, limit: Duration) -> Result<Arc<Self>, String> {
        let deadline = Instant::now() + limit;
        let stream = loop {
            match UnixStream::connect(socket).await {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("connecting to {}: {e}", socket.display()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let (r, w) = stream.into_split();
        let (channel, mut hellos) = Self::over(r, w);
        channel
            .greet(&mut hellos, deadline)
            .await
            .map_err(|e| format!("the agent on {}: {e}", socket.display()))?;
        Ok(channel)
    }

    /// Connect to the agent through a hybrid vsock unix socket (Firecracker's, and
    /// vhost-device-vsock's): `CONNECT <port>\n`, `OK <host port>\n`, then the channel.
    pub async fn connect_vsock(
        socket: &Path,
        port: u32,
        limit: Duration,
    ) -> Result<Arc<Self>, String> {
        let deadline = Instant::now() + limit;
        loop {
            // One attempt waits for its OK at most VSOCK_ATTEMPT: a request sent while the
            // guest's vsock driver is still starting can be lost without the socket closing
            // (the device is reset when the driver binds), and then only a new one is answered.
            let wait = VSOCK_ATTEMPT.min(deadline.saturating_duration_since(Instant::now()));
            let attempt = async {
                let mut stream = UnixStream::connect(socket)
                    .await
                    .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
                stream
                    .write_all(format!("CONNECT {port}\n").as_bytes())
                    .await
                    .map_err(|e| e.to_string())?;
                // Byte by byte: nothing after the line may be read into a buffer here.
                let mut line = Vec::new();
                let mut byte = [0u8; 1];
                while line.len() < 64 && !line.ends_with(b"\n") {
                    if stream.read(&mut byte).await.map_err(|e| e.to_string())? == 0 {
                        return Err(
                            "the vsock socket closed before OK (no agent listening yet?)"
                                .to_owned(),
                        );
                    }
                    line.push(byte[0]);
                }
                svc_guest::parse_vsock_ok(&String::from_utf8_lossy(&line))?;
                Ok(stream)
            };
            let attempt = match tokio::time::timeout(wait, attempt).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::info!(
                        socket = %socket.display(),
                        port,
                        "vsock CONNECT unanswered after {} ms; connecting again",
                        wait.as_millis()
                    );
                    Err(format!("no OK within {} ms", wait.as_millis()))
                }
            };
            match attempt {
                Ok(stream) => {
                    let (r, w) = stream.into_split();
                    let (channel, mut hellos) = Self::over(r, w);
                    channel.greet(&mut hellos, deadline).await.map_err(|e| {
                        format!("the agent on {} port {port}: {e}", socket.display())
                    })?;
                    return Ok(channel);
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("vsock {} port {port}: {e}", socket.display()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Say hello (again every half second) until the agent answers this hello, by `deadline`.
    pub async fn greet(
        &self,
        hellos: &mut mpsc::UnboundedReceiver<String>,
        deadline: Instant,
    ) -> Result<(), String> {
        let nonce = format!("{:016x}", rand_u64());
        let want = format!("{} {nonce}", svc_guest::READY);
        loop {
            if self
                .out
                .send(Frame::new(0, Kind::Hello, nonce.clone()))
                .is_err()
            {
                return Err(self.ended_reason());
            }
            let wait = HELLO_RETRY.min(deadline.saturating_duration_since(Instant::now()));
            let answered = tokio::time::timeout(wait, async {
                while let Some(said) = hellos.recv().await {
                    if said == want {
                        return true;
                    }
                }
                false
            })
            .await;
            match answered {
                Ok(true) => return Ok(()),
                Ok(false) => return Err(self.ended_reason()),
                Err(_) if Instant::now() >= deadline => {
                    return Err("no answer to hello in time".to_owned());
                }
                Err(_) => {}
            }
        }
    }

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
        let writing = tokio::spawn({
            let ended_tx = ended_tx.clone();
            async move {
                if let Err(e) = write_frames(writer, out_rx).await {
                    let _ = ended_tx.send(Some(format!("writing to the agent: {e}")));
                }
            }
        });
        let reading = tokio::spawn({
            let (streams, guest, out) = (streams.clone(), guest.clone(), out.clone());
            async move {
                let why = read_frames(reader, &streams, &hello_tx, &guest, &out).await;
                let _ = ended_tx.send(Some(why));
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
                ended,
                tasks: [writing.abort_handle(), reading.abort_handle()],
            }),
            hello_rx,
        )
    }

    /// Hand the streams the guest opens from now on to `service` (until then they are
    /// refused).
    pub fn serve_guest(&self, service: GuestService) {
        lock_guest(&self.guest).service = Some(service);
    }

    /// Whether the channel still works.
    pub fn is_open(&self) -> bool {
        self.ended.borrow().is_none() && !self.out.is_closed()
    }

    fn ended_reason(&self) -> String {
        self.ended
            .borrow()
            .clone()
            .unwrap_or_else(|| "the channel to the agent closed".into())
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
        let mut opened = self.open(request)?;
        let id = opened.id;
        send_input(&self.out, id, &opened.credit, input).await?;
        let _ = self.out.send(Frame::new(id, Kind::Eof, Vec::new()));
        loop {
            match opened.events.recv().await {
                Some(Event::Exit(0)) => return Ok(()),
                Some(Event::Exit(code)) => return Err(format!("the agent ended it with {code}")),
                Some(Event::Error(e)) => return Err(e),
                Some(Event::Stdout(_) | Event::Stderr(_)) => {}
                None => return Err(self.ended_reason()),
            }
        }
    }

    /// Run a command in the guest: its streams and how it ends.
    pub fn exec(self: &Arc<Self>, exec: Exec) -> Result<ExecHandle, String> {
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
        Ok(ExecHandle {
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
        })
    }
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}

async fn write_frames<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: mpsc::UnboundedReceiver<Frame>,
) -> std::io::Result<()> {
    while let Some(f) = rx.recv().await {
        w.write_all(&f.encode()).await?;
        w.flush().await?;
    }
    Ok(())
}

/// Route the guest's frames to their streams until the channel ends; why it ended.
async fn read_frames<R: AsyncRead + Unpin>(
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
            Err(e) => return format!("the agent broke the protocol: {e}"),
        };
        let id = frame.stream;
        if id & GUEST_STREAM != 0 {
            if let Err(why) = from_guest(frame, guest, out) {
                return format!("the agent broke the protocol: {why}");
            }
            continue;
        }
        match frame.kind {
            Kind::Hello => {
                let _ = hello.send(String::from_utf8_lossy(&frame.payload).into_owned());
            }
            Kind::Stdout | Kind::Stderr => {
                let streams = lock(streams);
                let Some(s) = streams.get(&id) else { continue };
                let len = frame.payload.len() as u32;
                let unread = s.unread.fetch_add(len, Ordering::AcqRel) + len;
                if unread > WINDOW {
                    return format!(
                        "the agent broke the protocol: stream {id} sent {unread} bytes on a window of {WINDOW}"
                    );
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
                    continue;
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
            Kind::Open | Kind::Data | Kind::Eof | Kind::Resize | Kind::Signal => {}
        }
    }
}

/// A frame on a stream the guest opened.
fn from_guest(
    frame: Frame,
    guest: &Guest,
    out: &mpsc::UnboundedSender<Frame>,
) -> Result<(), String> {
    let id = frame.stream;
    let mut g = lock_guest(guest);
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
        Kind::Hello | Kind::Stdout | Kind::Stderr | Kind::Exit | Kind::Resize | Kind::Signal => {}
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

/// Send `input` on stream `id` within its credit.
async fn send_input(
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
async fn forward_input<R: AsyncRead + Unpin>(
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
async fn deliver(
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
struct Remote {
    out: mpsc::UnboundedSender<Frame>,
    ended: watch::Receiver<Option<String>>,
    id: u32,
    exit: Option<oneshot::Receiver<Result<i32, String>>>,
    code: Option<i32>,
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
