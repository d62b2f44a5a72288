//! The git SSH shim as git runs it: the `-G` probe, and a clear error when the relay socket is
//! not there. (The relay end to end: `tests/tests/git_relay.rs`.)

use std::process::Command;

#[test]
fn the_shim_answers_gits_probe_and_names_a_missing_relay() {
    let shim = env!("CARGO_BIN_EXE_svc-git-ssh");
    let probe = Command::new(shim)
        .args(["-G", "code.test"])
        .output()
        .expect("run the shim");
    assert!(probe.status.success(), "git's -G probe must succeed");
    let out = Command::new(shim)
        .env("SVC_GIT_SSH_SOCKET", "/nonexistent/git-ssh.sock")
        .args(["code.test", "git-upload-pack 'acme/widget.git'"])
        .output()
        .expect("run the shim");
    assert_eq!(out.status.code(), Some(255));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("svc: the git SSH relay (/nonexistent/git-ssh.sock)"),
        "{err}"
    );
}
