//! Writing the proxy's audit records: one `HttpEvent` each, through the thread's batch.

use std::{sync::Arc, time::Instant};

use super::context::Ctx;
use crate::audit::{AuditError, AuditEvent, AuditSink, HttpEvent};

/// Write `event` for `sandbox` now.
pub(super) fn write(
    audit: &Arc<dyn AuditSink>,
    sandbox: u32,
    event: HttpEvent,
) -> Result<(), AuditError> {
    crate::audit::emit_here(audit, sandbox, AuditEvent::Http(event))
}

/// Milliseconds since `started`.
pub(super) fn ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl Ctx {
    pub(super) fn audit_request(&self, sandbox: u32, e: HttpEvent) {
        let _ = write(&self.audit, sandbox, e);
    }

    /// A guest connection reset because a live change took its address or its host away.
    pub(super) fn audit_cut(&self, sandbox: u32, protocol: &str, host: Option<String>) {
        self.audit_request(
            sandbox,
            HttpEvent {
                host,
                ..HttpEvent::decided(protocol.to_owned(), "cut", "allowlist-change".to_owned())
            },
        );
    }

    /// A guest connection refused before any request (`reason` is the record's rule).
    pub(super) fn audit_conn(&self, sandbox: u32, reason: String) {
        self.audit_request(sandbox, HttpEvent::decided("TLS".into(), "deny", reason));
    }
}
