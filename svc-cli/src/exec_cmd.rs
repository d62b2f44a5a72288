//! `svc sandbox exec`: a command in a sandbox, attached like `docker exec`. The call is an
//! upgraded HTTP request (`Upgrade: svc-exec.v1`); afterwards the connection carries JSON
//! lines both ways: stdin, end of input, terminal size and signals up, output and the exit
//! code down.

use std::{
    io::{IsTerminal as _, Write as _},
    process::ExitCode,
};

use anyhow::Context as _;
use base64::Engine as _;
use bytes::Bytes;
use clap::Args;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use svc_control::api::{EXEC_UPGRADE, ExecFrame, ExecInput, ExecRequest, TermSize};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

use crate::{
    client::{Client, refused},
    exit,
};

/// `svc sandbox exec` arguments.
#[derive(Debug, Args)]
#[command(after_help = "\
Everything after NAME is the command and its arguments, flags included (`svc sandbox exec dev \
ls -la`); `--` before the command works too. The command runs as root in the sandbox with the \
sandbox's environment (placeholders, CA variables, SVC_SANDBOX) plus --env, in /workspace in a \
workspace's sandbox and in / otherwise (--workdir to choose); its output streams here.

Exit status: the command's own (128 + N when signal N ended it); 125 when svc or svcd could not \
run it (svcd unreachable, no such sandbox, refused), 126 when it cannot be run (permission \
denied, not an executable), 127 when it was not found.

Standard input is forwarded when it is not a terminal (a pipe or a file, as with ssh), or \
always with -i. -t runs the command on a terminal of this terminal's size (resized with it); \
then Ctrl-C and the other control keys act inside the sandbox. Without -t, SIGINT, SIGTERM and \
SIGHUP that svc receives are passed on to the command.

Examples:
  svc sandbox exec dev curl -sS https://api.github.com/
  echo hi | svc sandbox exec dev cat
  svc sandbox exec -it dev bash
  svc sandbox exec -w /root -e DEBUG=1 dev make test")]
pub struct ExecArgs {
    /// Keep standard input open and forward it, even when it is a terminal.
    #[arg(short = 'i', long)]
    pub interactive: bool,
    /// Run the command on a terminal (needs svc's own standard input to be one).
    #[arg(short = 't', long)]
    pub tty: bool,
    /// Extra environment, KEY=VALUE (repeatable).
    #[arg(long = "env", short = 'e')]
    pub env: Vec<String>,
    /// Working directory in the sandbox (default: /workspace in a workspace's sandbox, else /).
    #[arg(long = "workdir", short = 'w', visible_alias = "cwd")]
    pub workdir: Option<String>,
    /// The sandbox to run the command in.
    pub name: String,
    /// The command and its arguments (flags after CMD are the command's).
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<String>,
}

/// Run the command; svc's own failures end it with [`exit::EXEC_FAILED`] (125), so that they
/// are not mistaken for the command's status.
pub async fn run(client: &Client, a: ExecArgs) -> anyhow::Result<ExitCode> {
    attach(client, a)
        .await
        .map_err(|e| exit::coded(exit::EXEC_FAILED, e))
}

async fn attach(client: &Client, a: ExecArgs) -> anyhow::Result<ExitCode> {
    let env = a
        .env
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .filter(|(k, _)| !k.is_empty())
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .with_context(|| format!("--env {kv:?}: expected KEY=VALUE"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let stdin_is_tty = std::io::stdin().is_terminal();
    if a.tty && !stdin_is_tty {
        anyhow::bail!(
            "-t asks for a terminal, but svc's standard input is not one; drop -t (use -i to \
             forward input from a pipe)"
        );
    }
    let size = a.tty.then(local_size);
    let forward = a.interactive || a.tty || !stdin_is_tty;
    let req = ExecRequest {
        user: None,
        root: None,
        hardening: None,
        argv: a.command,
        env,
        cwd: a.workdir,
        stdin: forward,
        tty: size,
    };
    let io = upgrade(client, &a.name, &req).await?;
    let _raw = if a.tty { Some(RawMode::enter()?) } else { None };
    let (reader, writer) = tokio::io::split(TokioIo::new(io));
    let (tx, rx) = tokio::sync::mpsc::channel::<ExecInput>(64);
    let sender = tokio::spawn(send_frames(writer, rx));
    let mut tasks = Vec::new();
    if forward {
        tasks.push(tokio::spawn(read_stdin(tx.clone())));
    }
    tasks.push(tokio::spawn(forward_signals(tx.clone(), a.tty)));
    drop(tx);
    let code = receive_frames(reader).await;
    for t in tasks {
        t.abort();
    }
    sender.abort();
    let code = code?;
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(exit::FAILURE)))
}

/// Make the upgraded call; the raw connection after `101 Switching Protocols`.
async fn upgrade(
    client: &Client,
    name: &str,
    req: &ExecRequest,
) -> anyhow::Result<hyper::upgrade::Upgraded> {
    let stream = client.connect().await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("talking to svcd")?;
    tokio::spawn(conn.with_upgrades());
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("/v1/sandboxes/{name}/exec"))
        .header("host", "svcd")
        .header("connection", "upgrade")
        .header("upgrade", EXEC_UPGRADE)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(req)?)))
        .context("building the request")?;
    let resp = sender
        .send_request(request)
        .await
        .context("talking to svcd")?;
    let status = resp.status();
    if status != StatusCode::SWITCHING_PROTOCOLS {
        let body = resp.into_body().collect().await?.to_bytes();
        return Err(refused(status, &body).into());
    }
    hyper::upgrade::on(resp)
        .await
        .context("svcd agreed to attach, then the connection failed")
}

/// The frames svcd sends: output to ours, then the exit code.
async fn receive_frames(
    reader: tokio::io::ReadHalf<TokioIo<hyper::upgrade::Upgraded>>,
) -> anyhow::Result<i32> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut lines = tokio::io::BufReader::new(reader).lines();
    while let Some(line) = lines.next_line().await.context("reading svcd's stream")? {
        let frame: ExecFrame =
            serde_json::from_str(&line).with_context(|| format!("bad exec frame {line}"))?;
        match frame {
            ExecFrame::Stdout(d) => {
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(&b64.decode(d)?);
                let _ = out.flush();
            }
            ExecFrame::Stderr(d) => {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(&b64.decode(d)?);
                let _ = err.flush();
            }
            ExecFrame::Exit(c) => return Ok(c),
            ExecFrame::Error(e) => anyhow::bail!("the command could not run: {e}"),
        }
    }
    anyhow::bail!("the exec stream ended without an exit code (svcd stopped?)")
}

async fn send_frames(
    mut writer: tokio::io::WriteHalf<TokioIo<hyper::upgrade::Upgraded>>,
    mut rx: tokio::sync::mpsc::Receiver<ExecInput>,
) {
    while let Some(frame) = rx.recv().await {
        let mut b = serde_json::to_vec(&frame).unwrap_or_default();
        b.push(b'\n');
        if writer.write_all(&b).await.is_err() || writer.flush().await.is_err() {
            return;
        }
    }
}

async fn read_stdin(tx: tokio::sync::mpsc::Sender<ExecInput>) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut stdin = tokio::io::stdin();
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match stdin.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = tx.send(ExecInput::Eof).await;
                return;
            }
            Ok(n) => {
                if tx
                    .send(ExecInput::Stdin(b64.encode(&buf[..n])))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}

/// Without a terminal: SIGINT, SIGTERM and SIGHUP go to the command. With one: the window
/// size follows ours.
async fn forward_signals(tx: tokio::sync::mpsc::Sender<ExecInput>, tty: bool) {
    use tokio::signal::unix::{SignalKind, signal};
    if tty {
        let Ok(mut winch) = signal(SignalKind::window_change()) else {
            return;
        };
        while winch.recv().await.is_some() {
            if tx.send(ExecInput::Resize(local_size())).await.is_err() {
                return;
            }
        }
        return;
    }
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return;
    };
    loop {
        let n = tokio::select! {
            _ = int.recv() => 2,
            _ = term.recv() => 15,
            _ = hup.recv() => 1,
        };
        if tx.send(ExecInput::Signal(n)).await.is_err() {
            return;
        }
    }
}

/// This terminal's size (80x24 if it cannot be read).
fn local_size() -> TermSize {
    rustix::termios::tcgetwinsize(std::io::stdout())
        .ok()
        .filter(|w| w.ws_row > 0 && w.ws_col > 0)
        .map_or(TermSize { rows: 24, cols: 80 }, |w| TermSize {
            rows: w.ws_row,
            cols: w.ws_col,
        })
}

/// Our terminal in raw mode (keys go to the sandbox's terminal as typed) until dropped.
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enter() -> anyhow::Result<Self> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(&stdin).context("reading the terminal's mode")?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Now, &raw)
            .context("setting the terminal to raw mode")?;
        Ok(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}
