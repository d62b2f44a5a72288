//! The doctor's report: `schema/doctor-report.v1.json` is what the types generate, and a real
//! run (real processes: a pass, a retried failure, a timeout, a skipped test) fits it.

use std::path::Path;

use svc_control::{config::workspace::Check, doctor};

fn sh(name: &str, script: &str, timeout_ms: u64, retries: u32, required: bool) -> Check {
    Check {
        name: name.into(),
        command: "/bin/sh".into(),
        args: vec!["-c".into(), script.into()],
        timeout_ms,
        retries,
        required,
    }
}

#[test]
fn the_shipped_schema_is_the_generated_one() {
    let committed: serde_json::Value =
        serde_json::from_str(include_str!("../../schema/doctor-report.v1.json"))
            .expect("valid JSON");
    assert_eq!(
        committed,
        serde_json::to_value(doctor::schema()).expect("json"),
        "schema/doctor-report.v1.json is stale: regenerate it with `svc doctor --schema > schema/doctor-report.v1.json`"
    );
}

#[tokio::test]
async fn a_real_run_fits_the_schema() {
    let probes = [
        sh("ok", "echo fine", 5000, 0, false),
        sh("flaky-no-more", "echo bad >&2; exit 1", 5000, 1, false),
        sh("slow", "sleep 20", 300, 0, true),
    ];
    let tests = [sh("unit", "true", 5000, 0, true)];
    let report = doctor::run(
        Vec::new(),
        &probes,
        &tests,
        &doctor::OnHost(Path::new("/")),
        |_| {},
    )
    .await;
    let value = serde_json::to_value(&report).expect("json");
    let validator =
        jsonschema::validator_for(&serde_json::to_value(doctor::schema()).expect("schema"))
            .expect("the schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(&value)
        .map(|e| e.to_string())
        .collect();
    assert!(errors.is_empty(), "{errors:?}\n{value:#}");
    let status: Vec<&str> = value["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["status"].as_str().expect("status"))
        .collect();
    assert_eq!(status, ["passed", "failed", "timed_out", "skipped"]);
    assert_eq!(value["results"][1]["attempts"], 2);
    assert_eq!(value["required_failed"], true);
}
