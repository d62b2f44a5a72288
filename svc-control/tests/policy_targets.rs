//! Request-target canonicalisation: the forms the upstream reads one way are read that way,
//! and every ambiguous form is refused. Plus property tests: a decision never changes under an
//! encoding the upstream treats as equal, and the parsers never panic.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

mod common;

use common::{Fixture, req};
use proptest::prelude::*;
use svc_control::policy::{
    graphql,
    target::{self, TargetError},
};

#[test]
fn canonical_forms() {
    let cases: &[(&str, &str, &[&str], bool)] = &[
        ("root", "/", &[], false),
        ("simple", "/a/b", &["a", "b"], false),
        ("trailing_slash", "/a/b/", &["a", "b"], true),
        ("percent_unreserved", "/%61/%62", &["a", "b"], false),
        ("percent_lower_and_upper_hex", "/%4a%4A", &["JJ"], false),
        ("utf8_encoded", "/caf%C3%A9", &["café"], false),
        (
            "fullwidth_letter_is_a_letter",
            "/%ef%bc%a1pi",
            &["\u{ff21}pi"],
            false,
        ),
        ("space_encoded", "/a%20b", &["a b"], false),
        ("plus_stays_in_path", "/a+b", &["a+b"], false),
        ("semicolon_is_literal", "/a;x=1/b", &["a;x=1", "b"], false),
        (
            "three_dots_then_parameter",
            "/a/...;x",
            &["a", "...;x"],
            false,
        ),
        (
            "dots_inside_name_then_parameter",
            "/a/..b;x",
            &["a", "..b;x"],
            false,
        ),
        ("colon_and_at", "/a:b@c", &["a:b@c"], false),
        ("query_kept_apart", "/a?b=/c", &["a"], false),
        (
            "dot_inside_name",
            "/a.git/b..c/.d",
            &["a.git", "b..c", ".d"],
            false,
        ),
    ];
    for (name, raw, segs, trailing) in cases {
        let t = target::canonicalize(raw).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(t.parts(), *segs, "{name}");
        assert_eq!(t.trailing_slash, *trailing, "{name}");
    }
}

#[test]
fn refused_forms() {
    use TargetError::*;
    let long = format!("/{}", "a".repeat(9000));
    let cases: &[(&str, &str, TargetError)] = &[
        ("absolute_form", "https://evil.example/x", NotOriginForm),
        ("authority_form", "evil.example:443", NotOriginForm),
        ("asterisk_form", "*", NotOriginForm),
        ("empty", "", NotOriginForm),
        ("network_path", "//evil.example/x", NotOriginForm),
        ("too_long", &long, TooLong),
        ("fragment", "/a#b", Fragment),
        ("space", "/a b", InvalidCharacter),
        ("quote", "/a\"b", InvalidCharacter),
        ("angle", "/a<b>", InvalidCharacter),
        ("non_ascii_raw", "/café", InvalidCharacter),
        ("raw_backslash", "/a\\b", Backslash),
        ("encoded_backslash", "/a%5Cb", Backslash),
        ("encoded_slash_lower", "/a%2fb", EncodedSlash),
        ("encoded_slash_upper", "/a%2Fb", EncodedSlash),
        ("double_encoded_slash", "/a%252fb", DoubleEncoded),
        ("double_encoded_dot", "/%252e%252e/x", DoubleEncoded),
        ("double_encoded_letter", "/%2561", DoubleEncoded),
        ("dot", "/a/./b", DotSegment),
        ("dot_dot", "/a/../b", DotSegment),
        ("encoded_dot", "/a/%2e/b", DotSegment),
        ("encoded_dot_dot", "/a/%2e%2E/b", DotSegment),
        ("half_encoded_dot_dot", "/a/.%2e/b", DotSegment),
        ("trailing_dot_dot", "/a/..", DotSegment),
        (
            "tomcat_dot_dot_semicolon",
            "/public/..;/admin/",
            DotSegmentWithParameters,
        ),
        (
            "tomcat_dot_dot_encoded_semicolon",
            "/public/..%3b/admin/",
            DotSegmentWithParameters,
        ),
        (
            "tomcat_dot_dot_encoded_semicolon_upper",
            "/public/..%3B/admin",
            DotSegmentWithParameters,
        ),
        (
            "tomcat_encoded_dots_semicolon",
            "/public/%2e%2e;/admin",
            DotSegmentWithParameters,
        ),
        (
            "tomcat_all_encoded",
            "/public/%2E%2e%3B/admin",
            DotSegmentWithParameters,
        ),
        (
            "tomcat_half_encoded",
            "/public/.%2E;/admin",
            DotSegmentWithParameters,
        ),
        (
            "dot_dot_with_parameter_value",
            "/public/..;jsessionid=x/admin",
            DotSegmentWithParameters,
        ),
        (
            "dot_dot_with_two_parameters",
            "/public/..;a;b/admin",
            DotSegmentWithParameters,
        ),
        (
            "dot_with_parameter",
            "/public/.;x/admin",
            DotSegmentWithParameters,
        ),
        (
            "trailing_dot_dot_semicolon",
            "/public/..;",
            DotSegmentWithParameters,
        ),
        (
            "fullwidth_dot_dot",
            "/public/%ef%bc%8e%ef%bc%8e/admin",
            CompatibilityForm,
        ),
        (
            "fullwidth_solidus",
            "/public%ef%bc%8fadmin",
            CompatibilityForm,
        ),
        (
            "fullwidth_reverse_solidus",
            "/public%ef%bc%bcadmin",
            CompatibilityForm,
        ),
        (
            "two_dot_leader",
            "/public/%e2%80%a5/admin",
            CompatibilityForm,
        ),
        (
            "small_full_stop_pair",
            "/public/%ef%b9%92%ef%b9%92/admin",
            CompatibilityForm,
        ),
        (
            "fullwidth_semicolon_after_dots",
            "/public/..%ef%bc%9bx/admin",
            CompatibilityForm,
        ),
        (
            "greek_question_mark_is_semicolon",
            "/public/..%cd%be/admin",
            CompatibilityForm,
        ),
        (
            "fullwidth_percent",
            "/public/%ef%bc%852e%ef%bc%852e/admin",
            CompatibilityForm,
        ),
        ("parameters_on_nothing", "/public/;x/admin", EmptySegment),
        (
            "encoded_parameters_on_nothing",
            "/public/%3bx/admin",
            EmptySegment,
        ),
        ("empty_segment", "/a//b", EmptySegment),
        ("double_trailing_slash", "/a//", EmptySegment),
        ("bad_percent_short", "/a%2", BadPercentEncoding),
        ("bad_percent_non_hex", "/a%zz", BadPercentEncoding),
        ("bad_percent_in_query", "/a?x=%g1", BadPercentEncoding),
        ("overlong_slash", "/a%c0%afb", NotUtf8),
        ("overlong_dot", "/%c0%ae%c0%ae/x", NotUtf8),
        ("lone_continuation", "/%80", NotUtf8),
        ("surrogate", "/%ed%a0%80", NotUtf8),
        ("nul", "/a%00b", ControlCharacter),
        ("encoded_newline", "/a%0d%0aX-Injected:1", ControlCharacter),
        ("raw_tab", "/a\tb", ControlCharacter),
        ("encoded_del", "/a%7f", ControlCharacter),
        ("control_in_query", "/a?x=%0a", ControlCharacter),
    ];
    for (name, raw, expected) in cases {
        assert_eq!(
            target::canonicalize(raw).map(|_| ()),
            Err(*expected),
            "{name}: {raw:?}"
        );
    }
}

#[test]
fn the_double_encoded_slash_is_refused_not_guessed() {
    // `%252f` decodes once to `%2f`: a server that decodes twice would see '/'. Policy refuses
    // it, because some upstream might decode again.
    assert_eq!(
        target::canonicalize("/a%252fb").map(|_| ()),
        Err(TargetError::DoubleEncoded)
    );
    // A literal percent sign that is not an escape stays allowed.
    assert_eq!(target::canonicalize("/100%25").unwrap().parts(), ["100%"]);
}

#[test]
fn query_parsing() {
    let t = target::canonicalize("/x?a=1&b=two+words&c=%26&d&a=2").unwrap();
    assert_eq!(t.query_value("b"), Some("two words"));
    assert_eq!(t.query_value("c"), Some("&"));
    assert_eq!(t.query_value("d"), Some(""));
    assert_eq!(
        t.query_value("a"),
        None,
        "a key given twice has no single value"
    );
    assert_eq!(t.query_value("z"), None);
    assert_eq!(t.path(), "/x", "audit paths carry no query values");
}

/// Encode each character of `s` as %XX where `mask` says so (unreserved characters only, which
/// every server decodes to the same byte).
fn encode_some(s: &str, mask: &[bool]) -> String {
    s.chars()
        .zip(mask.iter().cycle())
        .map(|(c, &enc)| {
            if enc && c.is_ascii_alphanumeric() {
                format!("%{:02X}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

const PATHS: &[(&str, &str, &str)] = &[
    ("POST", "github.com", "/acme/widget.git/git-upload-pack"),
    ("POST", "github.com", "/evil/exfil.git/git-receive-pack"),
    ("GET", "github.com", "/acme/widget/archive/main.tar.gz"),
    ("POST", "github.com", "/acme/widget/archive/main.tar.gz"),
    ("GET", "api.github.com", "/repos/acme/widget/pulls"),
    ("GET", "api.github.com", "/repos/evil/exfil/pulls"),
    ("POST", "api.github.com", "/repos/acme/widget/pulls"),
    ("GET", "api.example.com", "/v1/models"),
    ("GET", "api.example.com", "/v2/abc/items"),
    ("GET", "api.example.com", "/admin"),
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn decisions_do_not_change_under_equivalent_encodings(i in 0..PATHS.len(), mask in prop::collection::vec(any::<bool>(), 1..16)) {
        let f = Fixture::new();
        let (m, host, path) = PATHS[i];
        let plain = f.decide(&req(m, host, path));
        let encoded_path = encode_some(path, &mask);
        let encoded = f.decide(&req(m, host, &encoded_path));
        prop_assert_eq!(plain.allowed(), encoded.allowed(), "{} vs {}", path, encoded_path);
        prop_assert_eq!(plain.rule, encoded.rule);
    }

    #[test]
    fn owner_and_repo_case_never_opens_a_foreign_repo(upper in prop::collection::vec(any::<bool>(), 11)) {
        let f = Fixture::new();
        let name: String = "evil/exfil".chars().zip(upper.iter()).map(|(c, &u)| if u { c.to_ascii_uppercase() } else { c }).collect();
        let d = f.decide(&req("POST", "github.com", &format!("/{name}.git/git-receive-pack")));
        prop_assert!(!d.allowed());
    }

    #[test]
    fn canonicalize_never_panics(raw in "\\PC{0,64}") {
        let _ = target::canonicalize(&raw);
    }

    #[test]
    fn canonicalize_never_panics_on_url_bytes(raw in "/[a-zA-Z0-9%./\\\\?#;=&+:@-]{0,64}") {
        if let Ok(t) = target::canonicalize(&raw) {
            for s in &t.segments {
                prop_assert!(!s.is_empty() && s != "." && s != ".." && !s.contains('/') && !s.contains('\\'));
            }
        }
    }

    #[test]
    fn graphql_check_never_panics(query in "[{}()a-z:@.!$#\"\\n ]{0,80}") {
        let body = serde_json::json!({ "query": query }).to_string();
        let _ = graphql::check_viewer_login(body.as_bytes());
    }

    #[test]
    fn graphql_only_the_viewer_login_shape_passes(extra in "[a-z]{1,8}", alias in any::<bool>()) {
        let q = if alias { format!("{{ {extra}: viewer {{ login }} }}") } else { format!("{{ viewer {{ login {extra} }} }}") };
        let body = serde_json::json!({ "query": q }).to_string();
        prop_assert!(graphql::check_viewer_login(body.as_bytes()).is_err());
    }

    #[test]
    fn decide_never_panics(method in "[A-Z]{1,7}", host in "[a-zA-Z0-9.:\\[\\]-]{0,30}", target in "\\PC{0,40}", body in "\\PC{0,40}") {
        let f = Fixture::new();
        let _ = f.decide(&req(&method, &host, &target).body(&body));
    }
}
