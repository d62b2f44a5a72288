//! Helpers for svc's privileged tests: root checks that fail loudly, throwaway network
//! namespaces and veth pairs that clean up on drop, unique names so parallel tests and a running
//! svcd never collide.
#![forbid(unsafe_code)]

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
};

/// `v` (milliseconds) sorted, as a benchmark prints it: median, range and count.
pub fn ms_stats(v: &mut [f64]) -> String {
    v.sort_by(f64::total_cmp);
    match (v.first(), v.get(v.len() / 2), v.last()) {
        (Some(lo), Some(mid), Some(hi)) => format!(
            "median {mid:>8.1} ms  (range {lo:.1}–{hi:.1}, n={})",
            v.len()
        ),
        _ => "no figures".to_owned(),
    }
}

/// A process's resident memory in KiB (`VmRSS`), 0 if it is gone.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The oldest child of a sandbox's init `init`: the server of its channel.
pub fn init_server_pid(init: u32) -> u32 {
    let children = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"))
        .expect("the init's children");
    children
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("the init has its server")
}

/// The loop devices bound to an image under `dir`: (`/dev/loopN`, image).
pub fn loop_devices_under(dir: &std::path::Path) -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let dir = dir.display().to_string();
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let backing = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            let backing = backing.trim().to_owned();
            backing
                .starts_with(&dir)
                .then(|| (format!("/dev/{name}"), backing))
        })
        .collect()
}

/// Fail (never skip) when the test cannot do what it must, saying why.
pub fn require_root() {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    assert_eq!(
        uid, "0",
        "this test loads eBPF programs and creates network namespaces: it must run as root \
         (run it through `cargo xtask test`, which CI runs as root)"
    );
}

/// A short name unique to this process and call, at most 15 bytes with `prefix` (≤ 6 bytes).
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id() % 100_000;
    let name = format!("{prefix}{pid}x{n}");
    assert!(name.len() <= 15, "name {name} too long for an interface");
    name
}

/// The first name [`unique`]`(prefix)` gives that `free` takes: names something a killed
/// test left behind still holds (process ids are reused) are passed over.
pub fn unique_where(prefix: &str, free: impl Fn(&str) -> bool) -> String {
    loop {
        let name = unique(prefix);
        if free(&name) {
            return name;
        }
    }
}

/// The first name [`unique`]`(prefix)` gives that is not yet an entry of `dir` (a killed
/// test's namespace, pin directory, … may hold it).
pub fn unique_under(dir: &Path, prefix: &str) -> String {
    unique_where(prefix, |n| !dir.join(n).exists())
}

/// A new, empty directory under the temporary directory named [`unique`]`(prefix)`, made
/// here and by this call only. Process ids are reused (`kernel.pid_max` can be 32768), so a
/// name may already be taken by what a killed test left behind (a world's directory with an
/// svcd state a new svcd would adopt): such a name is passed over for the next one.
pub fn fresh_dir(prefix: &str) -> PathBuf {
    let made = |name: &str| {
        let dir = std::env::temp_dir().join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(e) => panic!("making {}: {e}", dir.display()),
        }
    };
    std::env::temp_dir().join(unique_where(prefix, made))
}

/// Wait until something accepts TCP connections on `addr:port` as seen from network namespace
/// `netns` (the test's own when `None`), for up to ten seconds; panics naming `what`.
pub fn wait_tcp(netns: Option<&str>, addr: &str, port: u16, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let up = match netns {
            Some(ns) => Command::new("ip")
                .args(["netns", "exec", ns, "bash", "-c"])
                .arg(format!("exec 3<>/dev/tcp/{addr}/{port}"))
                .output()
                .is_ok_and(|o| o.status.success()),
            None => std::net::TcpStream::connect((addr, port)).is_ok(),
        };
        if up {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what} did not listen on {addr}:{port}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Run a command, panicking with its output when it fails.
pub fn run(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("spawning {program} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run `cmd` to its end, panicking with its standard error when it fails.
pub fn run_cmd(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run `cmd` (standard input empty, output captured) as `Command::output` does, but for at
/// most `limit`: a command still running then is killed and `Err` carries what it had said,
/// so a hang fails its test by name instead of holding the whole run.
pub fn output_within(cmd: &mut Command, limit: std::time::Duration) -> Result<Output, String> {
    use std::io::Read;
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawning {:?}: {e}", cmd.get_program()))?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut v);
            }
            v
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    // A thread waits for the child, so its end is seen when it comes (a benchmark times
    // commands through this: no polling interval is added to what they take).
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap_or(i32::MAX));
    let (ended, end) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let status = child.wait();
        let _ = ended.send(());
        status
    });
    let status = match end.recv_timeout(limit) {
        Ok(()) => waiter.join().ok().and_then(Result::ok),
        Err(_) => {
            // Still running at the limit: not reaped, so the pid is still the child's.
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = waiter.join();
            None
        }
    };
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => Err(format!(
            "{:?} {:?} still running after {} s, killed; it had said:\n{}{}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            limit.as_secs(),
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        )),
    }
}

/// Run a command and report whether it succeeded.
pub fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// A network namespace removed on drop.
#[derive(Debug)]
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    /// A new network namespace with its loopback up. A name a killed test's namespace still
    /// holds (process ids are reused) is passed over, as [`fresh_dir`] does.
    pub fn new() -> Self {
        let name = unique_under(Path::new("/run/netns"), "svct");
        run("ip", &["netns", "add", &name]);
        run("ip", &["-n", &name, "link", "set", "lo", "up"]);
        Self { name }
    }

    /// Run `f` on a thread that has entered this namespace: sockets it opens, interfaces it
    /// looks up and programs it attaches live there.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let file =
                        std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
                    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                        .unwrap_or_else(|e| panic!("setns {path}: {e}"));
                    f()
                })
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e))
        })
    }

    /// Run a command inside the namespace (standard input empty), for at most five minutes.
    pub fn exec(&self, program: &str, args: &[&str]) -> Output {
        let mut full = vec!["netns", "exec", &self.name, program];
        full.extend_from_slice(args);
        output_within(
            Command::new("ip").args(&full),
            std::time::Duration::from_secs(300),
        )
        .unwrap_or_else(|e| panic!("ip netns exec {} {program}: {e}", self.name))
    }

    /// `ip -n <this namespace> ARGS…`, which must succeed.
    pub fn ip(&self, args: &[&str]) -> Output {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// `sysctl -qw SETTINGS…` inside this namespace, which must succeed.
    pub fn sysctl(&self, settings: &[&str]) {
        let mut full = vec!["netns", "exec", self.name.as_str(), "sysctl", "-qw"];
        full.extend_from_slice(settings);
        run("ip", &full);
    }
}

impl Default for NetNs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// A veth pair between two namespaces: `a_name` in `a` (made under a unique name first, so two
/// worlds never collide while it is created, then renamed) and `b_name` in `b`.
pub fn veth(a: &NetNs, a_name: &str, b: &NetNs, b_name: &str) {
    let tmp = unique("svv");
    run(
        "ip",
        &[
            "link", "add", &tmp, "netns", &a.name, "type", "veth", "peer", "name", b_name, "netns",
            &b.name,
        ],
    );
    a.ip(&["link", "set", &tmp, "name", a_name]);
}

/// A pin directory of this test's own under /sys/fs/bpf, removed (with whatever was pinned
/// there) on drop.
#[derive(Debug)]
pub struct PinDir {
    pub path: PathBuf,
}

impl PinDir {
    pub fn new() -> Self {
        Self {
            // A killed test's pins (their maps) are not this world's to load.
            path: Path::new("/sys/fs/bpf").join(unique_under(Path::new("/sys/fs/bpf"), "svct")),
        }
    }
}

impl Default for PinDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = svc_control::dataplane::remove_pin_dir(&self.path);
    }
}

/// A VM booted bare (no svcd), for the benches' floor.
pub mod bare_vm;
pub mod containerd;
pub mod cri;
pub mod dns;
/// The sandbox-escape checks, each run in a sandbox or in a pod's container.
pub mod escapes;
pub mod frames;
pub mod git;
/// What the CRI tests share: pods, containers, exec, the perimeter checks.
pub mod pods;
pub mod project;
/// A read-only OCI registry on loopback for the CRI plugin's `PullImage`.
pub mod registry;
pub mod rootfs;
pub mod servers;
pub mod ssh_host;
pub mod stacks;
/// A workspace binary or image older than its sources: said loudly.
mod stale;
pub mod topology;
pub mod users;
/// A microvm of svcd's taken over by the test's backend; trees attached to it; its agent stopped.
pub mod vm;
pub mod world;

/// A loaded fence with a standard sandbox, for `BPF_PROG_TEST_RUN` tables.
pub mod fixture {
    use std::{net::IpAddr, time::Duration};

    use svc_control::{
        dataplane::{AllowEntry, CidrEntry, Fence, PortRule, SandboxLink, WEB},
        policy::{destination, mode::EgressMode},
    };

    use crate::PinDir;

    /// Test runs happen on the loopback device: records for them are keyed by ifindex 1.
    pub const TEST_RUN_IFINDEX: u32 = 1;
    pub const SANDBOX: u32 = 7;

    pub struct Loaded {
        pub fence: Fence,
        pub pins: PinDir,
    }

    pub fn link(mode: EgressMode, ifindex: u32) -> SandboxLink {
        SandboxLink {
            ifindex,
            sandbox: SANDBOX,
            mode,
            proxy: true,
            guest_v4: "10.213.0.2".parse().expect("v4"),
            gateway_v4: "10.213.0.1".parse().expect("v4"),
            guest_v6: Some("fd53::2".parse().expect("v6")),
            guest_v6_link_local: Some("fe80::2".parse().expect("v6")),
            gateway_v6: Some("fd53::1".parse().expect("v6")),
        }
    }

    /// A permanent entry (no TTL, no idle grace) opening `rules` on `addr` for host `host_id`.
    pub fn allow(addr: impl Into<IpAddr>, rules: &[PortRule], host_id: u32) -> AllowEntry {
        AllowEntry {
            addr: addr.into(),
            rules: rules.to_vec(),
            host_id,
            ttl: None,
            idle: Duration::ZERO,
        }
    }

    /// The standard allow list: web on 192.0.2.10 and 2001:db8::10, UDP 4433 and ICMP on
    /// 192.0.2.30, web on 198.51.100.0/24.
    pub fn entries() -> (Vec<AllowEntry>, Vec<CidrEntry>) {
        let web = |a: &str, id| AllowEntry {
            addr: a.parse::<IpAddr>().expect("ip"),
            rules: WEB.to_vec(),
            host_id: id,
            ttl: None,
            idle: Duration::from_secs(30),
        };
        let entries = vec![
            web("192.0.2.10", 1),
            web("2001:db8::10", 1),
            allow(
                "192.0.2.30".parse::<IpAddr>().expect("ip"),
                &[PortRule::Udp(4433), PortRule::Icmp],
                2,
            ),
        ];
        let cidrs = vec![CidrEntry {
            net: "198.51.100.0/24".parse().expect("net"),
            rules: WEB.to_vec(),
            host_id: 3,
        }];
        (entries, cidrs)
    }

    /// Destination classes with the test pools (10.213/16, fd53::/16) as sandbox pools.
    pub fn host_network() -> destination::HostNetwork {
        destination::HostNetwork {
            host_addresses: vec![],
            sandbox_pools: vec![
                "10.213.0.0/16".parse().expect("net"),
                "fd53::/16".parse().expect("net"),
            ],
            allow_cidrs: vec![],
            svcd_ports: vec![],
        }
    }

    /// Load a fence in a fresh pin directory and install the standard sandbox on `ifindex`.
    pub fn load(mode: EgressMode, ifindex: u32) -> Loaded {
        let pins = PinDir::new();
        let mut fence = Fence::load(&pins.path).expect("load fence");
        let (deny, allow) = destination::fence_cidrs(&host_network());
        fence
            .set_destination_classes(&deny, &allow)
            .expect("classes");
        let (entries, cidrs) = entries();
        fence
            .install_sandbox(&link(mode, ifindex), &entries, &cidrs)
            .expect("install");
        Loaded { fence, pins }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_fresh_dir_passes_over_names_already_taken() {
        // The next names `unique` gives, taken first as a killed test's leftovers would be.
        let probe = super::unique("fdt");
        let (stem, n) = probe.rsplit_once('x').expect("prefix, pid, x, counter");
        let n: u32 = n.parse().expect("counter");
        let taken: Vec<_> = (1..=3)
            .map(|i| std::env::temp_dir().join(format!("{stem}x{}", n + i)))
            .collect();
        for t in &taken {
            std::fs::create_dir_all(t.join("state")).expect("leftover");
        }
        let fresh = super::fresh_dir("fdt");
        let empty = std::fs::read_dir(&fresh).expect("made").next().is_none();
        let passed_over = !taken.contains(&fresh);
        for t in taken.iter().chain([&fresh]) {
            let _ = std::fs::remove_dir_all(t);
        }
        assert!(passed_over, "{} was taken already", fresh.display());
        assert!(empty, "{} is not new", fresh.display());
    }
}
