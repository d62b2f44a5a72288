//! `svcd images build` and `svcd images status` for real: the base tree from this machine's
//! apt sources by the real mmdebstrap, the microvm kernel, initramfs and root file system,
//! into a directory of the test's own (never target/images, which every worktree shares);
//! a second build changes nothing and says so; a changed guest binary is put in without
//! running mmdebstrap again; without mmdebstrap the build is refused, naming the package.
//!
//! The guest binaries are those `cargo xtask images` builds
//! (target/guest/x86_64-unknown-linux-gnu/release).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::SystemTime,
};

use svc_tests::world::workspace_bin;

fn target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")
}

/// The statically linked guest binaries, asserted to be built.
fn guest_bins() -> PathBuf {
    let dir = target().join("guest/x86_64-unknown-linux-gnu/release");
    for bin in [
        "svc-microvm-agent",
        "svc-git-ssh",
        "svc-supervise",
        "svc-init",
    ] {
        assert!(
            dir.join(bin).is_file(),
            "{} is missing: build the guest binaries with `cargo xtask images`",
            dir.join(bin).display()
        );
    }
    dir
}

/// A fresh directory under target/tmp, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Self {
        let dir = target()
            .join("tmp")
            .join(format!("{what}-{}", svc_tests::unique("i")));
        std::fs::create_dir_all(&dir).expect("scratch dir");
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `svcd --config /dev/null images ARGS` (no host configuration: the paths are all given).
fn images(args: &[&str], path_env: Option<&str>) -> Output {
    let mut cmd = Command::new(workspace_bin("svcd"));
    cmd.args(["--config", "/dev/null", "images"]).args(args);
    if let Some(p) = path_env {
        cmd.env("PATH", p);
    }
    cmd.output().expect("running svcd images")
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn json(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", text(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

/// Every path under `dir` with its modification time (what a build that changes nothing
/// leaves as it is).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, SystemTime> {
    let listing = Command::new("find")
        .arg(dir)
        .args(["-maxdepth", "3"])
        .output()
        .expect("find");
    String::from_utf8_lossy(&listing.stdout)
        .lines()
        .map(PathBuf::from)
        .filter_map(|p| {
            let t = std::fs::symlink_metadata(&p).ok()?.modified().ok()?;
            Some((p, t))
        })
        .collect()
}

/// Which steps built something, by name.
fn built(report: &serde_json::Value) -> Vec<String> {
    report["report"]["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter(|s| s["built"] == true)
        .map(|s| s["step"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn a_second_build_changes_nothing_and_a_new_guest_binary_is_put_in_alone() {
    svc_tests::require_root();
    let scratch = Scratch::new("images");
    let out = scratch.0.join("images");
    let out_s = out.to_str().expect("utf-8 path");
    // The guest binaries, copied so the test can change one.
    let bins = scratch.0.join("guest");
    std::fs::create_dir_all(&bins).expect("bins dir");
    for entry in std::fs::read_dir(guest_bins()).expect("guest bins") {
        let p = entry.expect("entry").path();
        if [
            "svc-microvm-agent",
            "svc-git-ssh",
            "svc-supervise",
            "svc-init",
        ]
        .iter()
        .any(|n| p.file_name().is_some_and(|f| f == *n))
        {
            std::fs::copy(&p, bins.join(p.file_name().expect("name"))).expect("copy bin");
        }
    }
    let bins_s = bins.to_str().expect("utf-8 path");
    let where_ = ["--out", out_s, "--guest-bins", bins_s];

    let first = images(&[&["build"][..], &where_, &["--json"]].concat(), None);
    let first = json(&first);
    assert_eq!(
        built(&first),
        [
            "mmdebstrap",
            "guest-binaries",
            "kernel",
            "initramfs",
            "rootfs"
        ],
        "{first:#}"
    );
    for step in first["report"]["steps"].as_array().expect("steps") {
        eprintln!(
            "first build: {} {:.1} s",
            step["step"],
            step["secs"].as_f64().unwrap_or(0.0)
        );
    }
    for f in [
        "base/rootfs/usr/bin/tini",
        "base/rootfs/usr/local/bin/svc-git-ssh",
        "base/stamp",
    ] {
        assert!(out.join(f).exists(), "no {f}");
    }
    for f in ["vmlinuz", "initrd.img", "rootfs.ext4", "stamp"] {
        assert!(out.join("microvm").join(f).exists(), "no microvm/{f}");
    }

    let before = snapshot(&out);
    let again = images(&[&["build"][..], &where_].concat(), None);
    let again_text = text(&again);
    assert!(again.status.success(), "{again_text}");
    assert!(
        again_text.contains("svcd images: up to date: nothing rebuilt"),
        "{again_text}"
    );
    assert!(
        again_text.contains("[mmdebstrap] base tree") && again_text.contains("is current"),
        "{again_text}"
    );
    assert_eq!(snapshot(&out), before, "the second build changed files");

    let status = json(&images(
        &[&["status"][..], &where_, &["--json"]].concat(),
        None,
    ));
    assert_eq!(status["base"]["current"], true, "{status:#}");
    assert_eq!(status["microvm"]["current"], true, "{status:#}");
    let stamp = status["base"]["stamp"].to_string();
    assert!(stamp.contains("packages: ca-certificates"), "{status:#}");

    // A new git SSH shim: the base image is out of date, the shim alone is put in.
    let shim = bins.join("svc-git-ssh");
    let mut bytes = std::fs::read(&shim).expect("shim");
    bytes.extend_from_slice(b"\0changed");
    std::fs::write(&shim, bytes).expect("change the shim");
    let plain = images(&[&["status"][..], &where_].concat(), None);
    let plain_text = String::from_utf8_lossy(&plain.stdout).into_owned();
    assert!(
        plain_text.contains(
            "base: out of date: /usr/local/bin/svc-git-ssh differ from the guest binaries"
        ),
        "{}",
        text(&plain)
    );
    let rebuilt = json(&images(
        &[&["build", "--base-only"][..], &where_, &["--json"]].concat(),
        None,
    ));
    assert_eq!(built(&rebuilt), ["guest-binaries"], "{rebuilt:#}");
    let status = json(&images(
        &[&["status"][..], &where_, &["--json"]].concat(),
        None,
    ));
    assert_eq!(status["base"]["current"], true, "{status:#}");
    assert_eq!(
        status["microvm"]["current"], false,
        "the microvm root file system holds the old base tree: {status:#}"
    );
}

#[test]
fn without_mmdebstrap_the_build_is_refused_naming_the_package() {
    svc_tests::require_root();
    let scratch = Scratch::new("nommdeb");
    let out = scratch.0.join("images");
    let empty = scratch.0.join("empty-path");
    std::fs::create_dir_all(&empty).expect("empty dir");
    let run = images(
        &[
            "build",
            "--out",
            out.to_str().expect("utf-8"),
            "--guest-bins",
            guest_bins().to_str().expect("utf-8"),
        ],
        Some(empty.to_str().expect("utf-8")),
    );
    let t = text(&run);
    assert_eq!(run.status.code(), Some(1), "{t}");
    assert!(
        t.contains(
            "svcd: error: mmdebstrap is not installed (it builds the base tree from Debian \
             packages): install it with `apt install mmdebstrap`"
        ),
        "{t}"
    );
    assert!(!out.exists(), "a refused build made {}", out.display());
}

#[test]
fn status_of_nothing_built_says_so_and_bad_configuration_exits_78() {
    let scratch = Scratch::new("status");
    let out = scratch.0.join("none");
    let where_ = [
        "--out",
        out.to_str().expect("utf-8"),
        "--guest-bins",
        "/nonexistent",
    ];
    let plain = images(&[&["status"][..], &where_].concat(), None);
    let t = text(&plain);
    assert!(plain.status.success(), "{t}");
    assert!(t.contains("base: not built"), "{t}");
    assert!(t.contains("microvm: not built"), "{t}");
    assert!(
        t.contains(&format!("{}", out.join("microvm/vmlinuz").display())),
        "{t}"
    );
    let j = json(&images(
        &[&["status", "--json"][..], &where_].concat(),
        None,
    ));
    for image in ["base", "microvm"] {
        assert_eq!(j[image]["present"], false, "{j:#}");
        assert_eq!(j[image]["current"], false, "{j:#}");
    }

    let bad = scratch.0.join("svcd.toml");
    std::fs::write(&bad, "[container]\nimage = \"relative/base\"\n").expect("config");
    let run = Command::new(workspace_bin("svcd"))
        .arg("--config")
        .arg(&bad)
        .args(["images", "status"])
        .output()
        .expect("svcd");
    assert_eq!(run.status.code(), Some(78), "{}", text(&run));
    assert!(text(&run).contains("container.image"), "{}", text(&run));
}

/// A build that would replace svcd.toml's images is refused while a sandbox's guest runs on
/// them, naming it; with no guest running, the same build goes on (here to the missing
/// mmdebstrap, so nothing is built either way).
#[test]
fn a_build_under_a_running_guest_is_refused_naming_it() {
    svc_tests::require_root();
    let scratch = Scratch::new("running");
    let state = scratch.0.join("state");
    let base = scratch.0.join("images/base");
    let config = scratch.0.join("svcd.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = \"{}\"\n\n[container]\nimage = \"{}\"\n",
            state.display(),
            base.display()
        ),
    )
    .expect("config");
    let mut guest = Command::new("sleep").arg("60").spawn().expect("sleep");
    let pid = guest.id();
    {
        let mut store = svc_control::store::Store::open(&state).expect("store");
        store
            .reserve("busy", "{}", "2026-11-26T00:00:00Z", 16)
            .expect("reserve");
        let start = svc_control::runtime::start_time(pid).expect("the guest's start time");
        store
            .set_running("busy", "{}", "", "", pid, start, &[])
            .expect("running");
    }
    let empty = scratch.0.join("empty-path");
    std::fs::create_dir_all(&empty).expect("empty dir");
    let build = || {
        Command::new(workspace_bin("svcd"))
            .arg("--config")
            .arg(&config)
            .args(["images", "build", "--force", "--base-only", "--guest-bins"])
            .arg(guest_bins())
            .env("PATH", &empty)
            .output()
            .expect("svcd")
    };
    let refused = build();
    let t = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{t}");
    assert!(
        t.contains("svcd: error: 1 sandbox guest(s) run on these images (busy)"),
        "{t}"
    );
    assert!(!base.exists(), "a refused build made {}", base.display());

    guest.kill().expect("kill");
    guest.wait().expect("wait");
    let after = build();
    let t = text(&after);
    assert!(t.contains("mmdebstrap is not installed"), "{t}");
}
