//! `.svc/workspace.json` v1: accepted shapes, defaults, and every refusal with its location.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

use std::path::Path;

use svc_control::config::workspace::{
    self, Backend, Capability, DEFAULT_CHECK_TIMEOUT_MS, WorkspaceFile,
};

fn parse(text: &str) -> Result<workspace::Workspace, svc_control::config::ConfigErrors> {
    workspace::parse(Path::new(".svc/workspace.json"), text)
}

const FULL_EXAMPLE: &str = include_str!("../../examples/workspace/.svc/workspace.json");

#[test]
fn accepted_shapes() {
    let cases: &[(&str, &str)] = &[
        ("full_example_from_the_repo", FULL_EXAMPLE),
        ("minimal_version_only", r#"{"version": 1}"#),
        (
            "schema_relative_path",
            r#"{"$schema": "./schema/workspace.v1.json", "version": 1}"#,
        ),
        (
            "schema_parent_path",
            r#"{"$schema": "../schema/workspace.v1.json", "version": 1}"#,
        ),
        (
            "readiness_profile",
            r#"{"version":1,"readiness":{"profiles":{"default":[{"name":"db","type":"service","serviceName":"postgres"}]}},"services":{"definitions":{"postgres":{"command":"postgres -D /data"}}}}"#,
        ),
        (
            "service_definitions",
            r#"{"version":1,"services":{"defaults":{"maxRestarts":1},"definitions":{"web":{"command":"python3 -m http.server 8000","cwd":"/workspace/site","env":{"PORT":"8000"},"healthCheck":{"command":"curl -sf localhost:8000","intervalMs":500,"timeoutMs":2000},"autoRestart":false}}}}"#,
        ),
        (
            "empty_readiness_profiles",
            r#"{"version":1,"readiness":{"profiles":{}}}"#,
        ),
        (
            "service_defaults_partial",
            r#"{"version":1,"services":{"defaults":{"autoRestart":false}}}"#,
        ),
        (
            "spotlight_forward",
            r#"{"version":1,"spotlight":{"defaults":[{"service":"web","remotePort":3000,"localPort":3000}]}}"#,
        ),
        (
            "auth_defaults",
            r#"{"version":1,"auth":{"defaults":{"authProfiles":["gitconfig"],"sshAgentForward":true,"gitCredentialMode":"host-helper"}}}"#,
        ),
        (
            "lifecycle_hooks",
            r#"{"version":1,"lifecycle":{"onSetup":["make deps"],"onStart":[],"onTeardown":["make clean"],"timeoutMs":30000}}"#,
        ),
        (
            "runtime_empty_means_automatic",
            r#"{"version":1,"runtime":{"required":[]}}"#,
        ),
        (
            "runtime_microvm_prefer_first",
            r#"{"version":1,"runtime":{"required":["microvm"],"selection":"prefer-first"}}"#,
        ),
        (
            "runtime_container_backend",
            r#"{"version":1,"runtime":{"required":["microvm","container"]}}"#,
        ),
        (
            "runtime_netns_is_the_container_backends_old_name",
            r#"{"version":1,"runtime":{"required":["microvm","netns"]}}"#,
        ),
        (
            "capability_spotlight_tunnel",
            r#"{"version":1,"capabilities":{"required":["spotlight.tunnel"]}}"#,
        ),
        (
            "doctor_spec_example_timeouts",
            r#"{"version":1,"doctor":{"probes":[{"name":"p","command":"true","timeoutMs":300000}],"tests":[{"name":"t","command":"true","timeoutMs":900000}]}}"#,
        ),
        (
            "unicode_in_strings",
            r#"{"version":1,"lifecycle":{"onStart":["echo héllo ✓"]}}"#,
        ),
    ];
    for (name, text) in cases {
        if let Err(e) = parse(text) {
            panic!("{name}: must be accepted, got:\n{e}");
        }
    }
}

#[test]
fn doctor_check_defaults_match_the_spec() {
    let w = parse(r#"{"version":1,"doctor":{"probes":[{"name":"p","command":"true"}]}}"#).unwrap();
    let check = &w.file().doctor.as_ref().unwrap().probes[0];
    assert_eq!(check.timeout_ms, 60_000);
    assert_eq!(DEFAULT_CHECK_TIMEOUT_MS, 60_000);
    assert_eq!(check.retries, 0);
    assert!(!check.required);
    assert!(check.args.is_empty());
}

#[test]
fn example_parses_to_the_expected_values() {
    let w = parse(FULL_EXAMPLE).unwrap();
    let f: &WorkspaceFile = w.file();
    assert_eq!(f.version, 1);
    assert_eq!(f.runtime.as_ref().unwrap().required, vec![Backend::MICROVM]);
    assert_eq!(
        f.capabilities.as_ref().unwrap().required,
        vec![Capability::SpotlightTunnel]
    );
    let doctor = f.doctor.as_ref().unwrap();
    assert!(doctor.probes[0].required);
    assert_eq!(doctor.tests[0].retries, 1);
    assert_eq!(doctor.tests[1].timeout_ms, 900_000);
}

/// (name, text, expected location path, a fragment the message must contain)
const REFUSED: &[(&str, &str, &str, &str)] = &[
    (
        "version_2",
        r#"{"version": 2}"#,
        "/version",
        "unsupported version 2",
    ),
    (
        "version_0",
        r#"{"version": 0}"#,
        "/version",
        "unsupported version 0",
    ),
    (
        "version_as_string",
        r#"{"version": "1"}"#,
        "/version",
        "invalid type",
    ),
    ("version_missing", r#"{}"#, "", "missing field `version`"),
    (
        "version_negative",
        r#"{"version": -1}"#,
        "/version",
        "invalid value",
    ),
    (
        "unknown_top_level_field",
        r#"{"version":1,"extra":true}"#,
        "/extra",
        "unknown field `extra`",
    ),
    (
        "unknown_field_in_check",
        r#"{"version":1,"doctor":{"probes":[{"name":"p","command":"c","timeout":5}]}}"#,
        "/doctor/probes/0/timeout",
        "unknown field `timeout`",
    ),
    (
        "unknown_capability",
        r#"{"version":1,"capabilities":{"required":["spotlight.tunnel","teleport"]}}"#,
        "/capabilities/required/1",
        "unknown variant `teleport`",
    ),
    (
        "unknown_backend",
        r#"{"version":1,"runtime":{"required":["docker"]}}"#,
        "/runtime/required/0",
        "unknown variant `docker`",
    ),
    (
        "backend_listed_twice",
        r#"{"version":1,"runtime":{"required":["microvm","microvm"]}}"#,
        "/runtime/required/1",
        "listed twice",
    ),
    (
        "container_listed_twice_under_its_old_name",
        r#"{"version":1,"runtime":{"required":["container","netns"]}}"#,
        "/runtime/required/1",
        "\"container\" is listed twice",
    ),
    (
        "unknown_selection",
        r#"{"version":1,"runtime":{"selection":"prefer-last"}}"#,
        "/runtime/selection",
        "unknown variant `prefer-last`",
    ),
    (
        "readiness_type_unknown",
        r#"{"version":1,"readiness":{"profiles":{"d":[{"name":"x","type":"process","serviceName":"s"}]}}}"#,
        "/readiness/profiles/d/0/type",
        "unknown variant `process`",
    ),
    (
        "readiness_missing_service_name",
        r#"{"version":1,"readiness":{"profiles":{"d":[{"name":"x","type":"service"}]}}}"#,
        "/readiness/profiles/d/0",
        "missing field `serviceName`",
    ),
    (
        "readiness_duplicate_profile",
        r#"{"version":1,"readiness":{"profiles":{"d":[],"d":[]}}}"#,
        "/readiness/profiles",
        "duplicate key \"d\"",
    ),
    (
        "duplicate_top_level_key",
        r#"{"version":1,"version":1}"#,
        "",
        "duplicate field `version`",
    ),
    (
        "duplicate_check_name_in_probes",
        r#"{"version":1,"doctor":{"probes":[{"name":"a","command":"x"},{"name":"a","command":"y"}]}}"#,
        "/doctor/probes/1/name",
        "already used at /doctor/probes/0/name",
    ),
    (
        "duplicate_check_name_across_phases",
        r#"{"version":1,"doctor":{"probes":[{"name":"a","command":"x"}],"tests":[{"name":"a","command":"y"}]}}"#,
        "/doctor/tests/0/name",
        "unique across probes and tests",
    ),
    (
        "empty_check_name",
        r#"{"version":1,"doctor":{"tests":[{"name":"","command":"x"}]}}"#,
        "/doctor/tests/0/name",
        "must not be empty",
    ),
    (
        "empty_check_command",
        r#"{"version":1,"doctor":{"tests":[{"name":"t","command":" "}]}}"#,
        "/doctor/tests/0/command",
        "must not be empty",
    ),
    (
        "zero_timeout",
        r#"{"version":1,"doctor":{"tests":[{"name":"t","command":"x","timeoutMs":0}]}}"#,
        "/doctor/tests/0/timeoutMs",
        "at least 1 ms",
    ),
    (
        "negative_retries",
        r#"{"version":1,"doctor":{"tests":[{"name":"t","command":"x","retries":-1}]}}"#,
        "/doctor/tests/0/retries",
        "invalid value",
    ),
    (
        "required_as_string",
        r#"{"version":1,"doctor":{"tests":[{"name":"t","command":"x","required":"yes"}]}}"#,
        "/doctor/tests/0/required",
        "invalid type",
    ),
    (
        "args_not_strings",
        r#"{"version":1,"doctor":{"tests":[{"name":"t","command":"x","args":[1]}]}}"#,
        "/doctor/tests/0/args/0",
        "invalid type",
    ),
    (
        "spotlight_port_zero",
        r#"{"version":1,"spotlight":{"defaults":[{"service":"w","remotePort":0,"localPort":1}]}}"#,
        "/spotlight/defaults/0/remotePort",
        "1 to 65535",
    ),
    (
        "spotlight_port_too_big",
        r#"{"version":1,"spotlight":{"defaults":[{"service":"w","remotePort":70000,"localPort":1}]}}"#,
        "/spotlight/defaults/0/remotePort",
        "invalid value",
    ),
    (
        "auth_profile_unknown",
        r#"{"version":1,"auth":{"defaults":{"authProfiles":["netrc"]}}}"#,
        "/auth/defaults/authProfiles/0",
        "unknown variant `netrc`",
    ),
    (
        "git_credential_mode_unknown",
        r#"{"version":1,"auth":{"defaults":{"gitCredentialMode":"store"}}}"#,
        "/auth/defaults/gitCredentialMode",
        "unknown variant `store`",
    ),
    (
        "lifecycle_empty_command",
        r#"{"version":1,"lifecycle":{"onStart":[""]}}"#,
        "/lifecycle/onStart/0",
        "must not be empty",
    ),
    (
        "readiness_names_an_undefined_service",
        r#"{"version":1,"readiness":{"profiles":{"d":[{"name":"x","type":"service","serviceName":"web"}]}},"services":{"definitions":{"db":{"command":"x"}}}}"#,
        "/readiness/profiles/d/0/serviceName",
        "no service \"web\" in services.definitions (defined: db)",
    ),
    (
        "service_relative_cwd",
        r#"{"version":1,"services":{"definitions":{"web":{"command":"x","cwd":"site"}}}}"#,
        "/services/definitions/web/cwd",
        "absolute path",
    ),
    (
        "service_bad_name",
        r#"{"version":1,"services":{"definitions":{"Web_1":{"command":"x"}}}}"#,
        "/services/definitions/Web_1",
        "service name",
    ),
    (
        "service_empty_command",
        r#"{"version":1,"services":{"definitions":{"web":{"command":" "}}}}"#,
        "/services/definitions/web/command",
        "must not be empty",
    ),
    (
        "health_zero_interval",
        r#"{"version":1,"services":{"definitions":{"web":{"command":"x","healthCheck":{"command":"true","intervalMs":0}}}}}"#,
        "/services/definitions/web/healthCheck/intervalMs",
        "at least 1",
    ),
    (
        "lifecycle_zero_timeout",
        r#"{"version":1,"lifecycle":{"onStart":["true"],"timeoutMs":0}}"#,
        "/lifecycle/timeoutMs",
        "at least 1 ms",
    ),
    (
        "schema_absolute_path",
        r#"{"$schema":"/etc/schema.json","version":1}"#,
        "/$schema",
        "absolute",
    ),
    (
        "schema_url",
        r#"{"$schema":"https://example.com/s.json","version":1}"#,
        "/$schema",
        "a URL",
    ),
    (
        "schema_empty",
        r#"{"$schema":"","version":1}"#,
        "/$schema",
        "empty",
    ),
    (
        "comments_are_not_json",
        "{\n  // comment\n  \"version\": 1\n}",
        "",
        "comments are not allowed",
    ),
    ("trailing_comma", r#"{"version":1,}"#, "", "trailing comma"),
    (
        "trailing_garbage",
        r#"{"version":1} x"#,
        "",
        "trailing characters",
    ),
    ("not_an_object", r#"[1,2]"#, "", "is not of type \"object\""),
    (
        "array_where_struct_belongs_top",
        r#"[null, 1]"#,
        "",
        "is not of type \"object\"",
    ),
    (
        "array_where_struct_belongs_nested",
        r#"{"version":1,"services":[{"autoRestart":true}]}"#,
        "/services",
        "not valid under any of the schemas",
    ),
    ("empty_file", "", "", "EOF"),
];

#[test]
fn refusals_name_the_location_and_reason() {
    for (name, text, path, fragment) in REFUSED {
        let errors = match parse(text) {
            Ok(_) => panic!("{name}: must be refused"),
            Err(e) => e.0,
        };
        let hit = errors
            .iter()
            .find(|e| e.location.path == *path && e.message.contains(fragment));
        assert!(
            hit.is_some(),
            "{name}: expected an error at {path:?} containing {fragment:?}, got {errors:#?}"
        );
        for e in &errors {
            assert_eq!(
                e.file,
                Path::new(".svc/workspace.json"),
                "{name}: every error names the file"
            );
            assert!(!e.message.is_empty(), "{name}: every error says why");
        }
    }
}

#[test]
fn deep_nesting_is_refused_without_overflowing_the_stack() {
    for depth in [200, 100_000] {
        let text = format!(
            r#"{{"version":1,"lifecycle":{{"onStart":{}{}}}}}"#,
            "[".repeat(depth),
            "]".repeat(depth)
        );
        let errors = parse(&text).unwrap_err().0;
        assert!(
            errors
                .iter()
                .any(|e| e.location.path == "/lifecycle/onStart/0"),
            "depth {depth}: {errors:#?}"
        );
    }
}

#[test]
fn huge_arrays_parse_or_fail_cleanly() {
    let cmds = vec!["\"true\""; 50_000].join(",");
    let text = format!(r#"{{"version":1,"lifecycle":{{"onStart":[{cmds}]}}}}"#);
    let w = parse(&text).unwrap();
    assert_eq!(
        w.file()
            .lifecycle
            .as_ref()
            .unwrap()
            .on_start
            .as_ref()
            .unwrap()
            .len(),
        50_000
    );
}

#[test]
fn syntax_errors_carry_line_and_column() {
    let text =
        "{\n  \"version\": 1,\n  \"doctor\": {\"probes\": [{\"name\": \"p\", \"command\": 5}]}\n}";
    let errors = parse(text).unwrap_err().0;
    assert_eq!(errors[0].location.line, Some(3));
    assert!(errors[0].location.column.is_some());
    assert_eq!(errors[0].location.path, "/doctor/probes/0/command");
    let shown = errors[0].to_string();
    assert!(shown.starts_with(".svc/workspace.json:3:"), "{shown}");
}

#[test]
fn several_rule_errors_are_all_reported() {
    let text = r#"{"version":2,"$schema":"/abs","doctor":{"tests":[{"name":"","command":""}]}}"#;
    let errors = parse(text).unwrap_err().0;
    assert!(errors.len() >= 4, "{errors:#?}");
}

#[test]
fn schema_file_is_generated_from_the_types() {
    let generated =
        serde_json::to_string_pretty(&workspace::json_schema::<WorkspaceFile>()).unwrap();
    let committed = include_str!("../../schema/workspace.v1.json");
    assert_eq!(
        committed.trim_end(),
        generated.trim_end(),
        "schema/workspace.v1.json is stale: regenerate it with `svc config schema > schema/workspace.v1.json`"
    );
}

#[test]
fn schema_lists_every_registered_capability_and_backend() {
    let schema = serde_json::to_string(&workspace::json_schema::<WorkspaceFile>()).unwrap();
    for c in Capability::ALL {
        assert!(
            schema.contains(&format!("\"{}\"", c.name())),
            "capability {} missing from schema",
            c.name()
        );
    }
    for b in Backend::all() {
        assert!(
            schema.contains(&format!("\"{}\"", b.name())),
            "backend {} missing from schema",
            b.name()
        );
    }
}

#[test]
fn registry_names_round_trip_through_serde() {
    for c in Capability::ALL {
        let v: Capability = serde_json::from_value(serde_json::json!(c.name())).unwrap();
        assert_eq!(v, c);
    }
    for b in Backend::all() {
        let v: Backend = serde_json::from_value(serde_json::json!(b.name())).unwrap();
        assert_eq!(v, b.canonical(), "{b:?} round-trips to its canonical name");
        let as_written: Backend = serde_json::from_value(serde_json::json!(b.written())).unwrap();
        assert_eq!(as_written, b, "{b:?} reads back as written");
    }
    let old: Backend = serde_json::from_value(serde_json::json!("netns")).unwrap();
    assert_eq!(old.canonical(), Backend::CONTAINER);
}

#[test]
fn every_section_reports_its_errors_together_in_file_order() {
    // Rules the schema cannot say, broken in every section: all reported at once, in the
    // order of the sections' checks.
    let text = r#"{
        "$schema": "/abs/workspace.v1.json",
        "version": 1,
        "services": {"definitions": {"web": {"command": " ", "cwd": "rel", "env": {"A=B": "x"}}}},
        "readiness": {"profiles": {"p": [{"name": "n", "type": "service", "serviceName": "db"}]}},
        "spotlight": {"defaults": [{"service": " ", "remotePort": 1, "localPort": 2}]},
        "lifecycle": {"onSetup": [" "]},
        "runtime": {"required": ["container", "netns"]},
        "doctor": {"tests": [{"name": "t", "command": "true"}, {"name": "t", "command": "true"}]}
    }"#;
    let errors = parse(text).unwrap_err().0;
    let paths: Vec<&str> = errors.iter().map(|e| e.location.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/$schema",
            "/services/definitions/web/command",
            "/services/definitions/web/cwd",
            "/services/definitions/web/env",
            "/readiness/profiles/p/0/serviceName",
            "/spotlight/defaults/0/service",
            "/lifecycle/onSetup/0",
            "/runtime/required/1",
            "/doctor/tests/1/name",
        ],
        "{errors:#?}"
    );
    assert_eq!(
        errors[4].message,
        "no service \"db\" in services.definitions (defined: web)"
    );
    assert_eq!(
        errors[8].message,
        "check name \"t\" is already used at /doctor/tests/0/name; names must be unique across probes and tests"
    );
}
