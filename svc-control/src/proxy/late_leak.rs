//! The request body past its prefix, examined as it goes upstream (`policy::body_scan`): a
//! placeholder in it or in its trailers ends the stream with an error, so the upstream request
//! is aborted (its connection closed mid-body, never completed), and the leak is kept in a
//! [`Seen`] for the forwarding stage to answer and audit.
//!
//! No byte of a placeholder goes upstream: the last bytes of what came that could begin one
//! (at most 63, and only those, `BodyScanner::may_begin`) wait for the bytes after them (or the
//! trailers, or the body's end) before they go on; that includes the end of the prefix the
//! decision read. What the upstream has before the placeholder comes (the head, the body's first
//! bytes) is not taken back: the request reaches it, incomplete, and is aborted.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, PoisonError},
};

use bytes::Bytes;
use futures::StreamExt as _;
use hyper::body::Frame;

use super::body::{BoxError, Rest};
use crate::policy::{
    body_scan::{BodyScanner, LateLeak},
    credentials::PlaceholderTable,
};

/// Where the scan of one request's body tells what it found.
#[derive(Debug, Clone, Default)]
pub(super) struct Seen(Arc<Mutex<Option<LateLeak>>>);

impl Seen {
    /// The leak found, if any.
    pub(super) fn leak(&self) -> Option<LateLeak> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn found(&self, leak: LateLeak) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(leak);
    }
}

/// The body's `prefix` (examined whole by the decision) and `rest`, as they go upstream:
/// `rest` examined for `table`'s placeholders as it streams, and the bytes that could begin one
/// held back until what follows them is seen.
pub(super) fn scanned(
    prefix: Bytes,
    rest: Rest,
    table: &PlaceholderTable,
    seen: &Seen,
) -> (Bytes, Rest) {
    let scanner = BodyScanner::after_prefix(table.clone(), &prefix);
    if scanner.is_idle() {
        return (prefix, rest);
    }
    let keep = scanner.may_begin(&prefix);
    let sent = prefix.slice(..prefix.len() - keep);
    let scan = Scan {
        rest,
        scanner,
        seen: seen.clone(),
        held: prefix.slice(prefix.len() - keep..),
        ready: VecDeque::new(),
        stopped: false,
    };
    let stream = futures::stream::unfold(scan, |mut scan| async move {
        let item = scan.step().await?;
        Some((item, scan))
    });
    (sent, Box::pin(stream))
}

/// The scan of one body as it streams.
struct Scan {
    rest: Rest,
    scanner: BodyScanner,
    seen: Seen,
    /// Bytes that could begin a placeholder, waiting for what follows them.
    held: Bytes,
    /// Frames cleared to go upstream.
    ready: VecDeque<Frame<Bytes>>,
    /// The body ended, or a placeholder (or an error) ended it.
    stopped: bool,
}

impl Scan {
    /// The next frame to send upstream; an error (a placeholder in what came) aborts it.
    async fn step(&mut self) -> Option<Result<Frame<Bytes>, BoxError>> {
        loop {
            if let Some(frame) = self.ready.pop_front() {
                return Some(Ok(frame));
            }
            if self.stopped {
                return None;
            }
            match self.rest.next().await {
                None => {
                    self.stopped = true;
                    self.release();
                }
                Some(Err(e)) => {
                    self.stopped = true;
                    return Some(Err(e));
                }
                Some(Ok(frame)) => {
                    if let Err(leak) = self.examine(frame) {
                        self.stopped = true;
                        self.seen.found(leak.clone());
                        return Some(Err(Box::new(leak)));
                    }
                }
            }
        }
    }

    /// One frame from the guest: what of it (and of the bytes held before it) may go on.
    fn examine(&mut self, frame: Frame<Bytes>) -> Result<(), LateLeak> {
        let frame = match frame.into_data() {
            Ok(data) => {
                self.scanner.data(&data)?;
                let all = if self.held.is_empty() {
                    data
                } else {
                    let mut all = Vec::with_capacity(self.held.len() + data.len());
                    all.extend_from_slice(&self.held);
                    all.extend_from_slice(&data);
                    Bytes::from(all)
                };
                let keep = self.scanner.may_begin(&all);
                self.held = all.slice(all.len() - keep..);
                let cleared = all.slice(..all.len() - keep);
                if !cleared.is_empty() {
                    self.ready.push_back(Frame::data(cleared));
                }
                return Ok(());
            }
            Err(frame) => frame,
        };
        if let Some(trailers) = frame.trailers_ref() {
            let fields = trailers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()));
            self.scanner.trailers(fields)?;
        }
        self.release();
        self.ready.push_back(frame);
        Ok(())
    }

    /// The held bytes go on (what follows them is no placeholder's).
    fn release(&mut self) {
        if !self.held.is_empty() {
            let held = std::mem::take(&mut self.held);
            self.ready.push_back(Frame::data(held));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        hosts::HostPattern,
        policy::credentials::{CredentialKind, Placeholder, PlaceholderEntry},
    };

    /// What goes upstream of `body` cut into `split`-byte frames after a `prefix_len`-byte
    /// prefix: the data sent, and whether the stream was aborted.
    fn upstream(
        body: &[u8],
        prefix_len: usize,
        split: usize,
        t: &PlaceholderTable,
    ) -> (Vec<u8>, bool) {
        let (prefix, rest) = body.split_at(prefix_len.min(body.len()));
        let frames: Vec<Result<Frame<Bytes>, BoxError>> = rest
            .chunks(split)
            .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
            .collect();
        let rest: Rest = Box::pin(futures::stream::iter(frames));
        let seen = Seen::default();
        let (sent, mut rest) = scanned(Bytes::copy_from_slice(prefix), rest, t, &seen);
        let mut out = sent.to_vec();
        let aborted = futures::executor::block_on(async {
            while let Some(item) = rest.next().await {
                match item.map(Frame::into_data) {
                    Ok(Ok(data)) => out.extend_from_slice(&data),
                    Ok(Err(_)) => {}
                    Err(_) => return true,
                }
            }
            false
        });
        assert_eq!(aborted, seen.leak().is_some());
        (out, aborted)
    }

    #[test]
    fn no_byte_of_a_placeholder_goes_upstream_at_any_split() {
        let p = Placeholder::mint().unwrap();
        let s = p.expose().to_owned();
        let t = PlaceholderTable::new(vec![PlaceholderEntry {
            placeholder: p,
            kind: CredentialKind::Host,
            hosts: vec![HostPattern::parse("api.example.com").unwrap()],
        }]);
        let before = "x=".repeat(300);
        let leaking = format!("{before}{s}&more");
        let clean = format!("{before}{}", &s[..40]);
        for prefix_len in [0, 10, 620, 640] {
            for split in [1, 2, 7, 63, 64, 65, 1000] {
                let (out, aborted) = upstream(leaking.as_bytes(), prefix_len, split, &t);
                assert!(aborted, "prefix {prefix_len} split {split}: not aborted");
                assert!(
                    out.len() <= before.len() && before.as_bytes().starts_with(&out),
                    "prefix {prefix_len} split {split}: {} bytes went up, past the placeholder's start",
                    out.len()
                );
                let (out, aborted) = upstream(clean.as_bytes(), prefix_len, split, &t);
                assert!(!aborted, "prefix {prefix_len} split {split}");
                assert_eq!(
                    out,
                    clean.as_bytes(),
                    "prefix {prefix_len} split {split}: the clean body whole"
                );
            }
        }
    }
}
