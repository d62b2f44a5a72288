//! `svc egress explain` through the real binary: the decision, the rule, the exit code.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

mod common;

use std::process::Output;

use common::{output, project, svc_command, temp_file};

fn explain(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    output(
        svc_command()
            .current_dir(dir.path())
            .args(["egress", "explain", "--host-config", "/dev/null"])
            .args(args),
    )
}

fn json(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = explain(&all);
    (
        out.status.code(),
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr))),
    )
}

#[test]
fn foreign_repo_push_is_refused_with_its_rule() {
    let out = explain(&[
        "--repo",
        "acme/widget",
        "POST",
        "https://github.com/evil/exfil.git/git-receive-pack",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("DENY 403"), "{text}");
    assert!(text.contains("rule:    smart-http-foreign-repo"), "{text}");
}

#[test]
fn bound_repo_clone_is_allowed_with_the_placeholder_swapped() {
    let (code, doc) = json(&[
        "--repo",
        "acme/widget",
        "--bearer",
        "code-host",
        "GET",
        "https://github.com/acme/widget.git/info/refs?service=git-upload-pack",
    ]);
    assert_eq!(code, Some(0));
    assert_eq!(doc["decision"]["verdict"], "allow");
    assert_eq!(doc["decision"]["credential"]["action"], "swap");
    assert_eq!(doc["decision"]["credential"]["kind"], "code-host");
    assert_eq!(doc["decision"]["rule"], "smart-http");
}

#[test]
fn graphql_body_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let ok = dir.path().join("ok.json");
    std::fs::write(&ok, r#"{"query":"query { viewer { login } }"}"#).unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"query":"query { viewer { login } r: repository(owner:\"e\",name:\"x\") { id } }"}"#,
    )
    .unwrap();
    let (code, doc) = json(&[
        "--repo",
        "acme/widget",
        "--body-file",
        ok.to_str().unwrap(),
        "POST",
        "https://api.github.com/graphql",
    ]);
    assert_eq!(
        (code, doc["decision"]["rule"].as_str()),
        (Some(0), Some("graphql-viewer"))
    );
    let (code, doc) = json(&[
        "--repo",
        "acme/widget",
        "--body-file",
        bad.to_str().unwrap(),
        "POST",
        "https://api.github.com/graphql",
    ]);
    assert_eq!(
        (code, doc["decision"]["rule"].as_str()),
        (Some(1), Some("graphql-refused"))
    );
}

#[test]
fn placeholder_in_a_query_string_is_a_leak() {
    let (code, doc) = json(&[
        "--allow-host",
        "api.example.com",
        "GET",
        "https://api.example.com/x?key={placeholder:api.example.com}",
    ]);
    assert_eq!(code, Some(1));
    assert_eq!(doc["decision"]["rule"], "credential-leak");
    let (code, doc) = json(&[
        "--allow-host",
        "api.example.com",
        "--allow-host",
        "other.example.com",
        "-H",
        "Authorization: Bearer {placeholder:other.example.com}",
        "GET",
        "https://api.example.com/",
    ]);
    assert_eq!(code, Some(1));
    assert_eq!(doc["decision"]["rule"], "credential-leak");
}

#[test]
fn domain_fronting_and_unlisted_hosts() {
    let (code, doc) = json(&[
        "--allow-host",
        "a.example.com",
        "--sni",
        "a.example.com",
        "GET",
        "https://evil.example.org/",
    ]);
    assert_eq!(
        (code, doc["decision"]["status"].as_u64()),
        (Some(1), Some(421))
    );
    let (code, doc) = json(&["GET", "https://evil.example.org/"]);
    assert_eq!(
        (code, doc["decision"]["rule"].as_str()),
        (Some(1), Some("host-not-allowed"))
    );
}

#[test]
fn config_yaml_policy_paths_apply() {
    let (_dir, cfg) = temp_file(
        "config.yaml",
        "egress:\n  policy:\n    api.example.com:\n      paths: [\"/v1/**\"]\n",
    );
    let c = cfg.to_str().unwrap();
    let (code, doc) = json(&["--config", c, "GET", "https://api.example.com/v1/models"]);
    assert_eq!(
        (code, doc["decision"]["rule"].as_str()),
        (Some(0), Some("policy-path"))
    );
    let (code, doc) = json(&["--config", c, "GET", "https://api.example.com/admin"]);
    assert_eq!(
        (code, doc["decision"]["rule"].as_str()),
        (Some(1), Some("policy-default-deny"))
    );
}

/// Tomcat, Jetty and Spring drop a segment's `;` parameters before resolving dot segments:
/// `/public/..;/admin/` is `/admin/` to them, so explain refuses it as the proxy does; and
/// fullwidth `．．` and `／`, which servers that normalise paths read as `..` and `/`.
#[test]
fn dot_segments_with_parameters_are_refused_by_explain() {
    let (_dir, cfg) = temp_file(
        "config.yaml",
        "egress:\n  policy:\n    api.corp.test:\n      paths: [\"/public/**\"]\n",
    );
    let c = cfg.to_str().unwrap();
    for url in [
        "https://api.corp.test/public/..;/admin/",
        "https://api.corp.test/public/..%3b/admin/",
        "https://api.corp.test/public/%2e%2e;/admin",
        "https://api.corp.test/public/.%2E%3Bx=1/admin",
        "https://api.corp.test/public/%ef%bc%8e%ef%bc%8e/admin",
        "https://api.corp.test/public%ef%bc%8fadmin",
    ] {
        let (code, doc) = json(&["--config", c, "GET", url]);
        assert_eq!(
            (code, doc["decision"]["rule"].as_str()),
            (Some(1), Some("target-invalid")),
            "{url}: {doc}"
        );
    }
    let (code, doc) = json(&["--config", c, "GET", "https://api.corp.test/public/a;v=1"]);
    assert_eq!(
        (code, doc["decision"]["rule"].as_str()),
        (Some(0), Some("policy-path")),
        "a parameter on a real segment stays allowed: {doc}"
    );
}

#[test]
fn bad_arguments_are_clear_errors() {
    for (args, fragment) in [
        (&["GET", "github.com/x"][..], "has no scheme"),
        (&["GET", "ftp://x.example/"], "not http or https"),
        (
            &["--repo", "not-a-repo", "GET", "https://github.com/"],
            "--repo",
        ),
        (
            &["--allow-host", "*", "GET", "https://x.example/"],
            "--allow-host",
        ),
        (
            &["--bearer", "nowhere.example", "GET", "https://x.example/"],
            "no placeholder",
        ),
    ] {
        let out = explain(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: 1 is refused, 2 bad input"
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(fragment), "{args:?}: {err}");
    }
}

#[test]
fn ssh_requests_are_explained_with_the_relays_exact_lines() {
    let (_dir, config) = temp_file(
        "config.yaml",
        "egress:\n  policy:\n    github.com:\n      repos: [acme/widget]\n",
    );
    let config = config.to_str().unwrap();
    let push = "git@github.com git-receive-pack 'acme/widget.git'";
    struct Case {
        name: &'static str,
        ssh: &'static str,
        refs: &'static [&'static str],
        code: i32,
        rule: &'static str,
        message: Option<&'static str>,
    }
    for c in [
        Case {
            name: "push to main",
            ssh: push,
            refs: &["refs/heads/main"],
            code: 1,
            rule: "allowed-branches",
            message: Some("svc: refused: ref refs/heads/main not in allowed branches"),
        },
        Case {
            name: "one ref allowed, one not",
            ssh: push,
            refs: &["refs/heads/svc/a", "refs/tags/v1"],
            code: 1,
            rule: "allowed-branches",
            message: Some("svc: refused: ref refs/tags/v1 not in allowed branches"),
        },
        Case {
            name: "push to an svc branch",
            ssh: push,
            refs: &["refs/heads/svc/work"],
            code: 0,
            rule: "allowed-branches",
            message: None,
        },
        Case {
            name: "clone of the listed repository",
            ssh: "git@github.com git-upload-pack '/acme/widget.git'",
            refs: &[],
            code: 0,
            rule: "egress-policy",
            message: None,
        },
        Case {
            name: "foreign repository",
            ssh: "git@github.com git-upload-pack 'evil/exfil.git'",
            refs: &[],
            code: 1,
            rule: "egress-policy",
            message: Some(
                "svc: refused by egress policy: github.com evil/exfil not in .svc/config.yaml egress.policy",
            ),
        },
        Case {
            name: "a shell",
            ssh: "git@github.com sh -i",
            refs: &[],
            code: 1,
            rule: "request",
            message: Some(
                "svc: refused: only git-upload-pack and git-receive-pack are relayed, not \"sh\"",
            ),
        },
    ] {
        let mut args = vec!["--config", config, "--ssh", c.ssh];
        for r in c.refs {
            args.extend(["--ref", r]);
        }
        let (code, doc) = json(&args);
        assert_eq!(code, Some(c.code), "{}: {doc}", c.name);
        assert_eq!(doc["rule"], c.rule, "{}: {doc}", c.name);
        assert_eq!(doc["message"].as_str(), c.message, "{}: {doc}", c.name);
    }
    // Text output says what git would see; --ref on a fetch is a usage error.
    let out = explain(&[
        "--config",
        config,
        "--ssh",
        push,
        "--ref",
        "refs/heads/main",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("DENY"), "{text}");
    assert!(
        text.contains("git sees: svc: refused: ref refs/heads/main not in allowed branches"),
        "{text}"
    );
    let out = explain(&[
        "--config",
        config,
        "--ssh",
        "git@github.com git-upload-pack 'acme/widget.git'",
        "--ref",
        "refs/heads/main",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--ref applies to pushes"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn offline_explain_says_which_files_it_read() {
    // No project configuration here: the defaults, said so.
    let out = explain(&["GET", "https://api.example.com/"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no .svc/config.yaml found, using defaults"),
        "{err}"
    );
    assert!(err.contains("reading /dev/null"), "{err}");

    // A project's .svc/config.yaml in the current directory is read, and said to be.
    let dir = project(&[(".svc/config.yaml", "egress:\n  allow: [api.example.org]\n")]);
    let out = output(
        svc_command()
            .current_dir(dir.path())
            .args(["egress", "explain", "--host-config", "/dev/null", "--json"])
            .args(["GET", "https://api.example.org/"]),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("reading .svc/config.yaml"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        doc["read"],
        serde_json::json!({"project": ".svc/config.yaml", "host": "/dev/null"})
    );
    assert_eq!(doc["decision"]["verdict"], "allow");

    // --ssh reads the project's configuration alone, and says so too.
    let out = output(
        svc_command()
            .current_dir(dir.path())
            .args(["egress", "explain", "--json", "--ssh"])
            .arg("git@github.com git-upload-pack 'acme/widget.git'"),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("reading .svc/config.yaml"), "{err}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["read"]["project"], ".svc/config.yaml", "{doc}");
}

#[test]
fn explain_against_a_sandbox_takes_no_description_of_one() {
    for extra in [
        &["--repo", "acme/widget"][..],
        &["--allow-host", "pypi.org"],
        &["--config", "x.yaml"],
        &["--host-config", "/dev/null"],
    ] {
        let out = output(
            svc_command()
                .args(["egress", "explain", "--sandbox", "dev"])
                .args(extra)
                .args(["GET", "https://pypi.org/"]),
        );
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cannot be used with"), "{extra:?}: {err}");
    }
}
