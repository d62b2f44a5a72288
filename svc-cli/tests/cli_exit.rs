//! svc's exit status means one thing whichever command ends with it (docs/cli.md): 2 usage,
//! 78 invalid configuration, 125 exec could not run, 1 any other failure; and a caller the API
//! socket keeps out is told which group may use svcd and how to join it.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper that cannot run svc should panic"
)]

mod common;

use std::{
    os::unix::{fs::PermissionsExt as _, net::UnixListener},
    process::Output,
};

use common::{output, project, svc, svc_command};

/// `svc ARGS` against a socket nobody listens on.
fn unreachable(args: &[&str]) -> Output {
    output(
        svc_command()
            .args(args)
            .env("SVC_SOCKET", "/nonexistent/svc-cli-tests/svcd.sock"),
    )
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn usage_errors_exit_2() {
    let out = svc(&["sandbox", "exec", "dev"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("<CMD>"), "{}", stderr(&out));
    let out = svc(&["--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn exec_takes_the_command_without_dashes_and_its_flags_are_the_commands() {
    // Past the parser each time (to svcd, which is not there: 125), never a usage error.
    for args in [
        &["sandbox", "exec", "dev", "ls", "-la"][..],
        &["sandbox", "exec", "dev", "--", "ls", "-la"],
        &[
            "sandbox", "exec", "-i", "-w", "/tmp", "dev", "sh", "-c", "exit 3",
        ],
        &[
            "sandbox",
            "exec",
            "dev",
            "grep",
            "-e",
            "x",
            "--color",
            "/etc/passwd",
        ],
    ] {
        let out = unreachable(args);
        assert_eq!(out.status.code(), Some(125), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("cannot reach svcd"),
            "{}",
            stderr(&out)
        );
    }
}

#[test]
fn an_unreachable_svcd_is_125_for_exec_and_1_otherwise() {
    let out = unreachable(&["sandbox", "exec", "dev", "true"]);
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    let out = unreachable(&["sandbox", "list"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("(is it running?"),
        "ENOENT keeps the hint: {}",
        stderr(&out)
    );
}

#[test]
fn invalid_configuration_exits_78_from_config_check_and_doctor() {
    let dir = project(&[(
        ".svc/workspace.json",
        r#"{"version": 1, "capabilities": {"required": ["teleport"]}}"#,
    )]);
    let path = dir.path().to_str().expect("utf-8");
    for args in [&["config", "check", path][..], &["doctor", path]] {
        let out = unreachable(args);
        assert_eq!(out.status.code(), Some(78), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains("teleport"), "{}", stderr(&out));
    }
}

/// The group svc should name: one the caller (nobody, with no groups) is not in.
const SOCKET_GROUP: (u32, &str) = (4, "adm");

#[test]
fn a_caller_outside_the_api_group_is_told_the_group_and_the_fix() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test runs svc as another user (setpriv): run it as root"
    );
    let group = std::fs::read_to_string("/etc/group").expect("/etc/group");
    assert!(
        group
            .lines()
            .any(|l| l.starts_with(&format!("{}:x:{}:", SOCKET_GROUP.1, SOCKET_GROUP.0))),
        "this test needs the group {} with gid {}",
        SOCKET_GROUP.1,
        SOCKET_GROUP.0
    );
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let socket = dir.path().join("svcd.sock");
    let _listener = UnixListener::bind(&socket).expect("bind");
    std::os::unix::fs::chown(&socket, Some(0), Some(SOCKET_GROUP.0)).expect("chown");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o660)).expect("chmod");
    let as_nobody = |args: &[&str]| {
        output(
            std::process::Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(env!("CARGO_BIN_EXE_svc"))
                .args(args)
                .env("SVC_SOCKET", &socket),
        )
    };
    let said = format!(
        "svc: error: permission denied on {}: your user is not in the group 'adm' that may use \
         svcd; ask an administrator to run: usermod -aG adm $USER (then log in again)\n",
        socket.display()
    );
    let out = as_nobody(&["sandbox", "list"]);
    assert_eq!(stderr(&out), said);
    assert_eq!(out.status.code(), Some(1));
    let out = as_nobody(&["sandbox", "exec", "dev", "true"]);
    assert_eq!(stderr(&out), said);
    assert_eq!(out.status.code(), Some(125));
}
