//! Files the end-to-end tests set up on the host: project directories (`.svc/workspace.json`,
//! `.svc/config.yaml`), their owners, throwaway directories, and the text of what a command
//! said.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use crate::world::World;

/// The smallest workspace file: `.svc/workspace.json` with only its version.
pub const MINIMAL_WORKSPACE: (&str, &str) = (".svc/workspace.json", r#"{"version":1}"#);

/// What a command said: its standard output, then its standard error.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `path` as UTF-8 (the tests' own paths always are), for command lines.
pub fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8")
}

/// `chown -R UID:GID DIR`, which must succeed.
pub fn chown_tree(dir: &Path, uid: u32, gid: u32) {
    let out = Command::new("chown")
        .args(["-R", &format!("{uid}:{gid}")])
        .arg(dir)
        .output()
        .expect("chown");
    assert!(out.status.success(), "chown: {out:?}");
}

/// A project at `dir`: its `.svc` directory made and each `(path, text)` of `files` (paths
/// relative to `dir`, such as `.svc/workspace.json`) written.
pub fn project_at(dir: &Path, files: &[(&str, &str)]) -> PathBuf {
    std::fs::create_dir_all(dir.join(".svc")).expect("project dir");
    for (f, body) in files {
        std::fs::write(dir.join(f), body).unwrap_or_else(|e| panic!("writing {f}: {e}"));
    }
    dir.to_path_buf()
}

impl World {
    /// A project `name` under the world's directory (see [`project_at`]), owned by root.
    pub fn project(&self, name: &str, files: &[(&str, &str)]) -> PathBuf {
        project_at(&self.dir.join(name), files)
    }

    /// A project `project` whose `.svc/config.yaml` lets git reach acme/widget on the code
    /// host over SSH ([`crate::world::CODE_SSH_ADDR`]).
    pub fn ssh_project(&self) -> PathBuf {
        let config = format!(
            "egress:\n  policy:\n    {}:\n      repos: [acme/widget]\n",
            crate::world::CODE_SSH_ADDR
        );
        self.project("project", &[(".svc/config.yaml", &config)])
    }

    /// `svc sandbox create NAME --backend BACKEND --workspace DIR --trust EXTRA…`, asserting
    /// success; its stdout.
    pub fn sandbox_in_project(
        &self,
        name: &str,
        backend: &str,
        dir: &Path,
        extra: &[&str],
    ) -> String {
        let mut args = vec!["sandbox", "create", name, "--backend", backend];
        args.extend(["--workspace", path_str(dir), "--trust"]);
        args.extend(extra);
        self.svc_ok(&args)
    }

    /// [`World::project`], then the whole project given to `uid` (its group too).
    pub fn project_owned(&self, name: &str, uid: u32, files: &[(&str, &str)]) -> PathBuf {
        let dir = self.project(name, files);
        chown_tree(&dir, uid, uid);
        dir
    }
}

/// A Python script that exchanges two paths (`argv[1]`, `argv[2]`: `renameat2(RENAME_EXCHANGE)`)
/// as fast as it goes for `argv[3]` seconds: a race against svcd's path checks.
pub const SWAP: &str = r#"
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
a, b = sys.argv[1].encode(), sys.argv[2].encode()
end = time.time() + float(sys.argv[3])
while time.time() < end:
    for _ in range(1000):
        libc.renameat2(-100, a, -100, b, 2)
"#;
