//! Refusals from the perimeter: the answer (a status and a small JSON body naming the rule and
//! the reason, or git's own form for a refused push) and its audit record.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode, header};
use http_body_util::{BodyExt as _, Full};
use serde::Serialize;

use super::{body::ProxyBody, context::Exchange, git_push, record::ms};
use crate::{audit::HttpEvent, policy::request::Decision};

/// A refusal answered and audited: the response the guest gets instead (boxed, as it travels
/// back through the stages as their `Err`).
pub(super) type Refused = Box<Response<ProxyBody>>;

/// The JSON body of a refusal: enough for an agent to tell the fence from the server.
#[derive(Debug, Serialize)]
struct Refusal<'a> {
    perimeter: &'static str,
    status: u16,
    rule: String,
    reason: &'a str,
}

impl Exchange<'_> {
    /// Refuse this request with `status` by `rule` for `reason`, and audit it.
    pub(super) fn refuse(
        &self,
        host: Option<String>,
        path: Option<String>,
        status: u16,
        rule: &str,
        reason: &str,
    ) -> Refused {
        self.refuse_recorded(host, path, (status, rule, reason), None)
    }

    /// Refuse a request head the proxy could not read (400, 408, 414, 431) for `why`: the
    /// record says why too (there is no host or rule of the policy's to tell it).
    pub(super) fn refuse_head(&self, status: u16, why: &str) -> Refused {
        let rule = "request-malformed";
        self.refuse_recorded(None, None, (status, rule, why), Some(why.to_owned()))
    }

    /// [`Self::refuse`], with the record's `reason`.
    fn refuse_recorded(
        &self,
        host: Option<String>,
        path: Option<String>,
        (status, rule, reason): (u16, &str, &str),
        recorded: Option<String>,
    ) -> Refused {
        self.ctx.audit_request(
            self.sandbox,
            HttpEvent {
                host,
                path,
                status,
                bytes_down: refusal_body(status, rule, reason).len() as u64,
                duration_ms: ms(self.started),
                reason: recorded,
                ..HttpEvent::decided(self.method.to_string(), "deny", rule.to_owned())
            },
        );
        Box::new(refusal(status, rule, reason))
    }

    /// A smart-HTTP push held to AllowedBranches and refused: the answer git shows
    /// (`git_push`), audited with the decision's status and every ref of the push.
    pub(super) fn refuse_push(&self, decision: &Decision, status: u16) -> Refused {
        let answer = git_push::refusal(decision.push.as_ref(), &decision.reason);
        self.ctx.audit_request(
            self.sandbox,
            HttpEvent {
                host: decision.host.clone(),
                path: decision.path.clone(),
                status,
                bytes_down: answer.len() as u64,
                duration_ms: ms(self.started),
                refs: git_push::refs(decision.push.as_ref()),
                ..HttpEvent::decided(self.method.to_string(), "deny", decision.rule.name())
            },
        );
        Box::new(git_push::response(answer))
    }
}

/// A refusal from the perimeter: the status and a small JSON body naming the rule and reason.
pub(super) fn refusal(status: u16, rule: &str, reason: &str) -> Response<ProxyBody> {
    let body = refusal_body(status, rule, reason);
    let mut r = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::FORBIDDEN);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r.headers_mut().insert(
        HeaderName::from_static("x-svc-perimeter"),
        HeaderValue::from_static("refused"),
    );
    r
}

/// The JSON body of [`refusal`].
pub(super) fn refusal_body(status: u16, rule: &str, reason: &str) -> Vec<u8> {
    serde_json::to_vec(&Refusal {
        perimeter: "svc egress perimeter",
        status,
        rule: rule.to_owned(),
        reason,
    })
    .unwrap_or_default()
}
