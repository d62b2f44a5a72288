//! The real `svc` binary: `svc config check` and `svc config schema` as a user runs them.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

mod common;

use std::fs;

use common::{output, project, repo, svc_command};

/// `svc ARGS` without the doctor's microvm overrides of the caller's environment.
fn svc(args: &[&str]) -> std::process::Output {
    output(
        svc_command()
            .args(args)
            .env_remove("SVC_DOCTOR_MICROVM_EXEC_MODE")
            .env_remove("SVC_DOCTOR_MICROVM_INSTANCE")
            .env_remove("SVC_DOCTOR_MICROVM_DOCKER_MODE"),
    )
}

#[test]
fn check_accepts_the_example_workspace_and_prints_the_effective_config() {
    let out = svc(&["config", "check", &repo("examples/workspace")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("spotlight     api:8080 → localhost:18080  [workspace.json]"),
        "{stdout}"
    );
    assert!(stdout.contains("probes: node (required)"), "{stdout}");
}

#[test]
fn check_uses_the_compose_fallback() {
    let out = svc(&["config", "check", &repo("examples/compose")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(stdout.contains("web:80 → localhost:8000"), "{stdout}");
    assert!(stdout.contains("service debug skipped"), "{stdout}");
}

#[test]
fn check_json_is_one_document_for_scripts() {
    let out = svc(&["config", "check", "--json", &repo("examples/workspace")]);
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["ok"], true);
    assert_eq!(
        doc["workspace"]["effective"]["services"]["stopTimeoutMs"],
        15000
    );
    assert_eq!(
        doc["workspace"]["effective"]["doctor"]["probes"][0]["timeoutMs"],
        60000
    );
    assert!(doc["errors"].as_array().unwrap().is_empty());
}

#[test]
fn check_refuses_the_allow_policy_clash_with_the_spec_message_and_exit_78() {
    let dir = project(&[(
        ".svc/config.yaml",
        "egress:\n  allow: [API.example.com]\n  secrets:\n    - name: TOKEN\n      hosts: [api.example.com]\n",
    )]);
    let out = svc(&["config", "check", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(78));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("at egress.allow[0]: svc config: host \"API.example.com\" is listed under egress.allow and egress.policy; a host can be open (allow) or policy-gated (policy/secrets), not both \u{2014} remove it from egress.allow."),
        "{stderr}"
    );
    assert!(stderr.contains("1 error in"), "{stderr}");

    let out = svc(&["config", "check", "--json", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(78));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["errors"][0]["path"], "egress.allow[0]");
}

#[test]
fn check_reports_a_removed_environment_variable() {
    let out = output(
        svc_command()
            .args(["config", "check", &repo("examples/workspace")])
            .env("SVC_DOCTOR_MICROVM_INSTANCE", "x"),
    );
    assert_eq!(out.status.code(), Some(78));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("SVC_DOCTOR_MICROVM_INSTANCE is set, but it was removed"),
        "{stderr}"
    );
}

#[test]
fn check_reports_errors_with_file_line_and_pointer() {
    let dir = project(&[(
        ".svc/workspace.json",
        "{\n  \"version\": 1,\n  \"capabilities\": {\"required\": [\"teleport\"]}\n}\n",
    )]);
    let out = svc(&["config", "check", dir.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(78));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(".svc/workspace.json:3:"), "{stderr}");
    assert!(
        stderr.contains("at /capabilities/required/0: unknown variant `teleport`"),
        "{stderr}"
    );
}

#[test]
fn schema_command_prints_the_shipped_schema() {
    let out = svc(&["config", "schema"]);
    assert!(out.status.success());
    let shipped = fs::read_to_string(repo("schema/workspace.v1.json")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        shipped.trim_end()
    );
}

#[test]
fn help_is_there_for_every_command() {
    for args in [
        &["--help"][..],
        &["config", "--help"],
        &["config", "check", "--help"],
        &["config", "schema", "--help"],
    ] {
        let out = svc(args);
        assert!(out.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage: svc"),
            "{args:?}"
        );
    }
}

#[test]
fn check_refuses_a_directory_that_is_not_there() {
    let out = svc(&["config", "check", "/nonexistent/project"]);
    assert_eq!(out.status.code(), Some(78));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "",
        "no defaults printed"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(
            "✗ /nonexistent/project: no such directory: svc config check takes a workspace directory (the one holding .svc/)\n"
        ),
        "{stderr}"
    );
    let file = svc(&["config", "check", &repo("README.md")]);
    assert_eq!(file.status.code(), Some(78));
    assert!(
        String::from_utf8_lossy(&file.stderr).contains("README.md: not a directory"),
        "{file:?}"
    );
}
