//! Stage `forward`: the upstream request. To the checked name over the address the guest
//! dialled, if its class may be dialled (never a fresh resolution of the name, see `dial`); the
//! guest's headers less the hop-by-hop ones; the credential swapped or stripped as the policy
//! said; sent on the pool for the guest's protocol (`upstreams`) within the request timeout.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
};

use futures::StreamExt as _;
use http::{HeaderMap, HeaderValue, Request, Response, header};
use http_body_util::{BodyExt as _, Either, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::{Frame, Incoming};

use super::{
    body::{BoxError, ProxyBody, Rest},
    context::Exchange,
    dial, git_push,
    h1_pool::PooledBody,
    headers::{strip_hop_by_hop, websocket_headers},
    record::ms,
    refuse::{Refused, refusal, refusal_body},
    request::Outgoing,
    resolve::error_chain,
    scrub,
};
use crate::{
    audit::HttpEvent,
    hosts::Authority,
    policy::{
        credentials::{EchoGuard, Scheme},
        request::{CredentialAction, Decision},
    },
};

/// The upstream's answer, whichever pool carried it.
pub(super) type UpstreamResponse = Response<Either<PooledBody, Incoming>>;

/// A request sent upstream and answered.
pub(super) struct Sent {
    pub(super) response: UpstreamResponse,
    /// The checked name it went to.
    pub(super) host: String,
    pub(super) dial_to: SocketAddr,
    /// Dialled at `dial_to` (not through the operator's forward proxy).
    pub(super) direct: bool,
    /// What was done with its credential, for the record.
    pub(super) credential_note: &'static str,
    /// Set when a credential was swapped in: its answer is scrubbed of it (`scrub`).
    pub(super) echo_guard: Option<Arc<EchoGuard>>,
    /// The body's bytes sent so far.
    pub(super) bytes_up: Arc<AtomicU64>,
}

/// Where and how one request goes upstream.
pub(super) struct Route<'a> {
    pub(super) scheme: Scheme,
    /// Where the guest's connection was going (`SO_ORIGINAL_DST`).
    pub(super) dialled_to: Option<SocketAddr>,
    pub(super) decision: &'a Decision,
    /// A WebSocket handshake (sent on a fresh connection, its upgrade headers kept).
    pub(super) websocket: bool,
}

/// Rebuild the request for the upstream, and send it; `Err` is the refusal, already audited.
pub(super) async fn forward(
    ex: &Exchange<'_>,
    outgoing: Outgoing,
    route: Route<'_>,
) -> Result<Sent, Refused> {
    let decision = route.decision;
    let host = decision.host.clone().unwrap_or_default();
    let dial_to = checked_dial(ex, &host, &route)?;
    let config = &ex.ctx.config;
    // Through the operator's forward proxy the name goes to it (it resolves); otherwise
    // the connection goes to `dial_to`.
    let direct = !config
        .forward_proxy
        .as_ref()
        .is_some_and(|fp| fp.applies_to(&host));
    let Outgoing {
        mut parts,
        h2,
        authority,
        target,
        prefix,
        rest,
        credential,
        late_leak,
    } = outgoing;
    let uri = upstream_uri(
        route.scheme,
        &host,
        authority.as_deref(),
        &target,
        &parts.uri,
    );
    let mut up = Request::builder().method(parts.method.clone()).uri(uri);
    let mut headers = std::mem::take(&mut parts.headers);
    upstream_headers(ex, &route, &host, &mut headers);
    let refuse = |status: u16, rule: &str, reason: &str| {
        ex.refuse(
            Some(host.clone()),
            decision.path.clone(),
            status,
            rule,
            reason,
        )
    };
    let (credential_note, echo_guard) = swap_credential(ex, &credential, &host, &mut headers)
        .map_err(|why| refuse(502, "credential", &why))?;
    let (body, bytes_up) = upstream_body(prefix, rest);
    if let Some(h) = up.headers_mut() {
        *h = headers;
    }
    let Ok(up) = up.body(body) else {
        return Err(refuse(400, "request", "the request could not be rebuilt"));
    };
    let response = match tokio::time::timeout(
        config.request_timeout,
        send(ex, up, dial_to, route.websocket, h2),
    )
    .await
    {
        Ok(Ok(r)) => r,
        // A placeholder past the body's prefix: the upstream request was aborted mid-body.
        Ok(Err(_)) if let Some(leak) = late_leak.leak() => {
            let rule = crate::policy::request::Rule::CredentialLeak.name();
            return Err(refuse(403, &rule, &leak.to_string()));
        }
        Ok(Err(e)) => {
            let why = format!("upstream failed: {}", error_chain(&*e));
            return Err(refuse(502, "upstream", &why));
        }
        Err(_) => return Err(refuse(504, "upstream", "upstream timed out")),
    };
    Ok(Sent {
        response,
        host,
        dial_to,
        direct,
        credential_note,
        echo_guard,
        bytes_up,
    })
}

/// The address the guest dialled, and only if its class may be dialled; `Err` is the refusal,
/// audited with the address dialled and a push's refs.
fn checked_dial(ex: &Exchange<'_>, host: &str, route: &Route<'_>) -> Result<SocketAddr, Refused> {
    let e = match dial::checked(route.dialled_to, &ex.ctx.config.network) {
        Ok(t) => return Ok(t),
        Err(e) => e,
    };
    let (status, rule, reason) = (e.status(), e.rule(), e.to_string());
    let decision = route.decision;
    ex.ctx.audit_request(
        ex.sandbox,
        HttpEvent {
            host: Some(host.to_owned()),
            method: ex.method.to_string(),
            path: decision.path.clone(),
            status,
            decision: "deny",
            credential: "none",
            bytes_up: 0,
            bytes_down: refusal_body(status, &rule, &reason).len() as u64,
            duration_ms: ms(ex.started),
            upgrade: None,
            dialled: route.dialled_to.map(|a| a.to_string()),
            rule,
            refs: git_push::refs(decision.push.as_ref()),
            reason: None,
        },
    );
    Err(Box::new(refusal(status, &e.rule(), &reason)))
}

/// The upstream request's URI: the guest's scheme, the checked name, the port the guest asked
/// for, the original path.
fn upstream_uri(
    scheme: Scheme,
    host: &str,
    authority: Option<&str>,
    target: &str,
    uri: &http::Uri,
) -> String {
    let (scheme_name, default_port) = match scheme {
        Scheme::Https => ("https", 443),
        Scheme::Http => ("http", 80),
    };
    let port =
        Authority::parse(authority.unwrap_or(""), default_port).map_or(default_port, |a| a.port);
    let pq = uri
        .path_and_query()
        .map_or_else(|| target.to_owned(), |p| p.as_str().to_owned());
    if port == default_port {
        format!("{scheme_name}://{host}{pq}")
    } else {
        format!("{scheme_name}://{host}:{port}{pq}")
    }
}

/// The guest's headers as they go upstream: no hop-by-hop ones, no `Host` (the URI says it),
/// the operator's proxy credentials on plain HTTP through it, a WebSocket handshake's two.
fn upstream_headers(ex: &Exchange<'_>, route: &Route<'_>, host: &str, headers: &mut HeaderMap) {
    strip_hop_by_hop(headers);
    headers.remove(header::HOST);
    // Plain HTTP through the operator's proxy is an absolute-form request to it: its
    // credentials go with each request (an HTTPS tunnel carries them on its CONNECT).
    if route.scheme == Scheme::Http
        && let Some(fp) = &ex.ctx.config.forward_proxy
        && fp.applies_to(host)
        && let Some(auth) = &fp.auth
    {
        headers.insert(header::PROXY_AUTHORIZATION, auth.clone());
    }
    if route.websocket {
        websocket_headers(headers);
    }
}

/// Do with the credential what the policy said: (the record's note, the echo guard of a
/// swapped one). `Err` says why a swap cannot happen (one refusal for every way, naming which).
fn swap_credential(
    ex: &Exchange<'_>,
    credential: &CredentialAction,
    host: &str,
    headers: &mut HeaderMap,
) -> Result<(&'static str, Option<Arc<EchoGuard>>), String> {
    let (kind, placeholder) = match credential {
        CredentialAction::Passthrough => return Ok(("none", None)),
        CredentialAction::Strip => {
            headers.remove(header::AUTHORIZATION);
            return Ok(("stripped", None));
        }
        CredentialAction::Swap { kind, placeholder } => (*kind, placeholder),
    };
    let (mut v, token) = match ex.ctx.broker.bearer(ex.sandbox.id, placeholder, kind, host) {
        Some(Ok(token)) => HeaderValue::from_str(&format!("Bearer {}", token.expose()))
            .map(|v| (v, token))
            .map_err(|_| "the broker's credential is not a valid header value".to_owned())?,
        Some(Err(why)) => return Err(why),
        None => return Err("no credential is brokered for this host".to_owned()),
    };
    v.set_sensitive(true);
    headers.insert(header::AUTHORIZATION, v);
    scrub::prepare_request(headers);
    let guard = EchoGuard::new(token.expose(), placeholder);
    Ok(("swapped", Some(Arc::new(guard))))
}

/// The upstream request's body, and its byte count (for the record).
fn upstream_body(prefix: bytes::Bytes, rest: Option<Rest>) -> (ProxyBody, Arc<AtomicU64>) {
    let bytes_up = Arc::new(AtomicU64::new(0));
    let up_count = bytes_up.clone();
    let body = match rest {
        // The whole body is in hand: send it with its length, so a GET goes out with no body
        // framing at all (END_STREAM on the HTTP/2 HEADERS, no chunked encoding on HTTP/1.1)
        // and the upstream never sees a stream the proxy abandons half-open.
        None => {
            up_count.fetch_add(prefix.len() as u64, Ordering::Relaxed);
            Full::new(prefix)
                .map_err(|never| match never {})
                .boxed_unsync()
        }
        Some(rest) => UnsyncBoxBody::new(StreamBody::new(
            futures::stream::once(async move { Ok::<_, BoxError>(Frame::data(prefix)) })
                .chain(rest)
                .inspect(move |f| {
                    if let Some(d) = f.as_ref().ok().and_then(Frame::data_ref) {
                        up_count.fetch_add(d.len() as u64, Ordering::Relaxed);
                    }
                }),
        )),
    };
    (body, bytes_up)
}

/// Send on the pool for the guest's protocol. An HTTP/2 guest's request is counted in flight
/// on its pool until the response head is here.
async fn send(
    ex: &Exchange<'_>,
    up: Request<ProxyBody>,
    dial_to: SocketAddr,
    websocket: bool,
    h2: bool,
) -> Result<UpstreamResponse, BoxError> {
    let upstream = &ex.ctx.upstream;
    let (client, _in_flight) = if websocket {
        (dial::upgrade_client(&upstream.connectors, dial_to), None)
    } else if h2 {
        let authority = up.uri().authority().map_or("", |a| a.as_str());
        let (client, slot) = upstream.h2.at(dial_to).take(authority);
        (client, Some(slot))
    } else {
        return upstream
            .h1
            .request(up, dial_to)
            .await
            .map(|r| r.map(Either::Left))
            .map_err(BoxError::from);
    };
    client
        .request(up)
        .await
        .map(|r| r.map(Either::Right))
        .map_err(BoxError::from)
}
