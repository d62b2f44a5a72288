//! The `svc` command line against a world's svcd: run as root or as another user, asserted,
//! and the set-ups many tests share (a sandbox allowing hosts, one with the example host's
//! secret, `svc workspace up`).

use std::process::{Command, Output, Stdio};

use super::{CLI_LIMIT, EXAMPLE_TOKEN, World, workspace_bin};

impl World {
    /// Run `svc` against this svcd (for at most [`CLI_LIMIT`]: a command that hangs fails
    /// its test with svcd's log).
    pub fn svc(&self, args: &[&str]) -> Output {
        self.svc_env(args, &[])
    }

    /// `svc ARGS` against this svcd, not yet run: for a test that spawns it, pipes it or
    /// signals it.
    pub fn svc_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(workspace_bin("svc"));
        c.args(args).env("SVC_SOCKET", &self.socket);
        c
    }

    /// `svc sandbox exec NAME -- sh -c SCRIPT`, not yet run, every stream piped (a piped stdin
    /// is forwarded: the command's input ends when the caller's does).
    pub fn sh_command(&self, name: &str, script: &str) -> Command {
        let mut c = self.svc_command(&["sandbox", "exec", name, "--", "sh", "-c", script]);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// [`World::svc`] with environment variables set.
    pub fn svc_env(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = self.svc_command(args);
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

    /// `svc ARGS` with `value` and a newline on its standard input (as a secret's value is
    /// given), run to its end.
    pub fn svc_stdin(&self, args: &[&str], value: &str) -> Output {
        use std::io::Write as _;
        let mut child = self
            .svc_command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("svc");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(format!("{value}\n").as_bytes())
            .expect("write");
        child.wait_with_output().expect("svc")
    }

    /// `svc secret set NAME --pod-namespace NS…` with `value` on its standard input, which
    /// must succeed: pods of `namespaces` may name it.
    pub fn store_secret(&self, name: &str, value: &str, namespaces: &[&str]) {
        let mut args = vec!["secret", "set", name];
        for ns in namespaces {
            args.extend(["--pod-namespace", ns]);
        }
        let out = self.svc_stdin(&args, value);
        assert!(out.status.success(), "svc secret set {name}: {out:?}");
    }

    /// `svc …`, asserting success; its stdout.
    pub fn svc_ok(&self, args: &[&str]) -> String {
        self.succeeded(args, self.svc(args))
    }

    /// `out` of `svc ARGS`, asserting success (with svcd's log); its stdout.
    pub fn succeeded(&self, args: &[&str], out: Output) -> String {
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

    /// The two container sandboxes of a flood test: `flood` (the attacking guest, allowed
    /// allowed.example.test) and `calm` (allowed nothing), whose service must go on.
    pub fn flood_and_calm(&self) {
        self.svc_ok(&[
            "sandbox",
            "create",
            "flood",
            "--backend",
            "container",
            "--allow-host",
            "allowed.example.test",
        ]);
        self.svc_ok(&["sandbox", "create", "calm", "--backend", "container"]);
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

    /// svcd's events of `kind` about sandbox `name` so far (`svc events --json`).
    pub fn events(&self, kind: &str, name: &str) -> Vec<serde_json::Value> {
        self.svc_ok(&["events", "--json"])
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e["kind"] == kind && e["sandbox"] == name)
            .collect()
    }

    /// [`World::events`], asked again every 100 ms (at most `tries` times) until `enough`
    /// holds of them; the last answer, for the test to assert on.
    pub fn events_until(
        &self,
        kind: &str,
        name: &str,
        tries: u32,
        enough: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let mut seen = Vec::new();
        for _ in 0..tries {
            seen = self.events(kind, name);
            if enough(&seen) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        seen
    }

    /// curl's exit code for `url` from inside sandbox `name` (at most 5 s, the body dropped).
    pub fn curl_rc(&self, name: &str, url: &str) -> i32 {
        self.sh(name, &format!("curl -sS -o /dev/null --max-time 5 {url}"))
            .0
    }

    /// `svc sandbox show NAME --json`.
    pub fn show(&self, name: &str) -> serde_json::Value {
        serde_json::from_str(&self.svc_ok(&["sandbox", "show", name, "--json"])).expect("show json")
    }

    /// `POST /v1/sandboxes/NAME/exec` of `body` as root: (HTTP status, body).
    pub fn api_exec(&self, name: &str, body: &serde_json::Value) -> (u16, String) {
        let path = format!("/v1/sandboxes/{name}/exec");
        self.api(&[], "POST", &path, Some(body.to_string().as_bytes()))
    }

    /// `curl` to svcd's API socket as root (or under `ids`, setpriv's): (HTTP status, body).
    pub fn api(
        &self,
        ids: &[&str],
        method: &str,
        path: &str,
        body: Option<&[u8]>,
    ) -> (u16, String) {
        let file = self.dir.join(format!("body-{}", crate::unique("b")));
        let mut c = if ids.is_empty() {
            Command::new("curl")
        } else {
            let mut c = Command::new("setpriv");
            c.args(ids).arg("curl");
            c
        };
        c.args(["-s", "-o", "-", "-w", "\n%{http_code}", "--path-as-is"])
            .arg("--unix-socket")
            .arg(&self.socket)
            .args(["-X", method]);
        if let Some(b) = body {
            std::fs::write(&file, b).expect("body file");
            c.args(["-H", "Content-Type: application/json", "--data-binary"])
                .arg(format!("@{}", file.display()));
            use std::os::unix::fs::PermissionsExt as _;
            let _ = std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644));
        }
        c.arg(format!("http://svcd{path}"));
        let out: Output = c.output().expect("curl");
        let _ = std::fs::remove_file(&file);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }
}

/// `svc doctor --microvm --json DIR` with no svcd to ask (its socket a path that does not
/// exist) and without the microvm image variables: the host probes read this machine.
pub fn offline_microvm_doctor(dir: &std::path::Path) -> Command {
    let mut c = Command::new(workspace_bin("svc"));
    c.args([
        "--socket",
        "/nonexistent/svcd.sock",
        "doctor",
        "--microvm",
        "--json",
    ])
    .arg(dir)
    .env_remove("SVC_MICROVM_KERNEL")
    .env_remove("SVC_MICROVM_ROOTFS");
    c
}
