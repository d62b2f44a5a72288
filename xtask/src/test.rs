//! Every gate and every test, in the order a failure is cheapest to find.

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, bail};

use crate::ui;

pub fn run(cargo_test_args: &[String]) -> anyhow::Result<()> {
    ui::heading("gate: cargo fmt --check");
    ui::run(Command::new("cargo").args(["fmt", "--all", "--", "--check"]))?;
    ui::ok("formatted");

    ui::heading(
        "gate: cargo clippy --workspace --all-targets -- -D warnings (eBPF crate included)",
    );
    ui::run(Command::new("cargo").args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    ui::ok("no lints");

    ui::heading("gate: cargo deny check");
    deny()?;

    ui::heading("tests: cargo test --workspace (privileged tests run for real: eBPF, netns, veth)");
    room_for_the_test_build()?;
    ui::run_within(
        Command::new("cargo")
            .args(["test", "--workspace", "--no-fail-fast"])
            .args(cargo_test_args)
            // `cargo xtask` runs quietly (`.cargo/config.toml`), and this cargo would inherit
            // it: no `Running <target>` lines, no test names. A run's log names each target,
            // each test and each target's time. (Build scripts stay quiet: cargo gives them
            // the setting itself.)
            .env_remove("CARGO_TERM_QUIET"),
        TEST_LIMIT,
    )?;
    ui::ok("all gates and tests passed");
    Ok(())
}

/// The longest the test step may take, its build included: in a clean-clone run on this
/// machine kind (2 cores, 2026-11-27) the test targets' own times summed to 21 minutes, and the
/// test build adds several; past this, something hangs. The step's time is printed ("took").
const TEST_LIMIT: std::time::Duration = std::time::Duration::from_secs(45 * 60);

/// Free space the test build needs on `target/`'s file system when this step starts, measured
/// on a clean clone: the whole of `target/debug` is 5.3 GiB after a full run (test binaries
/// with line tables only), part of it already built by the clippy gate; 6 GiB leaves a margin
/// without refusing a run that would fit.
const TEST_BUILD_GIB: u64 = 6;

/// Refuse to start a build that cannot fit: a full disk fails in the linker with a bus error
/// half an hour in, naming nothing useful.
fn room_for_the_test_build() -> anyhow::Result<()> {
    let out = ui::output(Command::new("df").args(["--output=avail", "-B1", "target"]))?;
    let avail: u64 = out
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .with_context(|| format!("reading free space from df: {out:?}"))?;
    let gib = avail / (1 << 30);
    // A warm tree rebuilds only what changed; a clean one builds everything.
    // (The end-to-end test's binary marks a tree that has built the tests before.)
    let clean = !std::fs::read_dir("target/debug/deps").is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("e2e-"))
    });
    if gib < TEST_BUILD_GIB && !clean {
        ui::warn(&format!(
            "only {gib} GiB free on target/'s file system: a rebuild of what changed may fit; \
             a clean build needs about {TEST_BUILD_GIB} GiB; `cargo clean` drops stale test binaries"
        ));
        return Ok(());
    }
    if gib < TEST_BUILD_GIB {
        bail!(
            "only {gib} GiB free on target/'s file system; the test build needs about \
             {TEST_BUILD_GIB} GiB. Free some (`cargo clean` removes every build, stale test \
             binaries included) and run again."
        );
    }
    ui::info(&format!(
        "{gib} GiB free on target/'s file system (the test build needs about {TEST_BUILD_GIB})"
    ));
    Ok(())
}

fn deny() -> anyhow::Result<()> {
    ui::run(Command::new("cargo").args(["deny", "check", "licenses", "bans", "sources"]))?;
    ui::ok("licences, bans, sources");

    let online = Command::new("cargo")
        .args(["deny", "check", "advisories"])
        .output()
        .context("running cargo deny check advisories")?;
    if online.status.success() {
        ui::ok("advisories and yanked crates (RustSec database fetched)");
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&online.stderr);
    if !stderr.contains("failed to fetch advisory database") {
        eprint!("{stderr}");
        bail!("cargo deny check advisories failed");
    }
    // This machine kind reaches the package registries only, not the RustSec database on
    // GitHub. Say so loudly, and still check for yanked crates against the registry index.
    println!();
    ui::warn("ADVISORIES NOT CHECKED: the RustSec advisory database cannot be fetched from this");
    ui::warn("machine (no network beyond the package registries). Yanked crates are still checked");
    ui::warn(
        "against the crates.io index below. Run `cargo deny check advisories` where GitHub is",
    );
    ui::warn("reachable before a release.");
    println!();
    yanked_only()
}

/// `cargo deny check advisories` against an empty advisory database: only the yanked check
/// has anything to find.
fn yanked_only() -> anyhow::Result<()> {
    let db_root = PathBuf::from("target/advisory-db-offline");
    std::fs::create_dir_all(&db_root)?;
    let config = std::fs::read_to_string("deny.toml")?.replace(
        "[advisories]\n",
        &format!(
            "[advisories]\ndb-path = \"{}\"\n",
            std::fs::canonicalize(&db_root)?.display()
        ),
    );
    let config_path = db_root.join("deny-offline.toml");
    std::fs::write(&config_path, config)?;
    let attempt = || {
        Command::new("cargo")
            .args(["deny", "check", "--disable-fetch", "--config"])
            .arg(&config_path)
            .arg("advisories")
            .output()
    };
    let first = attempt()?;
    if first.status.success() {
        ui::ok("yanked crates (no advisories database)");
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&first.stderr);
    // cargo-deny names the database directory it expected; give it an empty one.
    let Some(dir) = stderr
        .split('"')
        .nth(1)
        .filter(|d| d.contains("advisory-db"))
    else {
        eprint!("{stderr}");
        bail!("cargo deny yanked check failed");
    };
    let dir = PathBuf::from(dir);
    std::fs::create_dir_all(dir.join("crates"))?;
    std::fs::write(dir.join("crates/.keep"), "")?;
    for args in [
        &["init", "-q"][..],
        &["add", "-A"],
        &[
            "-c",
            "user.name=svc",
            "-c",
            "user.email=svc@localhost",
            "commit",
            "-q",
            "-m",
            "empty advisory database",
        ],
    ] {
        ui::output(Command::new("git").arg("-C").arg(&dir).args(args))?;
    }
    let second = attempt()?;
    if !second.status.success() {
        eprint!("{}", String::from_utf8_lossy(&second.stderr));
        bail!("cargo deny found yanked crates");
    }
    ui::ok("yanked crates (no advisories database)");
    Ok(())
}
