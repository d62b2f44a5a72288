//! The git-over-SSH relay (SPEC 5.6): a sandbox's `svc-git-ssh` shim sends git's SSH request
//! here; the relay decides it with `policy::ssh`, then runs the host's real `ssh` with the
//! host's agent and pumps the session. A push's command list is read whole, the way git's
//! receive-pack reads it (`policy::receive_pack`), and every ref git would update checked before
//! a byte of it reaches the server; a stream svc cannot read as git does is refused.
//!
//! The relay resolves the server's name itself and has ssh dial the address it chose (the
//! first answer `policy::destination::classify_dial` lets through), never letting ssh resolve
//! on its own: a hostile resolver's loopback, metadata or sandbox answer is never dialled. The
//! host key is still checked against the name (`HostKeyAlias`).
//!
//! The shim speaks `svc_guest::proto` on one stream: `Open` with a `GitSsh` request, `Data`/
//! `Eof` for git's input, and gets `Stdout`/`Stderr`/`Exit` back, with credit both ways.

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use svc_guest::proto::{self, Frame, Kind, Request, WINDOW};
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _},
    sync::{Semaphore, mpsc},
};

use crate::policy::{
    destination::{HostNetwork, classify_dial},
    ssh::{self, RefUpdate, Service, SshRequest},
};

mod held;

/// What a sandbox may reach over SSH.
#[derive(Debug, Clone, Default)]
pub struct RelayPolicy {
    /// (host, `owner/repo`) pairs of `.svc/config.yaml` `egress.policy`.
    pub repos: Vec<(String, String)>,
    /// AllowedBranches globs (default `refs/heads/svc/**`).
    pub branches: Vec<String>,
}

/// How the relay runs the host's ssh.
#[derive(Debug, Clone)]
pub struct SshClient {
    pub binary: PathBuf,
    /// The host's agent (`SSH_AUTH_SOCK`); the only credential the relay uses.
    pub auth_sock: Option<PathBuf>,
    /// The known-hosts file servers are checked against (strictly).
    pub known_hosts: PathBuf,
    /// How the server's name is resolved (the host's resolver).
    pub resolver: RelayResolver,
    /// Every address the relay has ssh dial passes the destination classes with this.
    pub network: HostNetwork,
}

/// The resolver the relay finds a server's addresses with.
#[derive(Clone)]
pub struct RelayResolver(pub Arc<dyn crate::proxy::Resolve>);

impl std::fmt::Debug for RelayResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RelayResolver")
    }
}

/// The address ssh dials for `host:port`: the first of its addresses whose destination class
/// svc dials; refused with a line naming the classes when none is.
pub async fn dial_address(client: &SshClient, host: &str, port: u16) -> Result<SocketAddr, String> {
    let addrs: Vec<IpAddr> = client
        .resolver
        .0
        .resolve(host)
        .await
        .map_err(|e| format!("svc: refused: {host} could not be resolved: {e}"))?;
    let mut refused = Vec::new();
    for ip in addrs {
        let at = SocketAddr::new(ip, port);
        let verdict = classify_dial(at, &client.network);
        if verdict.reachable() {
            return Ok(at);
        }
        refused.push(format!("{at} ({})", verdict.class.name()));
    }
    Err(if refused.is_empty() {
        format!("svc: refused: {host} has no address")
    } else {
        format!(
            "svc: refused: {host} resolves only to addresses svc never dials for a sandbox: {}",
            refused.join(", ")
        )
    })
}

/// What one session did, for the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub host: String,
    pub repo: String,
    pub command: String,
    pub refs: Vec<RefUpdate>,
    /// The push came with a signed certificate.
    pub signed: bool,
    /// `allow` or `deny`.
    pub decision: &'static str,
    /// Why it was refused (the line git's stderr got), if it was.
    pub reason: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration: Duration,
    pub exit: i32,
}

pub use crate::policy::ssh::{policy_refusal, ref_refusal};

/// How long a connection may take to send its request.
const REQUEST_LIMIT: Duration = Duration::from_secs(30);

/// The shim's request: its first `Open` (stream id, ssh arguments, `GIT_PROTOCOL`). Anything
/// else is answered with an error on the stream and ends the connection.
async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut R,
    out: &mpsc::UnboundedSender<Frame>,
) -> Result<(u32, Vec<String>, Option<String>), String> {
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
        Ok(Request::GitSsh { args, git_protocol }) => Ok((f.stream, args, git_protocol)),
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

/// Answer one shim connection's request with `line` on git's stderr and exit status 1,
/// without looking further (a sandbox with too many sessions).
pub async fn refuse<R, W>(mut reader: R, writer: W, line: &str) -> Result<Session, String>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let (out, out_rx) = mpsc::unbounded_channel::<Frame>();
    let writing = tokio::spawn(write_frames(writer, out_rx));
    let read = read_request(&mut reader, &out).await;
    let result = read.map(|(id, args, _)| {
        let _ = out.send(Frame::new(id, Kind::Stderr, format!("{line}\n")));
        let _ = out.send(Frame::i32(id, Kind::Exit, 1));
        let request = ssh::parse_request(&args).ok();
        Session {
            host: request.as_ref().map(|r| r.host.clone()).unwrap_or_default(),
            repo: request.as_ref().map(|r| r.repo.clone()).unwrap_or_default(),
            command: request
                .map(|r| r.service.command().to_owned())
                .unwrap_or_default(),
            refs: Vec::new(),
            signed: false,
            decision: "deny",
            reason: Some(line.to_owned()),
            bytes_up: 0,
            bytes_down: 0,
            duration: started.elapsed(),
            exit: 1,
        }
    });
    finish(writing, out).await;
    result
}

/// Serve one shim connection.
pub async fn serve<R, W>(
    mut reader: R,
    writer: W,
    policy: &RelayPolicy,
    client: &SshClient,
) -> Result<Session, String>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let started = Instant::now();
    let (out, out_rx) = mpsc::unbounded_channel::<Frame>();
    let writing = tokio::spawn(write_frames(writer, out_rx));
    let (id, args, git_protocol) = match read_request(&mut reader, &out).await {
        Ok(r) => r,
        Err(e) => {
            finish(writing, out).await;
            return Err(e);
        }
    };
    let refuse = |session: Session, line: String| {
        let _ = out.send(Frame::new(id, Kind::Stderr, format!("{line}\n")));
        let _ = out.send(Frame::i32(id, Kind::Exit, 1));
        Session {
            decision: "deny",
            reason: Some(line),
            exit: 1,
            duration: started.elapsed(),
            ..session
        }
    };
    let blank = Session {
        host: String::new(),
        repo: String::new(),
        command: String::new(),
        refs: Vec::new(),
        signed: false,
        decision: "deny",
        reason: None,
        bytes_up: 0,
        bytes_down: 0,
        duration: Duration::ZERO,
        exit: 1,
    };
    let request = match ssh::parse_request(&args) {
        Ok(r) => r,
        Err(e) => {
            let s = refuse(blank, format!("svc: refused: {e}"));
            finish(writing, out).await;
            return Ok(s);
        }
    };
    let session = Session {
        host: request.host.clone(),
        repo: request.repo.clone(),
        command: request.service.command().to_owned(),
        ..blank
    };
    if !ssh::repo_allowed(&policy.repos, &request.host, &request.repo) {
        let s = refuse(session, policy_refusal(&request.host, &request.repo));
        finish(writing, out).await;
        return Ok(s);
    }
    let result = relay(
        &mut reader,
        &out,
        id,
        &request,
        git_protocol,
        policy,
        client,
        session,
    )
    .await;
    let mut session = match result {
        Ok(s) => s,
        Err((s, line)) => refuse(s, line),
    };
    session.duration = started.elapsed();
    finish(writing, out).await;
    Ok(session)
}

async fn finish(writing: tokio::task::JoinHandle<()>, out: mpsc::UnboundedSender<Frame>) {
    drop(out);
    let _ = tokio::time::timeout(Duration::from_secs(5), writing).await;
}

async fn write_frames<W: AsyncWrite + Unpin>(mut w: W, mut rx: mpsc::UnboundedReceiver<Frame>) {
    while let Some(f) = rx.recv().await {
        if w.write_all(&f.encode()).await.is_err() || w.flush().await.is_err() {
            return;
        }
    }
}

/// Run ssh and pump the session; a refused push is `Err` with its line.
#[expect(clippy::too_many_arguments, reason = "one session's parts")]
async fn relay<R: AsyncRead + Unpin>(
    reader: &mut R,
    out: &mpsc::UnboundedSender<Frame>,
    id: u32,
    request: &SshRequest,
    git_protocol: Option<String>,
    policy: &RelayPolicy,
    client: &SshClient,
    mut session: Session,
) -> Result<Session, (Session, String)> {
    // The command is ours, rebuilt from the parsed request (its path holds only name
    // characters): no guest text reaches a shell.
    let command = format!("{} '/{}.git'", request.service.command(), request.repo);
    let port = request.port.unwrap_or(22);
    let dial = match dial_address(client, &request.host, port).await {
        Ok(a) => a,
        Err(line) => return Err((session, line)),
    };
    // ssh dials the checked address and checks the host key under the name (as known_hosts
    // writes it: `[name]:port` off port 22).
    let alias = if port == 22 {
        request.host.clone()
    } else {
        format!("[{}]:{port}", request.host)
    };
    let mut cmd = tokio::process::Command::new(&client.binary);
    cmd.args(["-F", "/dev/null", "-T", "-x", "-a"])
        .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"])
        .arg("-o")
        .arg(format!(
            "UserKnownHostsFile={}",
            client.known_hosts.display()
        ))
        .args(["-o", "ClearAllForwardings=yes", "-o", "ProxyCommand=none"])
        .args(["-o", "ConnectTimeout=15", "-o", "CheckHostIP=no"])
        .arg("-o")
        .arg(format!("HostName={}", dial.ip()))
        .arg("-o")
        .arg(format!("HostKeyAlias={alias}"));
    if let Some(v) = git_protocol.filter(|v| ssh::git_protocol_ok(v)) {
        cmd.arg("-o").arg(format!("SetEnv=GIT_PROTOCOL={v}"));
    }
    if let Some(port) = request.port {
        cmd.arg("-p").arg(port.to_string());
    }
    let target = match &request.user {
        Some(u) => format!("{u}@{}", request.host),
        None => request.host.clone(),
    };
    cmd.arg("--").arg(target).arg(command);
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(sock) = &client.auth_sock {
        cmd.env("SSH_AUTH_SOCK", sock);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let line = format!("svc: the relay cannot run {}: {e}", client.binary.display());
            return Err((session, line));
        }
    };
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err((session, "svc: the relay lost ssh's pipes".into()));
    };
    // The server's output to git, within the shim's credit.
    let credit = Arc::new(Semaphore::new(WINDOW as usize));
    let down = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let pumps = [
        tokio::spawn(pump(
            id,
            Kind::Stdout,
            stdout,
            out.clone(),
            credit.clone(),
            down.clone(),
        )),
        tokio::spawn(pump(
            id,
            Kind::Stderr,
            stderr,
            out.clone(),
            credit.clone(),
            down.clone(),
        )),
    ];
    // git's input to the server: a push's command list is held until every ref is checked.
    let mut held: Option<Vec<u8>> = (request.service == Service::ReceivePack).then(Vec::new);
    let mut schedule = held::Schedule::default();
    // git's input goes to ssh from a task of its own, credited back as it is written: the
    // loop below never waits on the server, so git's credit for the server's output always
    // gets through (a server that writes while it does not read cannot stall both ways).
    // Held bytes were credited when they arrived.
    // The shim is held to its window: `unread` counts the bytes of git's input svcd holds
    // that the shim has not had credit back for, and a shim that sends past WINDOW is cut, so
    // svcd never holds more than a window per session whatever the server does (a server that
    // does not read stalls only this session).
    let (feed, mut fed) = mpsc::unbounded_channel::<(Vec<u8>, bool)>();
    let unread = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn({
        let out = out.clone();
        let mut stdin = stdin;
        let unread = unread.clone();
        async move {
            while let Some((bytes, credit)) = fed.recv().await {
                if stdin.write_all(&bytes).await.is_err() {
                    return;
                }
                if credit {
                    unread.fetch_sub(bytes.len(), Ordering::SeqCst);
                    let _ = out.send(Frame::u32(id, Kind::Credit, bytes.len() as u32));
                }
            }
            // Dropping stdin here: git's end of input, ssh closes the server's.
        }
    });
    let mut feed = Some(feed);
    let mut up = 0u64;
    let mut exited = None;
    let add_credit = |frame: &Frame| {
        if let Some(n) = frame.as_u32() {
            let room = (WINDOW as usize).saturating_sub(credit.available_permits());
            credit.add_permits((n as usize).min(room));
        }
    };
    loop {
        // git's next frame, or ssh's end (then git's input has nowhere to go: a client that
        // waits for the server would wait forever).
        let frame = tokio::select! {
            f = proto::read_frame(reader) => match f {
                Ok(Some(f)) => f,
                // The shim went away (it ends its input with Eof, never by closing): nobody
                // reads the server's output any more.
                Ok(None) | Err(_) => {
                    let _ = child.kill().await;
                    break;
                }
            },
            status = child.wait() => {
                exited = Some(status);
                break;
            }
        };
        match frame.kind {
            Kind::Data => {
                let n = frame.payload.len();
                up += n as u64;
                let holding = unread.fetch_add(n, Ordering::SeqCst) + n;
                if holding > WINDOW as usize {
                    let _ = child.kill().await;
                    writer.abort();
                    for p in pumps {
                        p.abort();
                    }
                    return Err((session, window_refusal(holding)));
                }
                let ready = match &mut held {
                    None => Some((frame.payload, true)),
                    Some(buf) => {
                        unread.fetch_sub(n, Ordering::SeqCst);
                        let _ = out.send(Frame::u32(id, Kind::Credit, n as u32));
                        buf.extend_from_slice(&frame.payload);
                        let read = if schedule.due(buf) {
                            ssh::parse_push(buf)
                        } else {
                            Ok(None)
                        };
                        match read {
                            Ok(None) => None,
                            Ok(Some(push)) => {
                                // Every ref git would update, refused or not, in the audit.
                                session.refs = push.updates.clone();
                                session.signed = push.signed;
                                if let Some(bad) =
                                    ssh::first_refused(&policy.branches, &push.updates)
                                {
                                    let line = ref_refusal(&bad.name);
                                    let _ = child.kill().await;
                                    writer.abort();
                                    for p in pumps {
                                        p.abort();
                                    }
                                    return Err((session, line));
                                }
                                held.take().map(|b| (b, false))
                            }
                            Err(e) => {
                                // Nothing reaches the server; the audit names what git would
                                // have applied.
                                (session.refs, session.signed) = ssh::git_reading(buf);
                                let _ = child.kill().await;
                                writer.abort();
                                for p in pumps {
                                    p.abort();
                                }
                                return Err((session, format!("svc: refused: {e}")));
                            }
                        }
                    }
                };
                if let (Some(chunk), Some(f)) = (ready, feed.as_ref()) {
                    let _ = f.send(chunk);
                }
            }
            Kind::Eof => {
                if held.is_some() {
                    // git ended before its command list was whole: nothing reaches the server.
                    let _ = child.kill().await;
                    break;
                }
                feed = None;
            }
            Kind::Credit => add_credit(&frame),
            _ => {}
        }
    }
    drop(feed);
    let status = match exited {
        Some(s) => s,
        None => child.wait().await,
    };
    writer.abort();
    // ssh has ended, but the server's last output may still wait in the pumps for git's
    // credit: keep taking git's credit until both have handed everything on.
    let aborts: Vec<_> = pumps
        .iter()
        .map(tokio::task::JoinHandle::abort_handle)
        .collect();
    let mut drained = std::pin::pin!(futures::future::join_all(pumps));
    loop {
        tokio::select! {
            _ = &mut drained => break,
            f = proto::read_frame(reader) => match f {
                Ok(Some(f)) if f.kind == Kind::Credit => add_credit(&f),
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => {
                    for a in &aborts {
                        a.abort();
                    }
                    break;
                }
            },
        }
    }
    let code = status.ok().and_then(|s| s.code()).unwrap_or(255);
    let _ = out.send(Frame::i32(id, Kind::Exit, code));
    session.decision = "allow";
    session.exit = code;
    session.bytes_up = up;
    session.bytes_down = down.load(std::sync::atomic::Ordering::Relaxed);
    Ok(session)
}

/// The line git's stderr gets when its shim sends past its credit window (a client that is not
/// the image's shim: the shim waits for credit).
pub fn window_refusal(holding: usize) -> String {
    format!(
        "svc: refused: the git SSH client sent {holding} bytes the relay had not credited (its \
         window is {WINDOW} bytes); the session is cut"
    )
}

async fn pump<R: AsyncRead + Unpin>(
    id: u32,
    kind: Kind,
    mut r: R,
    out: mpsc::UnboundedSender<Frame>,
    credit: Arc<Semaphore>,
    count: Arc<std::sync::atomic::AtomicU64>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        match credit.acquire_many(n as u32).await {
            Ok(p) => p.forget(),
            Err(_) => return,
        }
        count.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        if out.send(Frame::new(id, kind, &buf[..n])).is_err() {
            return;
        }
    }
}
