//! The HTTPS cases of the hostile guest: SNI, Host and authority forms, credentials, upgrades,
//! the ClientHello's framing, and placeholders where the policy does not read.

use serde_json::{Value, json};

use super::{
    forms::{ALLOWED, FORBIDDEN, OTHER, all, basic, finding, head, tls, ws_headers},
    framing::smuggling_cases,
};

/// The HTTPS cases against allowed.example.test's address (SNI allowed.example.test unless the
/// case says), `p` the guest's placeholder for it. (case, expected statuses: 0 is no answer.)
pub(crate) fn https_cases(p: &str) -> Vec<(Value, Vec<u16>)> {
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
/// read: in a trailer, and past the body's first `body_prefix` (64 KiB) bytes. Both are refused
/// (403, `credential-leak`) when the placeholder streams by; the head and the body before it
/// have gone upstream by then (`/abort-…`: the outside world gets an aborted request, never the
/// placeholder, never a complete request).
pub(crate) fn late_placeholders(p: &str) -> Vec<(Value, Vec<u16>)> {
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
                "/abort-trailer-other",
                "Transfer-Encoding: chunked\r\n",
                &format!("5\r\nhello\r\n0\r\nAuthorization: Bearer {p}\r\n\r\n"),
            ),
            vec![403],
        ),
        (
            post(
                "placeholder_past_the_body_prefix_to_another_host",
                "/abort-late-body",
                &format!("Content-Length: {late_len}\r\n"),
                &late,
            ),
            vec![403],
        ),
    ]
}
