//! The answer to a request the proxy swapped a credential into, scrubbed of that credential
//! (issue 28): `policy::credentials::EchoGuard` says what to look for and what each occurrence
//! becomes; this module does it to the response's headers, body and trailers as they stream.
//!
//! The body is never held whole: each chunk is emitted as soon as it is scanned, except its
//! last `longest pattern - 1` bytes, which wait for the next chunk (a match can straddle two
//! chunks) or the end of the body. Memory per response is bounded by one chunk plus that
//! tail. The placeholder is rarely as long as the real value, so a scrubbed body's length is
//! not the upstream's: its `Content-Length` is dropped and the body goes to the guest chunked
//! (HTTP/1.1) or as DATA frames ending with the stream (HTTP/2).

use std::{
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll, ready},
};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, header};
use hyper::body::{Body, Frame};

use crate::{
    audit::HttpEvent,
    policy::credentials::{
        ECHO_ACCEPT_ENCODING, ECHO_DROPPED_REQUEST_HEADERS, EchoGuard, echo_scannable,
    },
};

/// Make a request that carries a swapped credential one whose answer can be scanned: ask for
/// an identity encoding, and no byte ranges.
pub(super) fn prepare_request(headers: &mut HeaderMap) {
    headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static(ECHO_ACCEPT_ENCODING),
    );
    for name in ECHO_DROPPED_REQUEST_HEADERS {
        headers.remove(name);
    }
}

/// Check that the answer's codings let its body be scanned (before hop-by-hop headers go:
/// `Transfer-Encoding` is one), then scrub its headers. `Err` says why it cannot be passed on.
pub(super) fn response_head(
    guard: &EchoGuard,
    headers: &mut HeaderMap,
    echoes: &AtomicU64,
) -> Result<(), String> {
    let values = |name: HeaderName| -> Vec<Vec<u8>> {
        headers
            .get_all(name)
            .iter()
            .map(|v| v.as_bytes().to_vec())
            .collect()
    };
    let (ce, te) = (
        values(header::CONTENT_ENCODING),
        values(header::TRANSFER_ENCODING),
    );
    echo_scannable(
        &ce.iter().map(Vec::as_slice).collect::<Vec<_>>(),
        &te.iter().map(Vec::as_slice).collect::<Vec<_>>(),
    )?;
    echoes.fetch_add(scrub_headers(guard, headers), Ordering::Relaxed);
    Ok(())
}

/// Replace every occurrence in `headers`' values; the number replaced.
pub(super) fn scrub_headers(guard: &EchoGuard, headers: &mut HeaderMap) -> u64 {
    let mut found = 0;
    for value in headers.values_mut() {
        let (scrubbed, n) = replace_all(guard, value.as_bytes());
        if n == 0 {
            continue;
        }
        found += n;
        // The placeholder is hex, so a valid value stays valid; were it not, nothing is kept.
        let sensitive = value.is_sensitive();
        *value = HeaderValue::from_bytes(&scrubbed).unwrap_or(HeaderValue::from_static(""));
        value.set_sensitive(sensitive);
    }
    found
}

/// `haystack` with every occurrence replaced, and how many there were.
pub(super) fn replace_all(guard: &EchoGuard, haystack: &[u8]) -> (Vec<u8>, u64) {
    let mut s = Scrubber::new(Arc::new(guard.clone()), Arc::default());
    let mut out = s.push(Bytes::copy_from_slice(haystack)).to_vec();
    out.extend_from_slice(&s.finish());
    (out, s.found)
}

/// The record of a response in which the credential was found and replaced: the request's
/// own record as `decision: "scrubbed"`, `rule: "credential-echo"`.
pub(super) fn echo_record(request: &HttpEvent) -> HttpEvent {
    HttpEvent {
        decision: "scrubbed",
        rule: "credential-echo".to_owned(),
        ..request.clone()
    }
}

/// A streaming find-and-replace over one body.
pub(super) struct Scrubber {
    guard: Arc<EchoGuard>,
    /// The bytes held back: the end of what came so far, shorter than the longest pattern.
    tail: BytesMut,
    found: u64,
    /// Occurrences replaced, shared with the request's audit record.
    echoes: Arc<AtomicU64>,
}

impl Scrubber {
    pub(super) fn new(guard: Arc<EchoGuard>, echoes: Arc<AtomicU64>) -> Self {
        Self {
            guard,
            tail: BytesMut::new(),
            found: 0,
            echoes,
        }
    }

    /// The next chunk in; what can be emitted now out.
    pub(super) fn push(&mut self, chunk: Bytes) -> Bytes {
        self.scan(chunk, false)
    }

    /// The end of the body: whatever was held back, scrubbed.
    pub(super) fn finish(&mut self) -> Bytes {
        self.scan(Bytes::new(), true)
    }

    fn scan(&mut self, chunk: Bytes, last: bool) -> Bytes {
        let longest = self.guard.longest();
        if longest == 0 {
            return chunk;
        }
        let buf = if self.tail.is_empty() {
            chunk
        } else {
            self.tail.extend_from_slice(&chunk);
            self.tail.split().freeze()
        };
        // A match may be taken only where no longer pattern starting at or before it could
        // still run past the end of what is here (unless the body ended).
        let decidable = if last {
            buf.len()
        } else {
            buf.len().saturating_sub(longest - 1)
        };
        let mut out: Option<BytesMut> = None;
        let mut at = 0;
        while let Some((start, len)) = self.earliest(&buf[at..]).map(|(s, l)| (at + s, l)) {
            if start >= decidable {
                break;
            }
            let o = out.get_or_insert_with(|| BytesMut::with_capacity(buf.len()));
            o.extend_from_slice(&buf[at..start]);
            o.extend_from_slice(self.guard.replacement());
            at = start + len;
            self.found += 1;
            self.echoes.fetch_add(1, Ordering::Relaxed);
        }
        let keep = decidable.max(at);
        self.tail.extend_from_slice(&buf[keep..]);
        match out {
            None => buf.slice(..keep),
            Some(mut o) => {
                o.extend_from_slice(&buf[at..keep]);
                o.freeze()
            }
        }
    }

    /// The leftmost occurrence of any pattern in `hay` (the longest where several start
    /// there): its start and length.
    fn earliest(&self, hay: &[u8]) -> Option<(usize, usize)> {
        self.guard
            .patterns()
            .filter_map(|p| memchr::memmem::find(hay, p).map(|s| (s, p.len())))
            .min_by_key(|&(s, len)| (s, std::cmp::Reverse(len)))
    }
}

/// A response body scrubbed as it streams; its trailers too.
pub(super) struct Scrubbed<B> {
    inner: B,
    scrubber: Scrubber,
    trailers: Option<HeaderMap>,
    done: bool,
}

impl<B> Scrubbed<B> {
    pub(super) fn new(inner: B, guard: Arc<EchoGuard>, echoes: Arc<AtomicU64>) -> Self {
        Self {
            inner,
            scrubber: Scrubber::new(guard, echoes),
            trailers: None,
            done: false,
        }
    }
}

impl<B> Body for Scrubbed<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        loop {
            if let Some(t) = this.trailers.take() {
                return Poll::Ready(Some(Ok(Frame::trailers(t))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            let rest = match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => this.scrubber.push(data),
                    Err(frame) => {
                        let Ok(mut trailers) = frame.into_trailers() else {
                            continue;
                        };
                        let n = scrub_headers(&this.scrubber.guard, &mut trailers);
                        this.scrubber.echoes.fetch_add(n, Ordering::Relaxed);
                        this.trailers = Some(trailers);
                        this.done = true;
                        this.scrubber.finish()
                    }
                },
                // What was held back is never sent: the body failed.
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    this.done = true;
                    this.scrubber.finish()
                }
            };
            if !rest.is_empty() {
                return Poll::Ready(Some(Ok(Frame::data(rest))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.trailers.is_none() && self.scrubber.tail.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::policy::credentials::Placeholder;

    fn guard(real: &str) -> Arc<EchoGuard> {
        let p = Placeholder::parse(&"ab".repeat(32)).unwrap();
        Arc::new(EchoGuard::new(real, &p))
    }

    /// Feed `body` cut at `cuts` and gather the output.
    fn streamed(g: &Arc<EchoGuard>, body: &[u8], cuts: &[usize]) -> (Vec<u8>, u64) {
        let mut s = Scrubber::new(g.clone(), Arc::default());
        let mut out = Vec::new();
        let mut from = 0;
        for &c in cuts.iter().chain(std::iter::once(&body.len())) {
            let c = c.clamp(from, body.len());
            out.extend_from_slice(&s.push(Bytes::copy_from_slice(&body[from..c])));
            from = c;
        }
        out.extend_from_slice(&s.finish());
        (out, s.found)
    }

    fn naive(g: &EchoGuard, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut i = 0;
        'outer: while i < body.len() {
            let mut best: Option<&[u8]> = None;
            for p in g.patterns() {
                if body[i..].starts_with(p) && best.is_none_or(|b| p.len() > b.len()) {
                    best = Some(p);
                }
            }
            if let Some(p) = best {
                out.extend_from_slice(g.replacement());
                i += p.len();
                continue 'outer;
            }
            out.push(body[i]);
            i += 1;
        }
        out
    }

    #[test]
    fn an_echo_split_at_every_boundary_is_replaced() {
        let real = "ghp_REALtoken/with+odd=chars";
        let g = guard(real);
        let body = format!(r#"{{"headers":{{"Authorization":"Bearer {real}"}},"x":"{real}"}}"#);
        let want = body.replace(real, &"ab".repeat(32));
        for cut in 0..=body.len() {
            let (out, n) = streamed(&g, body.as_bytes(), &[cut]);
            assert_eq!(String::from_utf8(out).unwrap(), want, "cut at {cut}");
            assert_eq!(n, 2);
        }
        // One byte at a time.
        let cuts: Vec<usize> = (0..body.len()).collect();
        assert_eq!(streamed(&g, body.as_bytes(), &cuts).0, want.as_bytes());
    }

    #[test]
    fn escaped_echoes_are_replaced_too() {
        let real = "tok/en+\"x";
        let g = guard(real);
        for echoed in [
            r#"tok\/en+\"x"#,
            r#"tok/en+\"x"#,
            "tok%2Fen%2B%22x",
            "tok%2fen%2b%22x",
            "tok/en+&quot;x",
        ] {
            let (out, n) = streamed(&g, format!("<{echoed}>").as_bytes(), &[3]);
            assert_eq!(out, format!("<{}>", "ab".repeat(32)).as_bytes(), "{echoed}");
            assert_eq!(n, 1, "{echoed}");
        }
    }

    #[test]
    fn a_body_without_the_credential_passes_unchanged_and_in_step() {
        let g = guard("secret-token-value");
        let mut s = Scrubber::new(g, Arc::default());
        // Everything but the held-back tail is emitted at once.
        let out = s.push(Bytes::from_static(
            b"0123456789012345678901234567890123456789",
        ));
        assert_eq!(out.len(), 40 - ("secret-token-value".len() - 1));
        assert_eq!(s.tail.len(), "secret-token-value".len() - 1);
        let out2 = s.finish();
        assert_eq!(
            [out, out2].concat(),
            b"0123456789012345678901234567890123456789"
        );
    }

    #[test]
    fn headers_and_their_values_are_scrubbed() {
        let g = guard("real-token");
        let mut h = HeaderMap::new();
        h.insert("x-echo", HeaderValue::from_static("Bearer real-token"));
        h.insert("x-other", HeaderValue::from_static("nothing"));
        assert_eq!(scrub_headers(&g, &mut h), 1);
        assert_eq!(
            h["x-echo"].as_bytes(),
            format!("Bearer {}", "ab".repeat(32)).as_bytes()
        );
        assert_eq!(h["x-other"], "nothing");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Any body, any credential, cut anywhere: the streamed result is the whole-body
        /// replacement, and the credential never survives.
        #[test]
        fn streaming_equals_whole_body_replacement(
            real in "[g-z/\"%]{1,12}",
            pieces in proptest::collection::vec(
                prop_oneof![Just(None), "[g-z/\"%\\\\]{0,6}".prop_map(Some)], 0..12),
            cuts in proptest::collection::vec(0usize..200, 0..8),
        ) {
            let g = guard(&real);
            let body: String = pieces
                .into_iter()
                .map(|p| p.unwrap_or_else(|| real.clone()))
                .collect();
            let mut cuts = cuts;
            cuts.sort_unstable();
            let (out, _) = streamed(&g, body.as_bytes(), &cuts);
            prop_assert_eq!(&out, &naive(&g, body.as_bytes()));
            // The credential has no hex digit, so no placeholder can help spell it again.
            prop_assert!(memchr::memmem::find(&out, real.as_bytes()).is_none());
        }
    }
}
