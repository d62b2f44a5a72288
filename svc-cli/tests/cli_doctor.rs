//! The real `svc doctor` on a real workspace: probes then tests, lines per check, the JSON
//! report written whole, the exit code, and an invalid configuration refused.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

mod common;

use std::{fs, path::PathBuf};

use common::svc;

fn workspace(doctor: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "svc-cli-doctor-{}-{}",
        std::process::id(),
        doctor.len()
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join(".svc")).unwrap();
    fs::write(
        dir.join(".svc/workspace.json"),
        format!(r#"{{"version": 1, "doctor": {doctor}}}"#),
    )
    .unwrap();
    dir
}

#[test]
fn doctor_runs_probes_then_tests_and_reports_each() {
    let dir = workspace(
        r#"{"probes": [
             {"name": "in-the-workspace", "command": "test", "args": ["-d", ".svc"], "required": true},
             {"name": "optional", "command": "false"}
           ],
           "tests": [
             {"name": "slow", "command": "sleep", "args": ["30"], "timeoutMs": 300},
             {"name": "unit", "command": "true", "required": true}
           ]}"#,
    );
    let report = dir.join("report.json");
    let out = svc(&[
        "doctor",
        "--no-host",
        dir.to_str().unwrap(),
        "--report-json",
        report.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines[0].starts_with("✓ probe in-the-workspace"), "{stdout}");
    assert!(lines[1].starts_with("✗ probe optional"), "{stdout}");
    assert!(
        lines[2].starts_with("✗ test  slow")
            && lines[2].contains("no result within 300 ms: killed"),
        "{stdout}"
    );
    assert!(lines[3].starts_with("✓ test  unit"), "{stdout}");
    assert_eq!(lines[4], "4 checks: 2 passed, 2 failed, 0 skipped");
    let v: serde_json::Value = serde_json::from_slice(&fs::read(&report).unwrap()).unwrap();
    assert_eq!(v["results"][2]["status"], "timed_out");
    assert_eq!(v["results"][3]["phase"], "test");
    assert_eq!(v["required_failed"], false);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_failed_required_probe_skips_the_tests_and_fails_the_doctor() {
    let dir = workspace(
        r#"{"probes": [{"name": "toolchain", "command": "/nonexistent/cc", "required": true}],
           "tests": [{"name": "unit", "command": "true"}]}"#,
    );
    let out = svc(&["doctor", "--no-host", dir.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["results"][1]["status"], "skipped");
    assert_eq!(
        v["results"][1]["reason"],
        "required probe failed: toolchain"
    );
    // An invalid workspace is refused before anything runs.
    fs::write(
        dir.join(".svc/workspace.json"),
        r#"{"version": 1, "doctor": {"probes": [{"name": "x"}]}}"#,
    )
    .unwrap();
    let out = svc(&["doctor", dir.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(78));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("command"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = fs::remove_dir_all(&dir);
}

/// The built-in host probes come first, each named; without svcd the required `host:svcd`
/// fails with its fix, and the workspace's tests are skipped.
#[test]
fn host_probes_come_first_and_a_missing_svcd_fails_the_doctor() {
    let dir = workspace(r#"{"tests": [{"name": "unit", "command": "true"}]}"#);
    let out = svc(&[
        "--socket",
        "/nonexistent/svcd.sock",
        "doctor",
        dir.to_str().unwrap(),
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "host:removed-variables",
            "host:kernel",
            "host:btf",
            "host:bpffs",
            "host:nftables",
            "host:tun",
            "host:ip-forward",
            "host:oci-runtime",
            "host:container-ids",
            "host:disk-audit",
            "host:disk-state",
            "host:svcd",
            "unit"
        ]
    );
    let svcd = &v["results"][11];
    assert_eq!(svcd["status"], "failed");
    assert!(
        svcd["reason"]
            .as_str()
            .unwrap()
            .contains("svcd does not answer on /nonexistent/svcd.sock"),
        "{svcd}"
    );
    assert_eq!(v["results"][12]["status"], "skipped");
    assert_eq!(
        v["results"][12]["reason"],
        "required probe failed: host:svcd"
    );
    let _ = fs::remove_dir_all(&dir);
}
