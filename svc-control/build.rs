//! Builds `svc-ebpf` for `bpfel-unknown-none` with the nightly toolchain and embeds the object.
//!
//! There is no fallback: a missing prerequisite fails the build with a message naming it and
//! the one command that installs it.
use std::{path::Path, process::Command};

use anyhow::{Context as _, anyhow, bail};

const SETUP: &str = "cargo xtask setup";

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    if std::env::var_os("AYA_BUILD_SKIP").is_some() {
        bail!("AYA_BUILD_SKIP is set, but svc never builds without its eBPF programs; unset it");
    }
    check_prerequisites()?;

    let metadata = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .iter()
        .find(|p| p.name.as_str() == "svc-ebpf")
        .ok_or_else(|| anyhow!("package svc-ebpf not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("no parent for {}", ebpf.manifest_path))?;
    // The contract crate is compiled into the object too.
    let common = root_dir.join("../svc-ebpf-common");
    println!("cargo:rerun-if-changed={common}");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "svc-ebpf",
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
}

/// The three things the eBPF build needs beyond stable Rust.
fn check_prerequisites() -> anyhow::Result<()> {
    let sysroot = Command::new("rustup")
        .args(["run", "nightly", "rustc", "--print", "sysroot"])
        .output();
    let sysroot = match sysroot {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        _ => bail!(
            "building svc's eBPF programs needs the nightly Rust toolchain (via rustup), \
             which was not found; run `{SETUP}`"
        ),
    };
    let rust_src = Path::new(&sysroot).join("lib/rustlib/src/rust/library/core");
    if !rust_src.is_dir() {
        bail!(
            "building svc's eBPF programs needs the rust-src component of the nightly toolchain \
             ({} is missing); run `{SETUP}` (or `rustup component add rust-src --toolchain nightly`)",
            rust_src.display()
        );
    }
    let linker = Command::new("bpf-linker").arg("--version").output();
    if !matches!(linker, Ok(ref out) if out.status.success()) {
        bail!(
            "building svc's eBPF programs needs bpf-linker on PATH, which was not found; run \
             `{SETUP}` (it builds bpf-linker against Debian's llvm-22-dev)"
        );
    }
    Ok(())
}
