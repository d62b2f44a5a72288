//! A hostile guest against the proxy after its redesign into stages (issue 30): raw bytes from
//! inside a real container sandbox behind the real svcd (`attack/guest.py`: its own TLS
//! ClientHello framing, its own request heads), against the outside world's servers.
//!
//! Every case's request path says what must become of it: `/ok-…` must reach the outside world
//! (the legitimate neighbour of an attack), `/deny-…` must never reach it, `/any-…` may (its
//! answer is only shown). Besides each case's expected status: no real token ever reaches the
//! outside world on a path that is not `/ok-…`, and none ever reaches the guest.

use serde_json::{Value, json};
use svc_tests::{
    require_root,
    world::{EXAMPLE_TOKEN, World},
};

/// The guest's client (see its header).
const GUEST_PY: &str = include_str!("attack/guest.py");

/// A second allowed name with a server of its own (and an address of its own).
const OTHER: (&str, &str) = ("other.attack.test", "192.0.2.40");
const ALLOWED: &str = "allowed.example.test";
const FORBIDDEN: &str = "forbidden.example.test";

/// `bytes` as hex digits.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Write `bytes` to `path` in sandbox `name`.
fn put(w: &World, name: &str, path: &str, bytes: &[u8]) {
    let script = format!(
        "python3 -c 'import sys; open(sys.argv[1], \"wb\").write(bytes.fromhex(sys.argv[2]))' {path} {}",
        hex(bytes)
    );
    let (code, _, err) = w.sh(name, &script);
    assert_eq!(code, 0, "writing {path} in {name}: {err}");
}

/// Copy the guest's client into sandbox `name` as `/tmp/guest.py`.
fn install_guest(w: &World, name: &str) {
    put(w, name, "/tmp/guest.py", GUEST_PY.as_bytes());
}

/// Run `cases` in sandbox `name`; one result object per case, by case name.
fn attack(w: &World, name: &str, cases: &[Value]) -> Vec<Value> {
    put(
        w,
        name,
        "/tmp/cases.json",
        Value::from(cases).to_string().as_bytes(),
    );
    let (code, out, err) = w.sh(name, "python3 /tmp/guest.py /tmp/cases.json");
    assert_eq!(code, 0, "the guest's client failed: {err}\n{out}");
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// An HTTP/1.1 head: `method target`, `Host: host` (none when empty), `extra` lines (each
/// ending in CRLF), and `Connection: close` unless `keep`.
fn head(method: &str, target: &str, host: &str, extra: &str, keep: bool) -> String {
    let host = if host.is_empty() {
        String::new()
    } else {
        format!("Host: {host}\r\n")
    };
    let close = if keep { "" } else { "Connection: close\r\n" };
    format!("{method} {target} HTTP/1.1\r\n{host}{extra}{close}\r\n")
}

/// A case over TLS to `dial`'s address with SNI `sni`, sending each of `send` in turn.
fn tls(case: &str, dial: &str, sni: Option<&str>, send: &[String]) -> Value {
    json!({"case": case, "dial": dial, "sni": sni, "send": send})
}

/// A case over plain HTTP (port 80) to `dial`'s address.
fn plain(case: &str, dial: &str, send: &[String]) -> Value {
    json!({"case": case, "dial": dial, "tls": false, "send": send})
}

/// The HTTPS cases against allowed.example.test's address (SNI allowed.example.test unless the
/// case says), `p` the guest's placeholder for it. (case, expected statuses: 0 is no answer.)
fn https_cases(p: &str) -> Vec<(Value, Vec<u16>)> {
    let bearer = format!("Authorization: Bearer {p}\r\n");
    let h = |case: &str, target: &str, host: &str, extra: &str| {
        tls(
            case,
            ALLOWED,
            Some(ALLOWED),
            &[head("GET", target, host, extra, false)],
        )
    };
    let (o, f) = (OTHER.0, FORBIDDEN);
    let mut cases = vec![
        (h("ok_bearer", "/ok-bearer", ALLOWED, &bearer), vec![200]),
        (
            h(
                "ok_host_case_and_dot",
                "/ok-case-dot",
                "ALLOWED.Example.TEST.",
                &bearer,
            ),
            vec![200],
        ),
        (
            h(
                "ok_bearer_lower_case",
                "/ok-lower",
                ALLOWED,
                &format!("authorization: bearer {p}\r\n"),
            ),
            vec![200],
        ),
        (
            h("front_other_allowed", "/deny-front-other", o, &bearer),
            vec![421],
        ),
        (
            h("front_forbidden", "/deny-front-forbidden", f, ""),
            vec![421],
        ),
        (
            h(
                "host_userinfo_a",
                "/deny-userinfo-a",
                &format!("{ALLOWED}@{f}"),
                "",
            ),
            vec![400, 421],
        ),
        (
            h(
                "host_userinfo_b",
                "/deny-userinfo-b",
                &format!("{f}@{ALLOWED}"),
                "",
            ),
            vec![400, 421],
        ),
        (
            h(
                "host_port_userinfo",
                "/deny-port-userinfo",
                &format!("{ALLOWED}:443@{f}"),
                "",
            ),
            vec![400, 421],
        ),
        (
            h("host_ipv6_loopback", "/deny-v6", "[::1]", ""),
            vec![400, 421],
        ),
        (
            h("host_ip_of_the_name", "/deny-ip", "192.0.2.20", ""),
            vec![400, 421],
        ),
        (
            h("host_v4_mapped", "/deny-mapped", "[::ffff:192.0.2.20]", ""),
            vec![400, 421],
        ),
        (
            h(
                "host_non_ascii",
                "/deny-non-ascii",
                "allowed.exampl\u{e9}.test",
                "",
            ),
            vec![400, 421],
        ),
        (
            h(
                "host_punycode",
                "/deny-punycode",
                "xn--allowed-9ya.example.test",
                "",
            ),
            vec![421],
        ),
        (
            h(
                "host_twice",
                "/deny-host-twice",
                ALLOWED,
                &format!("Host: {f}\r\n"),
            ),
            vec![400],
        ),
        (h("host_empty", "/deny-host-empty", " ", ""), vec![400]),
        (h("host_missing", "/deny-host-missing", "", ""), vec![400]),
        (
            h(
                "absolute_form_other",
                &format!("https://{f}/deny-abs"),
                ALLOWED,
                "",
            ),
            vec![400, 403, 421],
        ),
        (
            h(
                "absolute_form_same",
                &format!("https://{ALLOWED}/any-abs"),
                ALLOWED,
                "",
            ),
            vec![200, 400, 403],
        ),
        (
            tls(
                "connect_inside_tls",
                ALLOWED,
                Some(ALLOWED),
                &[head(
                    "CONNECT",
                    &format!("{f}:443"),
                    &format!("{f}:443"),
                    "",
                    false,
                )],
            ),
            vec![400, 403, 405, 421],
        ),
        (
            tls(
                "connect_same_host",
                ALLOWED,
                Some(ALLOWED),
                &[head(
                    "CONNECT",
                    "allowed.example.test:443",
                    "allowed.example.test:443",
                    "",
                    false,
                )],
            ),
            vec![400, 403, 405],
        ),
        (
            tls(
                "trace",
                ALLOWED,
                Some(ALLOWED),
                &[head("TRACE", "/deny-trace", ALLOWED, "", false)],
            ),
            vec![403, 405],
        ),
        (
            all(
                tls(
                    "keepalive_then_front",
                    ALLOWED,
                    Some(ALLOWED),
                    &[
                        head("GET", "/ok-ka1", ALLOWED, "", true),
                        head("GET", "/deny-ka2", o, &bearer, false),
                    ],
                ),
                &[200, 421],
            ),
            vec![200],
        ),
        (
            all(
                tls(
                    "pipelined_front",
                    ALLOWED,
                    Some(ALLOWED),
                    &[head("GET", "/ok-pipe1", ALLOWED, "", true)
                        + &head("GET", "/deny-pipe2", o, &bearer, false)],
                ),
                &[200, 421],
            ),
            vec![200],
        ),
        (
            h(
                "placeholder_in_proxy_authorization",
                "/deny-proxy-auth",
                ALLOWED,
                &format!("Proxy-Authorization: Bearer {p}\r\n"),
            ),
            vec![403],
        ),
        (
            h(
                "authorization_twice",
                "/deny-auth-twice",
                ALLOWED,
                &(bearer.clone() + &bearer),
            ),
            vec![400, 403],
        ),
        (
            h(
                "placeholder_in_basic",
                "/deny-basic",
                ALLOWED,
                &format!("Authorization: Basic {}\r\n", basic(p)),
            ),
            vec![403],
        ),
        (
            h(
                "placeholder_in_url",
                &format!("/deny-url?t={p}"),
                ALLOWED,
                "",
            ),
            vec![403],
        ),
        (
            h(
                "placeholder_in_cookie",
                "/deny-cookie",
                ALLOWED,
                &format!("Cookie: t={p}\r\n"),
            ),
            vec![403],
        ),
        (
            h(
                "placeholder_upper_case_hex",
                "/deny-upper-hex",
                ALLOWED,
                &format!("X-Token: {}\r\n", p.to_ascii_uppercase()),
            ),
            vec![403],
        ),
        (
            tls(
                "placeholder_to_a_name_sharing_the_address",
                ALLOWED,
                Some("db.example.test"),
                &[head("GET", "/deny-db", "db.example.test", &bearer, false)],
            ),
            vec![403, 0],
        ),
        (
            h(
                "upgrade_h2c",
                "/deny-h2c",
                ALLOWED,
                "Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n",
            ),
            vec![400],
        ),
        (
            h("websocket_to_another_host", "/deny-ws", f, &ws_headers("")),
            vec![421],
        ),
        (
            tls(
                "websocket_with_a_body",
                ALLOWED,
                Some(ALLOWED),
                &[head(
                    "GET",
                    "/any-ws-body",
                    ALLOWED,
                    &ws_headers("Content-Length: 5\r\n"),
                    false,
                ) + "hello"],
            ),
            vec![101, 400, 403, 404, 200],
        ),
        (
            tls(
                "no_sni",
                ALLOWED,
                None,
                &[head("GET", "/deny-no-sni", ALLOWED, "", false)],
            ),
            vec![0],
        ),
        (
            tls(
                "sni_of_another_allowed_name",
                ALLOWED,
                Some(o),
                &[head("GET", "/deny-sni-other", o, "", false)],
            ),
            vec![0],
        ),
        (
            tls(
                "sni_forbidden",
                ALLOWED,
                Some(f),
                &[head("GET", "/deny-sni-forbidden", f, "", false)],
            ),
            vec![0],
        ),
    ];
    for how in ["bytes", "records"] {
        let mut c = tls(
            &format!("hello_split_in_{how}"),
            ALLOWED,
            Some(ALLOWED),
            &[head("GET", &format!("/ok-hello-{how}"), ALLOWED, "", false)],
        );
        c["hello"] = json!(how);
        cases.push((c, vec![200]));
    }
    cases.extend(smuggling_cases(&bearer));
    cases.extend(late_placeholders(p));
    cases
}

/// The placeholder of allowed.example.test sent to other.attack.test where the policy does not
/// read: in a trailer, and past the body's first `body_prefix` (64 KiB) bytes.
fn late_placeholders(p: &str) -> Vec<(Value, Vec<u16>)> {
    let o = OTHER.0;
    let post = |case: &str, target: &str, extra: &str, body: &str| {
        let mut raw = head("POST", target, o, extra, false);
        raw.push_str(body);
        finding(tls(case, o, Some(o), &[raw]), "late-placeholder")
    };
    // The guest's client writes the 200,000 bytes (`{{PAD:N}}`): an argument cannot hold them.
    let (late, late_len) = (format!("{{{{PAD:200000}}}}{p}"), 200_000 + p.len());
    vec![
        (
            post(
                "placeholder_in_a_trailer_to_another_host",
                "/deny-trailer-other",
                "Transfer-Encoding: chunked\r\n",
                &format!("5\r\nhello\r\n0\r\nAuthorization: Bearer {p}\r\n\r\n"),
            ),
            vec![403],
        ),
        (
            post(
                "placeholder_past_the_body_prefix_to_another_host",
                "/deny-late-body",
                &format!("Content-Length: {late_len}\r\n"),
                &late,
            ),
            vec![403],
        ),
    ]
}

/// `case`, which got through (or went unanswered) when this file was written: it runs in
/// the test of its finding (`what`), not in the one every case must pass.
fn finding(mut case: Value, what: &str) -> Value {
    case["finding"] = json!(what);
    case
}

/// `case`, whose answers on its connection must be exactly `statuses`, in order.
fn all(mut case: Value, statuses: &[u16]) -> Value {
    case["expect_statuses"] = json!(statuses);
    case
}

/// WebSocket handshake lines (and `extra`).
fn ws_headers(extra: &str) -> String {
    format!(
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{extra}"
    )
}

/// `x:p` in base64 (Basic authorization).
fn basic(p: &str) -> String {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = format!("x:{p}").into_bytes();
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= c.len() {
                char::from(ABC[(n >> (18 - 6 * i) & 63) as usize])
            } else {
                '='
            });
        }
    }
    out
}

/// Framing games: any request the proxy's parser and the upstream's could frame differently.
/// A smuggled request names `/deny-smuggled-…`: the upstream must never see it as a request.
fn smuggling_cases(bearer: &str) -> Vec<(Value, Vec<u16>)> {
    let smuggled = |n: &str| head("GET", &format!("/deny-smuggled-{n}"), OTHER.0, "", true);
    let post = |case: &str, target: &str, extra: &str, body: &str| {
        let mut raw = head("POST", target, ALLOWED, extra, true);
        raw.push_str(body);
        tls(case, ALLOWED, Some(ALLOWED), &[raw])
    };
    let s = smuggled("cl");
    let chunk = |s: &str| format!("{:x}\r\n{s}\r\n0\r\n\r\n", s.len());
    vec![
        (
            post(
                "cl_and_te",
                "/deny-cl-te",
                "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
                &format!("0\r\n\r\n{}", smuggled("clte")),
            ),
            vec![400],
        ),
        (
            tls(
                "cl_and_te_with_bare_lf",
                ALLOWED,
                Some(ALLOWED),
                &[format!(
                    "POST /deny-cl-te-lf HTTP/1.1\nHost: {ALLOWED}\nContent-Length: 4\n\
                     Transfer-Encoding: chunked\n\n0\r\n\r\n{}",
                    smuggled("clte-lf")
                )],
            ),
            vec![400],
        ),
        (
            all(
                finding(
                    tls(
                        "cl_and_te_after_a_refused_upgrade",
                        ALLOWED,
                        Some(ALLOWED),
                        &[
                            head(
                                "GET",
                                "/deny-upgrade-first",
                                ALLOWED,
                                "Upgrade: h2c\r\nConnection: Upgrade\r\n",
                                true,
                            ),
                            head(
                                "POST",
                                "/deny-cl-te-after-upgrade",
                                ALLOWED,
                                "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
                                true,
                            ) + "0\r\n\r\n",
                        ],
                    ),
                    "framing-witness",
                ),
                &[400, 400],
            ),
            vec![400],
        ),
        (
            all(
                finding(
                    tls(
                        "cl_and_te_after_a_refused_connect",
                        ALLOWED,
                        Some(ALLOWED),
                        &[
                            head(
                                "CONNECT",
                                "allowed.example.test:443",
                                "allowed.example.test:443",
                                "",
                                true,
                            ),
                            head(
                                "POST",
                                "/deny-cl-te-after-connect",
                                ALLOWED,
                                "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
                                true,
                            ) + "0\r\n\r\n",
                        ],
                    ),
                    "framing-witness",
                ),
                &[403, 400],
            ),
            vec![403],
        ),
        (
            finding(
                post(
                    "te_chunked_then_identity",
                    "/any-te-identity",
                    "Transfer-Encoding: chunked, identity\r\n",
                    &format!("0\r\n\r\n{}", smuggled("te-identity")),
                ),
                "unanswered-refusal",
            ),
            vec![400, 501, 200],
        ),
        (
            post(
                "te_twice",
                "/any-te-twice",
                "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n",
                &format!("0\r\n\r\n{}", smuggled("te-twice")),
            ),
            vec![400, 501, 200],
        ),
        (
            finding(
                post(
                    "te_xchunked",
                    "/deny-xchunked",
                    "Transfer-Encoding: xchunked\r\n",
                    &format!("0\r\n\r\n{}", smuggled("xchunked")),
                ),
                "unanswered-refusal",
            ),
            vec![400, 501],
        ),
        (
            finding(
                post(
                    "te_space_before_colon",
                    "/deny-te-space",
                    "Transfer-Encoding : chunked\r\nContent-Length: 4\r\n",
                    &format!("0\r\n\r\n{}", smuggled("te-space")),
                ),
                "unanswered-refusal",
            ),
            vec![400],
        ),
        (
            finding(
                post(
                    "obs_fold",
                    "/deny-obs-fold",
                    "X-Fold: a\r\n b\r\nContent-Length: 0\r\n",
                    "",
                ),
                "unanswered-refusal",
            ),
            vec![400],
        ),
        (
            tls(
                "bare_lf",
                ALLOWED,
                Some(ALLOWED),
                &[format!(
                    "GET /any-bare-lf HTTP/1.1\nHost: {ALLOWED}\nConnection: close\n\n"
                )],
            ),
            vec![200, 400],
        ),
        (
            post(
                "chunk_extension",
                "/any-chunk-ext",
                "Transfer-Encoding: chunked\r\n",
                "5;a=\"b\r\nc\"\r\nhello\r\n0\r\n\r\n",
            ),
            vec![200, 400],
        ),
        (
            post(
                "chunk_size_overflow",
                "/any-chunk-overflow",
                "Transfer-Encoding: chunked\r\n",
                "fffffffffffffffff1\r\nhello\r\n0\r\n\r\n",
            ),
            vec![400, 0, 200],
        ),
        (
            post(
                "request_in_a_body",
                "/any-cl-body",
                &format!("Content-Length: {}\r\n", s.len()),
                &s,
            ),
            vec![200],
        ),
        (
            post(
                "request_in_a_chunk",
                "/any-chunk-body",
                "Transfer-Encoding: chunked\r\n",
                &chunk(&smuggled("chunk")),
            ),
            vec![200],
        ),
        (
            post(
                "trailer_with_the_placeholder",
                "/any-trailer",
                "Transfer-Encoding: chunked\r\n",
                &format!("5\r\nhello\r\n0\r\n{bearer}\r\n"),
            ),
            vec![200, 400, 403],
        ),
    ]
}

/// Plain HTTP (port 80) to allowed.example.test's address.
fn plain_cases(p: &str) -> Vec<(Value, Vec<u16>)> {
    let bearer = format!("Authorization: Bearer {p}\r\n");
    let g = |case: &str, target: &str, host: &str, extra: &str| {
        plain(case, ALLOWED, &[head("GET", target, host, extra, false)])
    };
    vec![
        (g("plain_ok", "/ok-plain", ALLOWED, ""), vec![200]),
        (
            g(
                "plain_ok_host_with_port",
                "/ok-plain-port",
                "allowed.example.test:80",
                "",
            ),
            vec![200],
        ),
        (
            g(
                "plain_front_other_allowed",
                "/deny-plain-front",
                OTHER.0,
                "",
            ),
            vec![421],
        ),
        (
            g(
                "plain_front_forbidden",
                "/deny-plain-forbidden",
                FORBIDDEN,
                "",
            ),
            vec![403],
        ),
        (
            g(
                "plain_name_sharing_the_address_the_guard_did_not_answer",
                "/any-plain-db",
                "db.example.test",
                "",
            ),
            vec![421],
        ),
        (
            g("plain_bearer", "/deny-plain-bearer", ALLOWED, &bearer),
            vec![403],
        ),
        (
            g(
                "plain_absolute_form",
                &format!("http://{}/deny-plain-abs", OTHER.0),
                ALLOWED,
                "",
            ),
            vec![400, 403, 421],
        ),
        (
            g(
                "plain_absolute_form_no_host",
                &format!("http://{}/deny-plain-abs2", OTHER.0),
                "",
                "",
            ),
            vec![400, 403, 421],
        ),
        (
            g("plain_ip_host", "/deny-plain-ip", OTHER.1, ""),
            vec![403, 421],
        ),
        (
            g(
                "plain_host_trailing_dot_other",
                "/deny-plain-dot",
                "other.attack.test.",
                "",
            ),
            vec![421],
        ),
        (
            plain(
                "plain_keepalive_then_front",
                ALLOWED,
                &[
                    head("GET", "/ok-plain-ka1", ALLOWED, "", true),
                    head("GET", "/deny-plain-ka2", OTHER.0, "", false),
                ],
            ),
            vec![200],
        ),
        (
            finding(
                plain(
                    "h2c_prior_knowledge_on_plain_http",
                    ALLOWED,
                    &["PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_owned()],
                ),
                "unanswered-refusal",
            ),
            vec![400, 403],
        ),
        (
            json!({"case": "plain_http_to_port_443", "dial": ALLOWED, "tls": false, "port": 443,
                   "send": [head("GET", "/any-plain-on-443", ALLOWED, "", false)]}),
            vec![400, 403, 421, 502],
        ),
        (
            plain(
                "plain_http10_without_host",
                ALLOWED,
                &["GET /deny-plain-10 HTTP/1.0\r\n\r\n".to_owned()],
            ),
            vec![400],
        ),
        (
            g(
                "plain_websocket_to_other",
                "/deny-plain-ws",
                OTHER.0,
                &ws_headers(""),
            ),
            vec![421],
        ),
    ]
}

/// A sandbox allowing allowed.example.test (with its secret), other.attack.test and
/// db.example.test (allowed.example.test's address); the guest's client installed; its
/// placeholder.
fn hostile_sandbox(w: &World, name: &str) -> String {
    let secret = "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN@env:EXAMPLE";
    let args = [
        "sandbox",
        "create",
        "--allow-host",
        ALLOWED,
        "--allow-host",
        OTHER.0,
        "--allow-host",
        "db.example.test",
        "--secret",
        secret,
        name,
    ];
    let out = w.svc_env(&args, &[("EXAMPLE", EXAMPLE_TOKEN)]);
    assert!(out.status.success(), "{out:?}\n{}", w.svcd_log());
    install_guest(w, name);
    let (_, p, _) = w.sh(name, "printf %s \"$SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\"");
    assert_eq!(p.len(), 64, "{p}");
    p
}

/// What did not go as the cases expected, and what the outside world saw that it must not.
fn judge(w: &World, cases: &[(Value, Vec<u16>)], results: &[Value]) -> Vec<String> {
    let mut wrong = Vec::new();
    for ((case, want), got) in cases.iter().zip(results) {
        let status = got["status"].as_u64().unwrap_or(0) as u16;
        let name = case["case"].as_str().unwrap_or("?");
        let answer = got["answer"].as_str().unwrap_or("");
        eprintln!("{name:45} {status:3} {:?}", got["statuses"]);
        if !want.contains(&status) {
            wrong.push(format!(
                "{name}: status {status}, wanted one of {want:?}: {got}"
            ));
        }
        if let Some(all) = case.get("expect_statuses")
            && got["statuses"] != *all
        {
            wrong.push(format!(
                "{name}: statuses {}, wanted {all}: {got}",
                got["statuses"]
            ));
        }
        if answer.contains(EXAMPLE_TOKEN) {
            wrong.push(format!(
                "{name}: the real token reached the guest: {answer}"
            ));
        }
        // A refusal is the perimeter's: its JSON, never a bare parser error or a close.
        if (400..500).contains(&status) && !answer.contains("svc egress perimeter") {
            wrong.push(format!(
                "{name}: refused ({status}) without the perimeter's answer: {answer}"
            ));
        }
    }
    for r in w.received().iter().filter(|r| r["kind"] == "http") {
        let path = r["path"].as_str().unwrap_or("");
        if path.starts_with("/deny") {
            wrong.push(format!("a refused request reached the outside world: {r}"));
        }
        if r["credential"] == "real" && !path.starts_with("/ok") {
            wrong.push(format!(
                "the real token went out on a request not meant to carry it: {r}"
            ));
        }
        if r["host"] == FORBIDDEN {
            wrong.push(format!("the forbidden host was reached: {r}"));
        }
    }
    wrong
}

/// Every SNI / Host / authority / credential / framing / upgrade form of the brief, over TLS
/// and plain HTTP, from one hostile guest: the cases of `finding` (`None`: those that held).
fn hostile_forms(finding: Option<&str>) {
    let w = World::start_with_dns(&[OTHER], &[]);
    let p = hostile_sandbox(&w, "atk");
    let mut cases = https_cases(&p);
    cases.extend(plain_cases(&p));
    cases.retain(|(c, _)| c["finding"].as_str() == finding);
    let values: Vec<Value> = cases.iter().map(|(c, _)| c.clone()).collect();
    let results = attack(&w, "atk", &values);
    assert_eq!(results.len(), cases.len(), "{results:#?}");
    let mut wrong = judge(&w, &cases, &results);
    for r in w.audit().iter().filter(|r| r["decision"] == "deny") {
        eprintln!("audit: {} {} {}", r["status"], r["path"], r["rule"]);
    }
    if finding.is_none() {
        wrong.extend(held_extras(&w));
    }
    w.destroy_checked("atk");
    assert!(
        wrong.is_empty(),
        "{} got through:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// The forms that held when this file was written, and the neighbours that must work.
#[test]
fn a_hostile_guests_request_forms_are_refused_or_stay_bound() {
    require_root();
    hostile_forms(None);
}

/// FINDING: the framing witness (`h1_frames`) stops at a refused upgrade or CONNECT and the
/// connection goes on: a later request with both Content-Length and Transfer-Encoding is
/// forwarded (re-framed by hyper) instead of refused.
#[test]
#[ignore = "got through when written (attack report): h1_frames goes Opaque after a refused Upgrade/CONNECT"]
fn smuggling_shapes_are_refused_after_a_refused_upgrade_or_connect() {
    require_root();
    hostile_forms(Some("framing-witness"));
}

/// FINDING: heads hyper rejects itself (`Transfer-Encoding: chunked, identity`, `xchunked`,
/// a space before the colon, obs-fold) get hyper's bare 400 (no perimeter answer, no audit
/// record), and so does HTTP/2 with prior knowledge on port 80 (no answer at all).
#[test]
#[ignore = "got through when written (attack report): parser-level refusals are hyper's, unaudited"]
fn every_refusal_is_the_perimeters_answer() {
    require_root();
    hostile_forms(Some("unanswered-refusal"));
}

/// FINDING: a placeholder in a trailer, or past the body's first 64 KiB, goes to another host
/// unrefused (the credential rules read the head and the body's prefix only).
#[test]
#[ignore = "got through when written (attack report): trailers and the body past body_prefix are not examined"]
fn a_placeholder_sent_late_to_another_host_is_refused() {
    require_root();
    hostile_forms(Some("late-placeholder"));
}

/// HTTP/2 fronting and the gate's audit records (no answer at all, but a record naming why).
fn held_extras(w: &World) -> Vec<String> {
    let mut wrong = Vec::new();
    // HTTP/2: `:authority` of another allowed name on a connection opened for this one.
    let (_, h2, _) = w.sh(
        "atk",
        "curl -sk --http2 -o /dev/null -w '%{http_code} %{http_version}' \\
         -H 'Host: other.attack.test' https://allowed.example.test/deny-h2-front",
    );
    eprintln!("{:45} {h2}", "h2_authority_of_another_allowed_name");
    if h2 != "421 2" {
        wrong.push(format!("h2_authority_of_another_allowed_name: {h2}"));
    }
    let audit = w.audit();
    let rules: Vec<&str> = audit.iter().filter_map(|r| r["rule"].as_str()).collect();
    for why in [
        "ClientHello has no server name: refused",
        "server name other.attack.test does not match the address dialled",
        "server name forbidden.example.test is not allowed for this sandbox",
    ] {
        if !rules.iter().any(|r| r.starts_with(why)) {
            wrong.push(format!("no audit record says {why:?}"));
        }
    }
    // The legitimate neighbours did reach the outside world, with the real token where asked.
    let received = w.received();
    for ok in ["/ok-bearer", "/ok-case-dot", "/ok-lower"] {
        if !received
            .iter()
            .any(|r| r["path"] == ok && r["credential"] == "real")
        {
            wrong.push(format!(
                "{ok} did not reach the outside world with the real token"
            ));
        }
    }
    wrong
}

/// FINDING. A WebSocket handshake to the secret's own host carries the real token upstream (swapped as
/// on any request); an upstream that echoes the handshake's headers in a frame must show the
/// guest its placeholder, never the real token, as an HTTP echo does (`credential_echo`).
#[test]
#[ignore = "got through when written (attack report): a WebSocket relay is not scrubbed"]
fn a_websocket_echo_never_shows_the_guest_the_real_token() {
    require_root();
    let w = World::start();
    let p = hostile_sandbox(&w, "wse");
    let bearer = format!("Authorization: Bearer {p}\r\n");
    let case = tls(
        "websocket_echo",
        ALLOWED,
        Some(ALLOWED),
        &[head(
            "GET",
            "/ws-echo-headers",
            ALLOWED,
            &(ws_headers("") + &bearer),
            false,
        )],
    );
    let results = attack(&w, "wse", &[case]);
    let got = &results[0];
    eprintln!("{got:#}");
    assert_eq!(got["status"], 101, "the handshake was not relayed: {got}");
    let answer = got["answer"].as_str().unwrap_or("");
    assert!(
        answer.contains("authorization"),
        "the upstream's frame did not come: {answer}"
    );
    assert!(
        !answer.contains(EXAMPLE_TOKEN),
        "the real token reached the guest in a WebSocket frame: {answer}"
    );
    w.destroy_checked("wse");
}

/// FINDING. A name allowed on one port only (allowed.example.test:8443) whose address is shared with a
/// name allowed on 443 (db.example.test): the guest dials that address on 443 (open for
/// db.example.test), presents allowed.example.test as SNI and `Host:
/// allowed.example.test:8443`. The policy reads the port from `Host`; the proxy dials the port
/// the guest dialled: allowed.example.test's server on 443, which no rule allows.
#[test]
#[ignore = "got through when written (attack report): the policy reads Host's port, the proxy dials the dialled port"]
fn a_name_allowed_on_one_port_is_not_served_on_another_port_of_its_address() {
    require_root();
    let w = World::start();
    w.svc_ok(&[
        "sandbox",
        "create",
        "--allow-host",
        "allowed.example.test:8443",
        "--allow-host",
        "db.example.test",
        "ports",
    ]);
    install_guest(&w, "ports");
    let case = |case: &str, path: &str, host: &str| {
        let mut c = tls(
            case,
            ALLOWED,
            Some(ALLOWED),
            &[head("GET", path, host, "", false)],
        );
        c["resolve"] = json!(["db.example.test"]);
        c
    };
    let results = attack(
        &w,
        "ports",
        &[
            case("port_443_as_443", "/deny-port-443", ALLOWED),
            case(
                "port_443_as_8443",
                "/deny-port-8443",
                "allowed.example.test:8443",
            ),
        ],
    );
    for r in &results {
        eprintln!("{r:#}");
    }
    let reached: Vec<_> = w
        .received()
        .into_iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/deny-port"))
        })
        .collect();
    let audit: Vec<_> = w
        .audit()
        .into_iter()
        .filter(|r| r["layer"] == "http" && r["decision"] == "allow")
        .collect();
    assert!(
        reached.is_empty(),
        "allowed.example.test was served on port 443, which only db.example.test is allowed \
         on: {reached:#?}\nallowed records: {audit:#?}\nanswers: {results:#?}"
    );
    w.destroy_checked("ports");
}

/// FINDING (it depends on timing: the request must meet an empty bucket, which a flood on four
/// connections makes likely, not certain). A guest spends its audit budget (`limits.audit_burst` records at once, then
/// `audit_records_per_sec`) on refused requests, and while it goes on sends a request that carries its real
/// token upstream: that request must still leave a record of its own (host, path, the
/// credential swapped), not only a count in a `suppressed` record.
#[test]
#[ignore = "got through when written (attack report; timing-dependent): past its audit budget an allowed, credentialed request is only counted"]
fn a_credentialed_request_after_an_audit_flood_still_has_its_record() {
    require_root();
    let w = World::start();
    let p = hostile_sandbox(&w, "flood");
    // Refused requests on four kept-alive connections at once, each one audited.
    let mut flood = tls(
        "flood",
        ALLOWED,
        Some(ALLOWED),
        &[head("GET", "/deny-flood", FORBIDDEN, "", true)],
    );
    flood["repeat"] = json!(2500);
    flood["batch"] = json!(250);
    flood["parallel"] = json!(4);
    // The credentialed request goes while the flood still runs.
    flood["detach"] = json!(true);
    let pause = json!({"case": "pause", "sleep": 4});
    let after = tls(
        "after",
        ALLOWED,
        Some(ALLOWED),
        &[head(
            "POST",
            "/ok-after-flood",
            ALLOWED,
            &format!("Authorization: Bearer {p}\r\nContent-Length: 9\r\n"),
            false,
        ) + "exfiltrat"],
    );
    // Resolved before the flood (the guard is busy after it): the after request dials the
    // address the guard answered then.
    let before = tls(
        "before",
        ALLOWED,
        Some(ALLOWED),
        &[head("GET", "/ok-before-flood", ALLOWED, "", false)],
    );
    let mut after = after;
    after["addr"] = json!("192.0.2.20");
    let results = attack(&w, "flood", &[before, flood, pause, after]);
    eprintln!("{results:#?}");
    assert_eq!(results[3]["status"], 200, "{results:#?}");
    assert!(
        w.received()
            .iter()
            .any(|r| r["path"] == "/ok-after-flood" && r["credential"] == "real"),
        "the request did not go out"
    );
    // The suppressed counts are written every 5 s.
    std::thread::sleep(std::time::Duration::from_secs(7));
    let audit = w.audit();
    let suppressed: Vec<_> = audit
        .iter()
        .filter(|r| r["layer"] == "suppressed")
        .collect();
    let own: Vec<_> = audit
        .iter()
        .filter(|r| r["layer"] == "http" && r["path"] == "/ok-after-flood")
        .collect();
    let flood_records = audit.iter().filter(|r| r["layer"] == "dns").count();
    let mut by_rule = std::collections::BTreeMap::<String, usize>::new();
    for r in &audit {
        *by_rule
            .entry(format!("{} {} {}", r["layer"], r["rule"], r["status"]))
            .or_default() += 1;
    }
    eprintln!("flood: {flood_records} records written; by rule: {by_rule:#?}; own: {own:#?}");
    eprintln!("suppressed: {suppressed:#?}");
    assert!(
        !suppressed.is_empty(),
        "the flood stayed within the audit budget ({flood_records} records written): the \
         attack did not happen"
    );
    assert!(
        !own.is_empty(),
        "the request that carried the real token upstream left no record of its own (only \
         counted in {suppressed:?}); {} records in all",
        audit.len()
    );
    w.destroy_checked("flood");
}
