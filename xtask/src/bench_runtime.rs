//! `cargo xtask bench runtime` (issue 31): the OCI runtimes side by side on svcd's bundle.
//! runc (Debian's, the default), crun (Debian's, installed here if missing), youki's
//! libcontainer in-process (`spikes/youki-bench`, its own workspace, built here into
//! `target/youki-bench`), and any newer runtime `spikes/fetch-newer-runtimes.sh` left in
//! `target/runtimes` (runc and crun from Debian sid, which bookworm cannot install).

use std::process::Command;

use anyhow::Context as _;

use crate::{images, ui};

/// Build what the comparison needs and run `runtime-bench` with every runtime found; `args`
/// go to it first (`--rounds N`, `--warm-up N`).
pub fn run(args: &[String]) -> anyhow::Result<()> {
    images::build(&images::default_dir())?;
    if Command::new("crun").arg("--version").output().is_err() {
        ui::heading("bench: installing crun (Debian package) for the comparison");
        ui::run(Command::new("apt-get").args(["install", "-y", "crun"]))?;
    }
    ui::heading("bench: youki's libcontainer (spikes/youki-bench, its own workspace)");
    ui::run(
        Command::new("cargo")
            .args(["build", "--release", "-q", "--manifest-path"])
            .arg("spikes/youki-bench/Cargo.toml")
            .env("CARGO_TARGET_DIR", "target/youki-bench"),
    )?;
    // The driver only spawns runtimes and writes config.json: its own build type does not
    // show in the figures, and the debug build is the one the tests already made.
    ui::run(Command::new("cargo").args([
        "build",
        "-q",
        "-p",
        "svc-tests",
        "--bin",
        "runtime-bench",
    ]))?;
    let mut runtimes = vec![
        format!("runc-{}=runc", version("runc")?),
        format!("crun-{}=crun", version("crun")?),
    ];
    if let Ok(dir) = std::fs::read_dir("target/runtimes") {
        let mut newer: Vec<String> = dir
            .filter_map(Result::ok)
            .filter(|e| e.path().is_file())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                Some(format!("{name}={}", e.path().display()))
            })
            .collect();
        newer.sort();
        runtimes.extend(newer);
    }
    let youki = std::fs::canonicalize("target/youki-bench/release/youki-bench")
        .context("target/youki-bench/release/youki-bench")?;
    ui::run(
        Command::new("target/debug/runtime-bench")
            .args(args)
            .args(runtimes)
            .arg("--lib")
            .arg(format!("libcontainer-0.7.0={}", youki.display())),
    )
}

/// `PROGRAM --version`'s version: the first line's first word with a digit.
fn version(program: &str) -> anyhow::Result<String> {
    let out = Command::new(program)
        .arg("--version")
        .output()
        .with_context(|| format!("running {program} --version"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .next()
        .and_then(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))
        })
        .map(|v| v.split('+').next().unwrap_or(v).to_owned())
        .with_context(|| format!("{program} --version said {text:?}"))
}
