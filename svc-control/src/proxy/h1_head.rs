//! What the framing witness (`h1_frames`) reads of one complete HTTP/1.1 request head: how its
//! body is framed, or why hyper would refuse it. The proxy refuses those heads itself, with the
//! perimeter's answer and an audit record, before hyper sees them (hyper's own refusal is a
//! bare 400, or for `PRI * HTTP/2.0` a silent close).

/// How a head's body is framed, as hyper frames it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Body {
    None,
    Fixed(u64),
    Chunked,
}

/// A head hyper accepts: its body's framing, and whether it carried both Content-Length and
/// Transfer-Encoding (refused by the policy as request smuggling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Framed {
    pub(super) body: Body,
    pub(super) both_lengths: bool,
}

/// The most headers hyper accepts in a request head.
const MAX_HEADERS: usize = 100;

/// Read a complete head (leading empty lines already skipped): its framing, or why it is
/// refused.
pub(super) fn read(head: &[u8]) -> Result<Framed, &'static str> {
    // Room for more headers than hyper accepts, left uninitialised: zeroing 8 KiB per request
    // showed in profiles.
    let mut headers = [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; 256];
    let mut req = httparse::Request::new(&mut []);
    match req.parse_with_uninit_headers(head, &mut headers) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => return Err("the request head is incomplete"),
        Err(e) => return Err(parse_error(head, e)),
    }
    if req.headers.len() > MAX_HEADERS {
        return Err("the request head has more than 100 headers");
    }
    let (mut length, mut has_cl, mut te) = (None::<u64>, false, None::<&[u8]>);
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            has_cl = true;
            let n = content_length(h.value).ok_or("Content-Length is not a number")?;
            if length.is_some_and(|l| l != n) {
                return Err("Content-Length headers that disagree (request smuggling)");
            }
            length = Some(n);
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // hyper reads the last Transfer-Encoding header's last coding.
            te = Some(h.value);
        }
    }
    let body = match te {
        Some(_) if req.version == Some(0) => {
            return Err("Transfer-Encoding on an HTTP/1.0 request");
        }
        Some(te) => {
            let last = te.rsplit(|b| *b == b',').next().unwrap_or(&[]);
            if !last.trim_ascii().eq_ignore_ascii_case(b"chunked") {
                return Err("Transfer-Encoding does not end in chunked (its framing is unknown)");
            }
            Body::Chunked
        }
        None => match length {
            Some(0) | None => Body::None,
            Some(n) => Body::Fixed(n),
        },
    };
    Ok(Framed {
        body,
        both_lengths: has_cl && te.is_some(),
    })
}

/// A Content-Length value as hyper reads it: digits, or a list of the same digits.
fn content_length(value: &[u8]) -> Option<u64> {
    let mut n = None;
    for part in value.split(|b| *b == b',') {
        let part = part.trim_ascii();
        if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let v: u64 = std::str::from_utf8(part).ok()?.parse().ok()?;
        if n.is_some_and(|m| m != v) {
            return None;
        }
        n = Some(v);
    }
    n
}

/// Why httparse (hyper's parser) refused a head, in words.
fn parse_error(head: &[u8], e: httparse::Error) -> &'static str {
    if head.starts_with(b"PRI * HTTP/2.0") {
        return "HTTP/2 with prior knowledge (PRI * HTTP/2.0) is not served on this connection";
    }
    match e {
        httparse::Error::HeaderName => {
            "a header name holds a character a name may not (a space before the colon, or an \
             obs-fold continuation line)"
        }
        httparse::Error::HeaderValue => "a header value holds a character a value may not",
        httparse::Error::Version => "not an HTTP/1.x request",
        httparse::Error::TooManyHeaders => "the request head has more than 100 headers",
        _ => "the request line or a header line is malformed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
            (
                "h2_prior_knowledge",
                b"PRI * HTTP/2.0\r\n\r\n",
                "HTTP/2 with prior knowledge",
            ),
            (
                "content_length_not_a_number",
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n",
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
            let got = read(head);
            assert!(got.is_err_and(|w| w.contains(why)), "{name}: {got:?}");
        }
        let framed: &[(&str, &[u8], Framed)] = &[
            (
                "get",
                b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
                Framed {
                    body: Body::None,
                    both_lengths: false,
                },
            ),
            (
                "same_length_twice",
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\n",
                Framed {
                    body: Body::Fixed(3),
                    both_lengths: false,
                },
            ),
            (
                "gzip_then_chunked",
                b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n",
                Framed {
                    body: Body::Chunked,
                    both_lengths: false,
                },
            ),
            (
                "both_lengths",
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
                Framed {
                    body: Body::Chunked,
                    both_lengths: true,
                },
            ),
        ];
        for (name, head, want) in framed {
            assert_eq!(read(head), Ok(*want), "{name}");
        }
    }
}
