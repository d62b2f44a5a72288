//! The framing cases of the hostile guest (request smuggling shapes) and its plain-HTTP cases
//! (port 80: the Host bound to the address dialled).

use serde_json::{Value, json};

use super::forms::{ALLOWED, FORBIDDEN, OTHER, all, finding, head, plain, tls, ws_headers};

/// Framing games: any request the proxy's parser and the upstream's could frame differently.
/// A smuggled request names `/deny-smuggled-…`: the upstream must never see it as a request.
pub(crate) fn smuggling_cases(bearer: &str) -> Vec<(Value, Vec<u16>)> {
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
pub(crate) fn plain_cases(p: &str) -> Vec<(Value, Vec<u16>)> {
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
