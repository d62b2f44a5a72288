//! `cargo xtask`: the project's own set-up, gates, test runner and demo.
//!
//! - `cargo xtask setup`: install what the build and tests need (idempotent, fast when done).
//! - `cargo xtask test`: set up, then every gate and every test, as CI runs them.
//! - `cargo xtask demo`: set up, then the main job: what a fenced guest can and cannot reach.

mod bench_runtime;
mod crun;
mod demo;
mod images;
mod oci_image;
mod package;
mod setup;
mod test;
mod ui;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", about = "svc's set-up, gates, tests and demo")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install the prerequisites of the build and the demo: Debian packages, nightly rust-src,
    /// bpf-linker, the host accounts (`svcd setup-host`: the API group, the backends' users and
    /// their id ranges); with --tests also what only the tests need (QEMU from backports,
    /// cargo-deny).
    Setup {
        /// Also the tests' prerequisites.
        #[arg(long)]
        tests: bool,
    },
    /// Build the sandboxes' images from Debian packages: the guest binaries (cargo), then
    /// `svcd images build`: the base tree (mmdebstrap with this machine's apt sources) into
    /// OUT/base, and from it the microvm kernel, initramfs and ext4 root file system into
    /// OUT/microvm (default OUT: target/images); each is skipped when current.
    Images {
        /// Where to put the images (the container backend's `container.image` is OUT/base).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// Only the base tree (what the container backend and the demo need).
        #[arg(long)]
        base_only: bool,
    },
    /// Set up, then run every gate (fmt, clippy, deny, lintian on the Debian package) and every
    /// test, as CI does.
    Test {
        /// Extra arguments passed to `cargo test` (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        cargo_test_args: Vec<String>,
    },
    /// Set up, then the main job: svcd, a sandbox created with svc, and what it can and cannot
    /// reach (credentials swapped on the wire, DNS refusals, fence drops, audit, bpftool).
    Demo {
        /// The backend the demo's sandbox runs on: `container` (default) or `microvm`.
        #[arg(long, default_value = "container", value_parser = ["container", "microvm"])]
        backend: String,
    },
    /// Run a benchmark: `policy` (one egress decision, criterion), `fence` (throughput and
    /// per-packet cost with and without the eBPF fence, at scale) or `dns` (the guard's added
    /// latency and cached rate, beside the upstream and dnsmasq) or `proxy` (HTTPS latency, rate
    /// and CPU per request through the proxy beside direct TLS, nginx and mitmproxy, HTTP/1.1
    /// and HTTP/2, leaf minting) or
    /// `sandbox` (svc sandbox create to the first HTTPS request, and destroy, beside runc's
    /// own run, exec and delete of the same bundle) or `microvm` (the lifecycle canary's steps
    /// beside a bare QEMU boot of the same images) or `claim` (a microvm pool claim's guest
    /// step: bare VMs by machine and disk variant, interleaved, with QEMU's CPU time; `--svcd`:
    /// through two svcds at once, `--before SVCD` against an older svcd binary) or `git-ssh` (a clone over SSH through the
    /// relay from a sandbox beside the host's own ssh to the same server) or `scale` (container
    /// sandboxes created up to the largest count live at once: create time, svcd's nftables
    /// step beside a whole-set rewrite, list latency and memory at each count, requests from
    /// 100 at once, destroy-all and what is left; counts as arguments, default 1 100 500 1000)
    /// or `soak` (minutes of steady requests from 10 sandboxes while others are created and
    /// destroyed, then: every request audited once, svcd's descriptors and memory back, no
    /// error in its log; seconds as the argument, default 180) or `runtime` (the OCI runtimes
    /// side by side on svcd's bundle: runc, crun, youki's libcontainer in-process and any newer
    /// one in target/runtimes; create, start, exec and kill + delete, and an idmapped mount
    /// proof each) or `exec` (one `svc sandbox exec` through the guest's init beside one
    /// through `runc exec`, alternating on one svcd; rounds as the argument, default 100).
    Bench {
        /// Which benchmark.
        #[arg(value_parser = ["policy", "fence", "dns", "proxy", "sandbox", "microvm", "claim", "git-ssh", "scale", "soak", "runtime", "exec"])]
        which: String,
        /// Arguments for the benchmark (`scale`: the counts; `soak`: the seconds, default 180;
        /// `fence`: the alternating rounds, default 5; `proxy`: `--rounds N` of each comparison
        /// with nginx, default 5, or `--quick`; `runtime`: `--rounds N`, default 30, and
        /// `--warm-up N`, default 3; `sandbox`: `--id-ranges both` for shared against
        /// per-sandbox id ranges alternating in one run, with `--rounds N`, default 20, or
        /// `--pool [--rounds N]`: cold on crun and on runc 1.1.5 beside the warm pools, default
        /// 50, and the microvm pool, at most 10; `claim`: `--rounds N`, `--variants A,B`, or
        /// `--svcd [--before SVCD | --no-disk] [--idle]`).
        args: Vec<String>,
    },
    /// Build the Debian package `svc_<version>_amd64.deb` (svcd, svc, the guest binaries, man
    /// pages, completions, the systemd unit, the default /etc/svc/svcd.toml, the maintainer
    /// scripts) with dpkg-deb, then check it with lintian.
    Package {
        /// The package's version (default: the workspace's, from Cargo.toml).
        #[arg(long)]
        version: Option<String>,
        /// Package the debug build instead of the release build (what the tests install).
        #[arg(long)]
        debug: bool,
        /// Where the package goes.
        #[arg(long, default_value = "target/package")]
        out: std::path::PathBuf,
        /// Skip lintian.
        #[arg(long)]
        no_lint: bool,
    },
    /// Write svcd's node image for the Kubernetes DaemonSet (deploy/kubernetes) as an OCI image
    /// layout, without Docker: svcd, svc, the guest binaries, the containerd shim when built,
    /// the programs svcd runs for the container backend and their shared libraries. Push it
    /// with `skopeo copy oci:OUT/svc-node:TAG docker://REGISTRY/svc-node:TAG`.
    OciImage {
        /// Build the image from the debug build instead of the release build (what the tests
        /// check).
        #[arg(long)]
        debug: bool,
        /// The directory the layout goes in (as OUT/svc-node).
        #[arg(long, default_value = "target/oci")]
        out: std::path::PathBuf,
        /// The image's tag in the layout (default: the workspace's version).
        #[arg(long)]
        tag: Option<String>,
    },
}

fn bench(which: &str, args: &[String]) -> anyhow::Result<()> {
    ui::heading(&format!("bench: {which}"));
    match which {
        "policy" => ui::run(std::process::Command::new("cargo").args([
            "bench",
            "-p",
            "svc-control",
            "--bench",
            "policy",
        ])),
        "fence" => ui::run(
            std::process::Command::new("cargo")
                .args([
                    "run",
                    "--release",
                    "-q",
                    "-p",
                    "svc-tests",
                    "--bin",
                    "fence-bench",
                    "--",
                ])
                .args(args),
        ),
        "dns" => ui::run(std::process::Command::new("cargo").args([
            "run",
            "--release",
            "-q",
            "-p",
            "svc-tests",
            "--bin",
            "dns-bench",
        ])),
        "proxy" => setup::mitmproxy().and_then(|mitmdump| {
            let nginx = setup::nginx()?;
            ui::run(
                std::process::Command::new("cargo")
                    .env("SVC_MITMDUMP", mitmdump)
                    .env("SVC_NGINX", nginx)
                    .args([
                        "run",
                        "--release",
                        "-q",
                        "-p",
                        "svc-tests",
                        "--bin",
                        "proxy-bench",
                        "--",
                    ])
                    .args(args),
            )
        }),
        "sandbox" => demo::build_bins(true).and_then(|()| {
            ui::run(std::process::Command::new("target/release/sandbox-bench").args(args))
        }),
        // The microvm claim's guest step (`tests/src/bin/claim-bench.rs`): bare VMs by
        // variant, or `--svcd` through two svcds.
        "claim" => demo::build_bins(true)
            .and_then(|()| images::build_all(&images::default_dir()))
            .and_then(|()| {
                ui::run(std::process::Command::new("target/release/claim-bench").args(args))
            }),
        "microvm" => demo::build_bins(true)
            .and_then(|()| images::build_all(&images::default_dir()))
            .and_then(|()| {
                // svcd's debug log says where its part of each create went.
                ui::run(
                    std::process::Command::new("target/release/microvm-bench")
                        .env("SVC_TEST_SVCD_LOG", "info,svc_control::runtime=debug"),
                )
            }),
        // svcd's debug log says where each create's runtime step went.
        "scale" => with_base_image("scale-bench", args, "info,svc_control::runtime=debug"),
        "soak" => with_base_image("soak-bench", args, "info"),
        "git-ssh" => with_base_image("git-ssh-bench", args, "info"),
        "exec" => with_base_image("exec-bench", args, "info"),
        "runtime" => bench_runtime::run(args),
        other => anyhow::bail!("no benchmark {other:?}"),
    }
}

/// A benchmark of real container sandboxes: the release binaries and the base image, then
/// `target/release/BIN ARGS` with svcd's log at `svcd_log`.
fn with_base_image(bin: &str, args: &[String], svcd_log: &str) -> anyhow::Result<()> {
    demo::build_bins(true)?;
    images::build(&images::default_dir())?;
    ui::run(
        std::process::Command::new(format!("target/release/{bin}"))
            .args(args)
            .env("SVC_TEST_SVCD_LOG", svcd_log),
    )
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Setup { tests } => {
            if tests {
                setup::for_tests()
            } else {
                setup::run()
            }
        }
        Command::Test { cargo_test_args } => setup::for_tests()
            .and_then(|()| images::build_all(&images::default_dir()))
            // The package test installs the debug build's package; lintian checks it here.
            .and_then(|()| {
                package::run(&package::Options {
                    version: None,
                    debug: true,
                    out: "target/package".into(),
                    lint: true,
                })
            })
            // The OCI image test reads the debug build's node image.
            .and_then(|_| {
                oci_image::run(&oci_image::Options {
                    debug: true,
                    out: "target/oci".into(),
                    tag: None,
                })
            })
            .and_then(|_| test::run(&cargo_test_args)),
        Command::Demo { backend } => {
            let microvm = backend == "microvm";
            (if microvm {
                setup::for_microvm()
            } else {
                setup::run()
            })
            .and_then(|()| {
                if microvm {
                    images::build_all(&images::default_dir())
                } else {
                    images::build(&images::default_dir())
                }
            })
            .and_then(|()| demo::run(&backend))
        }
        Command::Images { out, base_only } => setup::run().and_then(|()| {
            let out = out.unwrap_or_else(images::default_dir);
            if base_only {
                images::build(&out)
            } else {
                images::build_all(&out)
            }
        }),
        Command::Bench { which, args } => setup::run().and_then(|()| bench(&which, &args)),
        Command::Package {
            version,
            debug,
            out,
            no_lint,
        } => setup::run().and_then(|()| {
            package::run(&package::Options {
                version,
                debug,
                out,
                lint: !no_lint,
            })
            .map(|_| ())
        }),
        Command::OciImage { debug, out, tag } => setup::run()
            .and_then(|()| oci_image::run(&oci_image::Options { debug, out, tag }).map(|_| ())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            ui::fail(&format!("{e:#}"));
            ExitCode::from(1)
        }
    }
}
