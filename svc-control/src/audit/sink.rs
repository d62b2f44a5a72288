//! Where records go: the [`AuditSink`] trait every writer takes (the JSONL file, svcd's naming
//! and budgeting sink, a serving thread's batch), and its error.

use std::path::PathBuf;

use super::record::{AuditEvent, AuditRecord, Incarnation};

/// Errors of the audit sink. Losing the sink is an error the caller acts on (the proxy
/// refuses requests), never a silent gap.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("opening audit log {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing audit log {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where records go.
pub trait AuditSink: Send + Sync {
    fn record(&self, r: &AuditRecord) -> Result<(), AuditError>;

    /// A record the caller has no further use for (a batching sink keeps it without a copy).
    fn record_owned(&self, r: AuditRecord) -> Result<(), AuditError> {
        self.record(&r)
    }

    /// `event` of `sandbox`, stamped now; the sink adds the sandbox's name where it knows it.
    fn emit(&self, sandbox: u32, event: AuditEvent) -> Result<(), AuditError> {
        self.record_owned(AuditRecord::now(sandbox, event))
    }

    /// `event` of `sandbox`'s incarnation `of` (for a writer that may outlive the sandbox: the
    /// record stays that sandbox's, whatever has its id when it is written), stamped now.
    fn emit_of(&self, sandbox: u32, of: &Incarnation, event: AuditEvent) -> Result<(), AuditError> {
        self.record_owned(AuditRecord::now_of(sandbox, of, event))
    }

    /// Several records, in order, written together where the sink can (one write for a
    /// file). Every record is tried; the first error is returned. A sink may fill in fields
    /// (the sandbox's name) in place.
    fn record_all(&self, records: &mut [AuditRecord]) -> Result<(), AuditError> {
        let mut first = Ok(());
        for r in records.iter() {
            let result = self.record(r);
            if first.is_ok() {
                first = result;
            }
        }
        first
    }

    /// Whether a record written now would land. The proxy asks before it answers a request whose
    /// record is only complete when the response body ends.
    fn ready(&self) -> Result<(), AuditError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::audit::events::PolicyEvent;

    /// Keeps what it is given.
    #[derive(Default)]
    struct Kept(Mutex<Vec<AuditRecord>>);

    impl AuditSink for Kept {
        fn record(&self, r: &AuditRecord) -> Result<(), AuditError> {
            self.0.lock().expect("not poisoned").push(r.clone());
            Ok(())
        }
    }

    fn change() -> AuditEvent {
        AuditEvent::Policy(PolicyEvent {
            change: "allowlist",
            added: vec!["a.test".into()],
            removed: Vec::new(),
            generation: 2,
            by: "uid 0".into(),
        })
    }

    #[test]
    fn emit_stamps_the_time_and_leaves_the_name_to_the_sink_unless_given() {
        let sink = Kept::default();
        sink.emit(4, change()).expect("kept");
        sink.emit_of(5, &Incarnation::new("dev", "00aa"), change())
            .expect("kept");
        sink.emit_of(6, &Incarnation::default(), change())
            .expect("kept");
        let kept = sink.0.lock().expect("not poisoned");
        let of = |r: &AuditRecord| (r.sandbox, r.sandbox_name.clone(), r.incarnation.clone());
        assert_eq!(of(&kept[0]), (4, None, None));
        assert_eq!(of(&kept[1]), (5, Some("dev".into()), Some("00aa".into())));
        assert_eq!(of(&kept[2]), (6, None, None), "unknown: the sink's to name");
        for r in kept.iter() {
            assert!(
                humantime::parse_rfc3339(&r.time).is_ok() && r.time.ends_with('Z'),
                "{}",
                r.time
            );
            assert_eq!(r.event, change());
        }
    }
}
