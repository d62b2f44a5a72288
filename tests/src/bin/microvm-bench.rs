//! `cargo xtask bench microvm`: the microvm lifecycle through svcd — create→READY, pause,
//! snapshot, fork→READY, resume, destroy, as `svc canary --json` times them — beside, in the
//! same run and interleaved with it, the reference: a bare QEMU boot of the same images with
//! the same command line (qcow2 overlay, QEMU started paused, `cont`, the agent's hello on
//! its channel), no svcd. Our overhead is create→READY over the bare boot. Median and range
//! over the rounds (TCG here; KVM hosts are an order of magnitude faster).
#![expect(clippy::expect_used, reason = "a benchmark: any failure ends it")]

use std::time::Instant;

use svc_control::runtime::microvm::qemu::{Accel, Images, VmDir};
use svc_tests::{bare_vm, ms_stats, world::World};

const ROUNDS: usize = 5;

/// One bare boot: overlay, QEMU paused, cont, the agent's hello; then quit. Milliseconds.
async fn bare_boot(images: &Images, accel: Accel) -> f64 {
    let dir = VmDir(svc_tests::fresh_dir("svb"));
    let t = Instant::now();
    bare_vm::overlay(images, &dir, None).await;
    let tap = format!("svb{}", std::process::id() % 100_000);
    let vm = bare_vm::boot(&dir, bare_vm::root_args(&dir, images, accel, &tap, &[])).await;
    let ms = t.elapsed().as_secs_f64() * 1000.0;
    vm.quit().await;
    let _ = std::fs::remove_dir_all(&dir.0);
    ms
}

fn canary(w: &World) -> serde_json::Value {
    let out = w.svc(&["canary", "--json"]);
    assert!(
        out.status.success(),
        "canary failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("canary json")
}

fn main() {
    let images = bare_vm::images();
    let (accel, why) = Accel::choose("auto");
    let rt = bare_vm::runtime();
    let w = World::start();
    // Warm up both (page cache, first-use costs).
    rt.block_on(bare_boot(&images, accel));
    canary(&w);

    let (mut bare, mut create, mut pause, mut snapshot, mut fork_ready, mut resume, mut destroy) =
        (vec![], vec![], vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..ROUNDS {
        bare.push(rt.block_on(bare_boot(&images, accel)));
        let r = canary(&w);
        let step = |name: &str| -> &serde_json::Value {
            r["steps"]
                .as_array()
                .expect("steps")
                .iter()
                .find(|s| s["step"] == name)
                .expect("step")
        };
        create.push(step("create")["ms"].as_f64().expect("ms"));
        pause.push(step("pause")["ms"].as_f64().expect("ms"));
        resume.push(step("resume")["ms"].as_f64().expect("ms"));
        destroy.push(step("destroy")["ms"].as_f64().expect("ms"));
        // "snapshot 812 ms, clone ready 1234 ms"
        let detail = step("fork")["detail"].as_str().expect("detail").to_owned();
        let nums: Vec<f64> = detail
            .split(|c: char| !c.is_ascii_digit() && c != '.')
            .filter_map(|n| n.parse().ok())
            .collect();
        snapshot.push(nums[0]);
        fork_ready.push(nums[1]);
    }
    let mut ratio: Vec<f64> = create.iter().zip(&bare).map(|(c, b)| c / b).collect();
    println!(
        "microvm lifecycle under {} ({why}), {ROUNDS} interleaved rounds, 512 MiB guest",
        accel.name()
    );
    println!(
        "  bare QEMU boot to the agent's hello  {}",
        ms_stats(&mut bare)
    );
    println!(
        "  svc create → READY                   {}",
        ms_stats(&mut create)
    );
    println!(
        "  pause                                {}",
        ms_stats(&mut pause)
    );
    println!(
        "  snapshot (fork, source paused)       {}",
        ms_stats(&mut snapshot)
    );
    println!(
        "  fork → clone READY                   {}",
        ms_stats(&mut fork_ready)
    );
    println!(
        "  resume                               {}",
        ms_stats(&mut resume)
    );
    println!(
        "  destroy (source and clone)           {}",
        ms_stats(&mut destroy)
    );
    // Where svcd's part of create goes (its debug log: launch, fence and cont, boot to the
    // agent's hello, setup), for the last rounds.
    let log = w.svcd_log();
    let phases: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("microvm started"))
        .collect();
    for l in phases.iter().rev().take(4).rev() {
        let fields = l.split("microvm started").nth(1).unwrap_or(l).trim();
        println!("  svcd phases: {fields}");
    }
    ratio.sort_by(f64::total_cmp);
    println!(
        "  create / bare boot, per round        median {:.2}×  (range {:.2}–{:.2})",
        ratio[ratio.len() / 2],
        ratio[0],
        ratio[ratio.len() - 1]
    );
}
