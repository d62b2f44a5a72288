//! Host allowlist, authority binding (SNI vs Host / :authority), methods, and the generic
//! `egress.policy` path patterns.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

mod common;

use common::{Fixture, Want::*, check, req};

#[test]
fn allowlist_and_authority_binding() {
    let f = Fixture::new();
    check(
        &f,
        &[
            (
                "allowed_extra_host",
                req("GET", "extra.example.com", "/"),
                Pass,
                "open-host",
            ),
            (
                "allowed_case_folded",
                req("GET", "EXTRA.example.com", "/").sni(Some("extra.example.com")),
                Pass,
                "open-host",
            ),
            (
                "allowed_trailing_dot",
                req("GET", "extra.example.com.", "/").sni(Some("extra.example.com")),
                Pass,
                "open-host",
            ),
            (
                "allowed_explicit_443",
                req("GET", "extra.example.com:443", "/").sni(Some("extra.example.com")),
                Pass,
                "open-host",
            ),
            (
                "other_port_not_allowed",
                req("GET", "extra.example.com:8443", "/").sni(Some("extra.example.com")),
                Deny(403),
                "host-not-allowed",
            ),
            (
                "dialled_port_is_the_hosts",
                req("GET", "extra.example.com", "/").dialled_port(443),
                Pass,
                "open-host",
            ),
            (
                "explicit_port_is_the_dialled_one",
                req("GET", "extra.example.com:443", "/")
                    .sni(Some("extra.example.com"))
                    .dialled_port(443),
                Pass,
                "open-host",
            ),
            (
                "host_port_other_than_the_dialled_one",
                req("GET", "extra.example.com:8443", "/")
                    .sni(Some("extra.example.com"))
                    .dialled_port(443),
                Deny(421),
                "authority-mismatch",
            ),
            (
                "default_port_other_than_the_dialled_one",
                req("GET", "extra.example.com", "/").dialled_port(8443),
                Deny(421),
                "authority-mismatch",
            ),
            (
                "wildcard_host",
                req("GET", "img.cdn.example.net", "/a.png"),
                Pass,
                "open-host",
            ),
            (
                "wildcard_apex_not_allowed",
                req("GET", "cdn.example.net", "/"),
                Deny(403),
                "host-not-allowed",
            ),
            (
                "not_allowed_host",
                req("GET", "evil.example.org", "/"),
                Deny(403),
                "host-not-allowed",
            ),
            (
                "suffix_trick",
                req("GET", "extra.example.com.evil.org", "/"),
                Deny(403),
                "host-not-allowed",
            ),
            (
                "prefix_trick",
                req("GET", "evilextra.example.com", "/"),
                Deny(403),
                "host-not-allowed",
            ),
            (
                "ip_literal_host",
                req("GET", "192.0.2.1", "/"),
                Deny(403),
                "host-not-allowed",
            ),
            (
                "metadata_ip_host",
                req("GET", "169.254.169.254", "/latest/meta-data/"),
                Deny(403),
                "host-not-allowed",
            ),
            (
                "domain_fronting_host_differs_from_sni",
                req("GET", "evil.example.org", "/").sni(Some("extra.example.com")),
                Deny(421),
                "authority-mismatch",
            ),
            (
                "fronting_between_two_allowed_hosts",
                req("GET", "open.example.com", "/").sni(Some("extra.example.com")),
                Deny(421),
                "authority-mismatch",
            ),
            (
                "fronting_case_only_is_same_host",
                req("GET", "Extra.Example.Com", "/").sni(Some("extra.example.com")),
                Pass,
                "open-host",
            ),
            (
                "no_host_header",
                req("GET", "extra.example.com", "/").authority(None),
                Deny(400),
                "authority-missing",
            ),
            (
                "host_with_userinfo",
                req("GET", "user@extra.example.com", "/").sni(Some("extra.example.com")),
                Deny(400),
                "authority-invalid",
            ),
            (
                "host_with_path",
                req("GET", "extra.example.com/x", "/").sni(Some("extra.example.com")),
                Deny(400),
                "authority-invalid",
            ),
            (
                "host_wildcard_literal",
                req("GET", "*.cdn.example.net", "/").sni(Some("x.cdn.example.net")),
                Deny(400),
                "authority-invalid",
            ),
            (
                "sni_ip_literal_with_name_host",
                req("GET", "extra.example.com", "/").sni(Some("192.0.2.1")),
                Deny(421),
                "authority-mismatch",
            ),
            (
                "sni_garbage",
                req("GET", "extra.example.com", "/").sni(Some("ex ample")),
                Deny(421),
                "authority-mismatch",
            ),
            (
                "idna_host_same_as_punycode_sni",
                req("GET", "bücher.example", "/").sni(Some("xn--bcher-kva.example")),
                Deny(403),
                "host-not-allowed",
            ),
        ],
    );
}

#[test]
fn methods() {
    let f = Fixture::new();
    check(
        &f,
        &[
            (
                "trace_refused",
                req("TRACE", "extra.example.com", "/"),
                Deny(403),
                "method-refused",
            ),
            (
                "track_refused",
                req("TRACK", "extra.example.com", "/"),
                Deny(403),
                "method-refused",
            ),
            (
                "trace_lower_case",
                req("trace", "extra.example.com", "/"),
                Deny(403),
                "method-refused",
            ),
            (
                "connect_to_other_host",
                req("CONNECT", "extra.example.com", "evil.example.org:443"),
                Deny(403),
                "method-refused",
            ),
            (
                "options_allowed_on_open_host",
                req("OPTIONS", "extra.example.com", "/"),
                Pass,
                "open-host",
            ),
            (
                "put_allowed_on_open_host",
                req("PUT", "extra.example.com", "/x"),
                Pass,
                "open-host",
            ),
        ],
    );
}

#[test]
fn generic_policy_paths() {
    let f = Fixture::new();
    let own = f.placeholder_for("api.example.com");
    check(
        &f,
        &[
            (
                "exact_path",
                req("GET", "api.example.com", "/v1/models").bearer(&own),
                Swap,
                "policy-path",
            ),
            (
                "exact_path_with_query",
                req("GET", "api.example.com", "/v1/models?limit=5"),
                Pass,
                "policy-path",
            ),
            (
                "exact_path_trailing_slash",
                req("GET", "api.example.com", "/v1/models/"),
                Deny(403),
                "policy-default-deny",
            ),
            (
                "exact_path_case_changed",
                req("GET", "api.example.com", "/V1/models"),
                Deny(403),
                "policy-default-deny",
            ),
            (
                "exact_path_child",
                req("GET", "api.example.com", "/v1/models/x"),
                Deny(403),
                "policy-default-deny",
            ),
            (
                "globstar_zero_segments",
                req("POST", "api.example.com", "/v1/chat"),
                Pass,
                "policy-path",
            ),
            (
                "globstar_one_segment",
                req("POST", "api.example.com", "/v1/chat/completions").bearer(&own),
                Swap,
                "policy-path",
            ),
            (
                "globstar_deep",
                req("POST", "api.example.com", "/v1/chat/a/b/c"),
                Pass,
                "policy-path",
            ),
            (
                "globstar_trailing_slash",
                req("POST", "api.example.com", "/v1/chat/x/"),
                Pass,
                "policy-path",
            ),
            (
                "globstar_not_sibling",
                req("POST", "api.example.com", "/v1/chatx"),
                Deny(403),
                "policy-default-deny",
            ),
            (
                "star_one_segment",
                req("GET", "api.example.com", "/v2/abc/items"),
                Pass,
                "policy-path",
            ),
            (
                "star_not_two_segments",
                req("GET", "api.example.com", "/v2/a/b/items"),
                Deny(403),
                "policy-default-deny",
            ),
            (
                "star_with_suffix",
                req("GET", "api.example.com", "/files/notes.txt"),
                Pass,
                "policy-path",
            ),
            (
                "star_with_suffix_mismatch",
                req("GET", "api.example.com", "/files/notes.exe"),
                Deny(403),
                "policy-default-deny",
            ),
            (
                "star_does_not_cross_encoded_slash",
                req("GET", "api.example.com", "/files/a%2fb.txt"),
                Deny(403),
                "target-invalid",
            ),
            (
                "dot_dot_escape",
                req("GET", "api.example.com", "/v1/chat/../../admin"),
                Deny(403),
                "target-invalid",
            ),
            (
                "encoded_dot_dot_escape",
                req("GET", "api.example.com", "/v1/chat/%2e%2e/%2e%2e/admin"),
                Deny(403),
                "target-invalid",
            ),
            (
                "tomcat_dot_dot_semicolon_escape",
                req("GET", "api.example.com", "/v1/chat/..;/..;/admin"),
                Deny(403),
                "target-invalid",
            ),
            (
                "tomcat_encoded_semicolon_escape",
                req("GET", "api.example.com", "/v1/chat/..%3b/..%3B/admin"),
                Deny(403),
                "target-invalid",
            ),
            (
                "tomcat_encoded_dots_semicolon_escape",
                req(
                    "GET",
                    "api.example.com",
                    "/v1/chat/%2e%2e;/%2E%2E;x=1/admin",
                ),
                Deny(403),
                "target-invalid",
            ),
            (
                "percent_encoded_legit_path",
                req("GET", "api.example.com", "/v1/%6dodels"),
                Pass,
                "policy-path",
            ),
            (
                "double_slash_prefix",
                req("GET", "api.example.com", "/v1//models"),
                Deny(403),
                "target-invalid",
            ),
            (
                "root_not_allowed",
                req("GET", "api.example.com", "/"),
                Deny(403),
                "policy-default-deny",
            ),
            (
                "admin_not_allowed",
                req("GET", "api.example.com", "/admin"),
                Deny(403),
                "policy-default-deny",
            ),
            (
                "secret_host_every_path",
                req("DELETE", "broker.example.com", "/anything")
                    .bearer(&f.placeholder_for("broker.example.com")),
                Swap,
                "secret-host",
            ),
            (
                "open_host_from_config",
                req("GET", "open.example.com", "/x"),
                Pass,
                "open-host",
            ),
        ],
    );
}

#[test]
fn request_shapes_that_smuggle() {
    let f = Fixture::new();
    let h = "extra.example.com";
    check(
        &f,
        &[
            (
                "content_length_and_transfer_encoding",
                req("POST", h, "/")
                    .header("Content-Length", "4")
                    .header("Transfer-Encoding", "chunked"),
                Deny(400),
                "request-malformed",
            ),
            (
                "both_lengths_in_the_raw_head_though_the_parser_kept_one",
                req("POST", h, "/")
                    .header("Transfer-Encoding", "chunked")
                    .both_lengths_in_head(),
                Deny(400),
                "request-malformed",
            ),
            (
                "duplicate_content_length",
                req("POST", h, "/")
                    .header("Content-Length", "4")
                    .header("content-length", "40"),
                Deny(400),
                "request-malformed",
            ),
            (
                "two_host_headers",
                req("GET", h, "/")
                    .header("Host", h)
                    .header("host", "evil.example.org"),
                Deny(400),
                "request-malformed",
            ),
            (
                "crlf_in_value",
                req("GET", h, "/").header("X-A", "a\r\nInjected: 1"),
                Deny(400),
                "request-malformed",
            ),
            (
                "nul_in_value",
                req("GET", h, "/").header("X-A", "a\u{0}b"),
                Deny(400),
                "request-malformed",
            ),
            (
                "space_in_name",
                req("GET", h, "/").header("X A", "b"),
                Deny(400),
                "request-malformed",
            ),
            (
                "single_content_length_is_fine",
                req("POST", h, "/")
                    .header("Content-Length", "4")
                    .body("abcd"),
                Pass,
                "open-host",
            ),
            (
                "chunked_alone_is_fine",
                req("POST", h, "/").header("Transfer-Encoding", "chunked"),
                Pass,
                "open-host",
            ),
            (
                "one_host_header_is_fine",
                req("GET", h, "/").header("Host", h),
                Pass,
                "open-host",
            ),
        ],
    );
}

/// A named case: method, HTTP/1.1 or not, headers, and what the upgrade rule says.
type UpgradeCase<'a> = (
    &'a str,
    &'a str,
    bool,
    &'a [(&'a str, &'a [u8])],
    svc_control::policy::request::UpgradeAsk,
);

#[test]
fn only_websocket_upgrades_pass_and_everything_else_is_refused() {
    use svc_control::policy::request::{UpgradeAsk, upgrade};
    let ws: &[(&str, &[u8])] = &[
        ("Connection", b"keep-alive, Upgrade"),
        ("Upgrade", b"websocket"),
    ];
    let cases: [UpgradeCase<'_>; 6] = [
        (
            "no_upgrade",
            "GET",
            true,
            &[("Connection", b"keep-alive")],
            UpgradeAsk::None,
        ),
        ("websocket", "GET", true, ws, UpgradeAsk::WebSocket),
        (
            "h2c",
            "GET",
            true,
            &[
                ("Connection", b"Upgrade, HTTP2-Settings"),
                ("Upgrade", b"h2c"),
            ],
            UpgradeAsk::Refused(
                "upgrade to h2c is refused: only WebSocket upgrades pass the perimeter".into(),
            ),
        ),
        (
            "websocket_by_post",
            "POST",
            true,
            ws,
            UpgradeAsk::Refused("a WebSocket handshake is an HTTP/1.1 GET".into()),
        ),
        (
            "websocket_over_h2",
            "GET",
            false,
            ws,
            UpgradeAsk::Refused("a WebSocket handshake is an HTTP/1.1 GET".into()),
        ),
        (
            "websocket_without_connection_upgrade",
            "GET",
            true,
            &[("Upgrade", b"WebSocket")],
            UpgradeAsk::Refused("Upgrade: websocket without Connection: upgrade".into()),
        ),
    ];
    for (name, method, h11, headers, want) in cases {
        assert_eq!(upgrade(method, h11, headers), want, "{name}");
    }
    let two = upgrade(
        "GET",
        true,
        &[("Connection", b"upgrade"), ("Upgrade", b"websocket, h2c")],
    );
    assert!(
        matches!(two, UpgradeAsk::Refused(_)),
        "a second protocol beside websocket"
    );
}
