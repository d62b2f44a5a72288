//! The main job, for now: `svc config check` on an example workspace and on a broken one, then
//! the eBPF fence on a real veth into a throwaway network namespace: a ping that works, is
//! dropped and counted once the fence is attached, and works again after detach.

use std::process::Command;

use anyhow::bail;

use crate::ui;

const NS: &str = "svcdemo-guest";
const HOST_LINK: &str = "svcdemo0";
const GUEST_LINK: &str = "guest0";
const HOST_ADDR: &str = "10.213.250.1";
const GUEST_ADDR: &str = "10.213.250.2";
const PIN_DIR: &str = "/sys/fs/bpf/svc-demo";

pub fn run() -> anyhow::Result<()> {
    ui::heading("build: svc and svcd");
    ui::run(Command::new("cargo").args([
        "build",
        "--quiet",
        "-p",
        "svc-cli",
        "-p",
        "svc-control",
        "--bins",
    ]))?;

    ui::heading("1. svc config check: the effective configuration of an example workspace");
    ui::run(Command::new("target/debug/svc").args(["config", "check", "examples/workspace"]))?;

    ui::heading("2. svc config check: a host both open and policy-gated is refused (SPEC 7)");
    let dir = std::env::temp_dir().join(format!("svc-demo-{}", std::process::id()));
    std::fs::create_dir_all(dir.join(".svc"))?;
    std::fs::write(
        dir.join(".svc/config.yaml"),
        "egress:\n  allow: [api.example.com]\n  policy:\n    API.example.com.:\n      paths: [\"/v1/**\"]\n",
    )?;
    println!(
        "  .svc/config.yaml:\n{}",
        indent(&std::fs::read_to_string(dir.join(".svc/config.yaml"))?)
    );
    let refused = Command::new("target/debug/svc")
        .args(["config", "check"])
        .arg(&dir)
        .status()?;
    std::fs::remove_dir_all(&dir)?;
    if refused.code() != Some(1) {
        bail!("svc config check should have refused the clash with exit code 1, got {refused}");
    }
    ui::ok("refused, exit code 1");

    ui::heading("3. the eBPF fence on a guest link");
    let _cleanup = Cleanup;
    cleanup_quietly();
    setup_link()?;
    ui::ok(&format!(
        "guest namespace {NS}: {GUEST_LINK} {GUEST_ADDR} ↔ host {HOST_LINK} {HOST_ADDR}"
    ));

    let replies = ping();
    println!("  ping guest → gateway without the fence: {replies}/3 replies");
    if replies == 0 {
        bail!("the guest cannot reach its gateway even without the fence");
    }

    ui::run(Command::new("target/debug/svcd").args([
        "fence",
        "attach",
        HOST_LINK,
        "--pin-dir",
        PIN_DIR,
    ]))?;
    let replies = ping();
    println!("  ping guest → gateway with the fence:    {replies}/3 replies");
    if replies != 0 {
        bail!("the fence let {replies} echo requests through");
    }
    ui::ok("dropped by the fence (default deny)");

    println!("\n  the counters, summed over CPUs:");
    ui::run(Command::new("target/debug/svcd").args(["fence", "counters", "--pin-dir", PIN_DIR]))?;

    println!("\n  what an operator sees with bpftool:");
    ui::run(Command::new("bpftool").args([
        "prog",
        "show",
        "pinned",
        &format!("{PIN_DIR}/prog_svc_tap_ingress"),
    ]))?;
    ui::run(Command::new("bpftool").args([
        "link",
        "show",
        "pinned",
        &format!("{PIN_DIR}/links/{HOST_LINK}_ingress"),
    ]))?;
    let dump = ui::output(Command::new("bpftool").args([
        "map",
        "dump",
        "pinned",
        &format!("{PIN_DIR}/SVC_COUNTERS"),
    ]))?;
    println!("  $ bpftool map dump pinned {PIN_DIR}/SVC_COUNTERS   (the drop_ipv4_default entry)");
    println!(
        "    key = reason code 3 (u32, little-endian); value per CPU = packets (u64), bytes (u64)"
    );
    let lines: Vec<&str> = dump.lines().collect();
    if let Some(i) = lines.iter().position(|l| l.trim() == "03 00 00 00") {
        for line in lines.iter().skip(i.saturating_sub(1)).take(4) {
            println!("    {line}");
        }
    }

    ui::run(Command::new("target/debug/svcd").args([
        "fence",
        "detach",
        HOST_LINK,
        "--pin-dir",
        PIN_DIR,
    ]))?;
    let replies = ping();
    println!("  ping guest → gateway after detach:     {replies}/3 replies");
    if replies == 0 {
        bail!("the guest still cannot reach its gateway after detach");
    }
    ui::ok("reachable again");

    ui::heading("done: cleaning up the namespace, the link and the pinned fence");
    Ok(())
}

fn setup_link() -> anyhow::Result<()> {
    let ip = |args: &[&str]| ui::output(Command::new("ip").args(args)).map(drop);
    ip(&["netns", "add", NS])?;
    ip(&[
        "link", "add", HOST_LINK, "type", "veth", "peer", "name", GUEST_LINK,
    ])?;
    ip(&["link", "set", GUEST_LINK, "netns", NS])?;
    ip(&["addr", "add", &format!("{HOST_ADDR}/30"), "dev", HOST_LINK])?;
    ip(&["link", "set", HOST_LINK, "up"])?;
    ip(&[
        "-n",
        NS,
        "addr",
        "add",
        &format!("{GUEST_ADDR}/30"),
        "dev",
        GUEST_LINK,
    ])?;
    ip(&["-n", NS, "link", "set", GUEST_LINK, "up"])?;
    ip(&["-n", NS, "link", "set", "lo", "up"])?;
    Ok(())
}

/// Echo replies out of 3.
fn ping() -> usize {
    let out = Command::new("ip")
        .args([
            "netns", "exec", NS, "ping", "-c", "3", "-i", "0.2", "-W", "1", HOST_ADDR,
        ])
        .output();
    out.map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .matches("bytes from")
            .count()
    })
    .unwrap_or(0)
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Removes everything the demo made, on success and on failure.
struct Cleanup;

impl Drop for Cleanup {
    fn drop(&mut self) {
        cleanup_quietly();
    }
}

fn cleanup_quietly() {
    let _ = ui::succeeds(Command::new("target/debug/svcd").args([
        "fence",
        "unload",
        "--pin-dir",
        PIN_DIR,
    ]));
    let _ = ui::succeeds(Command::new("ip").args(["link", "del", HOST_LINK]));
    let _ = ui::succeeds(Command::new("ip").args(["netns", "del", NS]));
}
