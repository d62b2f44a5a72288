//! svcd's API on its unix socket (who may call, per-caller connection caps, the grace at
//! shutdown) and the metrics endpoint.

use std::{convert::Infallible, os::unix::fs::PermissionsExt as _, sync::Arc, time::Duration};

use anyhow::Context as _;
use http::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::{
    net::{TcpListener, UnixListener, UnixStream},
    sync::watch,
};
use tracing::{info, warn};

use super::{
    routes::{self, Ctx},
    supervisor::{Failure, Supervisor},
};
use crate::config::host::HostConfig;

/// How `run` ended (how its API stopped being served).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// SIGTERM or SIGINT.
    Stopped,
    /// `supervisor-upgrade --force`: the caller re-executes the binary.
    Upgrade,
}

/// The API socket, served until SIGTERM/SIGINT or an upgrade; then in-flight calls get
/// `grace` to finish.
pub(super) async fn serve_api(
    host: &HostConfig,
    exe: &std::path::Path,
    grace: Duration,
    sup: Arc<Supervisor>,
) -> anyhow::Result<Ended> {
    let listener = bind_socket(host).await?;
    let api_gid = nix::unistd::Group::from_name(&host.api_group)
        .ok()
        .flatten()
        .map(|g| g.gid.as_raw());
    if let Some(gid) = api_gid {
        let _ = nix::unistd::chown(&host.socket, None, Some(nix::unistd::Gid::from_raw(gid)));
    }
    let (upgrade_tx, mut upgrade_rx) = watch::channel(false);
    let ctx = Arc::new(Ctx {
        sup: sup.clone(),
        api_gid,
        upgrade: upgrade_tx,
        exe: exe.to_path_buf(),
        callers: super::callers::Callers::default(),
    });
    sup.event(
        "supervisor.started",
        None,
        serde_json::json!({"pid": std::process::id(), "sandboxes": sup.count()}),
    );
    info!(
        socket = %host.socket.display(),
        sandboxes = sup.count(),
        guard_port = host.guard_port,
        proxy_port = host.proxy_port,
        "svcd ready"
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    // The socket is bound and listening, the accept loop starts now and SIGTERM is handled:
    // calls are answered, and a stop from here on is clean.
    super::notify::notify(&format!(
        "READY=1\nSTATUS=serving {} sandboxes on {}\nMAINPID={}",
        sup.count(),
        host.socket.display(),
        std::process::id()
    ));
    // Each API connection holds a clone: the strong count is the number in flight.
    let connections = Arc::new(());
    let ended = loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let ctx = ctx.clone();
                    let token = connections.clone();
                    tokio::spawn(async move {
                        let _token = token;
                        serve_connection(ctx, stream).await;
                    });
                }
                Err(e) => {
                    warn!(error = %e, "accepting an API connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = term.recv() => break Ended::Stopped,
            _ = int.recv() => break Ended::Stopped,
            _ = upgrade_rx.wait_for(|u| *u) => break Ended::Upgrade,
        }
    };
    info!(
        ?ended,
        "svcd stopping; sandboxes keep running and their fence stays pinned"
    );
    super::notify::notify(match ended {
        Ended::Stopped => "STOPPING=1\nSTATUS=stopping",
        // The same process comes back (re-executed) and says READY=1 again.
        Ended::Upgrade => "RELOADING=1\nSTATUS=re-executing for an upgrade",
    });
    drop(listener);
    let _ = std::fs::remove_file(&host.socket);
    // Grace: wait for in-flight API calls (each holds a clone of `connections`).
    let deadline = tokio::time::Instant::now() + grace;
    while Arc::strong_count(&connections) > 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(ended)
}

async fn bind_socket(host: &HostConfig) -> anyhow::Result<UnixListener> {
    let path = &host.socket;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if UnixStream::connect(path).await.is_ok() {
            anyhow::bail!(
                "another svcd is already serving {} (stop it first, or use \
                 `svc supervisor-upgrade --force` to replace it)",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let listener =
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(listener)
}

/// Whether the peer may call the API: root, or a member of the API group.
fn authorised(stream: &UnixStream, api_gid: Option<u32>) -> Result<(), String> {
    let cred = stream
        .peer_cred()
        .map_err(|e| format!("cannot read the caller's credentials: {e}"))?;
    if cred.uid() == 0 {
        return Ok(());
    }
    let Some(gid) = api_gid else {
        return Err(format!(
            "uid {} may not use svcd: only root may (the API group does not exist on this host)",
            cred.uid()
        ));
    };
    if peer_groups(&cred).contains(&gid) {
        Ok(())
    } else {
        Err(format!(
            "uid {} may not use svcd: only root and members of the API group (gid {gid}) may",
            cred.uid()
        ))
    }
}

/// The peer's groups: its primary group and its supplementary groups (as its process has them).
fn peer_groups(cred: &tokio::net::unix::UCred) -> Vec<u32> {
    let mut groups = vec![cred.gid()];
    if let Some(pid) = cred.pid() {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        if let Some(g) = status.lines().find_map(|l| l.strip_prefix("Groups:")) {
            groups.extend(g.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
        }
    }
    groups
}

async fn serve_connection(ctx: Arc<Ctx>, stream: UnixStream) {
    let denied = authorised(&stream, ctx.api_gid).err();
    if let Some(reason) = &denied {
        warn!(%reason, "refused an API caller");
    }
    let cred = stream.peer_cred().ok();
    // A caller at its cap of connections is answered 429 at once and the connection closed.
    let _slot = match cred.map(|c| ctx.callers.hold(c.uid())) {
        Some(Some(slot)) => slot,
        Some(None) => {
            let uid = cred.map_or(0, |c| c.uid());
            let body = serde_json::json!({
                "code": "limit",
                "error": format!(
                    "uid {uid} already holds {} API connections to svcd: refused (close some)",
                    super::callers::API_CONNECTIONS_PER_CALLER
                ),
            })
            .to_string();
            let answer = format!(
                "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
                 content-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let mut stream = stream;
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                tokio::io::AsyncWriteExt::write_all(&mut stream, answer.as_bytes()),
            )
            .await;
            return;
        }
        None => None,
    };
    let caller = cred.map(|c| super::callers::Caller(c.uid()));
    let groups = super::callers::CallerGroups(cred.as_ref().map(peer_groups).unwrap_or_default());
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let ctx = ctx.clone();
        let denied = denied.clone();
        if let Some(c) = caller {
            req.extensions_mut().insert(c);
        }
        req.extensions_mut().insert(groups.clone());
        async move {
            Ok::<_, Infallible>(match denied {
                Some(reason) => super::http::failure(&Failure {
                    status: 403,
                    code: "forbidden",
                    message: reason,
                }),
                None => routes::route(ctx, req).await,
            })
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades()
        .await;
}

/// `GET /metrics` (OpenMetrics text) on `metrics.listen`; anything else is 404.
pub(super) async fn serve_metrics(
    listener: TcpListener,
    sup: Arc<Supervisor>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(_) => continue,
            },
            () = &mut shutdown => return,
        };
        let sup = sup.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let sup = sup.clone();
                async move {
                    let ok = req.method() == http::Method::GET && req.uri().path() == "/metrics";
                    let (status, ctype, body) = if ok {
                        (
                            http::StatusCode::OK,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            sup.metrics_text(),
                        )
                    } else {
                        (
                            http::StatusCode::NOT_FOUND,
                            "text/plain",
                            "svcd serves GET /metrics here\n".to_owned(),
                        )
                    };
                    Ok::<_, Infallible>(
                        http::Response::builder()
                            .status(status)
                            .header("content-type", ctype)
                            .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                            .unwrap_or_default(),
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
