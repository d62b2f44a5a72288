//! The proxy's own reader of an HTTP/1.x request head (the framing witness `h1_frames` holds
//! each head back from hyper until this has read it). It reads a head exactly as hyper 1.x does
//! (`hyper/src/proto/h1/role.rs`, `Server::parse`: httparse with its default configuration and
//! at most 100 headers, `Method::from_bytes`, `Uri::from_maybe_shared`, `HeaderName::from_bytes`,
//! then the Transfer-Encoding / Content-Length walk), and hyper is handed the head re-serialised
//! from this parse ([`Head::serialise`]), never the guest's bytes. A head hyper would refuse
//! itself (with a bare 400, or for `PRI * HTTP/2.0` a silent close) is refused here instead,
//! with the reason in words, so the proxy answers it with the perimeter's refusal and an audit
//! record. `svc-control/tests/h1_head_differential.rs` checks this against the real hyper.

use std::mem::MaybeUninit;

use http::{HeaderName, Method, Uri};

/// How a head's body is framed, as hyper frames it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// No body (no length, or `Content-Length: 0`).
    None,
    /// `Content-Length` bytes.
    Fixed(u64),
    /// Chunked.
    Chunked,
}

/// A head hyper accepts, as it reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The method.
    pub method: Method,
    /// The request target as sent.
    pub target: String,
    /// `0` for HTTP/1.0, `1` for HTTP/1.1.
    pub version: u8,
    /// Every header line in order (names as sent; values as httparse trims them).
    pub headers: Vec<(HeaderName, Vec<u8>)>,
    /// The body's framing.
    pub body: Body,
    /// It carried both Content-Length and Transfer-Encoding (the policy refuses those as
    /// request smuggling; hyper drops Content-Length, so the request alone cannot show it).
    pub both_lengths: bool,
    /// hyper treats it as an upgrade ask (`CONNECT`, or `Upgrade` on HTTP/1.1): if it is
    /// answered 101 (or a 2xx to `CONNECT`), hyper hands the connection over.
    pub upgrade: bool,
}

/// Why a head is refused: the status hyper would have answered (400, 414) and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status of the refusal.
    pub status: u16,
    /// What was wrong, in words.
    pub why: &'static str,
}

/// The most headers hyper accepts in a request head (`DEFAULT_MAX_HEADERS`).
pub const MAX_HEADERS: usize = 100;
/// The longest request target hyper accepts (`MAX_URI_LEN`).
const MAX_URI_LEN: usize = (u16::MAX - 1) as usize;
/// The largest Content-Length hyper accepts (`DecodedLength::MAX_LEN`).
const MAX_LENGTH: u64 = u64::MAX - 2;

fn refused(status: u16, why: &'static str) -> Refusal {
    Refusal { status, why }
}

/// Read the start of `buf` as a request head: `Ok(None)` while it is incomplete, else the head
/// and the bytes it took, or why it is refused.
pub fn read(buf: &[u8]) -> Result<Option<(Head, usize)>, Refusal> {
    let mut headers = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let taken = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut req,
        buf,
        &mut headers,
    ) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(parse_error(buf, &req, e)),
    };
    let (Some(method), Some(target), Some(version)) = (req.method, req.path, req.version) else {
        return Err(refused(400, "the request line is incomplete"));
    };
    if target.len() > MAX_URI_LEN {
        return Err(refused(
            414,
            "the request target is longer than 65534 bytes",
        ));
    }
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| refused(400, "the method is not a valid token"))?;
    Uri::try_from(target).map_err(|_| refused(400, "the request target is not a valid URI"))?;
    let mut names = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes())
            .map_err(|_| refused(400, "a header name is not a valid token"))?;
        names.push((name, h.value.to_vec()));
    }
    let (body, both_lengths, upgrade) = framing(&method, version, &names)?;
    let head = Head {
        method,
        target: target.to_owned(),
        version,
        headers: names,
        body,
        both_lengths,
        upgrade,
    };
    Ok(Some((head, taken)))
}

/// The body's framing, whether both lengths came, and whether hyper sees an upgrade ask: the
/// walk of hyper's `Server::parse` over the headers in order.
fn framing(
    method: &Method,
    version: u8,
    headers: &[(HeaderName, Vec<u8>)],
) -> Result<(Body, bool, bool), Refusal> {
    let http11 = version == 1;
    let (mut body, mut length) = (Body::None, None::<u64>);
    let (mut is_cl, mut is_te, mut te_chunked) = (false, false, false);
    let mut upgrade = method == Method::CONNECT;
    for (name, value) in headers {
        if name == http::header::TRANSFER_ENCODING {
            if !http11 {
                return Err(refused(400, "Transfer-Encoding on an HTTP/1.0 request"));
            }
            is_te = true;
            length = None;
            te_chunked = is_chunked(value);
            if te_chunked {
                body = Body::Chunked;
            }
        } else if name == http::header::CONTENT_LENGTH {
            is_cl = true;
            if is_te {
                // hyper skips a Content-Length after Transfer-Encoding unread.
                continue;
            }
            let n = from_digits(value).ok_or(refused(400, "Content-Length is not a number"))?;
            if n > MAX_LENGTH {
                return Err(refused(431, "Content-Length is larger than any body"));
            }
            if length.is_some_and(|l| l != n) {
                return Err(refused(
                    400,
                    "Content-Length headers that disagree (request smuggling)",
                ));
            }
            if length.is_none() {
                length = Some(n);
                body = if n == 0 { Body::None } else { Body::Fixed(n) };
            }
        } else if name == http::header::UPGRADE {
            upgrade = http11;
        }
    }
    if is_te && !te_chunked {
        return Err(refused(
            400,
            "Transfer-Encoding does not end in chunked (its framing is unknown)",
        ));
    }
    Ok((body, is_cl && is_te, upgrade))
}

/// hyper's `is_chunked_`: the value is text and its last coding is `chunked`.
fn is_chunked(value: &[u8]) -> bool {
    std::str::from_utf8(value).is_ok_and(|s| {
        // Only visible ASCII and tabs make a `HeaderValue::to_str`.
        s.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b))
            && s.rsplit(',')
                .next()
                .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"))
    })
}

/// hyper's `from_digits`: ASCII digits only (no sign, no list), no overflow.
fn from_digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, b| {
        b.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
}

/// Why httparse (hyper's parser) refused a head, in words.
fn parse_error(buf: &[u8], req: &httparse::Request<'_, '_>, e: httparse::Error) -> Refusal {
    let start = buf.iter().position(|b| !matches!(b, b'\r' | b'\n'));
    if start.is_some_and(|s| buf[s..].starts_with(b"PRI * HTTP/2.0")) {
        return refused(
            400,
            "HTTP/2 with prior knowledge (PRI * HTTP/2.0) is not served on this connection",
        );
    }
    refused(
        400,
        match e {
            httparse::Error::HeaderName => {
                "a header name holds a character a name may not (a space before the colon, or \
                 an obs-fold continuation line)"
            }
            httparse::Error::HeaderValue => "a header value holds a control character",
            httparse::Error::Token if req.method.is_none() => "the method is not a valid token",
            httparse::Error::Token => "the request target holds a character it may not",
            httparse::Error::Version => "not an HTTP/1.0 or HTTP/1.1 request line",
            httparse::Error::NewLine => "a line of the request head is not ended by CRLF or LF",
            httparse::Error::TooManyHeaders => "the request head has more than 100 headers",
            _ => "the request line or a header line is malformed",
        },
    )
}

impl Head {
    /// The head as hyper is handed it: the request line and every header line from this
    /// parse, CRLF-ended (hyper reads back exactly what was read here).
    pub fn serialise(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(self.target.as_bytes());
        out.extend_from_slice(if self.version == 1 {
            b" HTTP/1.1\r\n"
        } else {
            b" HTTP/1.0\r\n"
        });
        for (name, value) in &self.headers {
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(head: &[u8]) -> Result<Head, Refusal> {
        read(head).map(|h| h.expect("complete").0)
    }

    #[test]
    fn heads_hyper_would_refuse_are_named() {
        let refused: &[(&str, &[u8], &str)] = &[
            (
                "te_chunked_then_identity",
                b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
                "does not end in chunked",
            ),
            (
                "te_xchunked",
                b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n",
                "does not end in chunked",
            ),
            (
                "space_before_colon",
                b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n",
                "a space before the colon",
            ),
            (
                "obs_fold",
                b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n",
                "obs-fold",
            ),
            ("h2_prior_knowledge", b"PRI * HTTP/2.0\r\n\r\n", "HTTP/2"),
            (
                "content_length_signed",
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
                "not a number",
            ),
            (
                "content_length_list",
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\n",
                "not a number",
            ),
            (
                "content_lengths_disagree",
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                "disagree",
            ),
            (
                "te_on_http10",
                b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
                "HTTP/1.0",
            ),
        ];
        for (name, head, why) in refused {
            let got = verdict(head);
            assert!(
                got.as_ref().is_err_and(|r| r.why.contains(why)),
                "{name}: {got:?}"
            );
        }
    }

    #[test]
    fn heads_hyper_accepts_are_framed_as_it_frames_them() {
        let framed: &[(&str, &[u8], Body, bool)] = &[
            (
                "get",
                b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
                Body::None,
                false,
            ),
            (
                "same_length_twice",
                b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n",
                Body::Fixed(3),
                false,
            ),
            (
                "gzip_then_chunked",
                b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n",
                Body::Chunked,
                false,
            ),
            (
                "bad_length_after_te_is_skipped",
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: x\r\n\r\n",
                Body::Chunked,
                true,
            ),
        ];
        for (name, head, body, both) in framed {
            let got = verdict(head).unwrap_or_else(|e| panic!("{name}: {e:?}"));
            assert_eq!((got.body, got.both_lengths), (*body, *both), "{name}");
            let mut again = Vec::new();
            got.serialise(&mut again);
            assert_eq!(verdict(&again), Ok(got), "{name}: re-read");
        }
        assert_eq!(read(b"GET / HTTP/1.1\r\nHost: a\r\n"), Ok(None));
    }
}
