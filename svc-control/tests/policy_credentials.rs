//! Placeholders: minting, guest variable names, and every place a
//! placeholder must not be.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

mod common;

use base64::Engine as _;
use common::{Fixture, Want::*, check, hp, req};
use svc_control::policy::credentials::{
    self, CredentialKind, Placeholder, PlaceholderTable, SYNTHETIC_EXPIRY,
};

#[test]
fn minted_placeholders_are_64_lowercase_hex_and_distinct() {
    let mut seen = std::collections::HashSet::new();
    for _ in 0..1000 {
        let p = Placeholder::mint().unwrap();
        let s = p.expose();
        assert_eq!(s.len(), 64);
        assert!(
            s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{s}"
        );
        assert!(seen.insert(s.to_owned()), "a repeated placeholder");
        assert!(
            !format!("{p:?}").contains(s),
            "Debug must not print the whole placeholder"
        );
    }
}

#[test]
fn placeholder_entropy_is_spread_over_every_hex_digit() {
    // 1000 placeholders = 64,000 hex digits: every digit appears, none dominates.
    let mut counts = [0usize; 16];
    for _ in 0..1000 {
        for c in Placeholder::mint().unwrap().expose().chars() {
            counts[c.to_digit(16).unwrap() as usize] += 1;
        }
    }
    for (digit, n) in counts.iter().enumerate() {
        assert!(
            (3000..5000).contains(n),
            "digit {digit:x} appeared {n} times of 64000"
        );
    }
}

#[test]
fn guest_variable_names() {
    let cases: &[(&str, &str)] = &[
        ("api.example.com", "SVC_CRED_API_EXAMPLE_COM"),
        ("my-host.example.com", "SVC_CRED_MY_HOST_EXAMPLE_COM"),
        ("API.Example.COM.", "SVC_CRED_API_EXAMPLE_COM"),
        ("host1.example.com:8443", "SVC_CRED_HOST1_EXAMPLE_COM_8443"),
        ("192.0.2.1", "SVC_CRED_192_0_2_1"),
        ("2001:db8::1", "SVC_CRED_2001_DB8__1"),
        ("bücher.example", "SVC_CRED_XN__BCHER_KVA_EXAMPLE"),
    ];
    for (host, stem) in cases {
        assert_eq!(
            credentials::env_stem(&hp(host)).as_deref(),
            Some(*stem),
            "{host}"
        );
    }
    assert_eq!(
        credentials::env_stem(&hp("*.cdn.example.com")),
        None,
        "wildcards get no placeholder"
    );
}

#[test]
fn guest_environment_has_token_and_synthetic_expiry() {
    let t = PlaceholderTable::mint(
        &[hp("api.example.com")],
        &[hp("api.github.com")],
        Some(&hp("api.anthropic.com")),
    )
    .unwrap();
    let env: std::collections::HashMap<String, String> = t.guest_env().into_iter().collect();
    assert_eq!(
        env["SVC_CRED_API_EXAMPLE_COM_EXPIRES_AT"],
        "2099-12-31T23:59:59Z"
    );
    assert_eq!(SYNTHETIC_EXPIRY, "2099-12-31T23:59:59Z");
    assert_eq!(env["SVC_CRED_API_EXAMPLE_COM_TOKEN"].len(), 64);
    assert_eq!(env["CODE_HOST_TOKEN"].len(), 64);
    assert_eq!(env["AGENT_AUTH_TOKEN"].len(), 64);
    let values: std::collections::HashSet<&String> = env
        .iter()
        .filter(|(k, _)| !k.ends_with("EXPIRES_AT"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(values.len(), 3, "every placeholder is distinct");
}

#[test]
fn colliding_variable_names_are_an_error() {
    let err = PlaceholderTable::mint(&[hp("a-b.example.com"), hp("a.b.example.com")], &[], None)
        .unwrap_err();
    assert!(
        err.to_string().contains("SVC_CRED_A_B_EXAMPLE_COM_TOKEN"),
        "{err}"
    );
    // The same host twice is not a collision.
    assert!(
        PlaceholderTable::mint(&[hp("a.example.com"), hp("A.example.com.")], &[], None).is_ok()
    );
}

#[test]
fn rotation_gives_new_sandboxes_fresh_placeholders() {
    let first = PlaceholderTable::mint(&[hp("api.example.com")], &[], None).unwrap();
    let second = PlaceholderTable::mint(&[hp("api.example.com")], &[], None).unwrap();
    assert_ne!(
        first.entries()[0].placeholder,
        second.entries()[0].placeholder
    );
    // A running sandbox keeps the table it was given: the same table still resolves its own.
    let own = first.entries()[0].placeholder.expose().to_owned();
    assert!(first.lookup(&own).is_some());
    assert!(
        second.lookup(&own).is_none(),
        "one sandbox's placeholder is nothing to another"
    );
}

#[test]
fn where_a_placeholder_may_and_may_not_be() {
    let f = Fixture::new();
    let own = f.placeholder_for("extra.example.com");
    let other = f.placeholder_for("open.example.com");
    let code = f.code_token();
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("x-access-token:{own}"));
    let upper = own.to_uppercase();
    let foreign = Placeholder::mint().unwrap().expose().to_owned();
    check(
        &f,
        &[
            (
                "bearer_on_own_host_is_swapped",
                req("GET", "extra.example.com", "/api").bearer(&own),
                Swap,
                "open-host",
            ),
            (
                "bearer_scheme_case_insensitive",
                req("GET", "extra.example.com", "/")
                    .header("authorization", &format!("bearer {own}")),
                Swap,
                "open-host",
            ),
            (
                "no_placeholder_passes_through",
                req("GET", "extra.example.com", "/"),
                Pass,
                "open-host",
            ),
            (
                "other_real_token_passes_through",
                req("GET", "extra.example.com", "/").bearer("ghp_notaplaceholder"),
                Pass,
                "open-host",
            ),
            (
                "unknown_64_hex_is_not_ours",
                req("GET", "extra.example.com", "/").bearer(&foreign),
                Pass,
                "open-host",
            ),
            (
                "bearer_of_another_host",
                req("GET", "extra.example.com", "/").bearer(&other),
                Deny(403),
                "credential-leak",
            ),
            (
                "code_token_to_non_code_host",
                req("GET", "extra.example.com", "/").bearer(&code),
                Deny(403),
                "credential-leak",
            ),
            (
                "own_token_to_code_host",
                req("GET", "api.github.com", "/").bearer(&own),
                Deny(403),
                "credential-leak",
            ),
            (
                "placeholder_in_query",
                req("GET", "extra.example.com", &format!("/x?token={own}")),
                Deny(403),
                "credential-leak",
            ),
            (
                "placeholder_in_path",
                req("GET", "extra.example.com", &format!("/x/{own}")),
                Deny(403),
                "credential-leak",
            ),
            (
                "placeholder_in_cookie",
                req("GET", "extra.example.com", "/").header("Cookie", &format!("t={own}")),
                Deny(403),
                "credential-leak",
            ),
            (
                "placeholder_in_custom_header",
                req("GET", "extra.example.com", "/").header("X-Api-Key", &own),
                Deny(403),
                "credential-leak",
            ),
            (
                "placeholder_in_body",
                req("POST", "extra.example.com", "/").body(&format!("{{\"token\":\"{own}\"}}")),
                Deny(403),
                "credential-leak",
            ),
            (
                "placeholder_upper_case_in_body",
                req("POST", "extra.example.com", "/").body(&upper),
                Deny(403),
                "credential-leak",
            ),
            (
                "placeholder_in_basic_auth",
                req("GET", "extra.example.com", "/")
                    .header("Authorization", &format!("Basic {basic}")),
                Deny(403),
                "credential-leak",
            ),
            (
                "placeholder_raw_in_authorization",
                req("GET", "extra.example.com", "/")
                    .header("Authorization", &format!("token {own}")),
                Deny(403),
                "credential-leak",
            ),
            (
                "placeholder_with_prefix_in_bearer",
                req("GET", "extra.example.com", "/").bearer(&format!("x{own}")),
                Deny(403),
                "credential-leak",
            ),
            (
                "two_authorization_headers",
                req("GET", "extra.example.com", "/")
                    .bearer(&own)
                    .bearer(&own),
                Deny(403),
                "credential-leak",
            ),
            (
                "bearer_over_plain_http",
                req("GET", "extra.example.com", "/")
                    .plain_http()
                    .bearer(&own),
                Deny(403),
                "credential-leak",
            ),
            (
                "plain_http_without_placeholder",
                req("GET", "extra.example.com", "/").plain_http(),
                Pass,
                "open-host",
            ),
            (
                "placeholder_to_not_allowed_host",
                req("GET", "evil.example.org", "/").bearer(&own),
                Deny(403),
                "host-not-allowed",
            ),
            (
                "agent_token_on_agent_host",
                req("POST", "api.anthropic.com", "/v1/messages")
                    .bearer(&f.placeholder_for("api.anthropic.com")),
                Swap,
                "agent-host",
            ),
            (
                "agent_token_elsewhere",
                req("GET", "extra.example.com", "/")
                    .bearer(&f.placeholder_for("api.anthropic.com")),
                Deny(403),
                "credential-leak",
            ),
            (
                "code_token_on_api",
                req("GET", "api.github.com", "/").bearer(&code),
                Swap,
                "api-root",
            ),
            (
                "code_token_on_uploads",
                req(
                    "POST",
                    "uploads.github.com",
                    "/repos/acme/widget/releases/1/assets",
                )
                .bearer(&code),
                Swap,
                "uploads-bound-repo",
            ),
            (
                "code_token_stripped_on_archive",
                req("GET", "github.com", "/a/b/archive/x.zip").bearer(&code),
                Strip,
                "archive",
            ),
            (
                "code_token_to_archive_host_is_a_leak",
                req("GET", "codeload.github.com", "/a/b/zip/main").bearer(&code),
                Deny(403),
                "credential-leak",
            ),
        ],
    );
}

#[test]
fn swap_names_the_credential_kind() {
    use svc_control::policy::request::{CredentialAction, Outcome};
    let f = Fixture::new();
    let d = f.decide(&req("GET", "api.github.com", "/").bearer(&f.code_token()));
    match d.outcome {
        Outcome::Allow {
            credential: CredentialAction::Swap { kind, placeholder },
        } => {
            assert_eq!(kind, CredentialKind::CodeHost);
            assert_eq!(placeholder.expose(), f.code_token());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn what_an_echoed_credential_is_looked_for_as() {
    let p = Placeholder::parse(&"0f".repeat(32)).unwrap();
    // (case, real value, forms that must be among the patterns)
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "plain token: only itself",
            "ghp_abc123XYZ",
            &["ghp_abc123XYZ"],
        ),
        (
            "slash: JSON with and without escaped slash, percent-encoded",
            "ya29.a/b",
            &["ya29.a/b", "ya29.a\\/b", "ya29.a%2Fb", "ya29.a%2fb"],
        ),
        (
            "quote and ampersand: JSON, HTML",
            "a\"b&c",
            &["a\"b&c", "a\\\"b&c", "a&quot;b&amp;c", "a%22b%26c"],
        ),
        ("plus: percent-encoded", "a+b", &["a+b", "a%2Bb", "a%2bb"]),
    ];
    for (case, real, want) in cases {
        let g = credentials::EchoGuard::new(real, &p);
        let got: Vec<String> = g
            .patterns()
            .map(|x| String::from_utf8_lossy(x).into_owned())
            .collect();
        for w in *want {
            assert!(got.iter().any(|g| g == w), "{case}: {w:?} not in {got:?}");
        }
        let distinct: std::collections::HashSet<&String> = got.iter().collect();
        assert_eq!(distinct.len(), got.len(), "{case}: repeated forms {got:?}");
        assert_eq!(g.replacement(), p.expose().as_bytes(), "{case}");
        assert_eq!(
            g.longest(),
            got.iter().map(String::len).max().unwrap(),
            "{case}"
        );
        assert!(
            !format!("{g:?}").contains(real),
            "{case}: Debug shows the value"
        );
    }
    assert_eq!(credentials::EchoGuard::new("", &p).longest(), 0);
}

#[test]
fn which_answers_to_a_swapped_request_can_be_scanned() {
    // (case, Content-Encoding values, Transfer-Encoding values, scannable)
    let cases: &[(&str, &[&str], &[&str], bool)] = &[
        ("no codings", &[], &[], true),
        ("identity", &["identity"], &[], true),
        ("identity, any case", &["Identity"], &["CHUNKED"], true),
        ("chunked transfer", &[], &["chunked"], true),
        ("gzip content", &["gzip"], &[], false),
        ("br content", &["br"], &[], false),
        ("gzip after identity", &["identity, gzip"], &[], false),
        ("gzip in a second header", &["identity", "gzip"], &[], false),
        ("gzip transfer coding", &[], &["gzip, chunked"], false),
        ("unknown coding", &["x-custom"], &[], false),
    ];
    for (case, ce, te, want) in cases {
        let ce: Vec<&[u8]> = ce.iter().map(|s| s.as_bytes()).collect();
        let te: Vec<&[u8]> = te.iter().map(|s| s.as_bytes()).collect();
        let got = credentials::echo_scannable(&ce, &te);
        assert_eq!(got.is_ok(), *want, "{case}: {got:?}");
    }
}
