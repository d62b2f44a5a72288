//! What the CLI's integration tests share: the `svc` binary built for them, run as a user
//! runs it, and paths in the repository.
#![allow(
    dead_code,
    reason = "each test file uses a different part of the helpers"
)]

use std::{
    path::{Path, PathBuf},
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

/// A temporary project: its `.svc` directory made and each `(path, text)` of `files` (paths
/// relative to it, such as `.svc/config.yaml`) written. Removed when dropped.
pub fn project(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join(".svc")).expect("mkdir .svc");
    for (f, body) in files {
        std::fs::write(dir.path().join(f), body).expect("write a project file");
    }
    dir
}

/// A temporary directory holding one file `name` with `body`: the directory (removed when
/// dropped) and the file's path.
pub fn temp_file(name: &str, body: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    std::fs::write(&path, body).expect("write the file");
    (dir, path)
}
