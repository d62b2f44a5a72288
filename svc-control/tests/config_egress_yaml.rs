//! `.svc/config.yaml` egress section: shapes, the allow/policy clash with its
//! exact message, and hostile YAML.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

use std::path::Path;

use svc_control::config::{ConfigErrors, egress};

fn parse(text: &str) -> Result<egress::EgressConfig, ConfigErrors> {
    egress::parse(Path::new(".svc/config.yaml"), text)
}

/// The clash's message, byte for byte (note the em dash).
fn spec_message(host: &str) -> String {
    format!(
        "svc config: host \"{host}\" is listed under egress.allow and egress.policy; a host can be open (allow) or policy-gated (policy/secrets), not both \u{2014} remove it from egress.allow."
    )
}

#[test]
fn spec_message_is_reproduced_exactly() {
    assert_eq!(
        egress::clash_message("api.example.com"),
        spec_message("api.example.com")
    );
    assert!(egress::clash_message("x").contains(" — remove it"));
}

#[test]
fn accepted_shapes() {
    let cases: &[(&str, &str)] = &[
        (
            "example_from_the_repo",
            include_str!("../../examples/workspace/.svc/config.yaml"),
        ),
        ("empty_file", ""),
        ("comment_only", "# nothing yet\n"),
        ("egress_null", "egress:\n"),
        (
            "allow_only",
            "egress:\n  allow: [a.example.com, b.example.com]\n",
        ),
        (
            "policy_with_paths",
            "egress:\n  policy:\n    api.example.com:\n      paths: [\"/v1/**\", \"/v2/*/items\"]\n",
        ),
        (
            "policy_with_repos",
            "egress:\n  policy:\n    code.example.com:\n      repos: [Owner/Repo, owner/other.git]\n",
        ),
        (
            "secrets",
            "egress:\n  secrets:\n    - name: CODE_HOST_TOKEN\n      hosts: [api.code.example]\n",
        ),
        (
            "archive_host_may_be_open",
            "egress:\n  allow: [codeload.example.com]\n  policy:\n    api.example.com: {}\n",
        ),
        (
            "wildcard_allow",
            "egress:\n  allow: [\"*.cdn.example.com\"]\n",
        ),
        (
            "ip_literal_allow",
            "egress:\n  allow: [\"192.0.2.10:8443\"]\n",
        ),
        (
            "anchors_used_sparingly",
            "egress:\n  policy:\n    a.example.com: &p\n      paths: [\"/x\"]\n    b.example.com: *p\n",
        ),
    ];
    for (name, text) in cases {
        let parsed = match parse(text) {
            Ok(p) => p,
            Err(e) => panic!("{name}: must be accepted, got:\n{e}"),
        };
        // What `svc workspace up` sends svcd, and svcd validates again: the same section.
        let wire = serde_json::to_string(&parsed.to_file()).unwrap();
        let back = egress::validate(
            Path::new("request"),
            serde_json::from_str::<egress::EgressFile>(&wire).unwrap(),
        )
        .unwrap_or_else(|e| panic!("{name}: the section as sent is refused:\n{e}"));
        assert_eq!(back, parsed, "{name}: changed on its way to svcd ({wire})");
    }
}

#[test]
fn clash_between_allow_and_policy_or_secrets_is_refused_with_the_spec_message() {
    // (name, yaml, the host as written under allow)
    let cases: &[(&str, &str, &str)] = &[
        (
            "allow_and_policy_same_case",
            "egress:\n  allow: [api.example.com]\n  policy:\n    api.example.com: {paths: [\"/x\"]}\n",
            "api.example.com",
        ),
        (
            "allow_and_policy_differ_in_case",
            "egress:\n  allow: [API.Example.com]\n  policy:\n    api.example.COM: {}\n",
            "API.Example.com",
        ),
        (
            "allow_and_policy_trailing_dot",
            "egress:\n  allow: [\"api.example.com.\"]\n  policy:\n    api.example.com: {}\n",
            "api.example.com.",
        ),
        (
            "policy_has_trailing_dot",
            "egress:\n  allow: [api.example.com]\n  policy:\n    \"api.example.com.\": {}\n",
            "api.example.com",
        ),
        (
            "allow_with_port",
            "egress:\n  allow: [\"api.example.com:443\"]\n  policy:\n    api.example.com: {}\n",
            "api.example.com:443",
        ),
        (
            "allow_and_secret_hosts",
            "egress:\n  allow: [uploads.example.com]\n  secrets:\n    - name: TOKEN\n      hosts: [uploads.example.com]\n",
            "uploads.example.com",
        ),
        (
            "allow_and_secret_hosts_case",
            "egress:\n  allow: [Uploads.Example.Com]\n  secrets:\n    - name: TOKEN\n      hosts: [\"uploads.example.com.\"]\n",
            "Uploads.Example.Com",
        ),
        (
            "allow_and_secret_idna",
            "egress:\n  allow: [\"bücher.example\"]\n  secrets:\n    - name: TOKEN\n      hosts: [\"xn--bcher-kva.example\"]\n",
            "bücher.example",
        ),
    ];
    for (name, text, host) in cases {
        let errors = parse(text).expect_err(name).0;
        let expected = spec_message(host);
        assert!(
            errors
                .iter()
                .any(|e| e.message == expected && e.location.path.starts_with("egress.allow[")),
            "{name}: expected exactly {expected:?}, got {errors:#?}"
        );
    }
}

#[test]
fn every_clashing_host_is_reported() {
    let text = "egress:\n  allow: [a.example.com, b.example.com, c.example.com]\n  policy:\n    a.example.com: {}\n  secrets:\n    - name: T\n      hosts: [c.example.com]\n";
    let errors = parse(text).unwrap_err().0;
    let paths: Vec<&str> = errors.iter().map(|e| e.location.path.as_str()).collect();
    assert_eq!(paths, ["egress.allow[0]", "egress.allow[2]"]);
}

/// (name, yaml, expected path, message fragment)
const REFUSED: &[(&str, &str, &str, &str)] = &[
    (
        "unknown_top_level_key",
        "egres:\n  allow: []\n",
        "",
        "unknown field `egres`",
    ),
    (
        "unknown_egress_key",
        "egress:\n  deny: [x.com]\n",
        "egress",
        "unknown field `deny`",
    ),
    (
        "unknown_policy_key",
        "egress:\n  policy:\n    a.example.com:\n      path: [\"/x\"]\n",
        "egress.policy.a.example.com",
        "unknown field `path`",
    ),
    (
        "allow_not_a_list",
        "egress:\n  allow: a.example.com\n",
        "egress.allow",
        "invalid type",
    ),
    (
        "invalid_allow_host",
        "egress:\n  allow: [\"exa mple.com\"]\n",
        "egress.allow[0]",
        "not a valid DNS name",
    ),
    (
        "star_alone",
        "egress:\n  allow: [\"*\"]\n",
        "egress.allow[0]",
        "wildcard",
    ),
    (
        "wildcard_on_public_suffix",
        "egress:\n  allow: [\"*.com\"]\n",
        "egress.allow[0]",
        "wildcard",
    ),
    (
        "invalid_policy_host",
        "egress:\n  policy:\n    \"bad host\": {}\n",
        "egress.policy.bad host",
        "not a valid DNS name",
    ),
    (
        "path_without_slash",
        "egress:\n  policy:\n    a.example.com:\n      paths: [\"v1/x\"]\n",
        "egress.policy.a.example.com.paths[0]",
        "must start with '/'",
    ),
    (
        "path_with_dotdot",
        "egress:\n  policy:\n    a.example.com:\n      paths: [\"/v1/../admin\"]\n",
        "egress.policy.a.example.com.paths[0]",
        "'..'",
    ),
    (
        "path_with_partial_doublestar",
        "egress:\n  policy:\n    a.example.com:\n      paths: [\"/v1/a**\"]\n",
        "egress.policy.a.example.com.paths[0]",
        "whole segment",
    ),
    (
        "path_with_query",
        "egress:\n  policy:\n    a.example.com:\n      paths: [\"/v1?x=1\"]\n",
        "egress.policy.a.example.com.paths[0]",
        "query",
    ),
    (
        "repo_without_owner",
        "egress:\n  policy:\n    c.example.com:\n      repos: [repo]\n",
        "egress.policy.c.example.com.repos[0]",
        "owner/repo",
    ),
    (
        "repo_with_option_injection",
        "egress:\n  policy:\n    c.example.com:\n      repos: [\"-oProxyCommand=x/y\"]\n",
        "egress.policy.c.example.com.repos[0]",
        "owner/repo",
    ),
    (
        "repo_with_dotdot",
        "egress:\n  policy:\n    c.example.com:\n      repos: [\"../etc\"]\n",
        "egress.policy.c.example.com.repos[0]",
        "owner/repo",
    ),
    (
        "policy_host_twice_after_normalising",
        "egress:\n  policy:\n    a.example.com: {}\n    A.EXAMPLE.COM.: {}\n",
        "egress.policy",
        "listed twice",
    ),
    (
        "duplicate_yaml_key",
        "egress:\n  allow: []\n  allow: []\n",
        "egress",
        "duplicate",
    ),
    (
        "duplicate_policy_key",
        "egress:\n  policy:\n    a.example.com: {}\n    a.example.com: {}\n",
        "egress.policy",
        "duplicate",
    ),
    (
        "secret_name_lowercase",
        "egress:\n  secrets:\n    - name: token\n      hosts: [a.example.com]\n",
        "egress.secrets[0].name",
        "upper-case",
    ),
    (
        "secret_without_name",
        "egress:\n  secrets:\n    - hosts: [a.example.com]\n",
        "egress.secrets[0]",
        "missing field `name`",
    ),
    ("not_yaml", "egress: [unclosed\n", "", ""),
    ("tab_indentation", "egress:\n\tallow: []\n", "", ""),
];

#[test]
fn refusals_name_the_location_and_reason() {
    for (name, text, path, fragment) in REFUSED {
        let errors = match parse(text) {
            Ok(_) => panic!("{name}: must be refused"),
            Err(e) => e.0,
        };
        assert!(
            errors
                .iter()
                .any(|e| e.location.path.starts_with(path) && e.message.contains(fragment)),
            "{name}: expected an error at {path:?} containing {fragment:?}, got {errors:#?}"
        );
        assert!(
            errors
                .iter()
                .all(|e| e.file == Path::new(".svc/config.yaml") && !e.message.is_empty()),
            "{name}"
        );
    }
}

#[test]
fn syntax_errors_carry_line_and_column() {
    let errors = parse("egress:\n  allow:\n    - a.example.com\n  policy: [\n")
        .unwrap_err()
        .0;
    assert!(errors[0].location.line.is_some(), "{errors:#?}");
}

#[test]
fn alias_bomb_is_refused_quickly() {
    // "Billion laughs": nine levels of nine aliases each.
    let mut text = String::from(
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for (prev, cur) in ["a", "b", "c", "d", "e", "f", "g", "h"]
        .iter()
        .zip(["b", "c", "d", "e", "f", "g", "h", "i"])
    {
        let refs = vec![format!("*{prev}"); 9].join(",");
        text.push_str(&format!("{cur}: &{cur} [{refs}]\n"));
    }
    text.push_str("egress:\n  allow: *i\n");
    let started = std::time::Instant::now();
    let result = parse(&text);
    assert!(result.is_err(), "an alias bomb must be refused");
    // Not a timing assertion of performance: a generous bound that only an expansion of
    // 9^9 strings would break.
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

#[test]
fn deep_nesting_is_refused() {
    let text = format!(
        "egress:\n  allow: {}{}\n",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let errors = parse(&text).unwrap_err().0;
    assert!(
        errors[0].message.contains("nested deeper than 64"),
        "{errors:#?}"
    );
    assert_eq!(errors[0].location.line, Some(2));
    // Brackets inside quotes do not count.
    let quoted = format!("egress:\n  allow: [\"{}\"]\n", "[".repeat(1000));
    let errors = parse(&quoted).unwrap_err().0;
    assert!(
        errors.iter().all(|e| !e.message.contains("nested deeper")),
        "{errors:#?}"
    );
}

#[test]
fn repos_are_normalised_case_insensitively_without_git_suffix() {
    let cfg = parse("egress:\n  policy:\n    code.example.com:\n      repos: [Acme/Widget.git]\n")
        .unwrap();
    let entry = cfg.policy.get("code.example.com").unwrap();
    assert_eq!(entry.repos[0].as_str(), "acme/widget");
}

#[test]
fn https_push_branches_is_an_opt_in_that_survives_a_round_trip() {
    let cases: &[(&str, &str, Option<bool>)] = &[
        ("absent", "egress:\n  allow: [a.example]\n", Some(false)),
        ("on", "egress:\n  httpsPushBranches: true\n", Some(true)),
        ("off", "egress:\n  httpsPushBranches: false\n", Some(false)),
        ("not_a_bool", "egress:\n  httpsPushBranches: main\n", None),
        (
            "snake_case_refused",
            "egress:\n  https_push_branches: true\n",
            None,
        ),
    ];
    for (name, text, want) in cases {
        match (parse(text), want) {
            (Ok(c), Some(w)) => {
                assert_eq!(c.https_push_branches, *w, "{name}");
                let again = egress::validate(Path::new("x"), c.to_file()).expect("round trip");
                assert_eq!(again, c, "{name}");
            }
            (Err(e), None) => assert!(
                e.to_string().contains("httpsPushBranches")
                    || e.to_string().contains("https_push_branches"),
                "{name}: {e}"
            ),
            (got, want) => panic!("{name}: want {want:?}, got {got:?}"),
        }
    }
}
