//! The loader's file discovery: workspace.json or compose files, dotenv, errors from every file
//! together, oversized and non-UTF-8 files.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

use std::{fs, path::Path};

use svc_control::config::{
    effective::{ApiParams, Source},
    loader,
};

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

#[test]
fn compose_is_used_only_without_workspace_json() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "docker-compose.yml",
        "services:\n  web:\n    ports: [\"8000:80\"]\n",
    );
    let l = loader::load_workspace(dir.path(), &ApiParams::default(), []).unwrap();
    assert_eq!(l.effective.sources["spotlight"], Source::Compose);
    assert_eq!(l.effective.spotlight[0].local_port, 8000);

    write(dir.path(), ".svc/workspace.json", r#"{"version":1}"#);
    let l = loader::load_workspace(dir.path(), &ApiParams::default(), []).unwrap();
    assert!(
        l.compose.is_none(),
        "workspace.json present: compose is not read"
    );
    assert!(l.effective.spotlight.is_empty());
}

#[test]
fn compose_file_order_and_ignored_files_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "docker-compose.yaml",
        "services:\n  a:\n    ports: [\"1:1\"]\n",
    );
    write(
        dir.path(),
        "docker-compose.yml",
        "services:\n  b:\n    ports: [\"2:2\"]\n",
    );
    let l = loader::load_workspace(dir.path(), &ApiParams::default(), []).unwrap();
    let c = l.compose.unwrap();
    assert!(
        c.file.ends_with("docker-compose.yml"),
        "docker-compose.yml comes before .yaml"
    );
    assert_eq!(c.ports.forwards[0].service, "b");
    assert_eq!(l.warnings.len(), 1);
    assert!(l.warnings[0].contains("docker-compose.yaml is ignored"));

    write(
        dir.path(),
        "compose.yaml",
        "services:\n  c:\n    ports: [\"3:3\"]\n",
    );
    let l = loader::load_workspace(dir.path(), &ApiParams::default(), []).unwrap();
    assert!(
        l.compose.unwrap().file.ends_with("compose.yaml"),
        "compose.yaml is preferred"
    );
    assert_eq!(l.warnings.len(), 2);
}

#[test]
fn dotenv_and_process_environment_feed_compose() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), ".env", "WEB_PORT=8100\nAPI_PORT=8200\n");
    write(
        dir.path(),
        "compose.yaml",
        "services:\n  web:\n    ports: [\"${WEB_PORT}:80\", \"${API_PORT}:81\"]\n",
    );
    let l = loader::load_workspace(
        dir.path(),
        &ApiParams::default(),
        [("API_PORT".to_owned(), "8300".to_owned())],
    )
    .unwrap();
    let locals: Vec<u16> = l.effective.spotlight.iter().map(|f| f.local_port).collect();
    assert_eq!(locals, [8100, 8300]);
}

#[test]
fn errors_from_every_file_are_reported_together() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), ".svc/workspace.json", r#"{"version":2}"#);
    write(
        dir.path(),
        ".svc/config.yaml",
        "egress:\n  allow: [a.example.com]\n  policy:\n    a.example.com: {}\n",
    );
    let errors = loader::load_workspace(dir.path(), &ApiParams::default(), [])
        .unwrap_err()
        .0;
    assert!(
        errors
            .iter()
            .any(|e| e.file.ends_with(".svc/workspace.json"))
    );
    assert!(errors.iter().any(|e| e.file.ends_with(".svc/config.yaml")));
}

#[test]
fn oversized_and_non_utf8_files_are_refused_before_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let big = format!(
        "{{\"version\":1,\"x\":\"{}\"}}",
        "a".repeat(2 * 1024 * 1024)
    );
    write(dir.path(), ".svc/workspace.json", &big);
    let errors = loader::load_workspace(dir.path(), &ApiParams::default(), [])
        .unwrap_err()
        .0;
    assert!(errors[0].message.contains("larger than"), "{errors:#?}");

    fs::write(
        dir.path().join(".svc/workspace.json"),
        b"{\"version\":1,\xff}",
    )
    .unwrap();
    let errors = loader::load_workspace(dir.path(), &ApiParams::default(), [])
        .unwrap_err()
        .0;
    assert!(errors[0].message.contains("UTF-8"), "{errors:#?}");
}
