//! The audit log on disk: JSON lines appended to one file, rotated to `<name>.1` when it
//! passes its cap; a failed write is remembered so the next `ready` says so.

use std::{
    fs::{File, OpenOptions},
    io::Write as _,
    path::{Path, PathBuf},
    sync::Mutex,
};

use super::{
    record::AuditRecord,
    sink::{AuditError, AuditSink},
};

/// A JSON-lines file, rotated to `<name>.1` when it passes `max_bytes`.
#[derive(Debug)]
pub struct JsonlFile {
    path: PathBuf,
    max_bytes: u64,
    state: Mutex<(File, u64)>,
    /// The last write failed; cleared by the next write that lands.
    failed: std::sync::atomic::AtomicBool,
}

impl JsonlFile {
    pub fn open(path: impl Into<PathBuf>, max_bytes: u64) -> Result<Self, AuditError> {
        let path = path.into();
        let file = open_append(&path)?;
        let len = file.metadata().map_or(0, |m| m.len());
        Ok(Self {
            path,
            max_bytes,
            state: Mutex::new((file, len)),
            failed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn rotate(&self, state: &mut (File, u64)) -> Result<(), AuditError> {
        let rotated = self.path.with_extension(format!(
            "{}.1",
            self.path
                .extension()
                .and_then(|e| e.to_str())
                .unwrap_or("log")
        ));
        std::fs::rename(&self.path, &rotated).map_err(|source| AuditError::Write {
            path: self.path.clone(),
            source,
        })?;
        *state = (open_append(&self.path)?, 0);
        Ok(())
    }
}

impl AuditSink for JsonlFile {
    fn record(&self, r: &AuditRecord) -> Result<(), AuditError> {
        self.write_lines(std::slice::from_ref(r))
    }

    /// One write for all of them.
    fn record_all(&self, records: &mut [AuditRecord]) -> Result<(), AuditError> {
        self.write_lines(records)
    }

    fn ready(&self) -> Result<(), AuditError> {
        if self.failed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(AuditError::Write {
                path: self.path.clone(),
                source: std::io::Error::other("the last audit write failed"),
            });
        }
        Ok(())
    }
}

impl JsonlFile {
    /// Write `records` as lines in one write; the outcome is what `ready` says next.
    fn write_lines(&self, records: &[AuditRecord]) -> Result<(), AuditError> {
        let result = self.append(records);
        self.failed
            .store(result.is_err(), std::sync::atomic::Ordering::Relaxed);
        result
    }

    fn append(&self, records: &[AuditRecord]) -> Result<(), AuditError> {
        let mut lines = Vec::with_capacity(256 * records.len());
        for r in records {
            // Serialising our own record types into memory cannot fail.
            if serde_json::to_writer(&mut lines, r).is_ok() {
                lines.push(b'\n');
            }
        }
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.1 + lines.len() as u64 > self.max_bytes && state.1 > 0 {
            self.rotate(&mut state)?;
        }
        state
            .0
            .write_all(&lines)
            .map_err(|source| AuditError::Write {
                path: self.path.clone(),
                source,
            })?;
        state.1 += lines.len() as u64;
        Ok(())
    }
}

fn open_append(path: &Path) -> Result<File, AuditError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| AuditError::Open {
            path: path.to_owned(),
            source,
        })?;
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| AuditError::Open {
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use svc_ebpf_common::{DropEvent, reason};

    use super::*;
    use crate::audit::record::tests::http_record;

    #[test]
    fn a_failed_write_makes_the_sink_not_ready() {
        // /dev/full takes the open and fails every write with ENOSPC: a real full disk.
        let sink = JsonlFile::open("/dev/full", 1 << 20).unwrap();
        assert!(sink.ready().is_ok(), "ready until a write fails");
        let r = http_record(1, "/");
        let err = sink.record(&r).unwrap_err();
        assert!(err.to_string().contains("/dev/full"), "{err}");
        assert!(sink.ready().is_err(), "not ready after a failed write");
    }

    #[test]
    fn jsonl_file_rotates_at_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence.jsonl");
        let sink = JsonlFile::open(&path, 300).unwrap();
        let e = DropEvent {
            family: 4,
            protocol: 17,
            reason: reason::DROP_UDP_NOT_ALLOWED,
            ..DropEvent::default()
        };
        for _ in 0..10 {
            sink.record(&AuditRecord::from_drop(&e, 0, SystemTime::now()))
                .unwrap();
        }
        assert!(std::fs::metadata(&path).unwrap().len() <= 300);
        assert!(dir.path().join("fence.jsonl.1").exists());
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap();
        }
    }
}
