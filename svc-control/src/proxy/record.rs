//! Writing the proxy's audit records: one `HttpEvent` each, through the thread's batch.

use std::{sync::Arc, time::Instant};

use super::{
    context::{Ctx, Exchange},
    git_push,
    sandboxes::ProxySandbox,
};
use crate::{
    audit::{AuditError, AuditEvent, AuditSink, HttpEvent, Incarnation},
    policy::request::{CredentialAction, Decision, Outcome},
};

/// Write `event` for sandbox `id`'s incarnation `of` (as its connection found it) now.
pub(super) fn write(
    audit: &Arc<dyn AuditSink>,
    (id, of): (u32, &Incarnation),
    event: HttpEvent,
) -> Result<(), AuditError> {
    crate::audit::emit_here(audit, id, of, AuditEvent::Http(event))
}

/// An allowed request on its way upstream, until its answer's head is back: if the guest
/// goes away meanwhile (it hangs up, its sandbox is destroyed, a live change cuts it), the
/// exchange is dropped before any stage could write its record, so this writes it (status
/// 0, with why). Disarmed once the `forward` stage has answered, which records the rest.
pub(super) struct Unanswered {
    audit: Arc<dyn AuditSink>,
    whose: (u32, Incarnation),
    record: Option<HttpEvent>,
    started: Instant,
}

impl Unanswered {
    /// The record `decision`'s request, dialled to `dialled`, gets if it is never answered.
    pub(super) fn arm(ex: &Exchange<'_>, decision: &Decision, dialled: Option<String>) -> Self {
        let credential = match &decision.outcome {
            Outcome::Allow {
                credential: CredentialAction::Swap { .. },
            } => "swapped",
            Outcome::Allow {
                credential: CredentialAction::Strip,
            } => "stripped",
            _ => "none",
        };
        Self {
            audit: ex.ctx.audit.clone(),
            whose: (ex.sandbox.id, ex.sandbox.incarnation.clone()),
            record: Some(HttpEvent {
                host: decision.host.clone(),
                path: decision.path.clone(),
                credential,
                dialled,
                refs: git_push::refs(decision.push.as_ref()),
                reason: Some("the guest went away before the upstream answered".into()),
                ..HttpEvent::decided(ex.method.to_string(), "allow", decision.rule.name())
            }),
            started: ex.started,
        }
    }

    /// The request was answered (or refused, and recorded as that).
    pub(super) fn disarm(mut self) {
        self.record = None;
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        if let Some(mut record) = self.record.take() {
            record.duration_ms = ms(self.started);
            let (id, of) = &self.whose;
            let _ = write(&self.audit, (*id, of), record);
        }
    }
}

/// Milliseconds since `started`.
pub(super) fn ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Ctx {
    pub(super) fn audit_request(&self, sandbox: &ProxySandbox, e: HttpEvent) {
        let _ = write(&self.audit, (sandbox.id, &sandbox.incarnation), e);
    }

    /// A guest connection reset because a live change took its address or its host away, or
    /// its sandbox was torn down (`why`, the record's reason).
    pub(super) fn audit_cut(
        &self,
        sandbox: &ProxySandbox,
        protocol: &str,
        host: Option<String>,
        why: &str,
    ) {
        self.audit_request(
            sandbox,
            HttpEvent {
                host,
                ..HttpEvent::decided(protocol.to_owned(), "cut", why.to_owned())
            },
        );
    }

    /// A guest connection refused before any request (`reason` is the record's rule).
    pub(super) fn audit_conn(&self, sandbox: &ProxySandbox, reason: String) {
        self.audit_request(sandbox, HttpEvent::decided("TLS".into(), "deny", reason));
    }
}
