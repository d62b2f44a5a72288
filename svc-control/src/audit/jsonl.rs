//! The audit log on disk: JSON lines appended to one file, rotated to `<name>.1` when it
//! passes its cap (older rotations shifting to `<name>.2` … `<name>.N`, the `keep` newest
//! kept); reopened on request (SIGHUP, after logrotate moved it); a failed write is
//! remembered so the next `ready` says so.

use std::{
    ffi::OsString,
    fs::{File, OpenOptions},
    io::Write as _,
    path::{Path, PathBuf},
    sync::Mutex,
};

use super::{
    record::AuditRecord,
    sink::{AuditError, AuditSink},
};

/// A JSON-lines file, rotated when it passes `max_bytes`, `keep` rotated files kept.
#[derive(Debug)]
pub struct JsonlFile {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    state: Mutex<(File, u64)>,
    /// The last write failed; cleared by the next write that lands.
    failed: std::sync::atomic::AtomicBool,
}

/// The `n`th rotated file of `path` (`audit.jsonl.1` is the newest).
pub fn rotated(path: &Path, n: u32) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

impl JsonlFile {
    /// Append to `path` (made if absent), rotated past `max_bytes` with one rotated file kept.
    pub fn open(path: impl Into<PathBuf>, max_bytes: u64) -> Result<Self, AuditError> {
        let path = path.into();
        let file = open_append(&path)?;
        let len = file.metadata().map_or(0, |m| m.len());
        Ok(Self {
            path,
            max_bytes,
            keep: 1,
            state: Mutex::new((file, len)),
            failed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The same file keeping `keep` rotated files (0: a full file is dropped, not kept).
    #[must_use]
    pub fn keeping(mut self, keep: u32) -> Self {
        self.keep = keep;
        self
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Close the file and open `path` again (made if absent): after logrotate renamed it, the
    /// next record lands in a new file at the path.
    pub fn reopen(&self) -> Result<(), AuditError> {
        let file = open_append(&self.path)?;
        let len = file.metadata().map_or(0, |m| m.len());
        *self.lock() = (file, len);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (File, u64)> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Shift the rotated files up one (the oldest past `keep` goes), the file to `.1`, and
    /// start a new one.
    fn rotate(&self, state: &mut (File, u64)) -> Result<(), AuditError> {
        let failed = |source| AuditError::Write {
            path: self.path.clone(),
            source,
        };
        if self.keep == 0 {
            std::fs::remove_file(&self.path).map_err(failed)?;
        } else {
            for n in (1..self.keep).rev() {
                match std::fs::rename(rotated(&self.path, n), rotated(&self.path, n + 1)) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(failed(e)),
                    _ => {}
                }
            }
            std::fs::rename(&self.path, rotated(&self.path, 1)).map_err(failed)?;
        }
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
        let mut state = self.lock();
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

    /// One record of about 150 bytes, numbered in its `rule`.
    fn numbered(n: usize) -> AuditRecord {
        http_record(1, &format!("/{n}"))
    }

    /// The numbers of the records in `path`, in order.
    fn numbers(path: &Path) -> Vec<usize> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).ok()?;
                v["path"].as_str()?.trim_start_matches('/').parse().ok()
            })
            .collect()
    }

    #[test]
    fn rotation_keeps_the_newest_files_it_is_told_to() {
        let one = serde_json::to_vec(&numbered(0)).unwrap().len() as u64 + 1;
        for keep in [0u32, 1, 3] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("audit.jsonl");
            // Two records a file: the third starts a new one.
            let sink = JsonlFile::open(&path, 2 * one + 1).unwrap().keeping(keep);
            for n in 0..10 {
                sink.record(&numbered(n)).unwrap();
            }
            assert_eq!(numbers(&path), [8, 9], "keep {keep}: the current file");
            for k in 1..=keep {
                let first = 8 - 2 * k as usize;
                assert_eq!(
                    numbers(&rotated(&path, k)),
                    [first, first + 1],
                    "keep {keep}: file .{k}"
                );
            }
            assert!(
                !rotated(&path, keep + 1).exists(),
                "keep {keep}: no file past .{keep}"
            );
        }
    }

    #[test]
    fn reopen_starts_a_new_file_after_the_old_one_was_moved() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.jsonl");
        let sink = JsonlFile::open(&path, 1 << 20).unwrap();
        sink.record(&numbered(1)).unwrap();
        let moved = dir.path().join("audit.jsonl-20261126");
        std::fs::rename(&path, &moved).unwrap();
        sink.record(&numbered(2)).unwrap();
        assert_eq!(numbers(&moved), [1, 2], "before the reopen, the moved file");
        sink.reopen().unwrap();
        sink.record(&numbered(3)).unwrap();
        assert_eq!(numbers(&path), [3], "after it, a new file at the path");
        assert_eq!(numbers(&moved), [1, 2]);
    }
}
