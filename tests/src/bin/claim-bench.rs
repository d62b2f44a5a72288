//! `cargo xtask bench claim`: a microvm pool claim's guest step (what `setup::claim` sends: the
//! agent's setup request beside the sandbox's guest files written through the channel) on VMs
//! booted with each machine variant svcd can give, interleaved round by round in one run:
//! `legacy` (private RAM, legacy virtio-mmio: a VM with no vhost-user device), `memfd` (the RAM
//! a shared memfd), `modern` (modern virtio-mmio), `memfd+modern`, and `trees` (both and the
//! spare virtio-fs share served by a virtiofsd and mounted in the guest, as every VM booted
//! after the trees share came). Each VM is set up once as the pool sets up its guests, then
//! claimed [`CLAIMS`] times; the figures are per claim: median and range over every round.
//! Without svcd: the guest's own cost, the VM's command line from `Qemu::args`.
#![expect(clippy::expect_used, reason = "a benchmark: any failure ends it")]

use std::{
    ffi::OsString,
    path::PathBuf,
    time::{Duration, Instant},
};

use svc_control::runtime::microvm::{
    channel::Channel,
    qemu::{Accel, Images, VmDir},
};
use svc_guest::proto::{Request, Setup, TREES_DIR, TREES_TAG};
use svc_tests::{bare_vm, ms_stats, world::World};

/// Claims per booted VM (the first is counted too: a pooled VM is claimed once).
const CLAIMS: usize = 4;

/// The machine variants, in the order each round boots them.
const VARIANTS: &[&str] = &[
    "legacy",
    "memfd",
    "modern",
    "memfd+modern",
    "trees",
    "grown",
    "grown+trees",
    "grown+sync",
    "grown+wait",
    "grown+trees+files",
    "grown+trees+warm",
    "grown+warm",
];

/// The guest's disk in the `grown` variants: `[container] disk_mib`'s default, 10 GiB.
const GROWN_MIB: u64 = 10 * 1024;

fn main() {
    if std::env::args().any(|a| a == "--svcd") {
        return through_svcd();
    }
    let rounds: usize = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .map_or(3, |n| n.parse().expect("--rounds N"));
    let only: Option<Vec<String>> = std::env::args()
        .skip_while(|a| a != "--variants")
        .nth(1)
        .map(|v| v.split(',').map(str::to_owned).collect());
    let variants: Vec<&str> = VARIANTS
        .iter()
        .copied()
        .filter(|v| only.as_ref().is_none_or(|o| o.iter().any(|x| x == v)))
        .collect();
    let images = bare_vm::images();
    let (accel, why) = Accel::choose("auto");
    let rt = bare_vm::runtime();
    let files = guest_files();
    let mut claims: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut boots: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    let mut cpus: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for round in 0..rounds {
        // Rotate the order each round: no variant always boots first or last.
        for k in 0..variants.len() {
            let i = (k + round) % variants.len();
            let (boot, each) = rt.block_on(one_vm(&images, accel, variants[i], &files));
            println!(
                "round {round} {:<13} boot {boot:>7.1} ms  claims (wall/QEMU CPU) {:?}",
                variants[i],
                each.iter()
                    .map(|(w, c)| format!("{w:.1}/{c:.1}"))
                    .collect::<Vec<_>>()
            );
            boots[i].push(boot);
            claims[i].extend(each.iter().map(|(w, _)| *w));
            cpus[i].extend(each.iter().map(|(_, c)| *c));
        }
    }
    println!(
        "microvm claim's guest step under {} ({why}), {rounds} interleaved rounds, {CLAIMS} \
         claims per VM, 512 MiB guest",
        accel.name()
    );
    for (i, v) in variants.iter().enumerate() {
        println!(
            "  {v:<13} claim {}   QEMU's CPU in it {}   boot to hello {}",
            ms_stats(&mut claims[i]),
            ms_stats(&mut cpus[i]),
            ms_stats(&mut boots[i])
        );
    }
}

/// The files a claim writes, as svcd writes them: resolv.conf, hosts, the system bundle with
/// the sandbox CA appended, the CA alone.
fn guest_files() -> Vec<(String, Vec<u8>)> {
    let ca = "-----BEGIN CERTIFICATE-----\n".to_owned()
        + &"A"
            .repeat(64 * 10)
            .replace(&"A".repeat(64), &("A".repeat(64) + "\n"))
        + "-----END CERTIFICATE-----\n";
    let system = std::fs::read_to_string("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default();
    vec![
        (
            "/etc/resolv.conf".into(),
            b"nameserver 10.0.0.1\noptions edns0\n".to_vec(),
        ),
        (
            "/etc/hosts".into(),
            b"127.0.0.1\tlocalhost\n127.0.1.1\tclaimed\n".to_vec(),
        ),
        (
            "/etc/ssl/certs/ca-certificates.crt".into(),
            (system + &ca).into_bytes(),
        ),
        (
            "/usr/local/share/ca-certificates/svc-sandbox-ca.crt".into(),
            ca.into_bytes(),
        ),
    ]
}

/// Boot one VM of `variant`, set it up as the pool does, claim it [`CLAIMS`] times, quit.
/// The boot to the agent's hello and each claim (wall clock, QEMU's CPU time), in
/// milliseconds.
async fn one_vm(
    images: &Images,
    accel: Accel,
    variant: &str,
    files: &[(String, Vec<u8>)],
) -> (f64, Vec<(f64, f64)>) {
    let dir = VmDir(svc_tests::fresh_dir("svcl"));
    let grown = variant.starts_with("grown");
    bare_vm::overlay(images, &dir, grown.then_some(GROWN_MIB)).await;
    let trees = variant.contains("trees");
    let mut virtiofsd = trees.then(|| start_virtiofsd(&dir));
    let shared = if trees {
        vec![(dir.0.join("trees.sock"), TREES_TAG.to_owned())]
    } else {
        Vec::new()
    };
    let tap = format!("svcl{}", std::process::id() % 100_000);
    let args = variant_args(
        bare_vm::root_args(&dir, images, accel, &tap, &shared),
        variant,
    );
    let t = Instant::now();
    let vm = bare_vm::boot(&dir, args).await;
    let boot = t.elapsed().as_secs_f64() * 1000.0;
    let channel = &vm.channel;
    pool_set_up(channel, variant, files).await;
    // The pool claims a VM as soon as it is ready.
    let mut each = Vec::new();
    let pid = vm.child.id().expect("QEMU's pid");
    for n in 0..CLAIMS {
        let (t, cpu) = (Instant::now(), cpu_ms(pid));
        claim(channel, &format!("claimed{n}"), files).await;
        each.push((t.elapsed().as_secs_f64() * 1000.0, cpu_ms(pid) - cpu));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    vm.quit().await;
    if let Some(v) = virtiofsd.as_mut() {
        let _ = v.kill();
        let _ = v.wait();
    }
    let _ = std::fs::remove_dir_all(&dir.0);
    (boot, each)
}

/// What the pool's boot gives a fresh guest of `variant`: its files, its root file system
/// grown to its disk (`grown…`), then its trees share mounted (`…trees…`), with the variant's
/// extra step.
async fn pool_set_up(
    channel: &std::sync::Arc<Channel>,
    variant: &str,
    files: &[(String, Vec<u8>)],
) {
    let (grown, trees) = (variant.starts_with("grown"), variant.contains("trees"));
    claim(channel, "pooled", files).await;
    if grown {
        run(
            channel,
            "resize2fs \"$(findmnt -n -o SOURCE /)\" >/dev/null 2>&1",
        )
        .await;
    }
    if variant == "grown+sync" {
        run(channel, "sync").await;
    }
    if variant == "grown+wait" {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if trees {
        channel
            .call(
                &Request::Mount {
                    tag: TREES_TAG.to_owned(),
                    path: TREES_DIR.to_owned(),
                },
                b"",
            )
            .await
            .expect("the trees share mounted");
    }
    if variant == "grown+trees+files" {
        claim(channel, "pooled", files).await;
    }
    if variant.ends_with("+warm") {
        run(channel, "sync").await;
        claim(channel, "pooled", files).await;
        run(channel, "sync").await;
    }
}

/// The CPU time every thread of process `pid` has had, in milliseconds (schedstat: ns).
fn cpu_ms(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0.0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .sum::<f64>()
        / 1e6
}

/// `sh -c script` in the guest, which must exit 0.
async fn run(channel: &std::sync::Arc<Channel>, script: &str) {
    let mut h = channel
        .exec(svc_guest::proto::Exec {
            argv: ["/bin/sh", "-c", script].map(str::to_owned).to_vec(),
            ..svc_guest::proto::Exec::default()
        })
        .expect("exec");
    assert_eq!(h.wait().await.expect("exit"), 0, "{script}");
}

/// What `setup::claim` sends: the setup request beside every file's write.
async fn claim(channel: &Channel, name: &str, files: &[(String, Vec<u8>)]) {
    let setup = Request::Setup(Setup {
        hostname: name.to_owned(),
        address: "10.200.0.2/30".into(),
        gateway: "10.200.0.1".into(),
        entropy: "ab".repeat(64),
        clock_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    });
    let writes = files.iter().map(|(path, content)| async move {
        let write = Request::WriteFile {
            path: path.clone(),
            mode: 0o644,
        };
        channel.call(&write, content).await
    });
    let (s, w) = tokio::join!(channel.call(&setup, b""), futures::future::join_all(writes));
    s.expect("setup");
    for r in w {
        r.expect("write");
    }
}

/// The command line of `variant` from the one `Qemu::args` gave a VM without (`legacy`) or
/// with (`trees`) a vhost-user device.
fn variant_args(mut args: Vec<OsString>, variant: &str) -> Vec<OsString> {
    let memfd = |a: &mut Vec<OsString>| {
        let m = a
            .iter()
            .position(|x| x == "microvm,pit=on,acpi=on")
            .expect("-M");
        a[m] = "microvm,pit=on,acpi=on,memory-backend=mem".into();
        a.splice(
            m + 1..m + 1,
            [
                "-object".into(),
                "memory-backend-memfd,id=mem,size=512M,share=on".into(),
            ],
        );
    };
    let modern = |a: &mut Vec<OsString>| {
        a.extend(["-global".into(), "virtio-mmio.force-legacy=false".into()]);
    };
    match variant {
        v if !v.contains("memfd") && !v.contains("modern") => {}
        "memfd" => memfd(&mut args),
        "modern" => modern(&mut args),
        "memfd+modern" => {
            memfd(&mut args);
            modern(&mut args);
        }
        other => panic!("no variant {other}"),
    }
    args
}

/// A virtiofsd serving an empty directory on the VM's trees socket.
fn start_virtiofsd(dir: &VmDir) -> std::process::Child {
    let shared: PathBuf = dir.0.join("trees");
    std::fs::create_dir_all(&shared).expect("trees");
    let socket = dir.0.join("trees.sock");
    let child = std::process::Command::new(virtiofsd())
        .arg("--socket-path")
        .arg(&socket)
        .arg("--shared-dir")
        .arg(&shared)
        .args(["--sandbox", "namespace", "--cache", "auto"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("virtiofsd");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        assert!(Instant::now() < deadline, "virtiofsd made no socket");
        std::thread::sleep(Duration::from_millis(5));
    }
    child
}

fn virtiofsd() -> PathBuf {
    svc_tests::world::tool("virtiofsd").expect("virtiofsd (`cargo xtask setup --tests` builds it)")
}

/// `--svcd [--rounds N]`: pooled microvm creates through two svcds at once ([`two_worlds`]),
/// their rounds alternating; each round waits for both pools to be full (no VM boots during a
/// claim), creates (`--idle`: half a second later, the guest's own CPU before it measured),
/// destroys. The create's answer, svcd's `guest` step (the claim through the agent) and the
/// pooled VM's QEMU CPU time during the create, per svcd.
fn through_svcd() {
    let rounds: usize = std::env::args()
        .skip_while(|a| a != "--rounds")
        .nth(1)
        .map_or(10, |n| n.parse().expect("--rounds N"));
    let settle = Duration::from_millis(
        std::env::args()
            .skip_while(|a| a != "--settle-ms")
            .nth(1)
            .map_or(0, |n| n.parse().expect("--settle-ms N")),
    );
    let worlds = two_worlds();
    let mut answers: Vec<Vec<f64>> = vec![Vec::new(); worlds.len()];
    let mut cpus: Vec<Vec<f64>> = vec![Vec::new(); worlds.len()];
    for round in 0..=rounds {
        for k in 0..worlds.len() {
            let i = (k + round) % worlds.len();
            let w = &worlds[i].1;
            // Both pools full: no VM boots while this one is claimed.
            let deadline = Instant::now() + Duration::from_secs(180);
            while worlds
                .iter()
                .any(|(_, w)| w.metric("svc_pool_size{backend=\"microvm\"}") < 1)
            {
                assert!(Instant::now() < deadline, "a pool did not refill");
                std::thread::sleep(Duration::from_millis(20));
            }
            std::thread::sleep(settle);
            let name = format!("p{round}");
            let qemu = pooled_qemu(w);
            // `--idle`: how busy the pooled guest is on its own for half a second before the
            // claim (which then comes that much later).
            let idle = if std::env::args().any(|a| a == "--idle") {
                let before = cpu_ms(qemu);
                std::thread::sleep(Duration::from_millis(500));
                format!(", {:.0} ms/s before it", (cpu_ms(qemu) - before) * 2.0)
            } else {
                String::new()
            };
            let (t, cpu) = (Instant::now(), cpu_ms(qemu));
            w.svc_ok(&["sandbox", "create", "--backend", "microvm", &name]);
            let took = t.elapsed().as_secs_f64() * 1000.0;
            let cpu = cpu_ms(qemu) - cpu;
            w.svc_ok(&["sandbox", "destroy", &name]);
            println!(
                "round {round} {:<15} create answered {took:.1} ms, QEMU's CPU in it {cpu:.1} ms{idle}",
                worlds[i].0
            );
            // Round 0 is the warm-up.
            if round > 0 {
                answers[i].push(took);
                cpus[i].push(cpu);
            }
        }
    }
    println!(
        "pooled microvm create through svcd, {rounds} alternating rounds, each claim {} ms \
         after both pools were full{}",
        settle.as_millis(),
        if std::env::args().any(|a| a == "--idle") {
            " (+500 ms: --idle)"
        } else {
            ""
        }
    );
    report(&worlds, &mut answers, &mut cpus);
}

/// Each svcd's figures (and with `CLAIM_BENCH_LOG` set, its log's set-up lines).
fn report(worlds: &[(&str, World)], answers: &mut [Vec<f64>], cpus: &mut [Vec<f64>]) {
    for (i, (label, w)) in worlds.iter().enumerate() {
        let mut guest: Vec<f64> = w
            .create_phases("p")
            .into_iter()
            .find(|(s, _)| s == "guest")
            .map(|(_, v)| v.iter().skip(1).map(|d| d.as_secs_f64() * 1000.0).collect())
            .unwrap_or_default();
        println!(
            "  {label:<15} create answered {}   guest step {}   QEMU's CPU {}",
            ms_stats(&mut answers[i]),
            ms_stats(&mut guest),
            ms_stats(&mut cpus[i])
        );
        if std::env::var_os("CLAIM_BENCH_LOG").is_some() {
            for l in w.svcd_log().lines().filter(|l| {
                l.contains("setup call") || l.contains("written") || l.contains("microvm started")
            }) {
                println!("    {l}");
            }
        }
    }
}

/// The two svcds `--svcd` compares: the workspace's beside `--before PATH`'s, or with and
/// without the trees share (`--no-disk`: with it, and without the disk growth).
fn two_worlds() -> [(&'static str, World); 2] {
    let pool = "\n[pool]\nmicrovm = 1\nrefill_per_second = 1\n";
    let no_disk = format!("disk_mib = 0{pool}");
    let before: Option<PathBuf> = std::env::args()
        .skip_while(|a| a != "--before")
        .nth(1)
        .map(PathBuf::from);
    [
        (
            if before.is_some() {
                "after"
            } else {
                "trees share"
            },
            World::start_with_tables(None, "", pool),
        ),
        if let Some(svcd) = &before {
            ("before", World::start_with_tables(Some(svcd), "", pool))
        } else if std::env::args().any(|a| a == "--no-disk") {
            (
                "trees, no disk",
                World::start_with_tables(None, "", &no_disk),
            )
        } else {
            (
                "no trees share",
                World::start_with_tables(None, "virtiofsd = \"/nonexistent/virtiofsd\"\n", pool),
            )
        },
    ]
}

/// The pid of the one QEMU of world `w` (its pooled VM: each claimed one is destroyed).
fn pooled_qemu(w: &World) -> u32 {
    let dir = w.dir.display().to_string();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.starts_with("qemu-system") && c.contains(&dir)
            })
        })
        .expect("the pooled VM's QEMU")
}
