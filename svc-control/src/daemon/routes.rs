//! The API's routes: one function per path, JSON in and out, streams as JSON lines.

use std::{path::PathBuf, sync::Arc, time::Duration};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::body::Incoming;
use tokio::sync::{mpsc, watch};
use tracing::info;

use super::{
    stream::{Body, line, ndjson},
    supervisor::{Failure, Supervisor},
};
use crate::{
    api::{self, CreateSandbox, ExecRequest, Health},
    audit::rfc3339,
    policy::ownership::{Principal, SandboxAction, SecretAction},
};

/// Largest API request body.
const MAX_BODY: usize = 1024 * 1024;

/// Everything the API handlers share.
pub(super) struct Ctx {
    pub(super) sup: Arc<Supervisor>,
    pub(super) api_gid: Option<u32>,
    pub(super) upgrade: watch::Sender<bool>,
    pub(super) exe: PathBuf,
    /// API connections each non-root caller holds open now.
    pub(super) callers: Arc<std::sync::Mutex<std::collections::HashMap<u32, u32>>>,
}

/// API connections one non-root caller may hold open at once (each is a descriptor and a task
/// of svcd's: a member holding thousands idle would starve every sandbox's guard and proxy).
pub(super) const API_CONNECTIONS_PER_CALLER: u32 = 64;

/// One of a caller's API connections, given back when dropped.
pub(super) struct CallerSlot {
    callers: Arc<std::sync::Mutex<std::collections::HashMap<u32, u32>>>,
    uid: u32,
}

impl Ctx {
    /// One more connection for `uid` (root: always), or `None` at its cap.
    pub(super) fn hold_connection(&self, uid: u32) -> Option<Option<CallerSlot>> {
        if uid == 0 {
            return Some(None);
        }
        let mut held = self
            .callers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = held.entry(uid).or_insert(0);
        if *n >= API_CONNECTIONS_PER_CALLER {
            return None;
        }
        *n += 1;
        Some(Some(CallerSlot {
            callers: self.callers.clone(),
            uid,
        }))
    }
}

impl Drop for CallerSlot {
    fn drop(&mut self) {
        let mut held = self
            .callers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = held.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.uid);
            }
        }
    }
}

pub(super) fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

pub(super) fn failure(f: &Failure) -> Response<Body> {
    json(
        StatusCode::from_u16(f.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &f.to_api(),
    )
}

async fn read_json<T: serde::de::DeserializeOwned>(req: Request<Incoming>) -> Result<T, Failure> {
    let body = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| Failure {
            status: 413,
            code: "too-large",
            message: format!("request body: {e} (limit {MAX_BODY} bytes)"),
        })?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| Failure::bad(format!("request body: {e}")))
}

pub(super) fn health(ctx: &Ctx) -> Health {
    Health {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        pid: std::process::id(),
        started_at: rfc3339(ctx.sup.started()),
        sandboxes: ctx.sup.count(),
        notes: Vec::new(),
    }
}

/// Who called the API (the peer's uid), for the audit of changes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caller(pub u32);

/// The caller's groups (primary and supplementary), for secrets shared with a group.
#[derive(Debug, Clone, Default)]
pub(super) struct CallerGroups(pub Vec<u32>);

/// The caller as `policy::ownership` sees it; a call without peer credentials is nobody's.
fn principal(req: &Request<Incoming>) -> Result<Principal, Failure> {
    let uid = req
        .extensions()
        .get::<Caller>()
        .map(|c| c.0)
        .ok_or_else(|| Failure::forbidden("cannot tell who called (no peer credentials)"))?;
    let groups = req
        .extensions()
        .get::<CallerGroups>()
        .map(|g| g.0.clone())
        .unwrap_or_default();
    Ok(Principal { uid, groups })
}

/// What a per-sandbox route does, for `policy::ownership` (any path under
/// `/sandboxes/{name}/` is one; those not named here are `Other`, refused to non-owners too).
fn sandbox_action(method: &Method, rest: &[&str]) -> SandboxAction {
    match (method, rest) {
        (&Method::GET, []) => SandboxAction::Show,
        (&Method::DELETE, []) => SandboxAction::Destroy,
        (&Method::POST, ["exec"]) => SandboxAction::Exec,
        (&Method::POST, ["fork"]) => SandboxAction::Fork,
        (&Method::POST, ["pause"]) => SandboxAction::Pause,
        (&Method::POST, ["resume"]) => SandboxAction::Resume,
        (&Method::POST, ["allow"]) => SandboxAction::Allow,
        (&Method::GET, ["workspace", "log"]) => SandboxAction::WorkspaceLog,
        _ => SandboxAction::Other,
    }
}

/// What a per-secret route does, for `policy::ownership` (any path under `/secrets/{name}/`
/// is one; those not named here are `Other`, their owner's or root's too).
fn secret_action(method: &Method, rest: &[&str]) -> SecretAction {
    match (method, rest) {
        (&Method::POST, ["rotate"]) => SecretAction::Rotate,
        (&Method::DELETE, []) => SecretAction::Remove,
        (&Method::POST, ["share"]) => SecretAction::Share,
        _ => SecretAction::Other,
    }
}

pub(super) async fn route(ctx: Arc<Ctx>, req: Request<Incoming>) -> Response<Body> {
    let span = tracing::info_span!("api", method = %req.method(), path = %req.uri().path());
    tracing::Instrument::instrument(route_in_span(ctx, req), span).await
}

async fn route_in_span(ctx: Arc<Ctx>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let Some(rest) = path.strip_prefix(api::PREFIX) else {
        return failure(&Failure {
            status: 404,
            code: "not-found",
            message: format!("no API path {path} (this svcd speaks {})", api::PREFIX),
        });
    };
    let parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let method = req.method().clone();
    let who = match principal(&req) {
        Ok(w) => w,
        Err(f) => return failure(&f),
    };
    // Every per-sandbox route: its owner's or root's (`policy::ownership`).
    if let ["sandboxes", name, rest @ ..] = parts.as_slice()
        && let Err(f) = ctx
            .sup
            .authorize_sandbox(&who, name, sandbox_action(&method, rest))
    {
        return failure(&f);
    }
    // Every per-secret route: its owner's or root's; one the caller cannot see is missing.
    if let ["secrets", name, rest @ ..] = parts.as_slice()
        && let Err(f) = ctx
            .sup
            .authorize_secret(&who, name, secret_action(&method, rest))
    {
        return failure(&f);
    }
    let result: Result<Response<Body>, Failure> = match (&method, parts.as_slice()) {
        (&Method::GET, ["health"]) => Ok(json(StatusCode::OK, &health(&ctx))),
        (&Method::GET, ["sandboxes"]) => ctx.sup.list_for(&who).map(|v| json(StatusCode::OK, &v)),
        (&Method::POST, ["sandboxes"]) => match read_json::<CreateSandbox>(req).await {
            Ok(create) => ctx
                .sup
                .create(create, &who)
                .await
                .map(|v| json(StatusCode::CREATED, &v)),
            Err(f) => Err(f),
        },
        (&Method::POST, ["trust", rest @ ..]) if rest.len() <= 1 => {
            let caller = Some(who.uid);
            let check = rest == ["check"];
            if !check && !rest.is_empty() {
                Err(Failure::bad(format!("no API path {path}")))
            } else {
                match read_json::<api::TrustRequest>(req).await {
                    Ok(t) if check => ctx.sup.trust_check(&t, caller),
                    Ok(t) => ctx.sup.trust_record(&t, caller),
                    Err(f) => Err(f),
                }
                .map(|v| json(StatusCode::OK, &v))
            }
        }
        (&Method::GET, ["sandboxes", name, "workspace", "log"]) => {
            workspace_log_stream(&ctx, name, &query)
        }
        (&Method::GET, ["sandboxes", name]) => ctx.sup.show(name).map(|v| json(StatusCode::OK, &v)),
        (&Method::DELETE, ["sandboxes", name]) => ctx
            .sup
            .destroy(name)
            .await
            .map(|v| json(StatusCode::OK, &v)),
        (&Method::POST, ["sandboxes", name, "exec"]) => {
            let name = (*name).to_owned();
            let upgrade = req.headers().get(http::header::UPGRADE).is_some_and(|u| {
                u.as_bytes()
                    .eq_ignore_ascii_case(api::EXEC_UPGRADE.as_bytes())
            });
            let mut req = req;
            let on_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
            match read_json::<ExecRequest>(req).await {
                Ok(exec) => match on_upgrade {
                    Some(on) => super::exec::upgraded(ctx.sup.clone(), &name, &exec, on).await,
                    None => super::exec::plain(&ctx.sup, &name, &exec).await,
                },
                Err(f) => Err(f),
            }
        }
        (&Method::POST, ["sandboxes", name, "fork"]) => {
            let name = (*name).to_owned();
            match read_json::<api::ForkRequest>(req).await {
                Ok(f) => ctx
                    .sup
                    .fork(&who, &name, f)
                    .await
                    .map(|v| json(StatusCode::OK, &v)),
                Err(f) => Err(f),
            }
        }
        (&Method::GET, ["secrets"]) => ctx.sup.secret_list(&who).map(|v| json(StatusCode::OK, &v)),
        (&Method::POST, ["secrets"]) => match read_json::<api::SetSecret>(req).await {
            Ok(s) => ctx
                .sup
                .secret_set(&who, s)
                .await
                .map(|v| json(StatusCode::CREATED, &v)),
            Err(f) => Err(f),
        },
        (&Method::POST, ["secrets", name, "rotate"]) => {
            let name = (*name).to_owned();
            match read_json::<api::RotateSecret>(req).await {
                Ok(r) => ctx
                    .sup
                    .secret_rotate(&who, &name, r)
                    .await
                    .map(|v| json(StatusCode::OK, &v)),
                Err(f) => Err(f),
            }
        }
        (&Method::DELETE, ["secrets", name]) => ctx
            .sup
            .secret_remove(&who, name)
            .map(|v| json(StatusCode::OK, &v)),
        (&Method::POST, ["secrets", name, "share"]) => {
            let name = (*name).to_owned();
            match read_json::<api::ShareSecret>(req).await {
                Ok(r) => ctx
                    .sup
                    .secret_share(&who, &name, &r)
                    .map(|v| json(StatusCode::OK, &v)),
                Err(f) => Err(f),
            }
        }
        (&Method::POST, ["sandboxes", name, "allow"]) => {
            let by = req
                .extensions()
                .get::<Caller>()
                .map_or_else(|| "unknown".to_owned(), |c| format!("uid {}", c.0));
            let name = (*name).to_owned();
            match read_json::<api::AllowChange>(req).await {
                Ok(change) => ctx
                    .sup
                    .allow(&name, change, &by)
                    .await
                    .map(|v| json(StatusCode::OK, &v)),
                Err(f) => Err(f),
            }
        }
        (&Method::POST, ["sandboxes", name, op @ ("pause" | "resume")]) => ctx
            .sup
            .lifecycle(name, op)
            .await
            .map(|v| json(StatusCode::OK, &v)),
        (&Method::GET, ["events"]) => events_stream(&ctx, &who, &query),
        (&Method::GET, ["audit"]) => audit_stream(&ctx, &who, &query),
        (&Method::POST, ["supervisor", "upgrade"]) if !who.is_root() => {
            Err(Failure::forbidden(format!(
                "supervisor-upgrade replaces svcd for every user: only root may (you are uid {})",
                who.uid
            )))
        }
        (&Method::POST, ["supervisor", "upgrade"]) => match read_json::<api::Upgrade>(req).await {
            Ok(u) if u.force => {
                let mut h = health(&ctx);
                if ctx.sup.agent_home().is_some() {
                    // mounts are fixed at creation; a re-exec adds none.
                    for v in ctx.sup.list().unwrap_or_default() {
                        if v.live_mounts.is_empty() {
                            h.notes.push(format!(
                                "sandbox {} was created without the coding agent's live mount; \
                                 supervisor-upgrade cannot add it to a running sandbox (SPEC \
                                 5.2.6, R-7): recreate it to get the mount",
                                v.name
                            ));
                        }
                    }
                }
                info!(exe = %ctx.exe.display(), "supervisor-upgrade: re-executing");
                let up = ctx.upgrade.clone();
                tokio::spawn(async move {
                    // Let this answer reach the caller first.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let _ = up.send(true);
                });
                Ok(json(StatusCode::ACCEPTED, &h))
            }
            Ok(_) => Err(Failure::bad(format!(
                "supervisor-upgrade replaces the running svcd with {} (re-exec): sandboxes keep \
                 running, their fence stays pinned and closed, and the new svcd re-adopts them. \
                 It cannot change a running sandbox's mounts or credential model (SPEC 5.2.6, \
                 R-7): recreate a sandbox for that. Pass --force to proceed.",
                ctx.exe.display()
            ))),
            Err(f) => Err(f),
        },
        _ => Err(Failure {
            status: 404,
            code: "not-found",
            message: format!("no API route {method} {path}"),
        }),
    };
    result.unwrap_or_else(|f| failure(&f))
}

/// `GET /v1/events`: a non-root caller reads only its own sandboxes' and secrets' events (and
/// svcd's own).
fn events_stream(ctx: &Ctx, who: &Principal, query: &str) -> Result<Response<Body>, Failure> {
    let mut follow = false;
    let mut after: i64 = 0;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("follow", v) => follow = matches!(v, "" | "1" | "true"),
            ("after", v) => {
                after = v
                    .parse()
                    .map_err(|_| Failure::bad(format!("after={v:?}: expected a number")))?;
            }
            (k, _) => return Err(Failure::bad(format!("unknown query parameter {k:?}"))),
        }
    }
    // Subscribe before reading the backlog, so nothing falls between the two.
    let mut live = ctx.sup.subscribe();
    let who = who.clone();
    let backlog = ctx.sup.events_after(after, 10_000)?;
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(async move {
        let mut last = after;
        for e in backlog {
            last = e.seq;
            if !Supervisor::sees_event(&who, &e) {
                continue;
            }
            if tx.send(line(&e)).await.is_err() {
                return;
            }
        }
        if !follow {
            return;
        }
        loop {
            tokio::select! {
                got = live.recv() => match got {
                    Ok(e) if e.seq > last => {
                        last = e.seq;
                        if !Supervisor::sees_event(&who, &e) {
                            continue;
                        }
                        if tx.send(line(&e)).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => return,
                },
                () = tx.closed() => return,
            }
        }
    });
    Ok(ndjson(rx))
}

/// How much of a workspace log file is read and sent at once.
const LOG_PIECE: usize = 16 << 10;

/// `GET /v1/sandboxes/{name}/workspace/log[?follow=1]`: the workspace's log records as JSON
/// lines; with `follow`, new ones as they are written, until the sandbox is destroyed.
fn workspace_log_stream(ctx: &Ctx, name: &str, query: &str) -> Result<Response<Body>, Failure> {
    let mut follow = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("follow", v) => follow = matches!(v, "" | "1" | "true"),
            (k, _) => return Err(Failure::bad(format!("unknown query parameter {k:?}"))),
        }
    }
    let (past, live) = ctx.sup.workspace_log_follow(name, follow)?;
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(async move {
        // The files as they were, in pieces (never the whole log in memory).
        for (file, len) in past {
            let mut file = tokio::io::AsyncReadExt::take(tokio::fs::File::from_std(file), len);
            loop {
                let mut buf = bytes::BytesMut::with_capacity(LOG_PIECE);
                match tokio::io::AsyncReadExt::read_buf(&mut file, &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(buf.freeze()).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
        let Some(mut live) = live else { return };
        loop {
            tokio::select! {
                got = live.recv() => match got {
                    Ok(l) => {
                        if tx.send(l).await.is_err() {
                            return;
                        }
                    }
                    // A follower too slow for the hooks' output misses lines (the log keeps
                    // them all); it is told so.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        let note = serde_json::json!({"kind": "lagged", "missed": n});
                        if tx.send(line(&note)).await.is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                },
                () = tx.closed() => return,
            }
        }
    });
    Ok(ndjson(rx))
}

/// `GET /v1/audit?sandbox=&layer=&verdict=&since=&follow=1`: the audit log's records that match,
/// rotated file first, as JSON lines exactly as written; with `follow`, new ones as they come
/// (across a rotation). A non-root caller reads only the records of its own sandboxes made
/// since each was created (as they are when the read starts).
fn audit_stream(ctx: &Ctx, who: &Principal, query: &str) -> Result<Response<Body>, Failure> {
    let pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (
                k.to_owned(),
                percent_encoding::percent_decode_str(v)
                    .decode_utf8_lossy()
                    .into_owned(),
            )
        })
        .collect();
    let follow = pairs
        .iter()
        .any(|(k, v)| k == "follow" && matches!(v.as_str(), "" | "1" | "true"));
    let mut filter = crate::audit::query::Filter::parse(&pairs, std::time::SystemTime::now())
        .map_err(Failure::bad)?;
    filter.only = ctx.sup.visible_sandboxes(who);
    let path = ctx.sup.audit_path();
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::task::spawn_blocking(move || super::audit_read::stream(&path, &filter, follow, &tx));
    Ok(ndjson(rx))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path under a sandbox names what it does; one no route knows is still `Other`
    /// (refused to non-owners), never let through.
    #[test]
    fn every_per_sandbox_path_is_an_action() {
        let cases: &[(Method, &[&str], SandboxAction)] = &[
            (Method::GET, &[], SandboxAction::Show),
            (Method::DELETE, &[], SandboxAction::Destroy),
            (Method::POST, &["exec"], SandboxAction::Exec),
            (Method::POST, &["fork"], SandboxAction::Fork),
            (Method::POST, &["pause"], SandboxAction::Pause),
            (Method::POST, &["resume"], SandboxAction::Resume),
            (Method::POST, &["allow"], SandboxAction::Allow),
            (
                Method::GET,
                &["workspace", "log"],
                SandboxAction::WorkspaceLog,
            ),
            (Method::POST, &["something-new"], SandboxAction::Other),
            (Method::PUT, &[], SandboxAction::Other),
        ];
        for (method, rest, want) in cases {
            assert_eq!(sandbox_action(method, rest), *want, "{method} {rest:?}");
        }
    }

    /// Every path under a stored secret names what it does; one no route knows is `Other`
    /// (its owner's or root's), never let through.
    #[test]
    fn every_per_secret_path_is_an_action() {
        let cases: &[(Method, &[&str], SecretAction)] = &[
            (Method::POST, &["rotate"], SecretAction::Rotate),
            (Method::DELETE, &[], SecretAction::Remove),
            (Method::POST, &["share"], SecretAction::Share),
            (Method::GET, &[], SecretAction::Other),
            (Method::POST, &["unshare"], SecretAction::Other),
            (Method::PUT, &[], SecretAction::Other),
        ];
        for (method, rest, want) in cases {
            assert_eq!(secret_action(method, rest), *want, "{method} {rest:?}");
        }
    }
}
