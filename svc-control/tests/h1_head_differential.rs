//! The proxy's HTTP/1.x head reader (`proxy::h1_head`) against the real receiver, hyper's
//! HTTP/1.1 server, over generated request heads: valid heads and their mutations (spaces around
//! colons, obs-fold, Transfer-Encoding lists, duplicate and odd Content-Length, bare LF and lone
//! CR, control bytes, long lines, names that are no tokens, HTTP versions, absolute and asterisk
//! targets, too many headers). Each head is fed to hyper in-process (over `tokio::io::duplex`)
//! and to the reader. Whenever hyper refuses, the reader refuses; whenever the reader accepts,
//! hyper accepts and reads the same method, target, version, headers and body framing, and
//! reads the head the reader re-serialises (what the proxy hands hyper) the same way again.

use std::{
    convert::Infallible,
    sync::{Arc, Mutex},
    time::Duration,
};

use http::{HeaderName, Method, Request, Response, Uri, Version};
use http_body_util::Full;
use hyper::body::{Body as _, Bytes, Incoming};
use hyper_util::rt::TokioIo;
use svc_control::proxy::h1_head::{self, Body, Head};
use tokio::io::AsyncWriteExt as _;

/// What hyper read of a request: method, target, version, headers (stable-sorted by name) and
/// the body's framing (`Some(n)`: exactly n bytes; `None`: chunked).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Read {
    method: Method,
    target: Uri,
    version: Version,
    headers: Vec<(HeaderName, Vec<u8>)>,
    length: Option<u64>,
}

/// Serve `bytes` (then the end of the stream) to a hyper HTTP/1.1 server: what it read of the
/// first request, or `None` if it never handed one to the service (refused, or incomplete).
async fn hyper_reads(bytes: &[u8]) -> Option<Read> {
    let (mut client, server) = tokio::io::duplex(1 << 20);
    let seen: Arc<Mutex<Option<Read>>> = Arc::default();
    let service_seen = seen.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let hint = req.body().size_hint();
        let mut headers: Vec<_> = req
            .headers()
            .iter()
            .map(|(n, v)| (n.clone(), v.as_bytes().to_vec()))
            .collect();
        headers.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
        let read = Read {
            method: req.method().clone(),
            target: req.uri().clone(),
            version: req.version(),
            headers,
            length: hint.exact(),
        };
        if let Ok(mut s) = service_seen.lock() {
            s.get_or_insert(read);
        }
        async { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok")))) }
    });
    let conn = tokio::spawn(
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(server), service)
            .with_upgrades(),
    );
    let writes = async {
        let _ = client.write_all(bytes).await;
        let _ = client.shutdown().await;
        // Keep reading the answer so hyper's writes never block.
        let mut sink = tokio::io::sink();
        let _ = tokio::io::copy(&mut client, &mut sink).await;
    };
    // A panic in hyper (its debug build asserts on some inputs) is a refusal too.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::join!(writes, async {
            let _ = conn.await;
        })
    })
    .await;
    seen.lock().ok()?.clone()
}

/// What hyper should read of a head the reader accepted: its headers as hyper keeps them (a
/// Content-Length after Transfer-Encoding, or repeated, is skipped; one before it is removed).
fn expected(head: &Head) -> Read {
    let (mut headers, mut is_te, mut length_kept) = (Vec::new(), false, false);
    for (name, value) in &head.headers {
        if name == http::header::TRANSFER_ENCODING {
            is_te = true;
            if std::mem::take(&mut length_kept) {
                headers.retain(|(n, _): &(HeaderName, Vec<u8>)| n != http::header::CONTENT_LENGTH);
            }
        } else if name == http::header::CONTENT_LENGTH {
            if is_te || length_kept {
                continue;
            }
            length_kept = true;
        }
        headers.push((name.clone(), value.clone()));
    }
    headers.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    Read {
        method: head.method.clone(),
        // The reader checked the target: the default never stands in.
        target: Uri::try_from(head.target.as_str()).unwrap_or_default(),
        version: if head.version == 1 {
            Version::HTTP_11
        } else {
            Version::HTTP_10
        },
        headers,
        length: match head.body {
            Body::None => Some(0),
            Body::Fixed(n) => Some(n),
            Body::Chunked => None,
        },
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<'a, T>(&mut self, from: &'a [T]) -> &'a T {
        &from[self.below(from.len())]
    }
}

/// Request lines the cases start from.
const LINES: &[&str] = &[
    "GET / HTTP/1.1",
    "POST /p?q=1 HTTP/1.1",
    "GET http://a.example/x HTTP/1.1",
    "OPTIONS * HTTP/1.1",
    "CONNECT a.example:443 HTTP/1.1",
    "GET / HTTP/1.0",
    "PUT /a/b%20c HTTP/1.1",
];

/// Header lines the cases pick from.
const HEADERS: &[&str] = &[
    "Host: a.example",
    "Transfer-Encoding: chunked",
    "Transfer-Encoding: chunked, identity",
    "Transfer-Encoding: xchunked",
    "Transfer-Encoding: gzip, Chunked",
    "transfer-encoding:chunked",
    "Transfer-Encoding: chunked\t",
    "Content-Length: 0",
    "Content-Length: 5",
    "Content-Length: 6",
    "Content-Length: 5, 5",
    "Content-Length: +5",
    "Content-Length: 05",
    "Content-Length: -1",
    "Content-Length: 99999999999999999999999",
    "Content-Length: 18446744073709551615",
    "Content-Length:",
    "Upgrade: websocket",
    "Connection: Upgrade",
    "Connection: close",
    "Expect: 100-continue",
    "X-A: b",
    "X-Tab:\tv\t",
    "X-Obs-Text: \u{e4}",
    "X-Empty:",
    "X(A): b",
    "X@: b",
    "X A: b",
    "\u{e4}: b",
    ": no-name",
];

/// Request targets a case may put in place of its own.
const TARGETS: &[&str] = &[
    "*",
    "http://[::1]:8080/x",
    "//x",
    "/a b",
    "/%zz",
    "/a\u{7f}",
    "a.example:443",
    "/\u{e4}",
    "https://a.example",
    "/{x}",
    "",
];

/// Versions a case may put in place of its own.
const VERSIONS: &[&str] = &[
    "HTTP/1.0",
    "HTTP/2.0",
    "HTTP/1.2",
    "HTTP/0.9",
    "http/1.1",
    "HTTP/1.1 ",
    "HTTP/11",
];

/// One generated head (and a body's first bytes).
fn case(rng: &mut Rng) -> Vec<u8> {
    let mut line: Vec<String> = rng.pick(LINES).split(' ').map(str::to_owned).collect();
    let mut headers: Vec<String> = vec!["Host: a.example".into()];
    for _ in 0..rng.below(4) {
        headers.push((*rng.pick(HEADERS)).to_owned());
    }
    for _ in 0..rng.below(3) {
        mutate(rng, &mut line, &mut headers);
    }
    let mut head = line.join(if rng.below(20) == 0 { "  " } else { " " });
    let eol = match rng.below(12) {
        0 => "\n",
        1 => "\r",
        _ => "\r\n",
    };
    head.push_str("\r\n");
    for h in &headers {
        head.push_str(h);
        head.push_str(if rng.below(15) == 0 { eol } else { "\r\n" });
    }
    head.push_str(if rng.below(10) == 0 { "\n" } else { "\r\n" });
    if rng.below(15) == 0 {
        head.insert_str(0, "\r\n\r\n");
    }
    let mut bytes = head.into_bytes();
    if rng.below(8) == 0 && !bytes.is_empty() {
        let at = rng.below(bytes.len());
        bytes.insert(
            at,
            *rng.pick(&[0u8, 1, 8, 0x0b, 0x0c, 0x1b, 0x7f, b'\r', b'\n', 0xff]),
        );
    }
    if rng.below(20) == 0 && !bytes.is_empty() {
        bytes.truncate(rng.below(bytes.len()));
    }
    bytes.extend_from_slice(b"hello");
    bytes
}

/// One mutation of the request line or the headers.
fn mutate(rng: &mut Rng, line: &mut [String], headers: &mut Vec<String>) {
    if headers.is_empty() {
        headers.push("X-B: c".into());
    }
    let h = rng.below(headers.len());
    match rng.below(11) {
        0 => line[2] = (*rng.pick(VERSIONS)).to_owned(),
        1 => line[1] = (*rng.pick(TARGETS)).to_owned(),
        2 => line[0] = (*rng.pick(&["get", "G@T", "PRI", "M-SEARCH", "GET\t"])).to_owned(),
        3 => {
            let colon: &&str = rng.pick(&[" :", "\t:", ": ", "::"]);
            headers[h] = headers[h].replacen(':', colon, 1);
        }
        4 => headers.insert(h + 1, (*rng.pick(&[" folded", "\tfolded", " "])).to_owned()),
        5 => headers.push(format!(
            "X-Long: {}",
            "a".repeat(*rng.pick(&[100, 9000, 70_000]))
        )),
        6 => line[1] = format!("/{}", "a".repeat(*rng.pick(&[1000, 65_533, 65_534]))),
        7 => headers.extend((0..*rng.pick(&[99, 100, 101])).map(|i| format!("X-{i}: v"))),
        8 => {
            let other = rng.below(headers.len());
            headers.swap(h, other);
        }
        9 => {
            headers.remove(h);
        }
        _ => headers.push((*rng.pick(HEADERS)).to_owned()),
    }
}

/// The number of generated heads.
const CASES: usize = 3000;

#[test]
fn the_head_reader_refuses_what_hyper_refuses_and_reads_the_rest_as_hyper_does() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("a runtime: {e}"));
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let (mut accepted, mut refused, mut incomplete) = (0, 0, 0);
    let mut wrong = Vec::new();
    for i in 0..CASES {
        let bytes = case(&mut rng);
        let hyper = rt.block_on(hyper_reads(&bytes));
        let shown = String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned();
        match (h1_head::read(&bytes), hyper) {
            (Ok(Some((head, _))), Some(read)) => {
                accepted += 1;
                let want = expected(&head);
                if read != want {
                    wrong.push(format!(
                        "case {i} read apart: {shown:?}\nhyper {read:?}\nours {want:?}"
                    ));
                }
                let mut again = Vec::new();
                head.serialise(&mut again);
                let reread = rt.block_on(hyper_reads(&again));
                if reread.as_ref() != Some(&want) {
                    wrong.push(format!(
                        "case {i} re-serialised read apart: {shown:?}\n{reread:?}"
                    ));
                }
            }
            (Ok(Some(_)), None) => wrong.push(format!(
                "case {i}: hyper refused, the reader accepted: {shown:?}"
            )),
            (Err(_), None) => refused += 1,
            (Ok(None), None) => incomplete += 1,
            (ours, Some(read)) => wrong.push(format!(
                "case {i}: hyper accepted ({read:?}), the reader did not ({ours:?}): {shown:?}"
            )),
        }
    }
    println!(
        "h1_head differential: {CASES} cases: {accepted} accepted by both, {refused} refused by \
         both, {incomplete} incomplete for both, {} apart",
        wrong.len()
    );
    assert!(
        wrong.is_empty() && accepted > 300 && refused > 300,
        "{} of {CASES} apart (accepted {accepted}, refused {refused}):\n{}",
        wrong.len(),
        wrong
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
