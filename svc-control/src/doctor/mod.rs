//! `svc doctor`'s workspace checks (SPEC 2.7, 4.2): each `doctor.probes` / `doctor.tests`
//! entry is run without a shell (`command` + `args`), in its own process group so a timeout
//! kills everything it started, retried `retries` times on failure; the tests run only when
//! every required probe passed, and are reported as skipped (with the probe that failed)
//! otherwise. The report's shape is [`Report`] (JSON Schema: `schema/doctor-report.v1.json`).

use std::{
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use schemars::JsonSchema;
use serde::Serialize;
use tokio::io::AsyncReadExt as _;

use crate::config::workspace::Check;

/// Bytes of a check's output kept for the report (the end of it).
const OUTPUT_TAIL: usize = 4096;

/// `probe` or `test`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Probe,
    Test,
}

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Passed,
    Failed,
    /// Killed at its timeout (counted as failed).
    TimedOut,
    /// Not run: a required probe failed.
    Skipped,
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct CheckResult {
    pub phase: Phase,
    pub name: String,
    pub status: Status,
    pub required: bool,
    /// Runs made (1 + retries used); 0 when skipped.
    pub attempts: u32,
    /// All attempts together.
    pub duration_ms: u64,
    /// The last attempt's exit code, if it exited.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Why it failed or was skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The end of the last attempt's standard output and error.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub output: String,
}

impl CheckResult {
    pub fn failed(&self) -> bool {
        matches!(self.status, Status::Failed | Status::TimedOut)
    }
}

/// Every check of a doctor run, in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Report {
    /// `svc-doctor-report/v1`.
    pub version: String,
    pub results: Vec<CheckResult>,
    /// Whether a required check failed (the doctor's exit code is then non-zero).
    pub required_failed: bool,
}

/// The JSON Schema of [`Report`] (`schema/doctor-report.v1.json`).
pub fn schema() -> schemars::Schema {
    schemars::schema_for!(Report)
}

/// One attempt's outcome: (status, exit code, reason, output tail).
pub type Attempt = (Status, Option<i32>, Option<String>, String);

/// Where checks run: [`OnHost`], or (svc's CLI) inside a sandbox through svcd.
pub trait Runner {
    /// Run `check` once, killing it (and what it started) at its timeout.
    fn attempt(&self, check: &Check) -> impl std::future::Future<Output = Attempt>;
}

/// Checks run on this host, in a directory.
#[derive(Debug, Clone, Copy)]
pub struct OnHost<'a>(pub &'a Path);

impl Runner for OnHost<'_> {
    fn attempt(&self, check: &Check) -> impl std::future::Future<Output = Attempt> {
        attempt(check, self.0)
    }
}

/// The outcome of a check that exited with `code` after `elapsed`, `output` its stdout and
/// stderr, having been run under coreutils' `timeout` (124: TERM at the timeout, 137: KILL
/// after it): how a runner that cannot kill a process group itself reads its result.
pub fn under_timeout(check: &Check, code: i32, elapsed: Duration, output: &[u8]) -> Attempt {
    let tail = tail(output);
    if crate::workspace::timed_out(code, elapsed, check.timeout_ms) {
        return (
            Status::TimedOut,
            None,
            Some(format!("no result within {} ms: killed", check.timeout_ms)),
            tail,
        );
    }
    let reason = match code {
        0 => return (Status::Passed, Some(0), None, tail),
        126 => format!("cannot run {:?}: not executable (exit 126)", check.command),
        127 => format!("cannot run {:?}: not found (exit 127)", check.command),
        c => format!("exited with {c}"),
    };
    (Status::Failed, Some(code), Some(reason), tail)
}

/// One attempt on this host.
async fn attempt(check: &Check, cwd: &Path) -> Attempt {
    let mut cmd = tokio::process::Command::new(&check.command);
    cmd.args(&check.args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            return (
                Status::Failed,
                None,
                Some(format!("cannot run {:?}: {e}", check.command)),
                String::new(),
            );
        }
    };
    let pgid = child.id().and_then(|p| i32::try_from(p).ok());
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let collect = async {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        let read_out = async {
            if let Some(o) = out.as_mut() {
                let _ = o.read_to_end(&mut a).await;
            }
        };
        let read_err = async {
            if let Some(e) = err.as_mut() {
                let _ = e.read_to_end(&mut b).await;
            }
        };
        tokio::join!(read_out, read_err);
        a.extend_from_slice(&b);
        a
    };
    let limit = Duration::from_millis(check.timeout_ms);
    let run = async {
        let (output, status) = tokio::join!(collect, child.wait());
        (output, status)
    };
    match tokio::time::timeout(limit, run).await {
        Ok((output, status)) => {
            let tail = tail(&output);
            match status {
                Ok(s) if s.success() => (Status::Passed, Some(0), None, tail),
                Ok(s) => (
                    Status::Failed,
                    s.code(),
                    Some(match s.code() {
                        Some(c) => format!("exited with {c}"),
                        None => "killed by a signal".into(),
                    }),
                    tail,
                ),
                Err(e) => (Status::Failed, None, Some(format!("waiting: {e}")), tail),
            }
        }
        Err(_) => {
            // The whole group: a shell script's children go too.
            if let Some(pg) = pgid {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pg),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            (
                Status::TimedOut,
                None,
                Some(format!("no result within {} ms: killed", check.timeout_ms)),
                String::new(),
            )
        }
    }
}

fn tail(output: &[u8]) -> String {
    let start = output.len().saturating_sub(OUTPUT_TAIL);
    String::from_utf8_lossy(&output[start..])
        .trim_end()
        .to_owned()
}

/// Run one check with its retries.
pub async fn run_check(phase: Phase, check: &Check, runner: &impl Runner) -> CheckResult {
    let started = Instant::now();
    let mut attempts = 0;
    loop {
        attempts += 1;
        let (status, exit_code, reason, output) = runner.attempt(check).await;
        if status == Status::Passed || attempts > check.retries {
            return CheckResult {
                phase,
                name: check.name.clone(),
                status,
                required: check.required,
                attempts,
                duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                exit_code,
                reason,
                output,
            };
        }
    }
}

/// Probes — `host` (the built-in ones, already run) first — then tests unless a required
/// probe failed (SPEC 4.2); each result goes to `progress` as soon as it is known.
pub async fn run(
    host: Vec<CheckResult>,
    probes: &[Check],
    tests: &[Check],
    runner: &impl Runner,
    mut progress: impl FnMut(&CheckResult),
) -> Report {
    let mut results = Vec::new();
    for r in host {
        progress(&r);
        results.push(r);
    }
    for c in probes {
        let r = run_check(Phase::Probe, c, runner).await;
        progress(&r);
        results.push(r);
    }
    let blocking: Vec<String> = results
        .iter()
        .filter(|r| r.required && r.failed())
        .map(|r| r.name.clone())
        .collect();
    for c in tests {
        let r = if blocking.is_empty() {
            run_check(Phase::Test, c, runner).await
        } else {
            CheckResult {
                phase: Phase::Test,
                name: c.name.clone(),
                status: Status::Skipped,
                required: c.required,
                attempts: 0,
                duration_ms: 0,
                exit_code: None,
                reason: Some(format!("required probe failed: {}", blocking.join(", "))),
                output: String::new(),
            }
        };
        progress(&r);
        results.push(r);
    }
    let required_failed = results.iter().any(|r| r.required && r.failed());
    Report {
        version: "svc-doctor-report/v1".into(),
        results,
        required_failed,
    }
}

/// One built-in host probe's outcome: `Ok(detail)` or `Err((what is wrong, how to fix it))`.
type HostOutcome = Result<String, (String, &'static str)>;

fn host_result(name: &str, required: bool, started: Instant, outcome: HostOutcome) -> CheckResult {
    let (status, reason, output) = match outcome {
        Ok(detail) => (Status::Passed, None, detail),
        Err((wrong, fix)) => (
            Status::Failed,
            Some(format!("{wrong} — fix: {fix}")),
            String::new(),
        ),
    };
    CheckResult {
        phase: Phase::Probe,
        name: format!("host:{name}"),
        status,
        required,
        attempts: 1,
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        exit_code: None,
        reason,
        output,
    }
}

/// Free space under which `svc doctor` warns about the file system of the audit log or of the
/// state directory: less than 5% of it or less than 1 GiB, whichever is more. svcd keeps
/// writing both while a sandbox is full (each sandbox's disk is its own image), but an image
/// only takes host space as its guest writes, so many busy sandboxes can still fill the host.
pub const LOW_SPACE_PERCENT: u64 = 5;
/// See [`LOW_SPACE_PERCENT`].
pub const LOW_SPACE_BYTES: u64 = 1 << 30;

/// One warning probe per directory (`host:disk-NAME`): its file system's free space, failed
/// (not required: a warning) when it is low (see [`LOW_SPACE_PERCENT`]). A directory not made
/// yet is looked up through its nearest existing parent.
pub fn free_space_probes(dirs: &[(&str, &Path)]) -> Vec<CheckResult> {
    dirs.iter()
        .map(|(name, dir)| {
            let t0 = Instant::now();
            let outcome = free_space(dir).and_then(|(avail, total)| {
                let shown = format!(
                    "{}: {} MiB free of {} MiB",
                    dir.display(),
                    avail >> 20,
                    total >> 20
                );
                match low_space(avail, total) {
                    None => Ok(shown),
                    Some(why) => Err((
                        format!("{shown} ({why})"),
                        "free space there, or move it (svcd.toml state_dir / audit_dir) to a \
                         larger file system; lower container.disk_mib to bound each sandbox less",
                    )),
                }
            });
            host_result(&format!("disk-{name}"), false, t0, outcome)
        })
        .collect()
}

/// Why `avail` bytes free of `total` is low, if it is.
pub fn low_space(avail: u64, total: u64) -> Option<String> {
    let floor = (total / 100 * LOW_SPACE_PERCENT).max(LOW_SPACE_BYTES);
    (avail < floor).then(|| {
        format!(
            "under {LOW_SPACE_PERCENT}% or {} GiB, whichever is more",
            LOW_SPACE_BYTES >> 30
        )
    })
}

/// (bytes available to unprivileged writers, size) of the file system holding `dir`.
fn free_space(dir: &Path) -> Result<(u64, u64), (String, &'static str)> {
    let at = dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(Path::new("/"));
    let st = nix::sys::statvfs::statvfs(at).map_err(|e| {
        (
            format!("statvfs {}: {e}", at.display()),
            "run the doctor as a user who can reach it",
        )
    })?;
    let frag = st.fragment_size();
    Ok((
        st.blocks_available().saturating_mul(frag),
        st.blocks().saturating_mul(frag),
    ))
}

/// Whether the ext4 image `image` holds the guest agent the microvm backend talks to
/// (read with e2fsprogs' debugfs, without mounting it).
fn agent_in_image(image: &str) -> HostOutcome {
    const AGENT: &str = "/usr/local/bin/svc-microvm-agent";
    let fix = "build the images with `cargo xtask images` (the rootfs gets the agent), or point SVC_MICROVM_ROOTFS at one";
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

/// The container backend's OCI runtime (`runtime`, svcd.toml's `container.runtime`): a
/// warning (not required) when it predates the fixes for the runtime's own escapes.
pub fn runtime_probe(runtime: &Path) -> CheckResult {
    use crate::runtime::container::advisory::{Verdict, check};
    let t0 = Instant::now();
    let outcome = match check(runtime) {
        Verdict::Fixed(detail) => Ok(detail),
        Verdict::Vulnerable(m) | Verdict::Unreadable(m) => Err((
            m,
            "install runc 1.2.8, 1.3.3 or later (a distribution build counts once its changelog names the three CVEs); microvm sandboxes do not use runc",
        )),
    };
    host_result("runc", false, t0, outcome)
}

/// The kernel's release as (major, minor).
fn kernel_version() -> Option<(u32, u32)> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let mut parts = release.trim().split(['.', '-']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The built-in host probes svcd's perimeter needs, each named with a fix hint; with
/// `microvm`, also the microvm backend's (SPEC 2.8), `microvm_user` being svcd.toml's
/// `microvm.user` (whose id range the QEMUs run in). `env` reads the environment.
pub fn host_probes(
    microvm: bool,
    microvm_user: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Vec<CheckResult> {
    let mut out = Vec::new();
    let mut probe = |name: &str, required: bool, f: &dyn Fn() -> HostOutcome| {
        let t0 = Instant::now();
        out.push(host_result(name, required, t0, f()));
    };
    probe(
        "removed-variables",
        true,
        &|| match crate::config::env::check_removed(&env) {
            Ok(()) => Ok("none of the removed SVC_DOCTOR_MICROVM_* variables is set".into()),
            Err(e) => Err((
                e.0.iter()
                    .map(|e| e.message.clone())
                    .collect::<Vec<_>>()
                    .join("; "),
                "unset them (the microvm backend reads SVC_MICROVM_KERNEL and SVC_MICROVM_ROOTFS)",
            )),
        },
    );
    probe("kernel", true, &|| match kernel_version() {
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
    });
    probe("btf", true, &|| {
        if Path::new("/sys/kernel/btf/vmlinux").exists() {
            Ok("/sys/kernel/btf/vmlinux".into())
        } else {
            Err((
                "the kernel exposes no BTF (/sys/kernel/btf/vmlinux)".into(),
                "a kernel built with CONFIG_DEBUG_INFO_BTF=y (every major distribution's is)",
            ))
        }
    });
    probe("bpffs", false, &|| {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        if mounts.lines().any(|l| l.split(' ').nth(2) == Some("bpf")) {
            Ok("a bpf file system is mounted".into())
        } else {
            Err((
                "no bpf file system is mounted".into(),
                "svcd mounts one at /sys/fs/bpf when it starts; or: mount -t bpf bpf /sys/fs/bpf",
            ))
        }
    });
    probe(
        "nftables",
        true,
        &|| match std::process::Command::new("nft")
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
        },
    );
    probe("tun", false, &|| {
        if Path::new("/dev/net/tun").exists() {
            Ok("/dev/net/tun".into())
        } else {
            Err((
                "/dev/net/tun is missing (the microvm backend's taps need it)".into(),
                "modprobe tun",
            ))
        }
    });
    probe(
        "ip-forward",
        false,
        &|| match std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
            .map(|s| s.trim().to_owned())
        {
            Ok(v) if v == "1" => Ok("net.ipv4.ip_forward = 1".into()),
            Ok(v) => Err((
                format!("net.ipv4.ip_forward = {v}"),
                "svcd enables it when it starts (the nftables table fences what is forwarded); or: sysctl -w net.ipv4.ip_forward=1",
            )),
            Err(e) => Err((
                format!("net.ipv4.ip_forward: {e}"),
                "run on Linux with /proc mounted",
            )),
        },
    );
    if microvm {
        for var in ["SVC_MICROVM_KERNEL", "SVC_MICROVM_ROOTFS"] {
            let value = env(var);
            probe(
                &var.to_ascii_lowercase().replace('_', "-"),
                true,
                &|| match &value {
                    None => Err((
                        format!("{var} is not set"),
                        "set it to the microvm image (cargo xtask images builds them)",
                    )),
                    Some(p) => match std::fs::File::open(p) {
                        Ok(_) => Ok(p.clone()),
                        Err(e) => Err((format!("{var}={p}: {e}"), "point it at a readable file")),
                    },
                },
            );
        }
        let rootfs = env("SVC_MICROVM_ROOTFS");
        probe("microvm-agent", true, &|| match &rootfs {
            None => Err((
                "no SVC_MICROVM_ROOTFS to look in".into(),
                "set SVC_MICROVM_ROOTFS (cargo xtask images builds the image)",
            )),
            Some(image) => agent_in_image(image),
        });
        probe("microvm-user", true, &|| {
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
        });
        probe("kvm", false, &|| {
            match std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm") {
                Ok(_) => Ok("/dev/kvm opens read-write (whether guests can run under it, QEMU tells: it falls back to TCG)".into()),
                Err(e) => Err((
                    format!("/dev/kvm: {e}: guests run under TCG, many times slower"),
                    "enable virtualisation (VT-x/AMD-V, or nested virtualisation on a VM) and load kvm",
                )),
            }
        });
        probe(
            "qemu",
            true,
            &|| match std::process::Command::new("qemu-system-x86_64")
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
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(name: &str, script: &str, timeout_ms: u64, retries: u32, required: bool) -> Check {
        Check {
            name: name.into(),
            command: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            timeout_ms,
            retries,
            required,
        }
    }

    #[tokio::test]
    async fn a_check_past_its_timeout_is_killed_with_its_children_and_counted_failed() {
        let dir = std::env::temp_dir();
        let marker = dir.join(format!("svc-doctor-child-{}", std::process::id()));
        let _ = std::fs::remove_file(&marker);
        // The shell starts a child that would write the marker after the timeout.
        let script = format!("(sleep 1; touch {}) & sleep 30", marker.display());
        let t0 = Instant::now();
        let r = run_check(
            Phase::Probe,
            &check("slow", &script, 200, 0, true),
            &OnHost(&dir),
        )
        .await;
        assert_eq!(r.status, Status::TimedOut);
        assert!(r.failed());
        assert_eq!(r.reason.as_deref(), Some("no result within 200 ms: killed"));
        assert!(t0.elapsed() < Duration::from_secs(10), "not waited out");
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!marker.exists(), "the check's child outlived the timeout");
    }

    #[test]
    fn results_read_from_timeouts_exit_code() {
        let c = check("c", "x", 1000, 0, false);
        let ms = Duration::from_millis;
        let cases: [(&str, i32, Duration, Status, Option<&str>); 6] = [
            ("passed", 0, ms(5), Status::Passed, None),
            ("failed", 3, ms(5), Status::Failed, Some("exited with 3")),
            (
                "term_at_timeout",
                124,
                ms(1000),
                Status::TimedOut,
                Some("within 1000 ms"),
            ),
            (
                "kill_after_timeout",
                137,
                ms(6000),
                Status::TimedOut,
                Some("killed"),
            ),
            // A check that exits 124 on its own, early, failed: it did not time out.
            (
                "own_124_early",
                124,
                ms(5),
                Status::Failed,
                Some("exited with 124"),
            ),
            ("not_found", 127, ms(5), Status::Failed, Some("not found")),
        ];
        for (name, code, elapsed, status, says) in cases {
            let (got, _, reason, out) = under_timeout(&c, code, elapsed, b"some output\n");
            assert_eq!(got, status, "{name}");
            assert_eq!(out, "some output", "{name}");
            if let Some(says) = says {
                let r = reason.unwrap_or_default();
                assert!(r.contains(says), "{name}: {r}");
            }
        }
    }

    #[tokio::test]
    async fn retries_rerun_a_failing_check_until_it_passes_or_they_run_out() {
        let dir = std::env::temp_dir().join(format!("svc-doctor-retry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        // Passes on the third run (two files counted before it).
        let flaky = "n=$(ls | wc -l); touch run$n; echo attempt $n; [ $n -ge 2 ]";
        let r = run_check(
            Phase::Test,
            &check("flaky", flaky, 5000, 2, false),
            &OnHost(&dir),
        )
        .await;
        assert_eq!((r.status, r.attempts), (Status::Passed, 3), "{r:?}");
        assert_eq!(r.output, "attempt 2");
        let r = run_check(
            Phase::Test,
            &check("never", "echo no >&2; exit 3", 5000, 1, false),
            &OnHost(&dir),
        )
        .await;
        assert_eq!(
            (
                r.status,
                r.attempts,
                r.exit_code,
                r.reason.as_deref(),
                r.output.as_str()
            ),
            (Status::Failed, 2, Some(3), Some("exited with 3"), "no")
        );
        let missing = Check {
            command: "/nonexistent/tool".into(),
            args: vec![],
            ..check("missing", "", 5000, 0, false)
        };
        let r = run_check(Phase::Probe, &missing, &OnHost(&dir)).await;
        assert!(
            r.reason
                .as_deref()
                .is_some_and(|w| w.starts_with("cannot run \"/nonexistent/tool\"")),
            "{r:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn host_probes_name_what_is_wrong_and_how_to_fix_it() {
        let removed = |v: &str| (v == "SVC_DOCTOR_MICROVM_INSTANCE").then(|| "x".to_owned());
        let r = host_probes(true, "svc-no-such-user", removed);
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
                "SVC_MICROVM_KERNEL is not set — fix: set it to the microvm image (cargo xtask images builds them)"
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
        let vm = host_probes(true, "svc-vm", |_| None);
        assert!(
            vm.iter()
                .any(|c| c.name == "host:microvm-user" && c.status == Status::Passed),
            "{vm:?}"
        );
        for ok in ["host:kernel", "host:btf", "host:nftables"] {
            assert_eq!(by(ok).status, Status::Passed, "{:?}", by(ok));
        }
        assert!(
            host_probes(false, "svc-vm", |_| None)
                .iter()
                .all(|c| !c.name.contains("microvm"))
        );
    }

    #[test]
    fn low_space_is_under_5_percent_or_1_gib_whichever_is_more() {
        const GIB: u64 = 1 << 30;
        // A 100 GiB file system: 5 GiB is the floor.
        assert!(low_space(4 * GIB, 100 * GIB).is_some());
        assert!(low_space(6 * GIB, 100 * GIB).is_none());
        // A 10 GiB one: 1 GiB is (5% would be 512 MiB).
        assert!(low_space(GIB - 1, 10 * GIB).is_some());
        assert!(low_space(GIB, 10 * GIB).is_none());
        assert!(low_space(0, 0).is_some());
        let r = free_space_probes(&[("state", Path::new("/nonexistent/svc/state"))]);
        assert_eq!(r[0].name, "host:disk-state");
        assert!(!r[0].required, "a warning, not a failure");
        assert!(
            r[0].output.starts_with("/nonexistent/svc/state: ")
                || r[0]
                    .reason
                    .as_deref()
                    .is_some_and(|w| w.contains("free of")),
            "{:?}",
            r[0]
        );
    }

    #[tokio::test]
    async fn tests_run_only_when_every_required_probe_passed() {
        let dir = std::env::temp_dir();
        let probes = [
            check("optional-fails", "exit 1", 5000, 0, false),
            check("required-passes", "true", 5000, 0, true),
        ];
        let tests = [check("t", "true", 5000, 0, true)];
        let mut heard = Vec::new();
        let r = run(Vec::new(), &probes, &tests, &OnHost(&dir), |c| {
            heard.push(c.name.clone())
        })
        .await;
        assert_eq!(heard, ["optional-fails", "required-passes", "t"]);
        assert_eq!(r.results[2].status, Status::Passed);
        assert!(
            !r.required_failed,
            "an optional failure does not fail the doctor"
        );

        let probes = [check("needed", "exit 2", 5000, 0, true)];
        let r = run(Vec::new(), &probes, &tests, &OnHost(&dir), |_| {}).await;
        assert_eq!(r.results[1].status, Status::Skipped);
        assert_eq!(
            r.results[1].reason.as_deref(),
            Some("required probe failed: needed")
        );
        assert!(r.required_failed);
        let v = serde_json::to_value(&r).expect("json");
        assert_eq!(v["results"][0]["phase"], "probe");
        assert_eq!(v["results"][1]["phase"], "test");
        assert_eq!(v["results"][1]["status"], "skipped");
    }
}
