//! The main job: build svc, svcd and the demo, then run the demo (`tests/src/bin/svc-demo.rs`):
//! an outside world in network namespaces, the real svcd, a sandbox created with the real
//! `svc`, and what it can and cannot reach. Everything it makes it removes.

use std::process::Command;

use anyhow::bail;

use crate::ui;

pub fn run(backend: &str) -> anyhow::Result<()> {
    ui::heading("build: svc, svcd and the demo's outside world");
    build_bins(false)?;
    let status = Command::new("target/debug/svc-demo")
        .arg(format!("--backend={backend}"))
        .status()?;
    if !status.success() {
        bail!("the demo failed ({status})");
    }
    Ok(())
}

/// Build svc, svcd and the tests crate's programs (the demo, the outside world, the benchmarks).
pub fn build_bins(release: bool) -> anyhow::Result<()> {
    let mut cmd = Command::new("cargo");
    cmd.args(["build", "--quiet"]);
    if release {
        cmd.arg("--release");
    }
    ui::run(cmd.args([
        "-p",
        "svc-cli",
        "-p",
        "svc-control",
        "-p",
        "svc-tests",
        "--bins",
    ]))
}
