//! Stage `request`: read what the policy needs of a guest request (its upgrade ask, authority,
//! target and the first `body_prefix` bytes of its body), ask `policy::request::decide`, and
//! answer a refusal here. An allowed request leaves as [`Allowed`].

use bytes::Bytes;
use futures::StreamExt as _;
use http::{Request, header, request::Parts};
use http_body_util::BodyExt as _;
use hyper::body::{Body as _, Frame, Incoming};

use super::{
    body::{BoxError, Rest},
    context::Exchange,
    h1_frames::Verdict,
    late_leak,
    refuse::Refused,
};
use crate::{
    limits::{Channel, Slot},
    policy::{
        credentials::Scheme,
        request::{self, CredentialAction, Decision, HttpRequest, Outcome, UpgradeAsk},
        upgrade,
    },
};

/// How the guest's connection carried the request.
#[derive(Debug, Clone, Copy)]
pub(super) struct Carried<'a> {
    /// `https` over the TLS path, `http` over plain HTTP.
    pub(super) scheme: Scheme,
    /// The TLS server name the connection was opened for (`None` on plain HTTP).
    pub(super) sni: Option<&'a str>,
    /// What the framing witness (`h1_frames`) read of the request's head as it arrived: whether
    /// it carried both Content-Length and Transfer-Encoding, or why the proxy refuses it (hyper
    /// was handed a stand-in); `None`: the witness lost the connection's framing, and the
    /// request is refused (fail closed).
    pub(super) framing: Option<&'a Verdict>,
    /// The port the guest dialled (`SO_ORIGINAL_DST`), where the request goes.
    pub(super) dialled_port: Option<u16>,
}

/// A request the policy allowed: what goes upstream, and what the answer's stages need.
pub(super) struct Allowed {
    pub(super) outgoing: Outgoing,
    pub(super) decision: Decision,
    /// The guest's side of a WebSocket handshake, when it is one.
    pub(super) guest_upgrade: Option<hyper::upgrade::OnUpgrade>,
    /// One of the sandbox's `limits.proxy_requests`, held until the answer's head is back.
    pub(super) reading: Slot,
}

/// What the `forward` stage rebuilds the upstream request from.
pub(super) struct Outgoing {
    pub(super) parts: Parts,
    pub(super) h2: bool,
    /// `Host` (HTTP/1.1) or `:authority` (HTTP/2), as sent.
    pub(super) authority: Option<String>,
    /// The request target as the policy read it.
    pub(super) target: String,
    /// The body's first bytes, and the rest as a stream (`None`: the prefix is all of it).
    pub(super) prefix: Bytes,
    pub(super) rest: Option<Rest>,
    pub(super) credential: CredentialAction,
    /// A placeholder found in `rest` (or its trailers) as it went upstream.
    pub(super) late_leak: late_leak::Seen,
}

/// Where a request says it goes.
struct Addressed {
    h2: bool,
    authority: Option<String>,
    /// An HTTP/2 request's `Host` beside its `:authority`.
    alt: Option<String>,
    target: String,
}

/// Read the request, ask the policy; `Err` is the refusal, already audited.
pub(super) async fn admit(
    ex: &Exchange<'_>,
    carried: Carried<'_>,
    mut req: Request<Incoming>,
) -> Result<Allowed, Refused> {
    // A head the witness refused: hyper was handed a stand-in, answered with the refusal.
    if let Some(Verdict::Refused { status, why }) = carried.framing {
        return Err(ex.refuse_head(*status, why));
    }
    // A protocol upgrade: WebSocket handshakes pass on (relayed once the upstream agrees),
    // every other upgrade is refused here, never dropped silently.
    let ask = upgrade_ask(&req);
    if let UpgradeAsk::Refused(why) = &ask {
        let path = Some(req.uri().path().to_owned());
        return Err(ex.refuse(None, path, 400, "upgrade-refused", why));
    }
    let Some(&Verdict::Framed { both_lengths, .. }) = carried.framing else {
        let path = Some(req.uri().path().to_owned());
        return Err(ex.refuse(None, path, 400, "request-malformed", FRAMING_LOST));
    };
    let guest_upgrade = (ask == UpgradeAsk::WebSocket).then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let addressed = addressed(&parts);
    // The body's prefix is read and decided on under one of the sandbox's
    // `limits.proxy_requests` (its memory is bounded by theirs), and within the head's time.
    let reading = match ex
        .ctx
        .config
        .limits
        .acquire(&ex.sandbox.guest(), Channel::ProxyRequests)
    {
        Ok(slot) => slot,
        Err(hit) => return Err(ex.refuse(None, None, 429, "limit", &hit.to_string())),
    };
    let (prefix, rest, complete) = body_prefix(ex, body).await?;
    let decision = ask_policy(
        ex,
        carried,
        both_lengths,
        &parts,
        &addressed,
        &prefix,
        complete,
    );
    let credential = allowed(ex, &decision)?;
    if let Some(why) = upgrade::credential_refused(&ask, &credential) {
        return Err(ex.refuse(
            decision.host.clone(),
            decision.path.clone(),
            403,
            upgrade::CREDENTIAL_RULE,
            why,
        ));
    }
    let seen = late_leak::Seen::default();
    let table = &ex.sandbox.policy.placeholders;
    let (prefix, rest) = match rest {
        Some(rest) => {
            let (prefix, rest) = late_leak::scanned(prefix, rest, table, &seen);
            (prefix, Some(rest))
        }
        None => (prefix, None),
    };
    Ok(Allowed {
        outgoing: Outgoing {
            parts,
            h2: addressed.h2,
            authority: addressed.authority,
            target: addressed.target,
            prefix,
            rest,
            credential,
            late_leak: seen,
        },
        decision,
        guest_upgrade,
        reading,
    })
}

/// Why a request on a connection whose framing the witness lost is refused.
const FRAMING_LOST: &str =
    "the connection's request framing could not be followed: refused (request smuggling)";

/// What the request's `Upgrade` asks for (`policy::request::upgrade`).
fn upgrade_ask(req: &Request<Incoming>) -> UpgradeAsk {
    let headers: Vec<(&str, &[u8])> = req
        .headers()
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()))
        .collect();
    request::upgrade(
        req.method().as_str(),
        req.version() == http::Version::HTTP_11,
        &headers,
    )
}

/// The authority (`:authority`, else `Host`, on HTTP/2; `Host` on HTTP/1.1) and the target
/// (origin-form on HTTP/2, as sent on HTTP/1.1).
fn addressed(parts: &Parts) -> Addressed {
    let h2 = parts.version == http::Version::HTTP_2;
    let host_header = parts
        .headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if !h2 {
        return Addressed {
            h2,
            authority: host_header,
            alt: None,
            target: parts.uri.to_string(),
        };
    }
    Addressed {
        h2,
        authority: parts
            .uri
            .authority()
            .map(|a| a.as_str().to_owned())
            .or_else(|| host_header.clone()),
        alt: host_header.filter(|_| parts.uri.authority().is_some()),
        target: parts
            .uri
            .path_and_query()
            .map_or("/".to_owned(), |p| p.as_str().to_owned()),
    }
}

/// The body's first `body_prefix` bytes within the head's time: (prefix, the rest, whether
/// the prefix is all). `Err` is the refusal.
async fn body_prefix(
    ex: &Exchange<'_>,
    body: Incoming,
) -> Result<(Bytes, Option<Rest>, bool), Refused> {
    let config = &ex.ctx.config;
    let read =
        tokio::time::timeout(config.header_timeout, read_prefix(body, config.body_prefix)).await;
    let Ok(read) = read else {
        return Err(ex.refuse(
            None,
            None,
            408,
            "request-body",
            &format!(
                "the request body's first {} bytes (or its end) did not come within {:?}",
                config.body_prefix, config.header_timeout
            ),
        ));
    };
    read.map_err(|_| {
        ex.refuse(
            None,
            None,
            400,
            "request-body",
            "the request body could not be read",
        )
    })
}

/// The policy's input, and its decision.
fn ask_policy(
    ex: &Exchange<'_>,
    carried: Carried<'_>,
    both_lengths: bool,
    parts: &Parts,
    addressed: &Addressed,
    prefix: &[u8],
    complete: bool,
) -> Decision {
    let headers: Vec<(&str, &[u8])> = parts
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()))
        .collect();
    request::decide(
        &ex.sandbox.policy,
        &HttpRequest {
            scheme: carried.scheme,
            method: parts.method.as_str(),
            target: &addressed.target,
            authority: addressed.authority.as_deref(),
            sni: carried.sni,
            alt_authority: addressed.alt.as_deref(),
            headers: &headers,
            body_prefix: prefix,
            body_complete: complete,
            head_had_both_lengths: both_lengths,
            dialled_port: carried.dialled_port,
        },
    )
}

/// The credential action of an allowed request; `Err` is the refusal of a denied one, or of
/// any while the audit log cannot be written.
fn allowed(ex: &Exchange<'_>, decision: &Decision) -> Result<CredentialAction, Refused> {
    let credential = match &decision.outcome {
        Outcome::Deny { status } if decision.rule == request::Rule::SmartHttpPushRefused => {
            return Err(ex.refuse_push(decision, *status));
        }
        Outcome::Deny { status } => {
            return Err(ex.refuse(
                decision.host.clone(),
                decision.path.clone(),
                *status,
                &decision.rule.name(),
                &decision.reason,
            ));
        }
        Outcome::Allow { credential } => credential.clone(),
    };
    // The record of an allowed request is written when its response body ends (or the guest
    // hangs up), with the bytes each way; the sink must be writable before anything is sent
    // upstream. No record, no request: the proxy refuses rather than go silent. The refusal's
    // own record is the probe that lets requests through again once the sink recovers.
    if let Err(e) = ex.ctx.audit.ready() {
        eprintln!("svc proxy: audit log unavailable, refusing: {e}");
        return Err(ex.refuse(
            decision.host.clone(),
            decision.path.clone(),
            503,
            "audit",
            "the audit log cannot be written; the perimeter refuses requests until it can",
        ));
    }
    Ok(credential)
}

/// Read up to `limit` bytes of a body: (prefix, the rest as a stream, whether the prefix is all).
async fn read_prefix(
    mut body: Incoming,
    limit: usize,
) -> Result<(Bytes, Option<Rest>, bool), hyper::Error> {
    let mut prefix = Vec::new();
    let mut extra: Option<Frame<Bytes>> = None;
    loop {
        if prefix.len() >= limit {
            break;
        }
        match body.frame().await {
            None => {
                return Ok((Bytes::from(prefix), None, true));
            }
            Some(Err(e)) => return Err(e),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => prefix.extend_from_slice(&data),
                Err(trailers) => {
                    extra = Some(trailers);
                    break;
                }
            },
        }
    }
    let complete = extra.is_some() && body.is_end_stream();
    let rest = futures::stream::iter(extra.map(Ok)).chain(
        http_body_util::BodyStream::new(body).map(|r| r.map_err(|e| Box::new(e) as BoxError)),
    );
    Ok((Bytes::from(prefix), Some(Box::pin(rest)), complete))
}
