//! Stage `response`: the upstream's answer to the guest. Its head scrubbed of a swapped
//! credential and of hop-by-hop headers; its body counted (and scrubbed) into the audit record,
//! written once when the body is done with ([`PendingRecord`]).

use std::{
    convert::Infallible,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

use http::{Response, header, response::Parts};
use http_body_util::{BodyExt as _, Either};
use hyper::body::Incoming;

use super::{
    body::ProxyBody,
    context::Exchange,
    forward::Sent,
    git_push,
    h1_pool::PooledBody,
    headers::{strip_hop_by_hop, websocket_headers},
    record::{self, ms},
    refuse::Refused,
    scrub,
};
use crate::{
    audit::{AuditSink, HttpEvent},
    policy::{credentials::EchoGuard, request::Decision},
};

/// The answer's head as it goes to the guest, with its body and the record of the request.
pub(super) struct Answer {
    pub(super) parts: Parts,
    pub(super) body: Either<PooledBody, Incoming>,
    /// The allowed request's record, its bytes and time not yet in.
    pub(super) record: HttpEvent,
    bytes_up: Arc<AtomicU64>,
    /// Occurrences of a swapped credential replaced in the answer (`scrub`).
    echoes: Arc<AtomicU64>,
    echo_guard: Option<Arc<EchoGuard>>,
}

/// The head of the upstream's answer, made fit for the guest (a WebSocket 101 keeps its two
/// upgrade headers); `Err` is the refusal of an answer that would disclose the credential.
pub(super) fn head(
    ex: &Exchange<'_>,
    sent: Sent,
    decision: Decision,
    websocket: bool,
) -> Result<Answer, Refused> {
    let (mut parts, body) = sent.response.into_parts();
    // A real token must never reach the guest, even echoed by the upstream.
    let echoes = Arc::new(AtomicU64::new(0));
    if let Some(guard) = &sent.echo_guard
        && let Err(why) = scrub::response_head(guard, &mut parts.headers, &echoes)
    {
        return Err(ex.refuse(Some(sent.host), decision.path, 502, "credential-echo", &why));
    }
    strip_hop_by_hop(&mut parts.headers);
    if websocket {
        websocket_headers(&mut parts.headers);
    }
    let record = HttpEvent {
        host: Some(sent.host),
        method: ex.method.to_string(),
        path: decision.path,
        status: parts.status.as_u16(),
        decision: "allow",
        rule: decision.rule.name(),
        credential: sent.credential_note,
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: 0,
        upgrade: None,
        dialled: sent.direct.then(|| sent.dial_to.to_string()),
        refs: git_push::refs(decision.push.as_ref()),
        reason: None,
    };
    Ok(Answer {
        parts,
        body,
        record,
        bytes_up: sent.bytes_up,
        echoes,
        echo_guard: sent.echo_guard,
    })
}

/// The answer to the guest: its body streamed (scrubbed, if a credential was swapped in), the
/// record written when it ends.
pub(super) fn stream(ex: &Exchange<'_>, answer: Answer) -> Response<ProxyBody> {
    let Answer {
        mut parts,
        body,
        record,
        bytes_up,
        echoes,
        echo_guard,
    } = answer;
    let mut pending = PendingRecord {
        audit: ex.ctx.audit.clone(),
        sandbox: ex.sandbox.id,
        of: ex.sandbox.incarnation.clone(),
        record: Some(record),
        started: ex.started,
        bytes_up,
        bytes_down: 0,
        echoes: echoes.clone(),
    };
    // A response that has no body by definition (to HEAD; 1xx, 204, 304) goes to the guest
    // as one that ends with its head: forwarding the upstream's (empty) stream under a
    // Content-Length makes HTTP/2 peers reset the stream as malformed.
    let status = parts.status.as_u16();
    if ex.method == http::Method::HEAD || status == 204 || status == 304 || status < 200 {
        drop(body);
        drop(pending); // writes the record
        return Response::from_parts(parts, empty());
    }
    let body = body.map_frame(move |f| {
        // The whole record moves into the body (not just the counter field), so it is
        // written when the body is dropped.
        let pending = &mut pending;
        if let Some(d) = f.data_ref() {
            pending.bytes_down += d.len() as u64;
        }
        f
    });
    let Some(guard) = echo_guard else {
        return Response::from_parts(parts, body.boxed_unsync());
    };
    // The scrubbed body's length is not the upstream's (bytes_down counts the upstream's).
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(
        parts,
        scrub::Scrubbed::new(body, guard, echoes).boxed_unsync(),
    )
}

/// A body that ends with the head.
pub(super) fn empty() -> ProxyBody {
    http_body_util::Empty::new()
        .map_err(|e: Infallible| match e {})
        .boxed_unsync()
}

/// The audit record of an allowed request, written once when the response body is done with:
/// ended, failed, or dropped because the guest went away.
struct PendingRecord {
    audit: Arc<dyn AuditSink>,
    sandbox: u32,
    /// The sandbox's incarnation as the connection found it.
    of: crate::audit::Incarnation,
    record: Option<HttpEvent>,
    started: Instant,
    bytes_up: Arc<AtomicU64>,
    bytes_down: u64,
    /// Occurrences of a swapped credential replaced in the answer (`scrub`).
    echoes: Arc<AtomicU64>,
}

impl Drop for PendingRecord {
    fn drop(&mut self) {
        if let Some(mut record) = self.record.take() {
            record.bytes_up = self.bytes_up.load(Ordering::Relaxed);
            record.bytes_down = self.bytes_down;
            record.duration_ms = ms(self.started);
            let echo =
                (self.echoes.load(Ordering::Relaxed) > 0).then(|| scrub::echo_record(&record));
            for record in std::iter::once(record).chain(echo) {
                self.write(record);
            }
        }
    }
}

impl PendingRecord {
    fn write(&self, record: HttpEvent) {
        if let Err(e) = record::write(&self.audit, (self.sandbox, &self.of), record) {
            eprintln!("svc proxy: audit record lost: {e}");
        }
    }
}
