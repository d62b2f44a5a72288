//! The main job, for now: `svc config check` on an example workspace and on a broken one,
//! `svc egress explain` on a foreign-repo push, then the packet fence on a real guest link:
//! a guest in a network namespace reaches the one address its sandbox allows, and nothing else;
//! the drops are counted and audited; svcd is killed and the fence stays closed.
//!
//! Everything lives in throwaway network namespaces (guest, host, outside) and a pin directory
//! of its own; nothing touches the machine's own network, and everything is removed at the end.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::ui;

const GUEST: &str = "svcdemo-guest";
const HOST: &str = "svcdemo-host";
const OUTSIDE: &str = "svcdemo-out";
const LINK: &str = "svcdemo0";
const PIN_DIR: &str = "/sys/fs/bpf/svc-demo";
const ALLOWED: &str = "192.0.2.10";
const OTHER: &str = "192.0.2.20";

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
    let work = std::env::temp_dir().join(format!("svc-demo-{}", std::process::id()));
    std::fs::create_dir_all(work.join(".svc"))?;
    std::fs::write(
        work.join(".svc/config.yaml"),
        "egress:\n  allow: [api.example.com]\n  policy:\n    API.example.com.:\n      paths: [\"/v1/**\"]\n",
    )?;
    println!(
        "  .svc/config.yaml:\n{}",
        indent(&std::fs::read_to_string(work.join(".svc/config.yaml"))?)
    );
    let refused = Command::new("target/debug/svc")
        .args(["config", "check"])
        .arg(&work)
        .status()?;
    if refused.code() != Some(1) {
        bail!("svc config check should have refused the clash with exit code 1, got {refused}");
    }
    ui::ok("refused, exit code 1");

    ui::heading("3. svc egress explain: a push to a repository the sandbox is not bound to");
    let explain = Command::new("target/debug/svc")
        .args([
            "egress",
            "explain",
            "--host-config",
            "/dev/null",
            "--repo",
            "acme/widget",
            "POST",
            "https://github.com/evil/exfil.git/git-receive-pack",
        ])
        .status()?;
    if explain.code() != Some(1) {
        bail!("the foreign push should be refused");
    }

    ui::heading("4. the packet fence on a guest link");
    let _cleanup = Cleanup { work: work.clone() };
    remove_world();
    world()?;
    ui::ok(&format!(
        "namespaces {GUEST} (10.213.250.2) ↔ {HOST} ({LINK}, 10.213.250.1) ↔ {OUTSIDE} ({ALLOWED}, {OTHER}, 172.16.5.5)"
    ));
    let servers = [
        serve(ALLOWED, "allowed")?,
        serve(OTHER, "not-allowed")?,
        serve("172.16.5.5", "private")?,
    ];
    wait_for_http(ALLOWED)?;
    println!("  without the fence the guest reaches all three:");
    for addr in [ALLOWED, OTHER, "172.16.5.5"] {
        println!("    curl http://{addr}/  →  {}", curl(addr));
    }

    let spec = work.join("spec.json");
    let audit = work.join("fence.jsonl");
    std::fs::write(&spec, spec_json())?;
    println!(
        "\n  the sandbox's fence (spec {}): allow {ALLOWED} on TCP 80, nothing else",
        spec.display()
    );
    let mut svcd = start_svcd(&spec, &audit)?;
    println!("  with the fence:");
    let results = [
        (ALLOWED, curl(ALLOWED)),
        (OTHER, curl(OTHER)),
        ("172.16.5.5", curl("172.16.5.5")),
        ("169.254.169.254", curl("169.254.169.254")),
    ];
    for (addr, r) in &results {
        println!("    curl http://{addr}/  →  {r}");
    }
    if !results[0].1.starts_with("allowed")
        || results[1..].iter().any(|(_, r)| !r.starts_with("blocked"))
    {
        bail!("the fence did not do what it should");
    }
    ui::ok(
        "the allowed address answers; the IP literal, the private address and the metadata address are dropped",
    );

    std::thread::sleep(Duration::from_millis(300));
    println!("\n  the audit log ({}):", audit.display());
    for line in std::fs::read_to_string(&audit)
        .unwrap_or_default()
        .lines()
        .take(6)
    {
        println!("    {line}");
    }
    println!("\n  the counters:");
    ui::run(Command::new("target/debug/svcd").args(["fence", "counters", "--pin-dir", PIN_DIR]))?;
    println!(
        "\n  what an operator sees with bpftool (the allow map: sandbox 250, generation 1, {ALLOWED}):"
    );
    let dump = ui::output(Command::new("bpftool").args([
        "map",
        "dump",
        "pinned",
        &format!("{PIN_DIR}/SVC_ALLOW4"),
    ]))?;
    for line in dump.lines().take(6) {
        println!("    {line}");
    }

    println!("\n  svcd is killed with SIGKILL:");
    svcd.kill()?;
    let _ = svcd.wait();
    println!("    curl http://{ALLOWED}/  →  {}", curl(ALLOWED));
    println!("    curl http://{OTHER}/  →  {}", curl(OTHER));
    if curl(OTHER).starts_with("not-allowed") {
        bail!("the fence opened when svcd died");
    }
    ui::ok("the pinned fence stays closed without svcd, and allowed traffic keeps flowing");
    drop(servers);

    ui::heading("done: removing the namespaces, the pinned fence and the demo files");
    Ok(())
}

fn world() -> anyhow::Result<()> {
    let ip = |args: &[&str]| ui::output(Command::new("ip").args(args)).map(drop);
    for ns in [GUEST, HOST, OUTSIDE] {
        ip(&["netns", "add", ns])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
    }
    ip(&[
        "link", "add", "g0", "netns", GUEST, "type", "veth", "peer", "name", LINK, "netns", HOST,
    ])?;
    ip(&[
        "link", "add", "oh", "netns", OUTSIDE, "type", "veth", "peer", "name", "ho", "netns", HOST,
    ])?;
    ip(&["-n", GUEST, "addr", "add", "10.213.250.2/30", "dev", "g0"])?;
    ip(&["-n", GUEST, "link", "set", "g0", "up"])?;
    ip(&[
        "-n",
        GUEST,
        "route",
        "add",
        "default",
        "via",
        "10.213.250.1",
    ])?;
    ip(&["-n", HOST, "addr", "add", "10.213.250.1/30", "dev", LINK])?;
    ip(&["-n", HOST, "link", "set", LINK, "up"])?;
    ip(&["-n", HOST, "addr", "add", "192.0.2.1/24", "dev", "ho"])?;
    ip(&["-n", HOST, "link", "set", "ho", "up"])?;
    ip(&["-n", HOST, "route", "add", "172.16.5.5/32", "via", ALLOWED])?;
    for a in [
        &format!("{ALLOWED}/24"),
        &format!("{OTHER}/24"),
        "172.16.5.5/32",
    ] {
        ip(&["-n", OUTSIDE, "addr", "add", a, "dev", "oh"])?;
    }
    ip(&["-n", OUTSIDE, "link", "set", "oh", "up"])?;
    ip(&[
        "-n",
        OUTSIDE,
        "route",
        "add",
        "10.213.0.0/16",
        "via",
        "192.0.2.1",
    ])?;
    ui::output(Command::new("ip").args([
        "netns",
        "exec",
        HOST,
        "sysctl",
        "-qw",
        "net.ipv4.ip_forward=1",
    ]))?;
    Ok(())
}

/// A one-line HTTP server on port 80 of `addr` in the outside namespace.
fn serve(addr: &str, body: &str) -> anyhow::Result<ChildGuard> {
    let script = format!(
        "import http.server as h\nclass H(h.BaseHTTPRequestHandler):\n  def do_GET(s):\n    s.send_response(200); s.end_headers(); s.wfile.write(b'{body}')\n  def log_message(s, *a): pass\nh.HTTPServer(('{addr}', 80), H).serve_forever()\n"
    );
    let child = Command::new("ip")
        .args(["netns", "exec", OUTSIDE, "python3", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting python3 http.server")?;
    Ok(ChildGuard(child))
}

fn wait_for_http(addr: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !curl(addr).starts_with("allowed") {
        if Instant::now() > deadline {
            bail!("the demo's HTTP server on {addr} did not come up");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// `curl` from the guest: the body, or "blocked (…)".
fn curl(addr: &str) -> String {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            GUEST,
            "curl",
            "-sS",
            "--max-time",
            "1",
            &format!("http://{addr}/"),
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => format!(
            "blocked ({})",
            String::from_utf8_lossy(&o.stderr)
                .trim()
                .trim_start_matches("curl: ")
        ),
        Err(e) => format!("blocked ({e})"),
    }
}

fn spec_json() -> String {
    serde_json_free(&[
        ("link", format!("\"{LINK}\"")),
        ("sandbox", "250".into()),
        ("mode", "\"curated\"".into()),
        ("guest_v4", "\"10.213.250.2\"".into()),
        ("gateway_v4", "\"10.213.250.1\"".into()),
        (
            "allow",
            format!("[{{\"addr\": \"{ALLOWED}\", \"tcp\": [80]}}]"),
        ),
        ("host_addresses", "[\"10.213.250.1\", \"192.0.2.1\"]".into()),
        ("sandbox_pools", "[\"10.213.0.0/16\"]".into()),
        (
            "nft",
            "{\"table\": \"svcdemo\", \"guard_port\": 15353, \"proxy_port\": 15443}".into(),
        ),
    ])
}

/// A JSON object from key/raw-value pairs (xtask has no serde).
fn serde_json_free(pairs: &[(&str, String)]) -> String {
    let body: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("  \"{k}\": {v}"))
        .collect();
    format!("{{\n{}\n}}\n", body.join(",\n"))
}

fn start_svcd(spec: &Path, audit: &Path) -> anyhow::Result<Child> {
    let child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{HOST}"))
        .args([
            "target/debug/svcd",
            "fence",
            "run",
            "--pin-dir",
            PIN_DIR,
            "--spec",
        ])
        .arg(spec)
        .arg("--audit")
        .arg(audit)
        .spawn()
        .context("starting svcd fence run")?;
    let pin = PathBuf::from(PIN_DIR)
        .join("links")
        .join(format!("{LINK}_ingress"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pin.exists() {
        if Instant::now() > deadline {
            bail!("svcd fence run did not attach the fence within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(child)
}

fn indent(s: &str) -> String {
    s.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Removes everything the demo made, on success and on failure.
struct Cleanup {
    work: PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        cleanup_quietly(&self.work);
    }
}

fn cleanup_quietly(work: &Path) {
    remove_world();
    let _ = std::fs::remove_dir_all(work);
}

/// Leftovers of this or an interrupted earlier run: svcd, the pinned fence, the namespaces.
fn remove_world() {
    let _ = ui::succeeds(
        Command::new("pkill").args(["-f", "svcd fence run --pin-dir /sys/fs/bpf/svc-demo"]),
    );
    let _ = ui::succeeds(Command::new("target/debug/svcd").args([
        "fence",
        "unload",
        "--pin-dir",
        PIN_DIR,
    ]));
    for ns in [GUEST, HOST, OUTSIDE] {
        let _ = ui::succeeds(Command::new("ip").args(["netns", "del", ns]));
    }
}
