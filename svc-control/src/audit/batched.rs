//! A serving thread's records, gathered over one turn of its event loop and written together:
//! a thread serving many connections at once finishes several requests per turn, and the file
//! then takes one write for all of their records instead of one each (a database's group
//! commit). Records wait at most until the thread runs out of ready work — the loop's
//! `before_park` calls [`Batched::flush`] — or until [`FLUSH_AT`] are waiting.

use std::sync::{Arc, Mutex, PoisonError};

use super::{
    record::{AuditEvent, AuditRecord, Incarnation},
    sink::{AuditError, AuditSink},
};

/// Records waiting before they are written at once, without waiting for the turn to end.
pub const FLUSH_AT: usize = 64;

/// The batching sink in front of `inner`, for one serving thread.
pub struct Batched {
    inner: Arc<dyn AuditSink>,
    waiting: Mutex<Vec<AuditRecord>>,
}

impl Batched {
    pub fn new(inner: Arc<dyn AuditSink>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            waiting: Mutex::new(Vec::with_capacity(FLUSH_AT)),
        })
    }

    /// Write what is waiting. A failure is the inner sink's to report through `ready` (the
    /// proxy then refuses requests until a write lands); it is logged here with the count lost.
    pub fn flush(&self) {
        let mut batch = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            if waiting.is_empty() {
                return;
            }
            std::mem::replace(&mut *waiting, Vec::with_capacity(FLUSH_AT))
        };
        if let Err(e) = self.inner.record_all(&mut batch) {
            let mut chain = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                chain.push_str(": ");
                chain.push_str(&s.to_string());
                source = s.source();
            }
            tracing::error!(target: "svc::audit", records = batch.len(), error = %chain, "audit records lost");
        }
    }
}

thread_local! {
    /// The batch of the serving thread this is, if it gathers records (see [`Batched::enter`]).
    static THIS_THREAD: std::cell::RefCell<Option<Arc<Batched>>> =
        const { std::cell::RefCell::new(None) };
}

impl Batched {
    /// Make this the batch of the current thread: [`record_here`] calls for its inner sink on
    /// this thread go to it (`per_core::spawn_with_audit` does this for a serving thread).
    pub fn enter(self: &Arc<Self>) {
        THIS_THREAD.with(|t| *t.borrow_mut() = Some(self.clone()));
    }
}

/// `r` into `sink` — through this thread's batch if it has one in front of that same sink,
/// else straight away.
pub fn record_here(sink: &Arc<dyn AuditSink>, r: AuditRecord) -> Result<(), AuditError> {
    let batch = THIS_THREAD.with(|t| {
        t.borrow()
            .as_ref()
            .filter(|b| std::ptr::addr_eq(Arc::as_ptr(&b.inner), Arc::as_ptr(sink)))
            .cloned()
    });
    match batch {
        Some(batch) => batch.record_owned(r),
        None => sink.record_owned(r),
    }
}

/// `event` of `sandbox`'s incarnation `of`, stamped now, into `sink` the way [`record_here`]
/// sends a record.
pub fn emit_here(
    sink: &Arc<dyn AuditSink>,
    sandbox: u32,
    of: &Incarnation,
    event: AuditEvent,
) -> Result<(), AuditError> {
    record_here(sink, AuditRecord::now_of(sandbox, of, event))
}

impl AuditSink for Batched {
    fn record(&self, r: &AuditRecord) -> Result<(), AuditError> {
        self.record_owned(r.clone())
    }

    fn record_owned(&self, r: AuditRecord) -> Result<(), AuditError> {
        let full = {
            let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
            waiting.push(r);
            waiting.len() >= FLUSH_AT
        };
        if full {
            self.flush();
        }
        Ok(())
    }

    fn ready(&self) -> Result<(), AuditError> {
        self.inner.ready()
    }
}

impl Drop for Batched {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::audit::jsonl::JsonlFile;

    fn record(n: u32) -> AuditRecord {
        crate::audit::record::tests::http_record(n, &format!("/{n}"))
    }

    /// The sandbox of every line in the file, in order.
    fn lines(path: &std::path::Path) -> Vec<u64> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).expect("a JSON line")["sandbox"]
                    .as_u64()
                    .expect("sandbox")
            })
            .collect()
    }

    #[test]
    fn records_wait_for_a_flush_or_a_full_batch_and_land_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let batched = Batched::new(Arc::new(JsonlFile::open(&path, 1 << 20).expect("open")));
        for n in 0..3 {
            batched.record_owned(record(n)).expect("queued");
        }
        assert_eq!(
            lines(&path),
            Vec::<u64>::new(),
            "nothing written before the turn ends"
        );
        batched.flush();
        assert_eq!(lines(&path), [0, 1, 2]);
        for n in 3..3 + FLUSH_AT as u32 {
            batched.record_owned(record(n)).expect("queued");
        }
        assert_eq!(
            lines(&path).len(),
            3 + FLUSH_AT,
            "a full batch goes at once"
        );
        batched.record(&record(1000)).expect("queued");
        drop(batched);
        assert_eq!(
            lines(&path).last(),
            Some(&1000),
            "dropping the sink writes the rest"
        );
        let got = lines(&path);
        assert!(
            got[..got.len() - 1].windows(2).all(|w| w[0] + 1 == w[1]),
            "{got:?}"
        );
    }

    /// On a serving thread (`per_core::spawn_with_audit`), records for its sink wait in the
    /// thread's batch and are in the file once the thread has run out of work, with no flush by
    /// anyone.
    #[test]
    fn a_serving_thread_writes_its_records_when_it_runs_out_of_work() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let sink: Arc<dyn AuditSink> = Arc::new(JsonlFile::open(&path, 1 << 20).expect("open"));
        let (written_tx, written_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (in_thread, file) = (sink.clone(), path.clone());
        let thread = crate::per_core::spawn_with_audit("audit-test".into(), &sink, move || {
            async move {
                for n in 0..5 {
                    let _ = record_here(&in_thread, record(n));
                }
                // Still in the turn that made them: nothing written yet.
                let _ = written_tx.send(lines(&file));
                let _ = stop_rx.await;
            }
        })
        .expect("thread");
        let during = written_rx.recv().expect("the thread ran");
        assert_eq!(during, Vec::<u64>::new(), "held until the turn ends");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while lines(&path).len() < 5 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(
            lines(&path),
            [0, 1, 2, 3, 4],
            "written while the thread waits"
        );
        let _ = stop_tx.send(());
        thread.join().expect("joined");
    }

    /// A thread that entered a batch sends records for that batch's sink through it, and
    /// records for any other sink straight on.
    #[test]
    fn records_here_go_through_this_threads_batch_for_its_own_sink_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (batched_path, other_path) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
        let sink: Arc<dyn AuditSink> =
            Arc::new(JsonlFile::open(&batched_path, 1 << 20).expect("open"));
        let other: Arc<dyn AuditSink> =
            Arc::new(JsonlFile::open(&other_path, 1 << 20).expect("open"));
        let batched = Batched::new(sink.clone());
        std::thread::scope(|s| {
            s.spawn(|| {
                batched.enter();
                record_here(&sink, record(1)).expect("queued");
                record_here(&other, record(2)).expect("written");
                assert_eq!(
                    lines(&batched_path),
                    Vec::<u64>::new(),
                    "waits in the batch"
                );
                assert_eq!(lines(&other_path), [2], "another sink is written at once");
                batched.flush();
                assert_eq!(lines(&batched_path), [1]);
            });
        });
        // Another thread has no batch: straight to the file.
        record_here(&sink, record(3)).expect("written");
        assert_eq!(lines(&batched_path), [1, 3]);
    }

    #[test]
    fn a_failed_batch_makes_the_sink_not_ready() {
        // /dev/full fails every write with ENOSPC: a real full disk.
        let batched = Batched::new(Arc::new(
            JsonlFile::open("/dev/full", 1 << 20).expect("open"),
        ));
        batched.record_owned(record(1)).expect("queued");
        assert!(batched.ready().is_ok(), "ready until a write fails");
        batched.flush();
        let e = batched
            .ready()
            .expect_err("not ready after the failed write");
        assert!(e.to_string().contains("/dev/full"), "{e}");
    }
}
