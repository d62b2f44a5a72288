//! Reading the audit log for `GET /v1/audit`: the rotated files, oldest first, then the
//! current one, line by line (only the last N matching with `tail`); then, when following, new
//! lines as they are written, across a rotation (the file shrinks or is replaced).

use std::{
    collections::VecDeque,
    io::{BufRead as _, BufReader, Seek as _, SeekFrom},
    os::unix::fs::MetadataExt as _,
    path::Path,
    time::Duration,
};

use bytes::Bytes;
use tokio::sync::mpsc;

use crate::audit::{query::Filter, rotated};

/// How often a follower looks for new lines.
const POLL: Duration = Duration::from_millis(200);

/// The incarnations a non-root reader may read now (its sandboxes as they are now; `None`:
/// every record).
pub(super) type Mine = Box<dyn Fn() -> Option<Vec<String>> + Send>;

/// Send every matching line to `tx` (blocking; run it on a blocking thread): with the
/// filter's `tail`, only the last that many of those written so far. Returns when the reader
/// goes away, or at the end of the files when not following. A follower's filter takes in
/// the sandboxes `mine` gives it as new lines come (a sandbox the reader made after it began
/// reading is its own too; an incarnation is never another sandbox's).
pub(super) fn stream(
    path: &Path,
    filter: &Filter,
    follow: bool,
    tx: &mpsc::Sender<Bytes>,
    mine: &Mine,
) {
    // A follower reads the files written so far with the sandboxes it has now, not only those
    // it had when it asked (a record of a sandbox it made meanwhile may already be there).
    let mut widened = filter.clone();
    if follow {
        widen(&mut widened, mine());
    }
    let filter = &widened;
    let mut out = Out {
        filter,
        tx,
        tail: filter
            .tail
            .map(|n| (n, VecDeque::with_capacity(n.min(4096)))),
    };
    let oldest = (1..).take_while(|n| rotated(path, *n).exists()).last();
    for n in (1..=oldest.unwrap_or(0)).rev() {
        if let Ok(f) = std::fs::File::open(rotated(path, n))
            && !out.lines(BufReader::new(f))
        {
            return;
        }
    }
    let Ok(mut file) = std::fs::File::open(path) else {
        if out.flush() && follow {
            follow_from(path, None, filter.clone(), tx, mine);
        }
        return;
    };
    let ino = file.metadata().map(|m| m.ino()).ok();
    let mut reader = BufReader::new(&mut file);
    if !out.lines(&mut reader) || !out.flush() || !follow {
        return;
    }
    let pos = reader.stream_position().ok();
    drop(reader);
    follow_from(path, ino.zip(pos), filter.clone(), tx, mine);
}

/// Where the matching lines of the files written so far go: straight to the reader, or the
/// last `tail` of them kept until the end.
struct Out<'a> {
    filter: &'a Filter,
    tx: &'a mpsc::Sender<Bytes>,
    tail: Option<(usize, VecDeque<String>)>,
}

impl Out<'_> {
    /// The matching lines of `reader`; false once the reader has gone away.
    fn lines(&mut self, reader: impl std::io::BufRead) -> bool {
        for line in reader.lines() {
            let Ok(line) = line else {
                return true;
            };
            match &mut self.tail {
                None => {
                    if !send_line(&line, self.filter, self.tx) {
                        return false;
                    }
                }
                Some((n, kept)) => {
                    if *n > 0 && wanted(&line, self.filter) {
                        if kept.len() == *n {
                            kept.pop_front();
                        }
                        kept.push_back(line);
                    }
                }
            }
        }
        true
    }

    /// Send the kept lines; false once the reader has gone away.
    fn flush(&mut self) -> bool {
        let Some((_, kept)) = &mut self.tail else {
            return true;
        };
        kept.drain(..).all(|line| send(&line, self.tx))
    }
}

/// Follow `path` from (inode, offset); a new inode or a shorter file starts over at 0.
fn follow_from(
    path: &Path,
    mut at: Option<(u64, u64)>,
    mut filter: Filter,
    tx: &mpsc::Sender<Bytes>,
    mine: &Mine,
) {
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
        widen(&mut filter, mine());
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
                    if !send_line(whole.trim_end(), &filter, tx) {
                        return;
                    }
                }
            }
        }
        at = Some((ino, offset + read));
    }
}

/// `filter`'s incarnations with those of `now` added (none taken away: a sandbox the reader
/// saw destroyed keeps its late records the reader's).
fn widen(filter: &mut Filter, now: Option<Vec<String>>) {
    if let (Some(only), Some(now)) = (&mut filter.only, now) {
        for key in now {
            if !only.contains(&key) {
                only.push(key);
            }
        }
    }
}

/// Whether `line` is a record the reader asked for.
fn wanted(line: &str, filter: &Filter) -> bool {
    serde_json::from_str::<serde_json::Value>(line).is_ok_and(|record| filter.matches(&record))
}

/// Send `line` if it is wanted; false once the reader has gone away.
fn send_line(line: &str, filter: &Filter, tx: &mpsc::Sender<Bytes>) -> bool {
    !wanted(line, filter) || send(line, tx)
}

/// Send `line`; false once the reader has gone away.
fn send(line: &str, tx: &mpsc::Sender<Bytes>) -> bool {
    let mut out = line.as_bytes().to_vec();
    out.push(b'\n');
    tx.blocking_send(Bytes::from(out)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A follower of incarnation `a1`'s records is given `b2` (a sandbox of its own made
    /// after it began): `b2`'s records reach it, those already written and new ones; `c3`'s
    /// (never its) do not.
    #[test]
    fn a_follower_takes_in_the_sandboxes_it_is_given_and_no_other() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        std::fs::write(
            &path,
            "{\"incarnation\":\"a1\",\"n\":1}\n{\"incarnation\":\"c3\",\"n\":0}\n\
             {\"incarnation\":\"b2\",\"n\":0}\n",
        )
        .expect("write");
        let filter = Filter {
            only: Some(vec!["a1".into()]),
            ..Filter::default()
        };
        let (tx, mut rx) = mpsc::channel::<Bytes>(16);
        let reader = {
            let path = path.clone();
            std::thread::spawn(move || {
                let mine: Mine = Box::new(|| Some(vec!["a1".into(), "b2".into()]));
                stream(&path, &filter, true, &tx, &mine);
            })
        };
        let first = rx.blocking_recv().expect("the first record");
        assert!(first.starts_with(b"{\"incarnation\":\"a1\""));
        let written = rx.blocking_recv().expect("b2's record written before");
        assert_eq!(&written[..], b"{\"incarnation\":\"b2\",\"n\":0}\n");
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        std::io::Write::write_all(
            &mut f,
            b"{\"incarnation\":\"c3\",\"n\":2}\n{\"incarnation\":\"b2\",\"n\":3}\n",
        )
        .expect("append");
        let next = rx.blocking_recv().expect("the next record");
        assert_eq!(&next[..], b"{\"incarnation\":\"b2\",\"n\":3}\n");
        drop(rx);
        reader.join().expect("the reader ends when its reader goes");
    }
}
