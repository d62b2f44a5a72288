//! Helpers for svc's privileged tests: root checks that fail loudly, throwaway network
//! namespaces and veth pairs that clean up on drop, unique names so parallel tests and a running
//! svcd never collide.
#![forbid(unsafe_code)]

use std::{
    path::PathBuf,
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
};

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
    pub fn new() -> Self {
        let name = unique("svct");
        run("ip", &["netns", "add", &name]);
        run("ip", &["-n", &name, "link", "set", "lo", "up"]);
        Self { name }
    }

    /// Run a command inside the namespace.
    pub fn exec(&self, program: &str, args: &[&str]) -> Output {
        let mut full = vec!["netns", "exec", &self.name, program];
        full.extend_from_slice(args);
        Command::new("ip")
            .args(&full)
            .output()
            .unwrap_or_else(|e| panic!("ip netns exec {} {program}: {e}", self.name))
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

/// A veth pair: `host` stays in the root namespace with `host_addr`, `guest` moves into `ns`
/// with `guest_addr` (both /30 out of 10.x test space on the pair itself; nothing routes it).
#[derive(Debug)]
pub struct GuestLink {
    pub host: String,
    pub guest: String,
    pub host_addr: String,
    pub guest_addr: String,
}

impl GuestLink {
    /// Create the pair. `subnet` is the third octet of 10.213.<subnet>.0/30.
    pub fn new(ns: &NetNs, subnet: u8) -> Self {
        let host = unique("svh");
        let guest = unique("svg");
        run(
            "ip",
            &["link", "add", &host, "type", "veth", "peer", "name", &guest],
        );
        run("ip", &["link", "set", &guest, "netns", &ns.name]);
        let host_addr = format!("10.213.{subnet}.1");
        let guest_addr = format!("10.213.{subnet}.2");
        run(
            "ip",
            &["addr", "add", &format!("{host_addr}/30"), "dev", &host],
        );
        run("ip", &["link", "set", &host, "up"]);
        run(
            "ip",
            &[
                "-n",
                &ns.name,
                "addr",
                "add",
                &format!("{guest_addr}/30"),
                "dev",
                &guest,
            ],
        );
        run("ip", &["-n", &ns.name, "link", "set", &guest, "up"]);
        Self {
            host,
            guest,
            host_addr,
            guest_addr,
        }
    }
}

impl Drop for GuestLink {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &self.host])
            .status();
    }
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
            path: PathBuf::from("/sys/fs/bpf").join(unique("svct")),
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

/// Crafted Ethernet frames for `BPF_PROG_TEST_RUN`.
pub mod frames {
    /// Ethernet header with the given ethertype, from 02:..:01 to 02:..:02.
    pub fn eth(ethertype: u16) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01];
        f.extend_from_slice(&ethertype.to_be_bytes());
        f
    }

    /// An ARP request who-has 10.213.0.1 tell 10.213.0.2.
    pub fn arp_request() -> Vec<u8> {
        let mut f = eth(0x0806);
        f.extend_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
        f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01, 10, 213, 0, 2]);
        f.extend_from_slice(&[0, 0, 0, 0, 0, 0, 10, 213, 0, 1]);
        f
    }

    /// An IPv4 ICMP echo request 10.213.0.2 → 10.213.0.1 (checksums are not checked by tc).
    pub fn ipv4_icmp_echo() -> Vec<u8> {
        let mut f = eth(0x0800);
        f.extend_from_slice(&[0x45, 0, 0, 28, 0, 1, 0x40, 0, 64, 1, 0, 0]);
        f.extend_from_slice(&[10, 213, 0, 2, 10, 213, 0, 1]);
        f.extend_from_slice(&[8, 0, 0, 0, 0, 1, 0, 1]);
        f
    }

    /// A minimal IPv6 UDP packet to 2001:db8::1 port 53.
    pub fn ipv6_udp() -> Vec<u8> {
        let mut f = eth(0x86DD);
        f.extend_from_slice(&[0x60, 0, 0, 0, 0, 8, 17, 64]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        f.extend_from_slice(&[0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&[0xc0, 0x00, 0, 53, 0, 8, 0, 0]);
        f
    }

    /// An 802.1Q VLAN-tagged frame carrying IPv4.
    pub fn vlan_tagged() -> Vec<u8> {
        let mut f = eth(0x8100);
        f.extend_from_slice(&[0, 42, 0x08, 0x00]);
        f.extend_from_slice(&ipv4_icmp_echo()[14..]);
        f
    }
}
