//! A workspace's log on disk: JSON lines in `workspace.log`, moved to `workspace.log.1` (the
//! older one dropped) when the next record would take it past [`LOG_CAP`], so one workspace
//! keeps at most twice that on the state file system however much its hooks print. Readers
//! get open descriptors and lengths, and read them piece by piece.

use std::{
    fs::File,
    io::{Read as _, Seek as _, SeekFrom, Write as _},
    path::{Path, PathBuf},
};

/// The most one log file holds, in bytes: 8 MiB (the log and its one rotated file: 16 MiB).
pub const LOG_CAP: u64 = 8 << 20;

/// How much of a log's end is read to find its last sequence number.
const TAIL: u64 = 64 << 10;

/// The log files as they were when a reader started: each open (rotated one first) with the
/// length to read of it. Records appended later are not part of it.
pub type LogPast = Vec<(File, u64)>;

/// The file a workspace's records are appended to.
#[derive(Debug)]
pub(super) struct LogFile {
    path: PathBuf,
    file: Option<File>,
    /// The current file's length.
    size: u64,
}

impl LogFile {
    pub(super) fn new(path: PathBuf) -> Self {
        let size = std::fs::metadata(&path).map_or(0, |m| m.len());
        Self {
            path,
            file: None,
            size,
        }
    }

    /// The rotated file's path.
    fn rotated(&self) -> PathBuf {
        rotated(&self.path)
    }

    /// Append one record (a whole line), rotating first if it would pass the cap.
    pub(super) fn append(&mut self, line: &[u8]) -> std::io::Result<()> {
        if self.size > 0 && self.size + line.len() as u64 > LOG_CAP {
            self.file = None;
            std::fs::rename(&self.path, self.rotated())?;
            self.size = 0;
        }
        if self.file.is_none() {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)?;
            self.size = f.metadata()?.len();
            self.file = Some(f);
        }
        if let Some(f) = &mut self.file {
            f.write_all(line)?;
            self.size += line.len() as u64;
        }
        Ok(())
    }

    /// The files as they are now (see [`LogPast`]); a file that is not there is left out.
    pub(super) fn past(&self) -> LogPast {
        [self.rotated(), self.path.clone()]
            .into_iter()
            .filter_map(|p| {
                let f = File::open(p).ok()?;
                let len = f.metadata().ok()?.len();
                Some((f, len))
            })
            .collect()
    }
}

fn rotated(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

/// The sequence number of the last record of the log at `path` (or of its rotated file if
/// it is empty), 0 if none: reads only its end.
pub(super) fn last_seq(path: &Path) -> u64 {
    [path.to_path_buf(), rotated(path)]
        .iter()
        .find_map(|p| tail_seq(p))
        .unwrap_or(0)
}

fn tail_seq(path: &Path) -> Option<u64> {
    let mut f = File::open(path).ok()?;
    let len = f.metadata().ok()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(TAIL))).ok()?;
    let mut buf = Vec::new();
    f.take(TAIL).read_to_end(&mut buf).ok()?;
    buf.split(|c| *c == b'\n')
        .rev()
        .filter(|l| !l.is_empty())
        .find_map(|l| {
            serde_json::from_slice::<serde_json::Value>(l)
                .ok()?
                .get("seq")?
                .as_u64()
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u64, text: &str) -> Vec<u8> {
        let mut l =
            serde_json::to_vec(&serde_json::json!({"seq": seq, "text": text})).unwrap_or_default();
        l.push(b'\n');
        l
    }

    #[test]
    fn the_log_rotates_at_its_cap_and_keeps_one_older_file() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("workspace.log");
        let mut log = LogFile::new(path.clone());
        let text = "x".repeat(16 << 10);
        let mut seq = 0;
        while seq < 3 * LOG_CAP / (16 << 10) {
            seq += 1;
            log.append(&record(seq, &text))
                .unwrap_or_else(|e| panic!("append: {e}"));
        }
        let sizes: Vec<u64> = log.past().iter().map(|(_, n)| *n).collect();
        assert_eq!(sizes.len(), 2, "the log and one rotated file");
        assert!(sizes.iter().all(|n| *n <= LOG_CAP), "{sizes:?}");
        assert_eq!(last_seq(&path), seq, "numbering goes on after a restart");
        assert!(!dir.path().join("workspace.log.1.1").exists());
    }

    #[test]
    fn a_missing_or_torn_log_gives_the_last_whole_record() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let path = dir.path().join("workspace.log");
        assert_eq!(last_seq(&path), 0);
        let mut bytes = record(7, "a");
        bytes.extend_from_slice(b"{\"seq\": 8, \"te");
        std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("write: {e}"));
        assert_eq!(last_seq(&path), 7);
    }
}
