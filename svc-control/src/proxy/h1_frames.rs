//! A witness of an HTTP/1.1 connection's framing, fed the same decrypted bytes hyper reads.
//!
//! hyper follows RFC 9112 §6.1 for a request with both `Content-Length` and
//! `Transfer-Encoding`: it decodes by the chunked framing and drops `Content-Length` before the
//! request reaches us, so the shape cannot be seen in the request. This tracker walks the byte
//! stream request by request (head, then the body by the framing hyper uses), and records for
//! each request head whether it carried both headers; the proxy refuses those (request
//! smuggling). A request that asks for an upgrade (or a `CONNECT`) is followed like any other:
//! if the proxy refuses it, the connection goes on and the next heads still get their verdicts
//! (once an upgrade is agreed, hyper hands the connection over and asks for no more). Anything
//! it cannot follow (a head over the limit, a framing hyper itself refuses) ends the tracking;
//! the requests after that have no verdict and are refused (fail closed).

use std::{
    collections::VecDeque,
    io,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The verdict of each request head, in order.
pub type Verdicts = Arc<Mutex<VecDeque<bool>>>;

#[derive(Debug)]
enum State {
    Head,
    Fixed(u64),
    ChunkSize,
    ChunkData(u64),
    ChunkEnd(u8),
    Trailers,
    Opaque,
}

/// Follows one connection.
#[derive(Debug)]
pub struct Tracker {
    state: State,
    line: Vec<u8>,
    max_head: usize,
    verdicts: Verdicts,
}

impl Tracker {
    pub fn new(max_head: usize) -> (Self, Verdicts) {
        let verdicts = Verdicts::default();
        (
            Self {
                state: State::Head,
                line: Vec::new(),
                max_head,
                verdicts: verdicts.clone(),
            },
            verdicts,
        )
    }

    /// Feed the next bytes of the connection.
    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            match self.state {
                State::Opaque => return,
                State::Head => {
                    let (taken, done) = take_until(&mut self.line, data, b"\r\n\r\n");
                    data = &data[taken..];
                    if done {
                        let head = std::mem::take(&mut self.line);
                        self.state = self.head(&head);
                    } else if self.line.len() > self.max_head {
                        self.state = State::Opaque;
                    }
                }
                State::Fixed(n) => {
                    let k = (data.len() as u64).min(n);
                    data = &data[k as usize..];
                    self.state = if n == k {
                        State::Head
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
                            self.state = State::Head;
                        }
                    } else if self.line.len() > self.max_head {
                        self.state = State::Opaque;
                    }
                }
            }
        }
    }

    /// A complete head: record its verdict and say how its body is framed.
    fn head(&mut self, head: &[u8]) -> State {
        // Room for more headers than hyper accepts (100), left uninitialised: zeroing 8 KiB per
        // request showed in profiles.
        let mut headers = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; 256];
        let mut req = httparse::Request::new(&mut []);
        // hyper skips empty lines before a request line; so do we.
        let start = head
            .iter()
            .position(|b| *b != b'\r' && *b != b'\n')
            .unwrap_or(head.len());
        if !matches!(
            req.parse_with_uninit_headers(&head[start..], &mut headers),
            Ok(httparse::Status::Complete(_))
        ) {
            return State::Opaque;
        }
        let mut length: Option<u64> = None;
        let (mut has_cl, mut te) = (false, None::<Vec<u8>>);
        for h in req.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                has_cl = true;
                length = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse().ok());
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                te = Some(h.value.to_ascii_lowercase());
            }
        }
        if let Ok(mut v) = self.verdicts.lock() {
            v.push_back(has_cl && te.is_some());
        }
        match (te, length) {
            (Some(te), _) => {
                let last = te.rsplit(|b| *b == b',').next().unwrap_or(&[]);
                if last.trim_ascii() == b"chunked" {
                    State::ChunkSize
                } else {
                    State::Opaque
                }
            }
            (None, Some(0)) if has_cl => State::Head,
            (None, Some(n)) => State::Fixed(n),
            (None, None) if has_cl => State::Opaque,
            (None, None) => State::Head,
        }
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

/// A stream whose reads are shown to a [`Tracker`] (HTTP/1.1 connections only).
pub struct Watched<S> {
    pub inner: S,
    pub tracker: Option<Tracker>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(t)) = (&r, self.tracker.as_mut()) {
            t.feed(&buf.filled()[before..]);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdicts(stream: &[u8], split: usize) -> Vec<bool> {
        let (mut t, v) = Tracker::new(64 * 1024);
        for piece in stream.chunks(split.max(1)) {
            t.feed(piece);
        }
        v.lock().unwrap().iter().copied().collect()
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
        let (mut t, _) = Tracker::new(1024);
        t.feed(b"\xff\xfe\r\n\r\n\r\n0\r\nzz\r\n");
        t.feed(&[0u8; 5000]);
        let (mut t, _) = Tracker::new(1024);
        t.feed(b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n");
        t.feed(b"more");
    }
}
