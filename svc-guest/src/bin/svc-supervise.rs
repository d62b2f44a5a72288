//! `svc-supervise --spec JSON`: the workspace's services, supervised inside the guest; reports
//! as JSON lines on standard output. See `svc_guest::services`.
//!
//! `svc-supervise --connect PORT`: one Spotlight connection — connects to the guest's own
//! `localhost:PORT` and copies standard input to it and it to standard output (svcd carries
//! the host side through the guest's exec, not through the fence).

use std::{io::Write, process::ExitCode, time::Duration};

use svc_guest::services::{self, Spec};
use tokio::sync::{mpsc, watch};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = match args.as_slice() {
        [flag, json] if flag == "--spec" => json.clone(),
        [flag, port] if flag == "--connect" => return connect(port),
        _ => {
            eprintln!(
                "usage: svc-supervise --spec JSON | --connect PORT (svcd starts it; see `svc \
                 workspace up`)"
            );
            return ExitCode::from(2);
        }
    };
    let spec: Spec = match serde_json::from_str(&json) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("svc-supervise: the spec is not valid: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("svc-supervise: starting the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    rt.block_on(async move {
        let longest = spec
            .services
            .iter()
            .map(|s| s.stop_timeout_ms)
            .max()
            .unwrap_or(0);
        if let Err(e) = services::take_over(
            std::process::id(),
            Duration::from_millis(longest + 5000),
            std::path::Path::new(services::STATE_DIR),
        )
        .await
        {
            eprintln!("svc-supervise: {e}");
            return ExitCode::from(1);
        }
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = watch::channel(false);
        tokio::spawn(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) else {
                return;
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            let _ = stop_tx.send(true);
        });
        // svcd may be gone (restarted): the services go on, their reports are dropped.
        let writer = tokio::spawn(async move {
            while let Some(r) = rx.recv().await {
                if let Ok(line) = serde_json::to_string(&r) {
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "{line}");
                    let _ = out.flush();
                }
            }
        });
        services::supervise(spec, tx, stop_rx, std::path::Path::new(services::STATE_DIR)).await;
        let _ = writer.await;
        let pid_file = std::path::Path::new(services::STATE_DIR).join(services::PID_FILE);
        if std::fs::read_to_string(&pid_file)
            .is_ok_and(|t| t.trim() == std::process::id().to_string())
        {
            let _ = std::fs::remove_file(&pid_file);
        }
        ExitCode::SUCCESS
    })
}

/// `--connect PORT`: relay standard input/output to `localhost:PORT` in the guest.
fn connect(port: &str) -> ExitCode {
    let Ok(port) = port.parse::<u16>() else {
        eprintln!("svc-supervise --connect: {port:?} is not a port");
        return ExitCode::from(2);
    };
    let sock = match std::net::TcpStream::connect(("127.0.0.1", port))
        .or_else(|_| std::net::TcpStream::connect(("::1", port)))
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("nothing answers on port {port} in the sandbox: {e}");
            return ExitCode::from(1);
        }
    };
    let Ok(mut to_sock) = sock.try_clone() else {
        return ExitCode::from(1);
    };
    let upstream = std::thread::spawn(move || {
        pump(&mut std::io::stdin().lock(), &mut to_sock);
        let _ = to_sock.shutdown(std::net::Shutdown::Write);
    });
    let mut from_sock = sock;
    pump(&mut from_sock, &mut std::io::stdout().lock());
    drop(upstream);
    ExitCode::SUCCESS
}

/// Copy `from` to `to` until `from` ends or either fails, each chunk written and flushed as
/// it comes.
///
/// Not `std::io::copy`: between a socket and a pipe it splices, and a splice from a socket
/// into a pipe waits for the socket's next bytes holding the pipe's lock, so the reader on the
/// other end (the runtime's exec) cannot take the bytes already there until more come: a
/// server's greeting sat in the pipe until the client spoke.
fn pump(from: &mut impl std::io::Read, to: &mut impl Write) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        if to.write_all(&buf[..n]).and_then(|()| to.flush()).is_err() {
            return;
        }
    }
}
