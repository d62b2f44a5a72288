//! The built-in host probes svcd's perimeter needs (`host:NAME`), each a function of its own
//! with a fix hint, run from one table.

use std::{path::Path, time::Instant};

use super::{
    images::{self, ImageSource},
    report::{CheckResult, HostOutcome, host_result},
};

/// What the probes read: svcd.toml's `microvm.user`, the environment, and where the microvm
/// images are found.
struct Host<'a> {
    microvm_user: &'a str,
    env: &'a dyn Fn(&str) -> Option<String>,
    images: &'a ImageSource,
}

/// A built-in probe: its name (`host:NAME`), whether it is required, and its check.
type Probe = (&'static str, bool, fn(&Host<'_>) -> HostOutcome);

/// The probes every host runs, in order.
const PERIMETER: &[Probe] = &[
    ("removed-variables", true, removed_variables),
    ("kernel", true, kernel),
    ("btf", true, btf),
    ("bpffs", false, bpffs),
    ("nftables", true, nftables),
    ("tun", false, tun),
    ("ip-forward", false, ip_forward),
];

/// The microvm backend's probes, after the others.
const MICROVM: &[Probe] = &[
    ("svc-microvm-kernel", true, microvm_kernel),
    ("svc-microvm-rootfs", true, microvm_rootfs),
    ("microvm-agent", true, microvm_agent),
    ("microvm-user", true, microvm_user),
    ("kvm", false, kvm),
    ("qemu", true, qemu),
];

/// The built-in host probes svcd's perimeter needs, each named with a fix hint; with
/// `microvm` (where its images are found), also the microvm backend's,
/// `microvm_user` being svcd.toml's `microvm.user` (whose id range the QEMUs run in). `env`
/// reads the environment.
pub fn host_probes(
    microvm: Option<&ImageSource>,
    microvm_user: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Vec<CheckResult> {
    let local = ImageSource::Local(Default::default(), String::new());
    let host = Host {
        microvm_user,
        env: &env,
        images: microvm.unwrap_or(&local),
    };
    let microvm_probes = if microvm.is_some() { MICROVM } else { &[] };
    let mut results: Vec<CheckResult> = PERIMETER
        .iter()
        .chain(microvm_probes)
        .map(|(name, required, probe)| {
            let t0 = Instant::now();
            host_result(name, *required, t0, probe(&host))
        })
        .collect();
    if let Some(source) = microvm {
        results.push(images::source_result(source));
    }
    results
}

fn removed_variables(host: &Host<'_>) -> HostOutcome {
    match crate::config::env::check_removed(host.env) {
        Ok(()) => Ok("none of the removed SVC_DOCTOR_MICROVM_* variables is set".into()),
        Err(e) => Err((
            e.0.iter()
                .map(|e| e.message.clone())
                .collect::<Vec<_>>()
                .join("; "),
            "unset them (the microvm backend reads SVC_MICROVM_KERNEL and SVC_MICROVM_ROOTFS)",
        )),
    }
}

fn kernel(_: &Host<'_>) -> HostOutcome {
    match kernel_version() {
        Some((major, minor)) if (major, minor) >= (6, 6) => {
            Ok(format!("Linux {major}.{minor}: TCX links for the fence"))
        }
        Some((major, minor)) => Err((
            format!("Linux {major}.{minor} has no TCX (the fence attaches with it)"),
            "run a kernel 6.6 or later",
        )),
        None => Err((
            "cannot read /proc/sys/kernel/osrelease".into(),
            "run on Linux with /proc mounted",
        )),
    }
}

fn btf(_: &Host<'_>) -> HostOutcome {
    if Path::new("/sys/kernel/btf/vmlinux").exists() {
        Ok("/sys/kernel/btf/vmlinux".into())
    } else {
        Err((
            "the kernel exposes no BTF (/sys/kernel/btf/vmlinux)".into(),
            "a kernel built with CONFIG_DEBUG_INFO_BTF=y (every major distribution's is)",
        ))
    }
}

fn bpffs(_: &Host<'_>) -> HostOutcome {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    if mounts.lines().any(|l| l.split(' ').nth(2) == Some("bpf")) {
        Ok("a bpf file system is mounted".into())
    } else {
        Err((
            "no bpf file system is mounted".into(),
            "svcd mounts one at /sys/fs/bpf when it starts; or: mount -t bpf bpf /sys/fs/bpf",
        ))
    }
}

fn nftables(_: &Host<'_>) -> HostOutcome {
    match std::process::Command::new("nft")
        .args(["--version"])
        .output()
    {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).trim().to_owned()),
        Ok(o) => Err((
            format!(
                "nft --version failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            "install nftables (apt install nftables)",
        )),
        Err(e) => Err((
            format!("nft: {e}"),
            "install nftables (apt install nftables)",
        )),
    }
}

fn tun(_: &Host<'_>) -> HostOutcome {
    if Path::new("/dev/net/tun").exists() {
        Ok("/dev/net/tun".into())
    } else {
        Err((
            "/dev/net/tun is missing (the microvm backend's taps need it)".into(),
            "modprobe tun",
        ))
    }
}

fn ip_forward(_: &Host<'_>) -> HostOutcome {
    match std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward").map(|s| s.trim().to_owned()) {
        Ok(v) if v == "1" => Ok("net.ipv4.ip_forward = 1".into()),
        Ok(v) => Err((
            format!("net.ipv4.ip_forward = {v}"),
            "svcd enables it when it starts (the nftables table fences what is forwarded); or: sysctl -w net.ipv4.ip_forward=1",
        )),
        Err(e) => Err((
            format!("net.ipv4.ip_forward: {e}"),
            "run on Linux with /proc mounted",
        )),
    }
}

fn microvm_kernel(host: &Host<'_>) -> HostOutcome {
    images::probe(host.images, host.env, "kernel", "SVC_MICROVM_KERNEL")
}

fn microvm_rootfs(host: &Host<'_>) -> HostOutcome {
    images::probe(host.images, host.env, "rootfs", "SVC_MICROVM_ROOTFS")
}

fn microvm_agent(host: &Host<'_>) -> HostOutcome {
    match images::image(host.images, host.env, "rootfs", "SVC_MICROVM_ROOTFS") {
        Ok(image) => agent_in_image(&image),
        Err(_) if matches!(host.images, ImageSource::Local(..)) => Err((
            "no SVC_MICROVM_ROOTFS to look in".into(),
            "set SVC_MICROVM_ROOTFS (svcd images build makes it)",
        )),
        Err(e) => Err(e),
    }
}

fn microvm_user(host: &Host<'_>) -> HostOutcome {
    let microvm_user = host.microvm_user;
    crate::runtime::ids::id_range(
        microvm_user,
        std::path::Path::new("/etc/subuid"),
        std::path::Path::new("/etc/subgid"),
        "microvm.user",
    )
    .map(|r| {
        format!(
            "{microvm_user}'s range: sandbox N's QEMU runs as uid {} + N, gid {} + N",
            r.uid, r.gid
        )
    })
    .map_err(|e| {
        (
            e.to_string(),
            "give the user a range of its own (the message says how)",
        )
    })
}

fn kvm(_: &Host<'_>) -> HostOutcome {
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
        Ok(_) => Ok("/dev/kvm opens read-write (whether guests can run under it, QEMU tells: it falls back to TCG)".into()),
        Err(e) => Err((
            format!("/dev/kvm: {e}: guests run under TCG, many times slower"),
            "enable virtualisation (VT-x/AMD-V, or nested virtualisation on a VM) and load kvm",
        )),
    }
}

fn qemu(_: &Host<'_>) -> HostOutcome {
    match std::process::Command::new("qemu-system-x86_64")
        .arg("--version")
        .output()
    {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .to_owned()),
        _ => Err((
            "qemu-system-x86_64 is not on PATH".into(),
            "install qemu-system-x86 (apt install qemu-system-x86)",
        )),
    }
}

/// Whether the ext4 image `image` holds the guest agent the microvm backend talks to
/// (read with e2fsprogs' debugfs, without mounting it).
fn agent_in_image(image: &str) -> HostOutcome {
    const AGENT: &str = "/usr/local/bin/svc-microvm-agent";
    let fix = "build the images with `svcd images build` (the rootfs gets the agent), or point SVC_MICROVM_ROOTFS at one";
    let out = std::process::Command::new("debugfs")
        .args(["-R", &format!("stat {AGENT}")])
        .arg(image)
        .output()
        .map_err(|e| (format!("debugfs (e2fsprogs): {e}"), "install e2fsprogs"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let said = String::from_utf8_lossy(&out.stderr);
    if text.contains("Type: regular") {
        Ok(format!("{image} holds {AGENT}"))
    } else if said.contains("File not found") {
        Err((format!("{image} has no {AGENT}"), fix))
    } else {
        Err((
            format!(
                "{image} is not an ext4 image debugfs can read: {}",
                said.lines().last().unwrap_or("").trim()
            ),
            fix,
        ))
    }
}

/// The container backend's OCI runtime (`runtime`, svcd.toml's `container.runtime`; none: the
/// default, the crun on PATH when it is 1.21 or later, else the package's, else runc), named
/// with its version: a
/// warning (not required) when it is missing, too old, or predates the fixes for the
/// runtime's own escapes.
pub fn runtime_probe(runtime: Option<&Path>) -> CheckResult {
    use crate::runtime::container::advisory::{Kind, Verdict, check};
    const RUNC_FIX: &str = "install runc 1.2.8, 1.3.3 or later (a distribution build counts once its changelog names the three CVEs); microvm sandboxes do not use runc";
    const CRUN_FIX: &str = "install crun 1.28 or later, or svc's build (`cargo xtask setup`); microvm sandboxes do not use crun";
    let t0 = Instant::now();
    let outcome = match crate::runtime::container::binary::choose(runtime) {
        Err(m) => Err((
            m,
            "install svc's crun (`cargo xtask setup`) or runc, or set container.runtime in svcd.toml",
        )),
        Ok(chosen) => {
            let fix = match chosen.identity.map(|id| id.kind) {
                Some(Kind::Crun) => CRUN_FIX,
                _ => RUNC_FIX,
            };
            match check(&chosen.path) {
                Verdict::Fixed(detail) => Ok(detail),
                Verdict::Vulnerable(m) | Verdict::Unreadable(m) => Err((m, fix)),
            }
        }
    };
    host_result("oci-runtime", false, t0, outcome)
}

/// The kernel's release as (major, minor).
fn kernel_version() -> Option<(u32, u32)> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let mut parts = release.trim().split(['.', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    #[test]
    fn host_probes_name_what_is_wrong_and_how_to_fix_it() {
        let removed = |v: &str| (v == "SVC_DOCTOR_MICROVM_INSTANCE").then(|| "x".to_owned());
        let local = ImageSource::Local(Default::default(), "not asked".into());
        let r = host_probes(Some(&local), "svc-no-such-user", removed);
        let by = |n: &str| {
            r.iter()
                .find(|c| c.name == n)
                .unwrap_or_else(|| panic!("{n}: {r:?}"))
        };
        let removed = by("host:removed-variables");
        assert_eq!(removed.status, Status::Failed);
        assert!(
            removed
                .reason
                .as_deref()
                .is_some_and(|w| w.contains("SVC_DOCTOR_MICROVM_INSTANCE is set")
                    && w.contains("— fix: unset them")),
            "{removed:?}"
        );
        let unset = by("host:svc-microvm-kernel");
        assert_eq!(
            unset.reason.as_deref(),
            Some(
                "SVC_MICROVM_KERNEL is not set — fix: set it to the microvm image (svcd images build makes them)"
            )
        );
        let no_range = by("host:microvm-user");
        assert_eq!(no_range.status, Status::Failed);
        assert!(
            no_range.reason.as_deref().is_some_and(|w| w
                .contains("\"svc-no-such-user\" has no range of 65536 ids in /etc/subuid")
                && w.contains("microvm.user")),
            "{no_range:?}"
        );
        // This machine has what the perimeter needs (`cargo xtask setup --tests` made svc-vm).
        let vm = host_probes(Some(&local), "svc-vm", |_| None);
        assert!(
            vm.iter()
                .any(|c| c.name == "host:microvm-user" && c.status == Status::Passed),
            "{vm:?}"
        );
        for ok in ["host:kernel", "host:btf", "host:nftables"] {
            assert_eq!(by(ok).status, Status::Passed, "{:?}", by(ok));
        }
        assert!(
            host_probes(None, "svc-vm", |_| None)
                .iter()
                .all(|c| !c.name.contains("microvm"))
        );
    }
}
