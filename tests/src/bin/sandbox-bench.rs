//! `cargo xtask bench sandbox`: time from `svc sandbox create` to a sandbox whose first HTTPS
//! request succeeds, and destroy time, container backend, median over 20 — beside, in the same
//! run, the floor: svcd's OCI runtime's own `run` (crun by default, runc when configured) of
//! the same kind of bundle (the same image overlay, the
//! same config.json from `runtime::container::oci`, a veth moved into its network namespace
//! and addressed with `ip`), then `runc delete`; and one `svc sandbox exec` beside one
//! `runc exec`. The svcd rounds run twice in the same run: each sandbox's writable layer a
//! directory of the state's (`disk_mib = 0`), then on its own 10 GiB ext4 image (the default),
//! to show what the disk limit costs. Then warm pools: create → first HTTPS request over
//! [`POOL_ROUNDS`] rounds from a pool (`[pool] container = 2`, each create finding it full)
//! beside as many cold ones on crun and on runc 1.1.5, as many from a pool whose sandboxes
//! share the coding agent's home, and the same for the microvm backend
//! over [`MICROVM_ROUNDS`] (`[pool] microvm = 1`), in one run (`sandbox-bench --pool`: only
//! that part).

use std::time::{Duration, Instant};

use svc_tests::world::World;

const ROUNDS: usize = 20;
/// Rounds of the pooled and cold figures (median, p90, p99).
const POOL_ROUNDS: usize = 50;

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p90(v: &mut [Duration]) -> Duration {
    v.sort();
    v[(v.len() * 9) / 10 - 1]
}

fn p99(v: &mut [Duration]) -> Duration {
    v.sort();
    v[(v.len() * 99).div_ceil(100) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn run(program: &str, args: &[&str]) {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One configuration's figures: each a list of one duration per round.
#[derive(Default)]
struct Rounds {
    create: Vec<Duration>,
    first: Vec<Duration>,
    ready: Vec<Duration>,
    destroy: Vec<Duration>,
    exec_true: Vec<Duration>,
}

/// One sandbox created, asked for its first HTTPS request until it succeeds, exec'd into
/// once and destroyed, its figures added to `r`.
fn one_round(w: &World, name: &str, r: &mut Rounds) {
    let t0 = Instant::now();
    w.svc_ok(&["sandbox", "create", name]);
    let t1 = Instant::now();
    // The first HTTPS request: DNS through the guard, the fence, the proxy, upstream TLS.
    while timed_curl(w, name, &[]).is_none() {
        assert!(t1.elapsed() < Duration::from_secs(10), "never became ready");
    }
    let t2 = Instant::now();
    let e0 = Instant::now();
    w.svc_ok(&["sandbox", "exec", name, "--", "true"]);
    r.exec_true.push(e0.elapsed());
    let d0 = Instant::now();
    w.svc_ok(&["sandbox", "destroy", name]);
    r.destroy.push(d0.elapsed());
    r.create.push(t1 - t0);
    r.first.push(t2 - t1);
    r.ready.push(t2 - t0);
}

/// A warm-up: one sandbox created, used and destroyed (first-use costs are not the figure).
fn warm_up(w: &World) {
    one_round(w, "warm", &mut Rounds::default());
}

/// A warm-up, then [`ROUNDS`] sandboxes created, used and destroyed one after another.
fn svcd_rounds(w: &World) -> Rounds {
    warm_up(w);
    let mut r = Rounds::default();
    for i in 0..ROUNDS {
        one_round(w, &format!("b{i}"), &mut r);
    }
    r
}

/// `backend`'s pool size as svcd's metrics say.
fn pool_size(w: &World, backend: &str) -> u32 {
    w.metrics()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("svc_pool_size{{backend=\"{backend}\"}} ")))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u32)
}

/// One create → first HTTPS request: the create's answer, then the first request's success
/// (a `svc sandbox exec … curl` as a user runs it), curl's own split of that request (its
/// `-w` times: name looked up, connected, TLS done, first byte, total), one `svc sandbox
/// exec … true` after it (the CLI, the API and the exec without curl), and curl's split of
/// two more requests: the same again (the leaf minted, the proxy's upstream connection kept)
/// and one trusting the sandbox CA alone (`--cacert`: no system bundle for OpenSSL to load).
#[derive(Debug, Clone, Copy)]
struct Ready {
    create: Duration,
    first: Duration,
    curl: [Duration; 5],
    exec_true: Duration,
    again: [Duration; 5],
    ca_only: [Duration; 5],
}

/// curl's `-w` times the bench asks for, in [`Ready::curl`]'s order.
const CURL_TIMES: &str =
    "%{time_namelookup} %{time_connect} %{time_appconnect} %{time_starttransfer} %{time_total}";

/// One sandbox created, used until its first HTTPS request succeeds, exec'd once and
/// destroyed.
fn create_to_first_https(w: &World, name: &str, extra: &[&str]) -> Ready {
    let t0 = Instant::now();
    w.svc_ok(&[&["sandbox", "create"], extra, &[name]].concat());
    let t1 = Instant::now();
    let curl = loop {
        if let Some(times) = timed_curl(w, name, &[]) {
            break times;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "never became ready");
    };
    let t2 = Instant::now();
    let e0 = Instant::now();
    w.svc_ok(&["sandbox", "exec", name, "--", "true"]);
    let exec_true = e0.elapsed();
    let again = timed_curl(w, name, &[]).expect("a second request");
    let ca_only = timed_curl(
        w,
        name,
        &["--cacert", svc_control::proxy::guest_trust::GUEST_CA_FILE],
    )
    .expect("a CA-only request");
    w.svc_ok(&["sandbox", "destroy", name]);
    Ready {
        create: t1 - t0,
        first: t2 - t1,
        curl,
        exec_true,
        again,
        ca_only,
    }
}

/// `svc sandbox exec NAME -- curl EXTRA … https://api.agent.test/`: curl's `-w` times when
/// it succeeded.
fn timed_curl(w: &World, name: &str, extra: &[&str]) -> Option<[Duration; 5]> {
    let out = w.svc(
        &[
            &[
                "sandbox",
                "exec",
                name,
                "--",
                "curl",
                "-sS",
                "-o",
                "/dev/null",
            ],
            extra,
            &[
                "-w",
                CURL_TIMES,
                "--max-time",
                "5",
                "https://api.agent.test/",
            ],
        ]
        .concat(),
    );
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let times: Vec<Duration> = text
        .split_whitespace()
        .map(|t| {
            Duration::from_secs_f64(
                t.parse::<f64>()
                    .unwrap_or_else(|e| panic!("curl's -w output {text:?}: {e}")),
            )
        })
        .collect();
    Some(
        times
            .try_into()
            .unwrap_or_else(|t| panic!("curl's -w output: five times expected, got {t:?}")),
    )
}

/// The median of each step svcd's log gives its creates of sandboxes named `prefix…`
/// (`phases=files=1.0ms guest=40.0ms …`), in the log's order.
fn phase_medians(w: &World, prefix: &str) -> String {
    w.create_phases(prefix)
        .iter_mut()
        .map(|(s, v)| format!("{s} {}", ms(median(v))))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Print one configuration's create → first HTTPS figures: median [p90, p99] of the total,
/// the create's answer and the first request after it, the median of each step svcd's log
/// gives, and what the first request is made of (curl's own times, an exec of `true`).
fn report_ready(what: &str, r: &[Ready], phases: &str) {
    let med = |f: &dyn Fn(&Ready) -> Duration| {
        let mut v: Vec<Duration> = r.iter().map(f).collect();
        ms(median(&mut v))
    };
    let mut total: Vec<Duration> = r.iter().map(|x| x.create + x.first).collect();
    println!(
        "  {what}  {} [{}, {}]  (create answered {}, then first HTTPS {})",
        ms(median(&mut total)),
        ms(p90(&mut total)),
        ms(p99(&mut total)),
        med(&|x| x.create),
        med(&|x| x.first)
    );
    println!("          svcd's steps: {phases}");
    let split = |f: &dyn Fn(&Ready) -> [Duration; 5]| {
        format!(
            "DNS {}, TCP {}, TLS {}, first byte {}, total {}",
            med(&|x| f(x)[0]),
            med(&|x| f(x)[1]),
            med(&|x| f(x)[2]),
            med(&|x| f(x)[3]),
            med(&|x| f(x)[4])
        )
    };
    println!(
        "          first HTTPS, curl's own: {}; an exec of `true` {}",
        split(&|x| x.curl),
        med(&|x| x.exec_true)
    );
    println!("          the same again: {}", split(&|x| x.again));
    println!(
        "          again, the sandbox CA alone (--cacert): {}",
        split(&|x| x.ca_only)
    );
}

/// create → first HTTPS request, [`POOL_ROUNDS`] times cold with `runtime_line`'s runtime
/// (`disk_mib = 0`): the figures, and the medians of svcd's steps.
fn cold_rounds(runtime_line: &str, prefix: &str, rounds: usize) -> (Vec<Ready>, String) {
    let w = World::start_with(&format!("disk_mib = 0\n{runtime_line}"));
    create_to_first_https(&w, "warm-up", &[]);
    let r: Vec<_> = (0..rounds)
        .map(|i| create_to_first_https(&w, &format!("{prefix}{i}"), &[]))
        .collect();
    (r, phase_medians(&w, prefix))
}

/// `rounds` creates → first HTTPS request from a full pool of `backend` in `w` (each create
/// waiting for the pool to be full again first: its refill is not measured), after one
/// claimed as a warm-up; the figures and the pool's hits.
fn pooled_rounds(
    w: &World,
    backend: &str,
    full: u32,
    rounds: usize,
    extra: &[&str],
) -> (Vec<Ready>, String) {
    let mut pooled = Vec::new();
    for i in 0..=rounds {
        let deadline = Instant::now() + Duration::from_secs(180);
        while pool_size(w, backend) < full {
            assert!(
                Instant::now() < deadline,
                "the {backend} pool did not refill"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let took = create_to_first_https(w, &format!("p{i}"), extra);
        if i > 0 {
            pooled.push(took);
        }
    }
    let hits = w
        .metrics()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("svc_pool_hits_total{{backend=\"{backend}\"}} ")))
        .unwrap_or("0")
        .trim()
        .to_owned();
    (pooled, hits)
}

/// create → first HTTPS request, in one run: [`POOL_ROUNDS`] times from a full container
/// pool, as many cold on the default runtime (crun) and as many cold on runc 1.1.5 (the
/// runtime before issue 31); then [`MICROVM_ROUNDS`] times from a microvm pool beside as many
/// cold microvm creates. Each printed with median, p90 and p99. The pools refill one sandbox
/// a second: a refill starts after the measured request, not during it (on two cores a
/// refill beside the measured steps would be measured too).
fn pooled_beside_cold(rounds: usize) {
    let (cold, cold_phases) = cold_rounds("", "c", rounds);
    let (runc, runc_phases) = cold_rounds("runtime = \"runc\"", "r", rounds);
    let w = World::start_with("disk_mib = 0\n[pool]\ncontainer = 2\nrefill_per_second = 1\n");
    let (pooled, hits) = pooled_rounds(&w, "container", 2, rounds, &[]);
    println!(
        "create → first HTTPS request, container backend, disk_mib = 0, {rounds} rounds \
         (median [p90, p99]); pool hits {hits}"
    );
    report_ready("cold, crun (default)", &cold, &cold_phases);
    report_ready("cold, runc 1.1.5    ", &runc, &runc_phases);
    report_ready("pooled, crun        ", &pooled, &phase_medians(&w, "p"));
    drop(w);
    pooled_with_agent_home(rounds);
    microvm_pooled_beside_cold(rounds.min(MICROVM_ROUNDS));
}

/// create → first HTTPS request, `rounds` times from a full container pool whose sandboxes
/// share the coding agent's home (owned by a user, as a real one is): the claim moves the
/// share into the running guest (svcd's `shares` step).
fn pooled_with_agent_home(rounds: usize) {
    let home = svc_tests::fresh_dir("bh");
    svc_tests::project::chown_tree(&home, 1234, 1234);
    let w = World::start_with_agent_home_and(
        &home,
        "disk_mib = 0\n[pool]\ncontainer = 2\nrefill_per_second = 1\n",
    );
    let (pooled, hits) = pooled_rounds(&w, "container", 2, rounds, &[]);
    println!("  (the same pool, each sandbox sharing the agent's home: pool hits {hits})");
    report_ready("pooled, agent's home", &pooled, &phase_medians(&w, "p"));
    drop(w);
    let _ = std::fs::remove_dir_all(&home);
}

/// Rounds of the microvm figures (a cold boot under TCG takes seconds).
const MICROVM_ROUNDS: usize = 10;

/// create → first HTTPS request on the microvm backend: [`MICROVM_ROUNDS`] cold, then as many
/// from a pool of one booted VM, in one run (skipped, saying why, without the microvm images).
fn microvm_pooled_beside_cold(rounds: usize) {
    let images = svc_tests::world::microvm_dir();
    if let Some(missing) = ["vmlinuz", "initrd.img", "rootfs.ext4"]
        .iter()
        .map(|f| images.join(f))
        .find(|p| !p.exists())
    {
        println!(
            "microvm: not measured: {} is missing (`cargo xtask images` builds it)",
            missing.display()
        );
        return;
    }
    let vm = ["--backend", "microvm"];
    let (cold, cold_phases) = {
        let w = World::start();
        create_to_first_https(&w, "warm-up", &vm);
        let r: Vec<_> = (0..rounds)
            .map(|i| create_to_first_https(&w, &format!("c{i}"), &vm))
            .collect();
        (r, phase_medians(&w, "c"))
    };
    let w = World::start_with("\n[pool]\nmicrovm = 1\nrefill_per_second = 1\n");
    let (pooled, hits) = pooled_rounds(&w, "microvm", 1, rounds, &vm);
    println!(
        "create → first HTTPS request, microvm backend, {rounds} rounds (median [p90, \
         p99]); pool hits {hits}"
    );
    report_ready("cold  ", &cold, &cold_phases);
    report_ready("pooled", &pooled, &phase_medians(&w, "p"));
}

/// `--id-ranges both [--rounds N]`: the cost of a host id range per sandbox. Two svcds at
/// once, one with `container.id_ranges = "shared"`, one with `"per-sandbox"` (otherwise the
/// defaults: each writable layer on its own disk), their rounds alternating so both see the
/// same host load; each figure's median, p90 and spread (fastest–slowest).
fn compare_id_ranges(rounds: usize) {
    let modes = ["shared", "per-sandbox"];
    let worlds: Vec<World> = modes
        .iter()
        .map(|m| World::start_with(&format!("id_ranges = \"{m}\"")))
        .collect();
    worlds.iter().for_each(warm_up);
    let mut results: Vec<Rounds> = modes.iter().map(|_| Rounds::default()).collect();
    for i in 0..rounds {
        // Which goes first alternates too.
        for k in 0..modes.len() {
            let k = (k + i) % modes.len();
            one_round(&worlds[k], &format!("r{i}"), &mut results[k]);
        }
    }
    for (mode, r) in modes.iter().zip(&mut results) {
        println!(
            "sandbox lifecycle, container backend, id_ranges = \"{mode}\", {rounds} rounds \
             alternating with the other setting (median [p90] fastest–slowest)"
        );
        for (what, v) in r.figures() {
            println!(
                "  {what}  {} [{}] {}–{}",
                ms(median(v)),
                ms(p90(v)),
                ms(v[0]),
                ms(v[v.len() - 1])
            );
        }
    }
}

/// The value after `flag` in the arguments, if given.
fn arg(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .map(|i| args.get(i + 1).cloned().unwrap_or_default())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds = |default: usize| {
        arg(&args, "--rounds").map_or(default, |n| {
            n.parse()
                .ok()
                .filter(|&n| n > 0)
                .unwrap_or_else(|| panic!("--rounds: expected a count above 0, got {n:?}"))
        })
    };
    if args.iter().any(|a| a == "--pool") {
        pooled_beside_cold(rounds(POOL_ROUNDS));
        return;
    }
    match arg(&args, "--id-ranges").as_deref() {
        None => {}
        Some("both") => return compare_id_ranges(rounds(ROUNDS)),
        Some(other) => panic!("--id-ranges: expected `both`, got {other:?}"),
    }
    // The disk limit's cost, in the same run: the writable layer a directory of the state's
    // (`disk_mib = 0`), then on a 10 GiB ext4 image of its own (the default).
    let mut plain = {
        let w = World::start_with("disk_mib = 0");
        svcd_rounds(&w)
    };
    let w = World::start_with("disk_mib = 10240");
    let mut disk = svcd_rounds(&w);

    // The floor, in the same run: what runc itself takes for the same kind of sandbox.
    let (mut bare_up, mut bare_down, mut bare_exec) = (vec![], vec![], vec![]);
    let floor = w.dir.join("floor");
    let state = floor.join("runc");
    // svcd's OCI runtime (crun by default): the floor runs the same program svcd does.
    let runtime = w.oci_runtime();
    let runtime_name = runtime.to_str().expect("the runtime's path is UTF-8");
    let ids = (200_000u32, 200_000u32);
    let root = std::fs::read_to_string("/etc/subuid")
        .ok()
        .and_then(|t| svc_control::runtime::container::rootfs::subordinate_range(&t, "svc-sandbox"))
        .unwrap_or(ids.0);
    let range = svc_control::runtime::container::rootfs::IdRange {
        uid: root,
        gid: root,
    };
    // The image shifted into the shared range (made here when svcd, per-sandbox by default,
    // made none).
    let lower = svc_control::runtime::container::rootfs::shifted_image(
        &svc_tests::world::image_dir(),
        range,
    )
    .expect("the image shifted into svc-sandbox's first range");
    for i in 0..ROUNDS {
        let name = format!("floor{i}");
        let dir = floor.join(&name);
        let t0 = Instant::now();
        let layers = svc_control::runtime::container::rootfs::Layers::under(&dir);
        layers.mount(&lower, range).expect("overlay");
        let map = svc_control::runtime::container::oci::IdMapping {
            container_id: 0,
            host_id: root,
            size: 65536,
        };
        let spec = svc_control::runtime::container::oci::sandbox(
            &svc_control::runtime::container::oci::SandboxBundle {
                hostname: &name,
                uid_map: map,
                gid_map: map,
                files: &[],
                shared: &[],
                sub_binds: &[],
                init: svc_control::runtime::container::INIT
                    .iter()
                    .map(|s| (*s).to_owned())
                    .collect(),
                cgroups_path: format!("/{}/{name}", w.cgroup_parent),
                limits: svc_control::runtime::container::oci::Limits {
                    memory_bytes: 4096 << 20,
                    pids_max: 4096,
                    cpu_millis: 2000,
                },
            },
        );
        std::fs::write(
            dir.join("bundle/config.json"),
            serde_json::to_vec(&spec).expect("json"),
        )
        .expect("config.json");
        let pid_file = dir.join("pid");
        // The container keeps the runtime's standard streams: give it none of ours to hold
        // open. The runtime is svcd's own (crun by default), so the floor is the same program.
        let status = std::process::Command::new(&runtime)
            .arg("--root")
            .arg(&state)
            .args(["run", "--detach", "--bundle"])
            .arg(dir.join("bundle"))
            .arg("--pid-file")
            .arg(&pid_file)
            .arg(&name)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .expect("runc run");
        assert!(status.success(), "runc run: {status}");
        let pid = std::fs::read_to_string(&pid_file).expect("pid");
        run(
            "ip",
            &[
                "link",
                "add",
                "svbh0",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                &format!("/proc/{}/ns/net", pid.trim()),
            ],
        );
        run("ip", &["addr", "add", "10.250.0.1/30", "dev", "svbh0"]);
        run("ip", &["link", "set", "svbh0", "up"]);
        let netns = format!("--net=/proc/{}/ns/net", pid.trim());
        run(
            "nsenter",
            &[&netns, "ip", "addr", "add", "10.250.0.2/30", "dev", "eth0"],
        );
        run("nsenter", &[&netns, "ip", "link", "set", "eth0", "up"]);
        bare_up.push(t0.elapsed());
        let e0 = Instant::now();
        run(
            runtime_name,
            &[
                "--root",
                state.to_str().expect("utf-8"),
                "exec",
                &name,
                "true",
            ],
        );
        bare_exec.push(e0.elapsed());
        let t1 = Instant::now();
        run(
            runtime_name,
            &[
                "--root",
                state.to_str().expect("utf-8"),
                "delete",
                "--force",
                &name,
            ],
        );
        layers.unmount().expect("unmount");
        let _ = std::process::Command::new("ip")
            .args(["link", "del", "svbh0"])
            .output();
        bare_down.push(t1.elapsed());
        let _ = std::fs::remove_dir_all(&dir);
    }

    for (label, r) in [
        ("writable layer a directory (disk_mib = 0)", &mut plain),
        (
            "writable layer on its own 10 GiB disk (disk_mib = 10240)",
            &mut disk,
        ),
    ] {
        report(label, r);
    }
    println!(
        "floor, same run: {} run of the same bundle + a veth addressed with `ip`",
        runtime.display()
    );
    println!(
        "  overlay + run + veth + addresses           {} [{}]",
        ms(median(&mut bare_up)),
        ms(p90(&mut bare_up))
    );
    println!(
        "  one runtime `exec … true`                  {} [{}]",
        ms(median(&mut bare_exec)),
        ms(p90(&mut bare_exec))
    );
    println!(
        "  delete --force + unmount + link            {} [{}]",
        ms(median(&mut bare_down)),
        ms(p90(&mut bare_down))
    );
    drop(w);
    pooled_beside_cold(POOL_ROUNDS);
}

fn report(label: &str, r: &mut Rounds) {
    println!(
        "sandbox lifecycle, container backend, {label}, {ROUNDS} rounds (medians; p90 in brackets)"
    );
    for (what, v) in r.figures() {
        println!("  {what}  {} [{}]", ms(median(v)), ms(p90(v)));
    }
}

impl Rounds {
    /// Each figure with its label.
    fn figures(&mut self) -> [(&'static str, &mut Vec<Duration>); 5] {
        [
            (
                "svc sandbox create (API answered)        ",
                &mut self.create,
            ),
            ("then first HTTPS request succeeds        ", &mut self.first),
            ("create → first HTTPS request succeeded   ", &mut self.ready),
            (
                "svc sandbox destroy                      ",
                &mut self.destroy,
            ),
            (
                "one `svc sandbox exec -- true` (overhead)",
                &mut self.exec_true,
            ),
        ]
    }
}
