//! What the CLI's integration tests share: the `svc` binary built for them, run as a user
//! runs it, and paths in the repository.
#![allow(
    dead_code,
    reason = "each test file uses a different part of the helpers"
)]

use std::{
    path::Path,
    process::{Command, Output},
};

/// The `svc` binary built for these tests, to add arguments and surroundings to.
pub fn svc_command() -> Command {
    Command::new(env!("CARGO_BIN_EXE_svc"))
}

/// Run `cmd` to the end; a `svc` that cannot be started fails the test.
pub fn output(cmd: &mut Command) -> Output {
    cmd.output().expect("run svc")
}

/// `svc ARGS`, run to the end.
pub fn svc(args: &[&str]) -> Output {
    output(svc_command().args(args))
}

/// A path in the repository (`examples/workspace`, `schema/workspace.v1.json`).
pub fn repo(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
        .display()
        .to_string()
}
