//! The API's routes: one function per path, JSON in and out, streams as JSON lines.

use std::{path::PathBuf, sync::Arc, time::Duration};

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::sync::watch;
use tracing::info;

use super::{
    callers::{Caller, Callers, principal},
    http::{Body, failure, json, read_json},
    streams,
    supervisor::{Failure, Supervisor},
};
use crate::{
    api::{self, CreateSandbox, ExecRequest, Health},
    audit::rfc3339,
    policy::ownership::{Principal, SandboxAction, SecretAction},
};

/// Everything the API handlers share.
pub(super) struct Ctx {
    pub(super) sup: Arc<Supervisor>,
    pub(super) api_gid: Option<u32>,
    pub(super) upgrade: watch::Sender<bool>,
    pub(super) exe: PathBuf,
    /// API connections each non-root caller holds open now.
    pub(super) callers: Callers,
}

pub(super) fn health(ctx: &Ctx) -> Health {
    Health {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        pid: std::process::id(),
        started_at: rfc3339(ctx.sup.started()),
        sandboxes: ctx.sup.count(),
        notes: Vec::new(),
        pools: ctx
            .sup
            .pool_status()
            .into_iter()
            .map(|(backend, ready, size)| crate::api::PoolStatus {
                backend: backend.to_owned(),
                ready,
                size,
            })
            .collect(),
    }
}

/// What a per-sandbox route does, for `policy::ownership` (any path under
/// `/sandboxes/{name}/` is one; those not named here are `Other`, refused to non-owners too).
fn sandbox_action(method: &Method, rest: &[&str]) -> SandboxAction {
    match (method, rest) {
        (&Method::GET, []) => SandboxAction::Show,
        (&Method::DELETE, []) => SandboxAction::Destroy,
        (&Method::POST, ["exec"]) => SandboxAction::Exec,
        (&Method::POST, ["explain"]) => SandboxAction::Explain,
        (&Method::POST, ["fork"]) => SandboxAction::Fork,
        (&Method::POST, ["pause"]) => SandboxAction::Pause,
        (&Method::POST, ["resume"]) => SandboxAction::Resume,
        (&Method::POST, ["allow"]) => SandboxAction::Allow,
        (&Method::GET, ["workspace", "log"]) => SandboxAction::WorkspaceLog,
        (&Method::POST, ["roots"]) => SandboxAction::AttachRoot,
        (&Method::DELETE, ["roots", _]) => SandboxAction::DetachRoot,
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
        (&Method::POST, ["pod-namespaces"]) => SecretAction::PodNamespaces,
        _ => SecretAction::Other,
    }
}

pub(super) async fn route(ctx: Arc<Ctx>, req: Request<Incoming>) -> Response<Body> {
    let span = tracing::info_span!("api", method = %req.method(), path = %req.uri().path());
    tracing::Instrument::instrument(route_in_span(ctx, req), span).await
}

async fn route_in_span(ctx: Arc<Ctx>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_owned();
    let Some(rest) = path.strip_prefix(api::PREFIX) else {
        return failure(&Failure {
            status: 404,
            code: "not-found",
            message: format!("no API path {path} (this svcd speaks {})", api::PREFIX),
        });
    };
    let parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let who = match principal(&req)
        .and_then(|who| authorize(&ctx, &who, req.method(), &parts).map(|()| who))
    {
        Ok(w) => w,
        Err(f) => return failure(&f),
    };
    let call = Call {
        ctx,
        who,
        path: &path,
        query: req.uri().query().unwrap_or("").to_owned(),
        method: req.method().clone(),
    };
    call.dispatch(&parts, req)
        .await
        .unwrap_or_else(|f| failure(&f))
}

/// Every per-sandbox route is its owner's or root's, and every per-secret route its owner's or
/// root's (one the caller cannot see is missing): `policy::ownership`.
fn authorize(ctx: &Ctx, who: &Principal, method: &Method, parts: &[&str]) -> Result<(), Failure> {
    match parts {
        ["sandboxes", name, rest @ ..] => {
            ctx.sup
                .authorize_sandbox(who, name, sandbox_action(method, rest))
        }
        ["secrets", name, rest @ ..] => {
            ctx.sup
                .authorize_secret(who, name, secret_action(method, rest))
        }
        _ => Ok(()),
    }
}

/// One authorized API call, on its way to its route.
struct Call<'a> {
    ctx: Arc<Ctx>,
    who: Principal,
    path: &'a str,
    query: String,
    method: Method,
}

type Answer = Result<Response<Body>, Failure>;

impl Call<'_> {
    async fn dispatch(&self, parts: &[&str], req: Request<Incoming>) -> Answer {
        match parts {
            ["sandboxes", rest @ ..] => self.sandboxes(rest, req).await,
            ["secrets", rest @ ..] => self.secrets(rest, req).await,
            ["trust", rest @ ..] if rest.len() <= 1 => self.trust(rest, req).await,
            ["supervisor", "upgrade"] if self.method == Method::POST => self.upgrade(req).await,
            ["health"] if self.method == Method::GET => {
                Ok(json(StatusCode::OK, &health(&self.ctx)))
            }
            ["events"] if self.method == Method::GET => {
                streams::events_stream(&self.ctx.sup, &self.who, &self.query)
            }
            ["backends"] if self.method == Method::GET => Ok(json(
                StatusCode::OK,
                &super::backends_route::describe(
                    self.ctx.sup.backends(),
                    |v| std::env::var(v).ok(),
                    self.who.is_root(),
                ),
            )),
            ["audit"] if self.method == Method::GET => {
                streams::audit_stream(&self.ctx.sup, &self.who, &self.query)
            }
            _ => Err(self.no_route()),
        }
    }

    fn no_route(&self) -> Failure {
        Failure {
            status: 404,
            code: "not-found",
            message: format!("no API route {} {}", self.method, self.path),
        }
    }

    /// `/v1/sandboxes[/{name}[/…]]`.
    async fn sandboxes(&self, rest: &[&str], req: Request<Incoming>) -> Answer {
        let sup = &self.ctx.sup;
        match (&self.method, rest) {
            (&Method::GET, []) => sup.list_for(&self.who).map(|v| json(StatusCode::OK, &v)),
            (&Method::POST, []) => {
                let create = read_json::<CreateSandbox>(req).await?;
                sup.create(create, &self.who)
                    .await
                    .map(|v| json(StatusCode::CREATED, &v))
            }
            (&Method::GET, [name, "workspace", "log"]) => {
                streams::workspace_log_stream(sup, name, &self.query)
            }
            (&Method::GET, [name]) => sup.show(name).map(|v| json(StatusCode::OK, &v)),
            (&Method::GET, [name, "stats"]) => sup.stats(name).map(|v| json(StatusCode::OK, &v)),
            (&Method::DELETE, [name]) => sup.destroy(name).await.map(|v| json(StatusCode::OK, &v)),
            (&Method::POST, [name, "exec"]) => self.exec(name, req).await,
            (&Method::POST, [name, "explain"]) => super::explain::explain(sup, name, req).await,
            (&Method::POST, [name, "fork"]) => {
                let f = read_json::<api::ForkRequest>(req).await?;
                sup.fork(&self.who, name, f)
                    .await
                    .map(|v| json(StatusCode::OK, &v))
            }
            (&Method::POST, [name, "allow"]) => {
                let by = req
                    .extensions()
                    .get::<Caller>()
                    .map_or_else(|| "unknown".to_owned(), |c| format!("uid {}", c.0));
                let change = read_json::<api::AllowChange>(req).await?;
                sup.allow(name, change, &by)
                    .await
                    .map(|v| json(StatusCode::OK, &v))
            }
            (&Method::POST, [name, "roots"]) => {
                let a = read_json::<api::ctr_root::AttachRoot>(req).await?;
                sup.attach_root(&self.who, name, a)
                    .await
                    .map(|v| json(StatusCode::OK, &v))
            }
            (&Method::DELETE, [name, "roots", id]) => sup
                .detach_root(name, id)
                .await
                .map(|v| json(StatusCode::OK, &v)),
            (&Method::POST, [name, op @ ("pause" | "resume")]) => sup
                .lifecycle(name, op)
                .await
                .map(|v| json(StatusCode::OK, &v)),
            _ => Err(self.no_route()),
        }
    }

    /// `POST /v1/sandboxes/{name}/exec`: an upgraded connection (interactive) or a body of
    /// JSON lines.
    async fn exec(&self, name: &str, mut req: Request<Incoming>) -> Answer {
        let upgrade = req.headers().get(http::header::UPGRADE).is_some_and(|u| {
            u.as_bytes()
                .eq_ignore_ascii_case(api::EXEC_UPGRADE.as_bytes())
        });
        let on_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
        let exec = read_json::<ExecRequest>(req).await?;
        match on_upgrade {
            Some(on) => super::exec::upgraded(self.ctx.sup.clone(), name, &exec, on).await,
            None => super::exec::plain(&self.ctx.sup, name, &exec).await,
        }
    }

    /// `/v1/secrets[/{name}[/…]]`.
    async fn secrets(&self, rest: &[&str], req: Request<Incoming>) -> Answer {
        let sup = &self.ctx.sup;
        match (&self.method, rest) {
            (&Method::GET, []) => sup.secret_list(&self.who).map(|v| json(StatusCode::OK, &v)),
            (&Method::POST, []) => {
                let s = read_json::<api::SetSecret>(req).await?;
                sup.secret_set(&self.who, s)
                    .await
                    .map(|v| json(StatusCode::CREATED, &v))
            }
            (&Method::POST, [name, "rotate"]) => {
                let r = read_json::<api::RotateSecret>(req).await?;
                sup.secret_rotate(&self.who, name, r)
                    .await
                    .map(|v| json(StatusCode::OK, &v))
            }
            (&Method::DELETE, [name]) => sup
                .secret_remove(&self.who, name)
                .map(|v| json(StatusCode::OK, &v)),
            (&Method::POST, [name, "share"]) => {
                let r = read_json::<api::ShareSecret>(req).await?;
                sup.secret_share(&self.who, name, &r)
                    .map(|v| json(StatusCode::OK, &v))
            }
            (&Method::POST, [name, "pod-namespaces"]) => {
                let r = read_json::<api::PodNamespacesChange>(req).await?;
                sup.secret_pod_namespaces(&self.who, name, &r)
                    .map(|v| json(StatusCode::OK, &v))
            }
            _ => Err(self.no_route()),
        }
    }

    /// `POST /v1/trust` records a workspace's trust; `POST /v1/trust/check` asks for it.
    async fn trust(&self, rest: &[&str], req: Request<Incoming>) -> Answer {
        if self.method != Method::POST {
            return Err(self.no_route());
        }
        let check = rest == ["check"];
        if !check && !rest.is_empty() {
            return Err(Failure::bad(format!("no API path {}", self.path)));
        }
        let t = read_json::<api::TrustRequest>(req).await?;
        let caller = Some(self.who.uid);
        if check {
            self.ctx.sup.trust_check(&t, caller)
        } else {
            self.ctx.sup.trust_record(&t, caller)
        }
        .map(|v| json(StatusCode::OK, &v))
    }

    /// `POST /v1/supervisor/upgrade`: root only, and only with `force`.
    async fn upgrade(&self, req: Request<Incoming>) -> Answer {
        if !self.who.is_root() {
            return Err(Failure::forbidden(format!(
                "supervisor-upgrade replaces svcd for every user: only root may (you are uid {})",
                self.who.uid
            )));
        }
        let u = read_json::<api::Upgrade>(req).await?;
        if !u.force {
            return Err(Failure::bad(format!(
                "supervisor-upgrade replaces the running svcd with {} (re-exec): sandboxes keep \
                 running, their fence stays pinned and closed, and the new svcd re-adopts them. \
                 It cannot change a running sandbox's mounts or credential model: \
                 recreate a sandbox for that. Pass --force to proceed.",
                self.ctx.exe.display()
            )));
        }
        let ctx = &self.ctx;
        let mut h = health(ctx);
        if ctx.sup.agent_home().is_some() {
            // Mounts are fixed at creation; a re-exec adds none.
            for v in ctx.sup.list().unwrap_or_default() {
                if v.live_mounts.is_empty() {
                    h.notes.push(format!(
                        "sandbox {} was created without the coding agent's live mount; \
                         supervisor-upgrade cannot add it to a running sandbox: \
                         recreate it to get the mount",
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
            (Method::POST, &["explain"], SandboxAction::Explain),
            (Method::POST, &["fork"], SandboxAction::Fork),
            (Method::POST, &["pause"], SandboxAction::Pause),
            (Method::POST, &["resume"], SandboxAction::Resume),
            (Method::POST, &["allow"], SandboxAction::Allow),
            (
                Method::GET,
                &["workspace", "log"],
                SandboxAction::WorkspaceLog,
            ),
            (Method::POST, &["roots"], SandboxAction::AttachRoot),
            (Method::DELETE, &["roots", "c1"], SandboxAction::DetachRoot),
            (Method::GET, &["roots"], SandboxAction::Other),
            (Method::DELETE, &["roots"], SandboxAction::Other),
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
            (
                Method::POST,
                &["pod-namespaces"],
                SecretAction::PodNamespaces,
            ),
            (Method::GET, &[], SecretAction::Other),
            (Method::POST, &["unshare"], SecretAction::Other),
            (Method::PUT, &[], SecretAction::Other),
        ];
        for (method, rest, want) in cases {
            assert_eq!(secret_action(method, rest), *want, "{method} {rest:?}");
        }
    }
}
