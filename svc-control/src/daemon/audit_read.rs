//! Reading the audit log for `GET /v1/audit`: the rotated file, then the current one, line by
//! line; then, when following, new lines as they are written, across a rotation (the file
//! shrinks or is replaced).

use std::{
    io::{BufRead as _, BufReader, Seek as _, SeekFrom},
    os::unix::fs::MetadataExt as _,
    path::Path,
    time::Duration,
};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::audit::query::Filter;

/// How often a follower looks for new lines.
const POLL: Duration = Duration::from_millis(200);

/// Send every matching line to `tx` (blocking; run it on a blocking thread). Returns when the
/// reader goes away, or at the end of the files when not following.
pub(super) fn stream(path: &Path, filter: &Filter, follow: bool, tx: &mpsc::Sender<Bytes>) {
    let rotated = path.with_extension("jsonl.1");
    if let Ok(f) = std::fs::File::open(&rotated)
        && !send_lines(BufReader::new(f), filter, tx)
    {
        return;
    }
    let Ok(mut file) = std::fs::File::open(path) else {
        if !follow {
            return;
        }
        return follow_from(path, None, filter, tx);
    };
    let ino = file.metadata().map(|m| m.ino()).ok();
    let mut reader = BufReader::new(&mut file);
    if !send_lines(&mut reader, filter, tx) || !follow {
        return;
    }
    let pos = reader.stream_position().ok();
    drop(reader);
    follow_from(path, ino.zip(pos), filter, tx);
}

/// Follow `path` from (inode, offset); a new inode or a shorter file starts over at 0.
fn follow_from(path: &Path, mut at: Option<(u64, u64)>, filter: &Filter, tx: &mpsc::Sender<Bytes>) {
    let mut partial = String::new();
    while !tx.is_closed() {
        std::thread::sleep(POLL);
        let Ok(meta) = std::fs::metadata(path) else {
            continue;
        };
        let (ino, offset) = match at {
            Some((ino, off)) if ino == meta.ino() && meta.len() >= off => (ino, off),
            _ => (meta.ino(), 0),
        };
        if meta.len() == offset {
            at = Some((ino, offset));
            continue;
        }
        let Ok(mut f) = std::fs::File::open(path) else {
            continue;
        };
        if f.seek(SeekFrom::Start(offset)).is_err() {
            continue;
        }
        let mut reader = BufReader::new(f);
        let mut read = 0u64;
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    read += n as u64;
                    if !line.ends_with('\n') {
                        // A line still being written: keep it for the next look.
                        partial.push_str(&line);
                        break;
                    }
                    partial.push_str(&line);
                    let whole = std::mem::take(&mut partial);
                    if !send_line(whole.trim_end(), filter, tx) {
                        return;
                    }
                }
            }
        }
        at = Some((ino, offset + read));
    }
}

/// Send the matching lines of `reader`; false once the reader has gone away.
fn send_lines(reader: impl std::io::BufRead, filter: &Filter, tx: &mpsc::Sender<Bytes>) -> bool {
    for line in reader.lines() {
        let Ok(line) = line else {
            return true;
        };
        if !send_line(&line, filter, tx) {
            return false;
        }
    }
    true
}

fn send_line(line: &str, filter: &Filter, tx: &mpsc::Sender<Bytes>) -> bool {
    let Ok(record) = serde_json::from_str::<serde_json::Value>(line) else {
        return true;
    };
    if !filter.matches(&record) {
        return true;
    }
    let mut out = line.as_bytes().to_vec();
    out.push(b'\n');
    tx.blocking_send(Bytes::from(out)).is_ok()
}
