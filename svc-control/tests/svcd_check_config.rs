//! `svcd check-config` as an operator runs it (the built `svcd`): every error of a bad file
//! at once with its file and line, exit 78; a good file `ok`, exit 0; a mixed code-host family
//! a warning naming the keys to set, still exit 0.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

use std::process::{Command, Output};

/// `svcd check-config --config FILE` with `text` as the file.
fn check_config(text: &str) -> (Output, std::path::PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("svcd.toml");
    std::fs::write(&file, text).expect("write svcd.toml");
    let out = Command::new(env!("CARGO_BIN_EXE_svcd"))
        .arg("check-config")
        .arg("--config")
        .arg(&file)
        .output()
        .expect("run svcd");
    (out, file, dir)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_good_file_is_ok() {
    let (out, file, _dir) = check_config(
        "state_dir = \"/var/lib/svc\"\n\n[audit]\nmax_mib = 64\nkeep = 4\n\n[microvm]\nkernel = \"/var/lib/svc/images/microvm/vmlinuz\"\n",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{}: ok\n", file.display()));
    assert_eq!(text(&out.stderr), "", "no warnings");
}

#[test]
fn every_error_is_reported_at_once_with_its_line() {
    let (out, file, _dir) = check_config(
        "state_dir = \"relative\"\n\n[microvm]\naccel = \"fast\"\nrootfs = \"rootfs.ext4\"\n\n[audit]\nmax_mib = 0\nkeep = 5000\n",
    );
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "");
    let f = file.display();
    let want = [
        format!("{f}:1:13: at state_dir: expected an absolute path, got relative"),
        format!("{f}:5:10: at microvm.rootfs: expected an absolute path, got rootfs.ext4"),
        format!("{f}:4:9: at microvm.accel: expected \"auto\", \"kvm\" or \"tcg\", got \"fast\""),
        format!(
            "{f}:8:11: at audit.max_mib: expected 1 to 1048576 (MiB the audit file may grow to), got 0"
        ),
        format!("{f}:9:8: at audit.keep: expected 0 to 1000 (rotated audit files kept), got 5000"),
        format!("svcd: {f}: invalid configuration (5 errors)"),
    ];
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines, want, "{stderr}");
}

#[test]
fn a_syntax_error_names_its_line() {
    let (out, file, _dir) = check_config("[audit]\nmax_mib = \n");
    assert_eq!(out.status.code(), Some(78));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with(&format!("{}:2:", file.display())),
        "{stderr}"
    );
}

#[test]
fn a_mixed_code_host_family_is_a_warning_naming_the_keys() {
    let (out, file, _dir) = check_config(
        "[hosts]\ncode_host = \"gitlab.example.org\"\ncode_api_host = \"gitlab.example.org\"\ncode_archive_host = \"gitlab.example.org\"\n",
    );
    assert_eq!(out.status.code(), Some(0), "a warning is no error");
    assert_eq!(text(&out.stdout), format!("{}: ok\n", file.display()));
    let stderr = text(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with(&format!(
            "warning: {}:2:13: at hosts.code_host: hosts.code_host is gitlab.example.org, not GitHub, but hosts.code_uploads_host is still uploads.github.com",
            file.display()
        )) && lines[0].contains("set hosts.code_uploads_host to gitlab.example.org's own host"),
        "{stderr}"
    );
}

#[test]
fn a_missing_file_is_an_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_svcd"))
        .args(["check-config", "--config", "/nonexistent/svcd.toml"])
        .output()
        .expect("run svcd");
    assert_eq!(out.status.code(), Some(78));
    assert_eq!(
        text(&out.stderr),
        "/nonexistent/svcd.toml: file not found\nsvcd: /nonexistent/svcd.toml: invalid configuration (1 error)\n"
    );
}
