//! Writing the proxy's audit records: one `HttpEvent` each, through the thread's batch.

use std::{sync::Arc, time::Instant};

use super::{context::Ctx, sandboxes::ProxySandbox};
use crate::audit::{AuditError, AuditEvent, AuditSink, HttpEvent, Incarnation};

/// Write `event` for sandbox `id`'s incarnation `of` (as its connection found it) now.
pub(super) fn write(
    audit: &Arc<dyn AuditSink>,
    (id, of): (u32, &Incarnation),
    event: HttpEvent,
) -> Result<(), AuditError> {
    crate::audit::emit_here(audit, id, of, AuditEvent::Http(event))
}

/// Milliseconds since `started`.
pub(super) fn ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Ctx {
    pub(super) fn audit_request(&self, sandbox: &ProxySandbox, e: HttpEvent) {
        let _ = write(&self.audit, (sandbox.id, &sandbox.incarnation), e);
    }

    /// A guest connection reset because a live change took its address or its host away.
    pub(super) fn audit_cut(&self, sandbox: &ProxySandbox, protocol: &str, host: Option<String>) {
        self.audit_request(
            sandbox,
            HttpEvent {
                host,
                ..HttpEvent::decided(protocol.to_owned(), "cut", "allowlist-change".to_owned())
            },
        );
    }

    /// A guest connection refused before any request (`reason` is the record's rule).
    pub(super) fn audit_conn(&self, sandbox: &ProxySandbox, reason: String) {
        self.audit_request(sandbox, HttpEvent::decided("TLS".into(), "deny", reason));
    }
}
