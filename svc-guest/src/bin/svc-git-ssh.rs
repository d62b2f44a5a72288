//! `svc-git-ssh`: the git SSH shim a sandbox's `GIT_SSH_COMMAND` names. git runs it as it
//! would run `ssh` (`[-o SendEnv=GIT_PROTOCOL] [-4|-6] [-p PORT] [USER@]HOST COMMAND`); the shim
//! sends that request, with `GIT_PROTOCOL`, to the host's relay over the sandbox's relay socket
//! (`SVC_GIT_SSH_SOCKET`, default `/run/svc/git-ssh.sock`) and pumps git's input, the server's
//! output and the exit status both ways. There is no key, no agent and no ssh client in the
//! guest: the host decides and connects. Statically linked, like the agent.
#![forbid(unsafe_code)]

use std::{process::ExitCode, sync::Arc};

use svc_guest::proto::{self, Frame, Kind, Request, WINDOW};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    sync::{Semaphore, mpsc},
};

/// Where the relay listens inside the sandbox.
const DEFAULT_SOCKET: &str = "/run/svc/git-ssh.sock";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // git probes an unknown ssh command with `-G HOST` to learn whether it takes OpenSSH's
    // options: say yes (exit 0), so it passes -p and -o SendEnv=GIT_PROTOCOL.
    if args.first().is_some_and(|a| a == "-G") {
        return ExitCode::SUCCESS;
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("svc-git-ssh: {e}");
            return ExitCode::from(255);
        }
    };
    let result = rt.block_on(run(args));
    // Not a plain drop: the task reading git's standard input sits in a blocking read that
    // only git closing the pipe would end, and git waits for this process to exit first.
    rt.shutdown_background();
    match result {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(255)),
        Err(e) => {
            eprintln!("svc: {e}");
            ExitCode::from(255)
        }
    }
}

async fn run(args: Vec<String>) -> Result<i32, String> {
    let socket = std::env::var("SVC_GIT_SSH_SOCKET").unwrap_or_else(|_| DEFAULT_SOCKET.into());
    let stream = tokio::net::UnixStream::connect(&socket)
        .await
        .map_err(|e| format!("the git SSH relay ({socket}): {e}"))?;
    let (mut reader, mut writer) = stream.into_split();
    let (out, mut out_rx) = mpsc::unbounded_channel::<Frame>();
    tokio::spawn(async move {
        while let Some(f) = out_rx.recv().await {
            if writer.write_all(&f.encode()).await.is_err() {
                return;
            }
        }
    });
    let request = Request::GitSsh {
        args,
        git_protocol: std::env::var("GIT_PROTOCOL").ok(),
    };
    let json = serde_json::to_vec(&request).map_err(|e| e.to_string())?;
    let _ = out.send(Frame::new(1, Kind::Open, json));
    // git's input to the server, within the relay's credit.
    let credit = Arc::new(Semaphore::new(WINDOW as usize));
    tokio::spawn({
        let (out, credit) = (out.clone(), credit.clone());
        async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let Ok(p) = credit.acquire_many(n as u32).await else {
                            return;
                        };
                        p.forget();
                        if out.send(Frame::new(1, Kind::Data, &buf[..n])).is_err() {
                            return;
                        }
                    }
                }
            }
            let _ = out.send(Frame::new(1, Kind::Eof, Vec::new()));
        }
    });
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    loop {
        let frame = proto::read_frame(&mut reader)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the git SSH relay closed the connection")?;
        match frame.kind {
            Kind::Stdout | Kind::Stderr => {
                let to = if frame.kind == Kind::Stdout {
                    stdout
                        .write_all(&frame.payload)
                        .await
                        .and(stdout.flush().await)
                } else {
                    stderr
                        .write_all(&frame.payload)
                        .await
                        .and(stderr.flush().await)
                };
                to.map_err(|e| e.to_string())?;
                let _ = out.send(Frame::u32(1, Kind::Credit, frame.payload.len() as u32));
            }
            Kind::Credit => {
                if let Some(n) = frame.as_u32() {
                    let room = (WINDOW as usize).saturating_sub(credit.available_permits());
                    credit.add_permits((n as usize).min(room));
                }
            }
            Kind::Exit => return Ok(frame.as_i32().unwrap_or(255)),
            Kind::Error => {
                return Err(String::from_utf8_lossy(&frame.payload).into_owned());
            }
            _ => {}
        }
    }
}
