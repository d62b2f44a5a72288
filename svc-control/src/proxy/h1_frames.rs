//! A witness of an HTTP/1.1 connection's framing, and the proxy's own head reader: it reads
//! the decrypted bytes before hyper does and hands hyper only what it has read.
//!
//! Each request head is held back until it is complete and read by `h1_head` (as hyper reads
//! it); hyper is handed the head re-serialised from that parse, never the guest's bytes, so the
//! policy and hyper cannot read a head two ways. The body then passes as it comes, followed by
//! the framing hyper uses (Content-Length, or chunked to its last chunk and trailers), to find
//! where the next head starts. Each head leaves a [`Verdict`] in order: whether it carried both
//! Content-Length and Transfer-Encoding (hyper decodes such a request by its chunked framing and
//! drops Content-Length, RFC 9112 6.1, so the request cannot show it; the proxy refuses those as
//! request smuggling), or why it is refused. A head hyper would refuse itself, or one over the
//! proxy's size limit, is not handed over: hyper gets a stand-in request (`GET /`,
//! `Connection: close`) whose verdict says why, the proxy answers it with the perimeter's
//! refusal and an audit record, and nothing more of the connection reaches hyper.
//!
//! A request hyper treats as an upgrade ask (`CONNECT`, `Upgrade:`) is followed like any other;
//! after it, the connection's bytes wait for the proxy's answer to it ([`Witness::answered`]):
//! agreed (101), the rest is the upgraded stream and passes as it comes; refused, the heads after
//! it are read as before. Anything the witness cannot follow (a chunk size it cannot read) passes
//! unread from then on; the requests after that have no verdict and are refused (fail closed).

use std::{
    collections::VecDeque,
    sync::{
        Mutex,
        atomic::{AtomicU8, Ordering},
    },
};

use super::h1_head::{self, Body};

/// What the witness read of one request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A head hyper frames as the witness does. `both_lengths`: it carried both Content-Length
    /// and Transfer-Encoding; `upgrade`: hyper treats it as an upgrade ask.
    Framed { both_lengths: bool, upgrade: bool },
    /// A head the proxy refuses before hyper reads it (hyper was handed a stand-in): the
    /// status and what was wrong.
    Refused { status: u16, why: String },
}

/// The witness's side shared with the connection's requests: the verdict of each head in order,
/// and the answer to an upgrade ask.
#[derive(Debug, Default)]
pub struct Witness {
    verdicts: Mutex<VecDeque<Verdict>>,
    upgrade: AtomicU8,
}

const UNANSWERED: u8 = 0;
const AGREED: u8 = 1;
const DECLINED: u8 = 2;

impl Witness {
    /// The verdict of the next request hyper hands the proxy (`None`: the witness lost the
    /// connection's framing).
    pub fn next(&self) -> Option<Verdict> {
        self.verdicts.lock().ok()?.pop_front()
    }

    /// The proxy answered the upgrade ask the last verdict named: `agreed` when hyper hands the
    /// connection over (a 101, or a 2xx to `CONNECT`).
    pub fn answered(&self, agreed: bool) {
        let answer = if agreed { AGREED } else { DECLINED };
        self.upgrade.store(answer, Ordering::Release);
    }

    fn push(&self, verdict: Verdict) {
        if let Ok(mut v) = self.verdicts.lock() {
            v.push_back(verdict);
        }
    }
}

/// What hyper reads in place of a refused head: a request the proxy answers with the refusal.
const STAND_IN: &[u8] = b"GET / HTTP/1.1\r\nHost: refused.invalid\r\nConnection: close\r\n\r\n";

#[derive(Debug)]
enum State {
    Head,
    Fixed(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd(u8),
    Trailers,
    /// After an upgrade ask: the bytes wait (in `line`) for the proxy's answer.
    Upgrading,
    /// Passes everything unread (an agreed upgrade, or framing the witness cannot follow).
    Opaque,
    /// After a refused head: nothing more reaches hyper.
    Dropped,
}

/// Follows one connection.
#[derive(Debug)]
pub struct Tracker {
    state: State,
    line: Vec<u8>,
    max_head: usize,
    /// The head being framed asked for an upgrade.
    asked_upgrade: bool,
    /// Heads read so far.
    heads: u64,
    witness: std::sync::Arc<Witness>,
}

impl Tracker {
    /// A tracker refusing heads over `max_head` bytes, and its shared side.
    pub fn new(max_head: usize) -> (Self, std::sync::Arc<Witness>) {
        let witness = std::sync::Arc::<Witness>::default();
        (
            Self {
                state: State::Head,
                line: Vec::new(),
                max_head,
                asked_upgrade: false,
                heads: 0,
                witness: witness.clone(),
            },
            witness,
        )
    }

    /// Feed the next bytes of the connection; the bytes hyper may read go to `out` (a head
    /// re-serialised once it is complete and read; a stand-in for one refused; body bytes as
    /// they come).
    pub fn feed(&mut self, mut data: &[u8], out: &mut Vec<u8>) {
        while !data.is_empty() {
            let before = data;
            match self.state {
                State::Dropped => return,
                State::Upgrading => return self.line.extend_from_slice(data),
                State::Opaque => return out.extend_from_slice(data),
                State::Head => {
                    let rest = self.head_bytes(data, out);
                    data = &data[data.len() - rest..];
                    continue;
                }
                State::Fixed(n) => {
                    let k = (data.len() as u64).min(n);
                    data = &data[k as usize..];
                    self.state = if n == k {
                        self.after_message()
                    } else {
                        State::Fixed(n - k)
                    };
                }
                State::ChunkSize => {
                    let (taken, done) = take_until(&mut self.line, data, b"\n");
                    data = &data[taken..];
                    if done {
                        let line = std::mem::take(&mut self.line);
                        self.state = chunk_size(&line).map_or(State::Opaque, |n| {
                            if n == 0 {
                                State::Trailers
                            } else {
                                State::ChunkData(n)
                            }
                        });
                    } else if self.line.len() > 1024 {
                        self.state = State::Opaque;
                    }
                }
                State::ChunkData(n) => {
                    let k = (data.len() as u64).min(n);
                    data = &data[k as usize..];
                    self.state = if n == k {
                        State::ChunkEnd(2)
                    } else {
                        State::ChunkData(n - k)
                    };
                }
                State::ChunkEnd(left) => {
                    let k = data.len().min(usize::from(left));
                    data = &data[k..];
                    self.state = if usize::from(left) == k {
                        State::ChunkSize
                    } else {
                        State::ChunkEnd(left - k as u8)
                    };
                }
                State::Trailers => {
                    let (taken, done) = take_until(&mut self.line, data, b"\n");
                    data = &data[taken..];
                    if done {
                        let line = std::mem::take(&mut self.line);
                        if line == b"\r\n" || line == b"\n" {
                            self.state = self.after_message();
                        }
                    } else if self.line.len() > self.max_head {
                        self.state = State::Opaque;
                    }
                }
            }
            // Body bytes pass as they come.
            out.extend_from_slice(&before[..before.len() - data.len()]);
        }
    }

    /// How many of the next bytes pass unread whatever they are (a `Content-Length` body's
    /// rest; `u64::MAX` once nothing more is read), if the next bytes are such.
    pub fn passing(&self) -> Option<u64> {
        match self.state {
            State::Fixed(n) => Some(n),
            State::Opaque => Some(u64::MAX),
            _ => None,
        }
    }

    /// `n` bytes of those ([`Self::passing`]) went to hyper as they came.
    pub fn passed(&mut self, n: u64) {
        if let State::Fixed(left) = self.state {
            self.state = if n >= left {
                self.after_message()
            } else {
                State::Fixed(left - n)
            };
        }
    }

    /// A head has begun and is not complete yet (its time runs): which one (counting from 0).
    pub fn head_started(&self) -> Option<u64> {
        (matches!(self.state, State::Head) && !self.line.is_empty()).then_some(self.heads)
    }

    /// Waiting for the proxy's answer to an upgrade ask: once it is in, go on (bytes that came
    /// meanwhile go to `out`, or are read as heads) and say `false`; `true` while it is not.
    pub fn awaiting_upgrade(&mut self, out: &mut Vec<u8>) -> bool {
        if !matches!(self.state, State::Upgrading) {
            return false;
        }
        let held = std::mem::take(&mut self.line);
        match self.witness.upgrade.swap(UNANSWERED, Ordering::AcqRel) {
            AGREED => {
                self.state = State::Opaque;
                out.extend_from_slice(&held);
            }
            DECLINED => {
                self.state = State::Head;
                self.feed(&held, out);
            }
            _ => {
                self.line = held;
                return true;
            }
        }
        false
    }

    /// The head's time ran out: refuse it (408), if one is being read.
    pub fn time_out(&mut self, seconds: u64, out: &mut Vec<u8>) {
        if self.head_started().is_some() {
            self.line.clear();
            let why = format!("the request head did not arrive within {seconds} s");
            self.refuse(408, why, out);
        }
    }

    /// Take bytes of a head (hyper skips empty lines before a request line; so does the
    /// reader): read it once complete, refuse one over the limit or one hyper would refuse.
    /// Returns how many bytes of `data` are left over (the body's, after a complete head).
    fn head_bytes(&mut self, data: &[u8], out: &mut Vec<u8>) -> usize {
        self.line.extend_from_slice(data);
        let blank = self
            .line
            .iter()
            .position(|b| !matches!(b, b'\r' | b'\n'))
            .unwrap_or(self.line.len());
        // Whole empty lines only: a lone CR is httparse's to judge.
        let skip = self.line[..blank]
            .iter()
            .rposition(|b| *b == b'\n')
            .map_or(0, |i| i + 1);
        self.line.drain(..skip);
        if !data.contains(&b'\n') || self.line.is_empty() {
            return self.over_limit(out);
        }
        match h1_head::read(&self.line) {
            Ok(None) => self.over_limit(out),
            Ok(Some((_, taken))) if taken > self.max_head => self.too_large(out),
            Ok(Some((head, taken))) => {
                let rest = self.line.len() - taken;
                self.witness.push(Verdict::Framed {
                    both_lengths: head.both_lengths,
                    upgrade: head.upgrade,
                });
                head.serialise(out);
                self.heads += 1;
                self.asked_upgrade = head.upgrade;
                self.state = match head.body {
                    Body::None => self.after_message(),
                    Body::Fixed(n) => State::Fixed(n),
                    Body::Chunked => State::ChunkSize,
                };
                self.line.clear();
                rest.min(data.len())
            }
            Err(refusal) => {
                self.line.clear();
                self.refuse(refusal.status, refusal.why.to_owned(), out);
                0
            }
        }
    }

    /// An incomplete head over the limit is refused (431); else wait for more.
    fn over_limit(&mut self, out: &mut Vec<u8>) -> usize {
        if self.line.len() > self.max_head {
            return self.too_large(out);
        }
        0
    }

    fn too_large(&mut self, out: &mut Vec<u8>) -> usize {
        self.line.clear();
        let why = format!(
            "the request head is over the proxy's limit of {} bytes",
            self.max_head
        );
        self.refuse(431, why, out);
        0
    }

    /// Where a message (head and body) leaves the connection: the next head, or the answer to
    /// its upgrade ask.
    fn after_message(&mut self) -> State {
        if std::mem::take(&mut self.asked_upgrade) {
            State::Upgrading
        } else {
            State::Head
        }
    }

    /// Refuse the head being read: hyper gets the stand-in, nothing after it.
    fn refuse(&mut self, status: u16, why: String, out: &mut Vec<u8>) {
        self.witness.push(Verdict::Refused { status, why });
        out.extend_from_slice(STAND_IN);
        self.state = State::Dropped;
    }
}

/// Append bytes of `data` to `acc` up to and including the first `end` seen across both;
/// returns (bytes taken from `data`, whether `end` was reached). `end` is 1 to [`MAX_END`] bytes.
fn take_until(acc: &mut Vec<u8>, data: &[u8], end: &[u8]) -> (usize, bool) {
    debug_assert!((1..=MAX_END).contains(&end.len()), "end {end:?}");
    let taken = match straddling(acc, data, end) {
        Some(taken) => Some(taken),
        None => memchr::memmem::find(data, end).map(|i| i + end.len()),
    };
    let n = taken.unwrap_or(data.len());
    acc.extend_from_slice(&data[..n]);
    (n, taken.is_some())
}

/// The longest end marker looked for (`\r\n\r\n`).
const MAX_END: usize = 4;

/// Where in `data` an `end` that began in `acc`'s last bytes finishes, if one does (`acc` holds
/// no whole `end`: it would have been found when those bytes came).
fn straddling(acc: &[u8], data: &[u8], end: &[u8]) -> Option<usize> {
    let reach = end.len().saturating_sub(1);
    let held = acc.len().min(reach);
    if held == 0 || end.len() > MAX_END {
        return None;
    }
    let mut window = [0u8; 2 * MAX_END];
    let from_data = data.len().min(reach);
    window[..held].copy_from_slice(&acc[acc.len() - held..]);
    window[held..held + from_data].copy_from_slice(&data[..from_data]);
    // A match starting at `i < held` ends `i + end.len() - held` bytes into `data`; one starting
    // later would need more of `data` than the window holds.
    memchr::memmem::find(&window[..held + from_data], end).map(|i| i + end.len() - held)
}

fn chunk_size(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\n")?;
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let size = line.split(|b| *b == b';').next()?.trim_ascii();
    if size.is_empty() || size.len() > 16 {
        return None;
    }
    u64::from_str_radix(std::str::from_utf8(size).ok()?, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verdicts of a stream fed in pieces of `split` bytes (every upgrade ask declined),
    /// and what hyper was handed.
    fn read(stream: &[u8], split: usize) -> (Vec<Verdict>, Vec<u8>) {
        let (mut t, w) = Tracker::new(64 * 1024);
        let mut out = Vec::new();
        for piece in stream.chunks(split.max(1)) {
            t.feed(piece, &mut out);
            while t.awaiting_upgrade(&mut out) {
                w.answered(false);
            }
        }
        (w.verdicts.lock().unwrap().iter().cloned().collect(), out)
    }

    /// The both-lengths verdicts of a stream hyper is handed whole.
    fn verdicts(stream: &[u8], split: usize) -> Vec<bool> {
        read(stream, split)
            .0
            .into_iter()
            .map(|v| match v {
                Verdict::Framed { both_lengths, .. } => both_lengths,
                Verdict::Refused { why, .. } => panic!("split {split}: refused: {why}"),
            })
            .collect()
    }

    #[test]
    fn a_head_hyper_would_refuse_is_replaced_by_the_stand_in() {
        // As re-serialised: header names as hyper keeps them (lower case).
        let get = b"GET / HTTP/1.1\r\nhost: a\r\n\r\n";
        let cases: &[(&str, &[u8], usize, u16)] = &[
            (
                "te_not_chunked_after_a_clean_get",
                b"GET / HTTP/1.1\r\nHost: a\r\n\r\nPOST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n",
                1,
                400,
            ),
            ("h2_prior_knowledge", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 0, 400),
            ("over_the_limit", &[b'a'; 70 * 1024], 0, 431),
        ];
        for (name, stream, clean, status) in cases {
            for split in [1, 2, 3, 7, 64, 4096] {
                let (verdicts, out) = read(stream, split);
                assert_eq!(
                    verdicts.len(),
                    clean + 1,
                    "{name} split {split}: {verdicts:?}"
                );
                assert!(
                    matches!(&verdicts[*clean], Verdict::Refused { status: s, .. } if s == status),
                    "{name} split {split}: {verdicts:?}"
                );
                let mut want = if *clean == 1 {
                    get.to_vec()
                } else {
                    Vec::new()
                };
                want.extend_from_slice(STAND_IN);
                assert_eq!(out, want, "{name} split {split}");
            }
        }
    }

    #[test]
    fn hyper_is_handed_heads_as_read_and_bodies_as_they_came() {
        let stream = b"\r\nPOST /a HTTP/1.1\r\nHOST:a\r\nContent-Length:  5 \r\n\r\nhello\
            GET /b HTTP/1.1\nX-E:\n\n";
        let want = b"POST /a HTTP/1.1\r\nhost: a\r\ncontent-length: 5\r\n\r\nhello\
            GET /b HTTP/1.1\r\nx-e: \r\n\r\n";
        for split in [1, 2, 5, 4096] {
            let (verdicts, out) = read(stream, split);
            assert_eq!(verdicts.len(), 2, "split {split}");
            assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(want));
        }
    }

    #[test]
    fn an_agreed_upgrade_passes_the_stream_unread() {
        let (mut t, w) = Tracker::new(1024);
        let mut out = Vec::new();
        t.feed(
            b"GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n\x81\x85abc",
            &mut out,
        );
        assert!(t.awaiting_upgrade(&mut out), "waits for the answer");
        let head = out.len();
        w.answered(true);
        assert!(!t.awaiting_upgrade(&mut out));
        t.feed(b"de\r\n\r\nGET", &mut out);
        assert_eq!(&out[head..], b"\x81\x85abcde\r\n\r\nGET");
        assert_eq!(
            w.next(),
            Some(Verdict::Framed {
                both_lengths: false,
                upgrade: true
            })
        );
        assert_eq!(w.next(), None);
    }

    #[test]
    fn a_fixed_body_passed_as_it_came_is_followed() {
        let (mut t, w) = Tracker::new(1024);
        let mut out = Vec::new();
        t.feed(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n", &mut out);
        assert_eq!(t.passing(), Some(10));
        t.passed(4);
        assert_eq!(t.passing(), Some(6));
        t.passed(6);
        assert_eq!(t.passing(), None);
        t.feed(b"GET / HTTP/1.1\r\n\r\n", &mut out);
        assert_eq!(w.verdicts.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_head_out_of_time_is_refused_408() {
        let (mut t, w) = Tracker::new(1024);
        let mut out = Vec::new();
        t.time_out(30, &mut out);
        assert!(out.is_empty(), "no head begun: nothing to refuse");
        t.feed(b"GET / HTTP/1.1\r\nX-Slow: a", &mut out);
        assert_eq!(t.head_started(), Some(0));
        t.time_out(30, &mut out);
        assert_eq!(out, STAND_IN);
        assert!(matches!(
            w.next(),
            Some(Verdict::Refused { status: 408, .. })
        ));
    }

    #[test]
    fn framing_cases_at_every_split() {
        let cases: &[(&str, &[u8], &[bool])] = &[
            ("get", b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", &[false]),
            (
                "two_gets",
                b"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n",
                &[false, false],
            ),
            (
                "fixed_body_that_looks_like_a_request",
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 65\r\n\r\nGET / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\nGET /n HTTP/1.1\r\nHost: a\r\n\r\n",
                &[false, false],
            ),
            (
                "chunked_then_get",
                b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-Trailer: 1\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
                &[false, false],
            ),
            (
                "cl_and_te",
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                &[true],
            ),
            (
                "te_then_cl_case_games",
                b"POST / HTTP/1.1\r\nHost: a\r\ntransfer-encoding: gzip, chunked\r\nCONTENT-LENGTH: 4\r\n\r\n0\r\n\r\n",
                &[true],
            ),
            (
                "smuggled_second_request_is_seen_after_a_clean_one",
                b"GET / HTTP/1.1\r\nHost: a\r\n\r\nPOST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                &[false, true],
            ),
            (
                "a_refused_upgrade_keeps_tracking",
                b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
                &[false, true],
            ),
            (
                "a_refused_connect_keeps_tracking",
                b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\nPOST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
                &[false, true],
            ),
        ];
        for (name, stream, want) in cases {
            for split in [1, 2, 3, 7, 64, 4096] {
                assert_eq!(verdicts(stream, split), *want, "{name} split {split}");
            }
        }
    }

    /// The byte-at-a-time search this replaced, as the reference.
    fn take_until_naive(acc: &mut Vec<u8>, data: &[u8], end: &[u8]) -> (usize, bool) {
        for (i, b) in data.iter().enumerate() {
            acc.push(*b);
            if acc.ends_with(end) {
                return (i + 1, true);
            }
        }
        (data.len(), false)
    }

    proptest::proptest! {
        #[test]
        fn take_until_finds_what_a_byte_at_a_time_search_finds(
            pieces in proptest::collection::vec(
                proptest::collection::vec(proptest::sample::select(b"\r\nab".to_vec()), 0..12),
                1..8,
            ),
            end in proptest::sample::select(vec![&b"\r\n\r\n"[..], b"\n", b"\r\n"]),
        ) {
            let (mut fast, mut slow) = (Vec::new(), Vec::new());
            for piece in &pieces {
                let mut rest = &piece[..];
                while !rest.is_empty() {
                    let got = take_until(&mut fast, rest, end);
                    proptest::prop_assert_eq!(got, take_until_naive(&mut slow, rest, end));
                    proptest::prop_assert_eq!(&fast, &slow);
                    if got.1 {
                        fast.clear();
                        slow.clear();
                    }
                    rest = &rest[got.0..];
                }
            }
        }
    }

    #[test]
    fn garbage_never_panics() {
        let mut out = Vec::new();
        let (mut t, _) = Tracker::new(1024);
        t.feed(b"\xff\xfe\r\n\r\n\r\n0\r\nzz\r\n", &mut out);
        t.feed(&[0u8; 5000], &mut out);
        let (mut t, _) = Tracker::new(1024);
        t.feed(
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",
            &mut out,
        );
        t.feed(b"more", &mut out);
    }
}
