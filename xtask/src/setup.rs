//! Prerequisites, installed idempotently. Each step checks first and does nothing when its
//! thing is already there, so a set-up machine costs a few seconds.

use std::{path::Path, process::Command};

use anyhow::{Context as _, bail};

use crate::ui;

/// Debian packages the build, the tests and the demo use.
pub const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    ("llvm-22-dev", "bpf-linker links against LLVM 22"),
    ("libpolly-22-dev", "LLVM 22's Polly, linked by llvm-sys"),
    ("libzstd-dev", "LLVM's compression, linked by bpf-linker"),
    ("zlib1g-dev", "LLVM's compression, linked by bpf-linker"),
    ("bpftool", "inspecting pinned programs and maps"),
    ("nftables", "the nft redirect and forward rules"),
    ("iproute2", "network namespaces, veth pairs, tc"),
    ("iputils-ping", "ICMP probes in the tests and the demo"),
    ("iperf3", "the fence throughput benchmark"),
    (
        "dnsmasq-base",
        "a real upstream resolver for the DNS guard tests (binary only, no service)",
    ),
    ("dnsutils", "dig, for the demo and by hand"),
    (
        "curl",
        "HTTPS requests from inside sandboxes (tests and the demo)",
    ),
    (
        "git",
        "git http-backend as the test code host, and git inside sandboxes",
    ),
    (
        "ca-certificates",
        "the system trust bundle a sandbox's CA is added to",
    ),
    (
        "openssh-client",
        "ssh and ssh-agent: the git SSH relay runs the host's ssh",
    ),
    (
        "openssh-server",
        "sshd: the git SSH relay's test code host (started by the tests, not as a service)",
    ),
    (
        "util-linux",
        "nsenter and setpriv: the tests enter namespaces and run svc as other users",
    ),
    ("dnsperf", "the DNS guard benchmark's load generator"),
    ("runc", "the OCI runtime of the container backend"),
    (
        "mmdebstrap",
        "builds the sandboxes' base image from Debian packages (svcd images build)",
    ),
    (
        "passwd",
        "useradd and usermod: the backends' system users and their id ranges",
    ),
];

/// bpf-linker release built against Debian's LLVM 22.
const BPF_LINKER_VERSION: &str = "0.13.0";
/// cargo-deny release whose rust-version fits the machine's stable compiler.
const CARGO_DENY_VERSION: &str = "0.18.9";

/// What building svc and running the demo need.
pub fn run() -> anyhow::Result<()> {
    ui::heading("set-up: prerequisites");
    require_root()?;
    debian_packages()?;
    crate::crun::install()?;
    nightly_rust_src()?;
    bpf_linker()?;
    host_accounts()
}

/// What the microvm demo needs besides: QEMU, and the user whose ids the QEMUs run as.
pub fn for_microvm() -> anyhow::Result<()> {
    run()?;
    qemu()?;
    microvm_tools()
}

/// What the tests need besides: the licence and advisory gate, and QEMU for the microvm
/// tests.
pub fn for_tests() -> anyhow::Result<()> {
    run()?;
    test_packages()?;
    qemu()?;
    microvm_tools()?;
    cargo_deny()
}

/// virtiofsd release whose rust-version fits the machine's stable compiler.
const VIRTIOFSD_VERSION: &str = "1.14.0";
/// vhost-device-vsock release (the microvm backend's vsock channel).
const VHOST_VSOCK_VERSION: &str = "0.3.0";

/// The microvm backend's helpers, built from crates.io into `target/tools/bin` (Debian 12
/// packages neither a virtiofsd that can migrate nor vhost-device-vsock): virtiofsd (the live
/// mount; links libseccomp and libcap-ng) and vhost-device-vsock (the vsock channel).
fn microvm_tools() -> anyhow::Result<()> {
    tool(
        "virtiofsd",
        VIRTIOFSD_VERSION,
        &["libseccomp-dev", "libcap-ng-dev"],
    )?;
    tool("vhost-device-vsock", VHOST_VSOCK_VERSION, &[])
}

fn tool(name: &str, version: &str, debian: &[&str]) -> anyhow::Result<()> {
    let bin = Path::new("target/tools/bin").join(name);
    if let Ok(v) = ui::output(Command::new(&bin).arg("--version"))
        && v.contains(version)
    {
        ui::ok(&format!("{name} ({})", v.trim()));
        return Ok(());
    }
    let missing = missing_packages(debian);
    if !missing.is_empty() {
        ui::info(&format!("{name} links {}: installing", missing.join(", ")));
        apt_install(&missing)?;
    }
    ui::info(&format!("building {name} {version} (about a minute)"));
    ui::run(Command::new("cargo").args([
        "install",
        name,
        "--version",
        version,
        "--locked",
        "--root",
        "target/tools",
    ]))?;
    ui::ok(&format!("{name} installed in target/tools/bin"));
    Ok(())
}

/// QEMU 10 (`qemu-system-x86`) from the suite's backports, enabled by copying this machine's
/// own Debian source entry (Debian 12's own QEMU 7.2 would replace the newer `qemu-utils`).
pub fn qemu() -> anyhow::Result<()> {
    let have = ui::output(Command::new("dpkg-query").args([
        "-W",
        "-f=${Status} ${Version}",
        "qemu-system-x86",
    ]));
    if let Ok(v) = &have
        && v.contains("install ok installed")
        && v.contains(":10.")
    {
        ui::ok(&format!(
            "qemu-system-x86 ({})",
            v.split(' ').next_back().unwrap_or("")
        ));
        return Ok(());
    }
    let codename = std::fs::read_to_string("/etc/os-release")?
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .context("/etc/os-release names no VERSION_CODENAME")?;
    let suite = format!("{codename}-backports");
    let deb822 = Path::new("/etc/apt/sources.list.d/debian.sources");
    let (file, entry) = if let Ok(text) = std::fs::read_to_string(deb822) {
        let stanza = text
            .split("\n\n")
            .find(|st| {
                st.lines()
                    .any(|l| l.starts_with("Suites:") && l.contains(&codename))
                    && !st.contains("security")
            })
            .context("no Debian entry in /etc/apt/sources.list.d/debian.sources")?;
        let copied: Vec<String> = stanza
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .map(|l| {
                if l.starts_with("Suites:") {
                    format!("Suites: {suite}")
                } else {
                    l.to_owned()
                }
            })
            .collect();
        (
            "/etc/apt/sources.list.d/svc-backports.sources",
            copied.join("\n") + "\n",
        )
    } else {
        let text = std::fs::read_to_string("/etc/apt/sources.list")
            .context("no apt sources (/etc/apt/sources.list)")?;
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("deb ") && l.split_whitespace().nth(2) == Some(codename.as_str())
            })
            .context("no Debian entry for this suite in /etc/apt/sources.list")?;
        let mut f: Vec<&str> = line.split_whitespace().collect();
        f[2] = &suite;
        (
            "/etc/apt/sources.list.d/svc-backports.list",
            f.join(" ") + "\n",
        )
    };
    ui::info(&format!(
        "enabling {suite} from this machine's own Debian entry ({file})"
    ));
    std::fs::write(file, entry).with_context(|| format!("writing {file}"))?;
    ui::run(Command::new("apt-get").args(["update", "-q"]))?;
    ui::run(
        Command::new("apt-get")
            .args([
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                "-t",
                &suite,
            ])
            .arg("qemu-system-x86")
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )?;
    ui::ok(&format!("qemu-system-x86 installed from {suite}"));
    Ok(())
}

/// The host accounts svcd needs — the API group and the backends' system users, each with a
/// free subordinate id range (the container user's sized for a slice of 65536 ids per
/// sandbox, `container.id_ranges = "per-sandbox"` being the default) — made by the freshly
/// built `svcd setup-host` (the code the Debian package's postinst runs; idempotent).
fn host_accounts() -> anyhow::Result<()> {
    let svcd = svcd()?;
    let out = ui::output(Command::new(&svcd).arg("setup-host"))?;
    for line in out.lines() {
        ui::info(line.trim_start_matches("svcd setup-host: "));
    }
    ui::ok("host accounts (svcd setup-host)");
    Ok(())
}

/// svcd's debug build, built now (a no-op when current): `target/debug/svcd`.
pub fn svcd() -> anyhow::Result<std::path::PathBuf> {
    ui::run(Command::new("cargo").args([
        "build",
        "--quiet",
        "-p",
        "svc-control",
        "--bin",
        "svcd",
    ]))?;
    Ok(Path::new("target/debug/svcd").to_path_buf())
}

fn require_root() -> anyhow::Result<()> {
    let uid = ui::output(Command::new("id").arg("-u"))?;
    if uid.trim() != "0" {
        bail!(
            "svc loads eBPF programs, creates network namespaces and installs Debian packages: run this as root (uid {} now)",
            uid.trim()
        );
    }
    Ok(())
}

fn debian_packages() -> anyhow::Result<()> {
    let all: Vec<&str> = DEBIAN_PACKAGES.iter().map(|(p, _)| *p).collect();
    let missing = missing_packages(&all);
    if missing.is_empty() {
        ui::ok(&format!(
            "Debian packages ({} present)",
            DEBIAN_PACKAGES.len()
        ));
        return Ok(());
    }
    for p in &missing {
        let why = DEBIAN_PACKAGES
            .iter()
            .find(|(n, _)| n == p)
            .map_or("", |(_, w)| w);
        ui::info(&format!("missing {p}: {why}"));
    }
    apt_install(&missing)?;
    ui::ok(&format!(
        "Debian packages installed: {}",
        missing.join(", ")
    ));
    Ok(())
}

/// Debian packages only the tests use.
const TEST_PACKAGES: &[(&str, &str)] = &[
    (
        "tinyproxy",
        "the operator's forward proxy of the upstream-proxy tests (started by the tests)",
    ),
    (
        "gh",
        "the code-host CLI whose login --repo falls back to (the tests log it in locally)",
    ),
    ("lintian", "checks the Debian package (cargo xtask package)"),
    (
        "dpkg-dev",
        "dpkg-shlibdeps: the Debian package's library dependencies",
    ),
    (
        "skopeo",
        "reads the node image's OCI layout (cargo xtask oci-image) as a registry client would",
    ),
    (
        "umoci",
        "unpacks the node image's OCI layout, checking every blob's digest",
    ),
    (
        "containerd",
        "containerd and ctr 1.6: the shim's tests start their own containerd (own root, state \
         and socket); the package's service is left disabled",
    ),
    (
        "gdb",
        "a CRI call that times out prints the shim's and svcd's threads' stacks (where it hung)",
    ),
];

fn test_packages() -> anyhow::Result<()> {
    let names: Vec<&str> = TEST_PACKAGES.iter().map(|(p, _)| *p).collect();
    let missing = missing_packages(&names);
    if missing.is_empty() {
        ui::ok(&format!(
            "test-only Debian packages ({} present)",
            names.len()
        ));
        return Ok(());
    }
    for (p, why) in TEST_PACKAGES.iter().filter(|(p, _)| missing.contains(p)) {
        ui::info(&format!("{p}: {why}"));
    }
    apt_install(&missing)?;
    if missing.contains(&"containerd") {
        host_containerd_off()?;
    }
    Ok(())
}

/// The package's containerd service disabled and stopped where systemd runs: the tests start
/// containerd themselves, and a host one would hold `/run/containerd` for nothing.
fn host_containerd_off() -> anyhow::Result<()> {
    if !Path::new("/run/systemd/system").exists() {
        return Ok(());
    }
    ui::run(Command::new("systemctl").args(["disable", "--now", "containerd.service"]))
}

/// The packages of `names` that are not installed.
pub fn missing_packages<'a>(names: &[&'a str]) -> Vec<&'a str> {
    names
        .iter()
        .copied()
        .filter(|p| {
            let status = ui::output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]));
            !matches!(status, Ok(s) if s.contains("install ok installed"))
        })
        .collect()
}

/// `apt-get update`, then install `packages` without recommends.
pub fn apt_install(packages: &[&str]) -> anyhow::Result<()> {
    ui::run(Command::new("apt-get").args(["update", "-q"]))?;
    ui::run(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn nightly_rust_src() -> anyhow::Result<()> {
    let sysroot = match ui::output(
        Command::new("rustup").args(["run", "nightly", "rustc", "--print", "sysroot"]),
    ) {
        Ok(s) => s.trim().to_owned(),
        Err(_) => {
            ui::info("no nightly toolchain: installing it (minimal profile)");
            ui::run(Command::new("rustup").args([
                "toolchain",
                "install",
                "nightly",
                "--profile",
                "minimal",
            ]))
            .context("the eBPF crate needs a nightly toolchain")?;
            ui::output(
                Command::new("rustup").args(["run", "nightly", "rustc", "--print", "sysroot"]),
            )?
            .trim()
            .to_owned()
        }
    };
    if Path::new(&sysroot)
        .join("lib/rustlib/src/rust/library/core")
        .is_dir()
    {
        ui::ok("nightly toolchain with rust-src");
        return Ok(());
    }
    ui::run(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        "nightly",
    ]))?;
    ui::ok("rust-src added to the nightly toolchain");
    Ok(())
}

fn bpf_linker() -> anyhow::Result<()> {
    if let Ok(v) = ui::output(Command::new("bpf-linker").arg("--version")) {
        ui::ok(&format!("bpf-linker ({})", v.trim()));
        return Ok(());
    }
    ui::info(&format!(
        "building bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (a minute or two)"
    ));
    ui::run(
        Command::new("cargo")
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--no-default-features",
                "--features",
                "llvm-22",
            ])
            .env("LLVM_PREFIX", "/usr/lib/llvm-22"),
    )?;
    ui::ok("bpf-linker installed");
    Ok(())
}

fn cargo_deny() -> anyhow::Result<()> {
    if let Ok(v) = ui::output(Command::new("cargo").args(["deny", "--version"])) {
        ui::ok(&format!("cargo-deny ({})", v.trim()));
        return Ok(());
    }
    ui::info(&format!(
        "building cargo-deny {CARGO_DENY_VERSION} (a few minutes)"
    ));
    ui::run(Command::new("cargo").args([
        "install",
        "cargo-deny",
        "--version",
        CARGO_DENY_VERSION,
        "--locked",
    ]))?;
    ui::ok("cargo-deny installed");
    Ok(())
}

/// mitmproxy, the peer tool of the proxy benchmark, in a virtualenv under `target/` (PyPI;
/// pinned). Only `cargo xtask bench proxy` needs it. Returns the `mitmdump` path.
pub fn mitmproxy() -> anyhow::Result<std::path::PathBuf> {
    const VERSION: &str = "11.0.2";
    let venv = std::path::Path::new("target/peer-mitmproxy");
    let mitmdump = venv.join("bin/mitmdump");
    let have = std::process::Command::new(&mitmdump)
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(VERSION));
    if !have {
        ui::heading(&format!(
            "set-up: mitmproxy {VERSION} (benchmark peer, PyPI)"
        ));
        ui::run(
            std::process::Command::new("python3")
                .args(["-m", "venv"])
                .arg(venv),
        )?;
        ui::run(std::process::Command::new(venv.join("bin/pip")).args([
            "install",
            "-q",
            &format!("mitmproxy=={VERSION}"),
        ]))?;
    }
    Ok(std::fs::canonicalize(mitmdump)?)
}

/// nginx, the general-purpose peer of the proxy benchmark: Debian's `nginx` package unpacked
/// under `target/` (`apt-get download` + `dpkg -x`), never installed — installing it would start
/// a web server on port 80 of the host. Its libraries (OpenSSL, PCRE2, zlib, libcrypt) are part
/// of a Debian base system; any missing are installed. Only `cargo xtask bench proxy` needs it.
/// Returns the binary's path.
pub fn nginx() -> anyhow::Result<std::path::PathBuf> {
    let root = std::path::Path::new("target/peer-nginx");
    let bin = root.join("usr/sbin/nginx");
    let works = |bin: &std::path::Path| {
        std::process::Command::new(bin)
            .arg("-v")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !works(&bin) {
        ui::heading("set-up: nginx (benchmark peer, Debian package unpacked under target/)");
        let download = root.join("download");
        let _ = std::fs::remove_dir_all(&download);
        std::fs::create_dir_all(&download)?;
        ui::run(
            Command::new("apt-get")
                .args(["download", "-q", "nginx"])
                .current_dir(&download),
        )?;
        let deb = std::fs::read_dir(&download)?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .ok_or_else(|| anyhow::anyhow!("apt-get download nginx left no .deb"))?;
        ui::run(Command::new("dpkg").arg("-x").arg(&deb).arg(root))?;
        if !works(&bin) {
            apt_install(&["libssl3", "libpcre2-8-0", "zlib1g", "libcrypt1"])?;
        }
        anyhow::ensure!(works(&bin), "{} does not run", bin.display());
        ui::ok("nginx unpacked");
    }
    Ok(std::fs::canonicalize(bin)?)
}
