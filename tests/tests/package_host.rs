//! The installed package run on this host: svcd from the installed tree (the Debian root's
//! binaries, the packaged unit's command line, the packaged configuration) serves a sandbox;
//! installing a newer build over it runs the real maintainer scripts, whose postinst
//! re-executes svcd in place (the sandbox is re-adopted, its fence never opens); `dpkg -r`'s
//! prerm stops svcd and then the sandbox's guest, whose state stays.
//!
//! What stands in for a host, and why: svcd runs in the test world (tests/src/world.rs) with the
//! packaged `/etc/svc/svcd.toml` plus the world's own settings appended (its state, socket and
//! pin paths, the test hosts, the outside world's DNS and CA: what an operator edits in the
//! conffile) and `--config` naming that file (what a drop-in's `ExecStart=` would add). A chroot
//! has no systemd: for the upgrade and removal the root gets `/run/systemd/system` and a
//! `systemctl` that does what systemd would for the calls the scripts make (daemon-reload;
//! is-active and stop of svcd.service act on the world's svcd by its pid).

#[path = "package/root.rs"]
mod root;

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use root::{Root, deb, field, rebuilt_as, sh, target};
use serde_json::Value;
use svc_tests::{
    require_root,
    world::{CLI_LIMIT, World, workspace_bin},
};

/// The packaged unit's `ExecStart=` words.
fn exec_start(root: &Root) -> Vec<String> {
    let unit = root.read("/lib/systemd/system/svcd.service");
    unit.lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .unwrap_or_else(|| panic!("the packaged unit has no ExecStart=:\n{unit}"))
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

/// A fresh root with the package installed, and a world whose svcd is the root's, started
/// as the packaged unit starts it, with the packaged configuration.
fn installed() -> (Root, World) {
    let deb = deb();
    let root = Root::fresh(&deb);
    let first = root.put(&deb, "svc.deb");
    root.run(&format!("dpkg -i {first} 2>&1"));
    let argv = exec_start(&root);
    assert_eq!(argv, ["/usr/sbin/svcd", "run"], "the unit's command line");
    // World runs `BINARY --config FILE run`: the unit's words with a drop-in's --config.
    let w = World::start_installed(&root.path(&argv[0]), &root.read("/etc/svc/svcd.toml"));
    (root, w)
}

/// The root's `svc ARGS` against the world's svcd.
fn svc(root: &Root, w: &World, args: &[&str]) -> Output {
    let mut c = Command::new(root.path("/usr/bin/svc"));
    c.args(args)
        .env("SVC_SOCKET", &w.socket)
        .env("NO_COLOR", "1");
    svc_tests::output_within(&mut c, CLI_LIMIT)
        .unwrap_or_else(|e| panic!("{e}\nsvcd log:\n{}", w.svcd_log()))
}

/// [`svc`], which must succeed; its standard output.
fn svc_ok(root: &Root, w: &World, args: &[&str]) -> String {
    w.succeeded(args, svc(root, w, args))
}

/// The root's `svc sandbox create --allow-host allowed.example.test NAME`.
fn create_allowing_the_allowed_host(root: &Root, w: &World, name: &str) {
    svc_ok(
        root,
        w,
        &[
            "sandbox",
            "create",
            "--allow-host",
            "allowed.example.test",
            name,
        ],
    );
}

/// The number field `key` of a sandbox as `svc sandbox show --json` gives it.
fn num(s: &Value, key: &str) -> u32 {
    s[key]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or_else(|| panic!("no {key} in {s}"))
}

#[test]
fn svcd_from_the_installed_tree_serves_a_sandbox() {
    require_root();
    let (root, w) = installed();
    assert_eq!(
        std::fs::read_link(format!("/proc/{}/exe", w.svcd_pid().expect("svcd")))
            .expect("svcd's binary"),
        root.path("/usr/sbin/svcd"),
        "the installed svcd runs"
    );
    // `svc doctor` is green: it exits 0 and no required probe failed.
    let ws = w.dir.join("doctor-ws");
    std::fs::create_dir_all(&ws).expect("workspace");
    let out = svc(&root, &w, &["doctor", "--json", &ws.display().to_string()]);
    let report: Value = serde_json::from_slice(&out.stdout).expect("the doctor's report");
    let failed: Vec<&Value> = report["results"]
        .as_array()
        .expect("results")
        .iter()
        .filter(|r| r["status"] == "failed" && r["required"] == true)
        .collect();
    assert!(
        out.status.success() && failed.is_empty(),
        "svc doctor is not green: {failed:#?}\n{report:#}"
    );
    assert!(
        report["results"]
            .as_array()
            .expect("results")
            .iter()
            .any(|r| r["name"] == "host:svcd" && r["status"] == "passed"),
        "the doctor reached the installed svcd: {report:#}"
    );

    create_allowing_the_allowed_host(&root, &w, "pk");
    let got = svc_ok(
        &root,
        &w,
        &[
            "sandbox",
            "exec",
            "pk",
            "--",
            "curl",
            "-sS",
            "--max-time",
            "10",
            "https://allowed.example.test/installed",
        ],
    );
    assert!(got.contains("allowed.example.test"), "{got}");
    let s = w.show("pk");
    let link = s["link"].as_str().expect("link").to_owned();
    svc_ok(&root, &w, &["sandbox", "destroy", "pk"]);
    w.assert_gone(num(&s, "id"), &link, num(&s, "pid"), "pk");
}

#[test]
fn an_upgrade_readopts_the_sandbox_and_remove_stops_it_keeping_its_state() {
    require_root();
    let (root, mut w) = installed();
    let systemd = Systemd::stand_in(&root, &w);
    create_allowing_the_allowed_host(&root, &w, "up");
    let before = w.show("up");
    let guest = num(&before, "pid");
    let svcd = w.svcd_pid().expect("svcd");
    let traffic = Traffic::start(&w, guest);

    // The newer build: dpkg unpacks it over the running svcd's binary; its postinst runs
    // `svc supervisor-upgrade --force`, which re-executes the new binary in place.
    let work = target().join("tmp").join(svc_tests::unique("deb"));
    std::fs::create_dir_all(&work).expect("work");
    let version = format!("{}+upgrade1", field(&deb(), "Version"));
    let newer = root.put(&rebuilt_as(&deb(), &version, &work), "svc-newer.deb");
    let _ = std::fs::remove_dir_all(&work);
    let out = systemd.dpkg(&format!("-i {newer}"));
    assert!(
        out.contains(&format!("svcd (pid {svcd}) is re-executing"))
            && out.contains("1 sandboxes re-adopted"),
        "postinst re-executed svcd:\n{out}\n{}",
        w.svcd_log()
    );
    let calls = systemd.calls();
    assert!(
        calls.iter().any(|c| c == "--quiet is-active svcd.service")
            && calls
                .iter()
                .all(|c| c == "--quiet is-active svcd.service" || c == "--system daemon-reload"),
        "the upgrade asked whether svcd runs, and neither restarted nor stopped it: {calls:?}"
    );
    assert_eq!(w.svcd_pid(), Some(svcd));
    assert_eq!(
        std::fs::read_link(format!("/proc/{svcd}/exe")).expect("svcd's binary"),
        root.path("/usr/sbin/svcd"),
        "svcd runs the newly installed binary (not the replaced one)"
    );
    let after = w.show("up");
    for key in ["id", "pid"] {
        assert_eq!(after[key], before[key], "{key}: {after}");
    }
    assert_eq!(after["state"], "running", "{after}");
    let (code, out, err) = w.sh(
        "up",
        "curl -sS --max-time 10 https://allowed.example.test/after",
    );
    assert_eq!(code, 0, "{err}\n{}", w.svcd_log());
    assert!(out.contains("allowed.example.test"), "{out}");
    traffic.stop_and_check(&w);

    removed(systemd, &mut w, svcd, guest);
}

/// `dpkg -r svc` with svcd (pid `svcd`) running sandbox `up` (guest `guest`): prerm stops
/// svcd, then the guest; the sandbox's state stays, and a later svcd lists it as dead and
/// destroys it.
fn removed(systemd: Systemd<'_>, w: &mut World, svcd: u32, guest: u32) {
    let out = systemd.dpkg("-r svc");
    assert!(
        out.contains(&format!(
            "svcd stop-sandboxes: sandbox up: stopped (pid {guest})"
        )),
        "{out}"
    );
    assert!(
        systemd.calls().iter().any(|c| c == "stop svcd.service"),
        "prerm stopped svcd: {:?}",
        systemd.calls()
    );
    assert!(!alive(svcd), "svcd still runs after remove");
    assert!(!alive(guest), "the guest outlived remove");
    assert!(
        !systemd.root.path("/usr/sbin/svcd").exists(),
        "svcd removed"
    );
    assert!(
        w.dir.join("state/sandboxes/up").is_dir(),
        "remove keeps the sandbox's state"
    );
    drop(systemd);

    // A later svcd lists it as dead, and destroys it: its row and files go. (Not checked: its
    // allow-map entries, which teardown finds only through the link, gone with the guest's
    // network namespace; they stay pinned until purge.)
    w.kill_svcd();
    w.svcd_exe = workspace_bin("svcd");
    w.start_svcd();
    assert_eq!(w.show("up")["state"], "dead");
    w.svc_ok(&["sandbox", "destroy", "up"]);
    assert!(
        !w.dir.join("state/sandboxes/up").exists(),
        "destroy removes the stopped sandbox's state"
    );
    assert!(
        !w.svc_ok(&["sandbox", "list", "-o", "name"])
            .lines()
            .any(|l| l == "up"),
        "destroy removes its row"
    );
}

/// Whether process `pid` runs (exists and is no zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

/// Traffic to the forbidden host from inside a sandbox that does not go through svcd
/// (`nsenter` into the guest's network namespace), looping until stopped: by address and
/// by name pinned to its address. None of it may ever connect.
struct Traffic {
    child: std::process::Child,
    log: PathBuf,
    stop: PathBuf,
}

impl Traffic {
    fn start(w: &World, guest: u32) -> Self {
        let log = w.dir.join("traffic.log");
        let stop = w.dir.join("traffic.stop");
        let script = format!(
            "while [ ! -e {stop} ]; do \
               if curl -s --connect-timeout 0.3 -k https://192.0.2.66/ >/dev/null 2>&1; then echo OPEN-literal; else echo closed; fi; \
               if curl -s --connect-timeout 0.3 --resolve forbidden.example.test:443:192.0.2.66 -k https://forbidden.example.test/ >/dev/null 2>&1; then echo OPEN-name; fi; \
             done > {log}",
            stop = stop.display(),
            log = log.display()
        );
        let child = Command::new("nsenter")
            .args(["--target", &guest.to_string(), "--net"])
            .args(["sh", "-c", &script])
            .stdout(Stdio::null())
            .spawn()
            .expect("traffic");
        Self { child, log, stop }
    }

    /// Stop the loop; it must have run and never connected.
    fn stop_and_check(mut self, w: &World) {
        std::fs::write(&self.stop, "").expect("stop file");
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "the traffic loop hung");
            std::thread::sleep(Duration::from_millis(100));
        }
        let results = std::fs::read_to_string(&self.log).expect("traffic log");
        assert!(
            results.lines().count() >= 5,
            "too little traffic: {results}"
        );
        assert!(!results.contains("OPEN"), "the fence opened:\n{results}");
        let received = w.received();
        assert!(
            !received
                .iter()
                .any(|r| r["name"] == "forbidden.example.test"
                    || r["name"] == "forbidden.example.test."
                    || r["host"] == "forbidden.example.test"),
            "the forbidden host saw something: {received:?}"
        );
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The root made to look like a host whose systemd runs the world's svcd, for the maintainer
/// scripts: `/run/systemd/system`; a `systemctl` first on PATH that does what systemd would
/// for the scripts' calls (and logs them), acting on svcd by its pid; the image directory
/// postinst looks for; the world's svcd.toml as the root's /etc/svc/svcd.toml (the operator's
/// edited conffile); and mounts: /proc, the world's directory at its own path (the
/// configuration's paths) and at /run/svc (svc's default socket). Unmounted on drop.
struct Systemd<'a> {
    root: &'a Root,
    mounts: Vec<PathBuf>,
}

const SYSTEMCTL: &str = r#"#!/bin/sh
# systemd's stand-in in this test root: the maintainer scripts' calls, done as systemd would.
echo "$*" >> /run/systemctl.log
pid=$(cat /run/svcd.mainpid)
alive() { [ -e "/proc/$pid" ] && ! grep -q '^State:.*[ZX]' "/proc/$pid/status"; }
case "$*" in
    "--system daemon-reload") exit 0 ;;
    "--quiet is-active svcd.service") alive ;;
    "stop svcd.service")
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 300); do alive || exit 0; sleep 0.1; done
        echo "systemctl: svcd (pid $pid) did not stop" >&2; exit 1 ;;
    *) echo "systemctl: unexpected call: $*" >&2; exit 1 ;;
esac
"#;

impl<'a> Systemd<'a> {
    fn stand_in(root: &'a Root, w: &World) -> Self {
        use std::os::unix::fs::PermissionsExt as _;
        let mut me = Self {
            root,
            mounts: Vec::new(),
        };
        let systemctl = root.path("/usr/local/sbin/systemctl");
        std::fs::write(&systemctl, SYSTEMCTL).expect("systemctl");
        std::fs::set_permissions(&systemctl, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        for dir in [
            "/run/systemd/system",
            "/var/lib/svc/images/base/rootfs",
            "/run/svc",
        ] {
            std::fs::create_dir_all(root.path(dir)).expect("dir");
        }
        let pid = w.svcd_pid().expect("svcd").to_string();
        std::fs::write(root.path("/run/svcd.mainpid"), pid).expect("main pid");
        std::fs::copy(&w.config, root.path("/etc/svc/svcd.toml")).expect("svcd.toml");
        me.mount(&["-t", "proc", "proc"], &root.path("/proc"));
        let world = w.dir.display().to_string();
        let inside = root.path(&world);
        std::fs::create_dir_all(&inside).expect("world dir in the root");
        me.mount(&["--bind", &world], &inside);
        me.mount(&["--bind", &world], &root.path("/run/svc"));
        me
    }

    fn mount(&mut self, how: &[&str], at: &Path) {
        sh(Command::new("mount").args(how).arg(at));
        self.mounts.push(at.to_owned());
    }

    /// `dpkg ARGS` in the root, which must succeed; what it and the scripts said.
    fn dpkg(&self, args: &str) -> String {
        sh(self.root.command(&format!("dpkg {args} 2>&1")).env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ))
    }

    /// The systemctl calls so far.
    fn calls(&self) -> Vec<String> {
        self.root
            .read("/run/systemctl.log")
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Systemd<'_> {
    fn drop(&mut self) {
        for at in self.mounts.iter().rev() {
            let ok = Command::new("umount")
                .arg(at)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(at).status();
            }
        }
    }
}
