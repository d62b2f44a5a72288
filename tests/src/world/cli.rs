//! The `svc` command line against a world's svcd: run as root or as another user, asserted,
//! and the set-ups many tests share (a sandbox allowing hosts, one with the example host's
//! secret, `svc workspace up`).

use std::process::{Command, Output};

use super::{CLI_LIMIT, EXAMPLE_TOKEN, World, workspace_bin};

impl World {
    /// Run `svc` against this svcd (for at most [`CLI_LIMIT`]: a command that hangs fails
    /// its test with svcd's log).
    pub fn svc(&self, args: &[&str]) -> Output {
        self.svc_env(args, &[])
    }

    pub fn svc_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = Command::new(workspace_bin("svc"));
        c.args(args).env("SVC_SOCKET", &self.socket);
        for (k, v) in env {
            c.env(k, v);
        }
        crate::output_within(&mut c, CLI_LIMIT)
            .unwrap_or_else(|e| panic!("{e}\nsvcd log:\n{}", self.svcd_log()))
    }

    /// `svc …` run by another user: `ids` are setpriv's (`--reuid=65534`, `--regid=…`,
    /// `--clear-groups`). The binary is copied (once) where any user may run it.
    pub fn svc_as(&self, ids: &[&str], args: &[&str]) -> Output {
        use std::os::unix::fs::PermissionsExt as _;
        let bin_dir = self.dir.join("bin");
        let svc = bin_dir.join("svc");
        if !svc.exists() {
            std::fs::create_dir_all(&bin_dir).expect("bin dir");
            std::fs::copy(workspace_bin("svc"), &svc).expect("copy svc");
        }
        for p in [&self.dir, &bin_dir, &svc] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let mut c = Command::new("setpriv");
        c.args(ids)
            .arg(&svc)
            .args(args)
            .env("SVC_SOCKET", &self.socket);
        crate::output_within(&mut c, CLI_LIMIT)
            .unwrap_or_else(|e| panic!("{e}\nsvcd log:\n{}", self.svcd_log()))
    }

    /// `svc …`, asserting success; its stdout.
    pub fn svc_ok(&self, args: &[&str]) -> String {
        self.succeeded(args, self.svc(args))
    }

    /// `out` of `svc ARGS`, asserting success (with svcd's log); its stdout.
    fn succeeded(&self, args: &[&str], out: Output) -> String {
        assert!(
            out.status.success(),
            "svc {args:?} failed ({}):\n{}{}\nsvcd log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.svcd_log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `svc sandbox create --allow-host HOST … NAME`, asserting success; its stdout.
    pub fn sandbox_allowing(&self, name: &str, hosts: &[&str]) -> String {
        let mut args = vec!["sandbox", "create"];
        for h in hosts {
            args.extend(["--allow-host", h]);
        }
        args.push(name);
        self.svc_ok(&args)
    }

    /// `svc sandbox create --allow-host allowed.example.test --secret
    /// SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN@SOURCE NAME` (`EXAMPLE` holds [`EXAMPLE_TOKEN`], for
    /// `env:EXAMPLE`), as it went.
    pub fn sandbox_with_example_secret(&self, name: &str, source: &str) -> Output {
        let secret = format!("SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN@{source}");
        self.svc_env(
            &Self::example_secret_args(name, &secret),
            &[("EXAMPLE", EXAMPLE_TOKEN)],
        )
    }

    /// [`World::sandbox_with_example_secret`], asserting success; its stdout.
    pub fn sandbox_with_example_secret_ok(&self, name: &str, source: &str) -> String {
        let secret = format!("SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN@{source}");
        let args = Self::example_secret_args(name, &secret);
        self.succeeded(&args, self.svc_env(&args, &[("EXAMPLE", EXAMPLE_TOKEN)]))
    }

    fn example_secret_args<'a>(name: &'a str, secret: &'a str) -> [&'a str; 7] {
        [
            "sandbox",
            "create",
            "--allow-host",
            "allowed.example.test",
            "--secret",
            secret,
            name,
        ]
    }

    /// The arguments of `svc workspace up --trust DIR --name NAME --backend container`.
    pub fn workspace_up_args<'a>(dir: &'a str, name: &'a str) -> [&'a str; 8] {
        [
            "workspace",
            "up",
            "--trust",
            dir,
            "--name",
            name,
            "--backend",
            "container",
        ]
    }

    /// `svc workspace up --trust DIR --name NAME --backend container`, as it went.
    pub fn workspace_up(&self, dir: &str, name: &str) -> Output {
        self.svc(&Self::workspace_up_args(dir, name))
    }

    /// [`World::workspace_up`], asserting success; its stdout.
    pub fn workspace_up_ok(&self, dir: &str, name: &str) -> String {
        self.svc_ok(&Self::workspace_up_args(dir, name))
    }

    /// `svc sandbox exec NAME -- sh -c SCRIPT`: (exit code, stdout, stderr).
    pub fn sh(&self, name: &str, script: &str) -> (i32, String, String) {
        let out = self.svc(&["sandbox", "exec", name, "--", "sh", "-c", script]);
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `svc sandbox show NAME --json`.
    pub fn show(&self, name: &str) -> serde_json::Value {
        serde_json::from_str(&self.svc_ok(&["sandbox", "show", name, "--json"])).expect("show json")
    }
}
