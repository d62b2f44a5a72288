//! `cargo xtask bench exec`: one `svc sandbox exec -- true` through svcd, alternating in one run
//! on one svcd: a sandbox made by an earlier svcd (adopted after a restart: its commands run by
//! its init over the channel this svcd sent it through the init's hand-over socket) beside one
//! made by this svcd (its commands run by its init, over the channel svcd handed it at create).
//! Beside them, the OCI runtime's own `exec … true` (svcd's runtime, crun by default) on the
//! same container (how svcd ran every command before the init, and still runs those of a guest
//! whose init gives no channel), and the floor of the command line: `svc sandbox show`.
//! Median, p90 and p99 over the rounds (default 100; the argument says how many).

use std::time::{Duration, Instant};

use svc_tests::world::World;

fn pick(v: &mut [Duration], per_mille: usize) -> Duration {
    v.sort();
    v[((v.len() * per_mille) / 1000).min(v.len() - 1)]
}

fn line(what: &str, v: &mut [Duration]) {
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    println!(
        "  {what:<44} {} [p90 {}, p99 {}]",
        ms(pick(v, 500)),
        ms(pick(v, 900)),
        ms(pick(v, 990))
    );
}

fn timed(f: impl FnOnce()) -> Duration {
    let t0 = Instant::now();
    f();
    t0.elapsed()
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(100);
    let mut w = World::start();
    // Made by "an earlier svcd": adopted after the restart, its channel through the hand-over.
    w.svc_ok(&["sandbox", "create", "before"]);
    w.kill_svcd();
    w.start_svcd();
    w.svc_ok(&["sandbox", "create", "after"]);
    let runc_root = w.dir.join("state/runc");
    let list = std::process::Command::new(w.oci_runtime())
        .arg("--root")
        .arg(&runc_root)
        .args(["list", "-q"])
        .output()
        .expect("the runtime's list");
    let ids = String::from_utf8_lossy(&list.stdout).into_owned();
    let after_id = ids
        .lines()
        .find(|l| l.contains("after"))
        .expect("the container of `after`")
        .to_owned();
    let exec = |name: &str| {
        w.svc_ok(&["sandbox", "exec", name, "--", "true"]);
    };
    // Warm up both paths.
    for _ in 0..3 {
        exec("before");
        exec("after");
    }
    let (mut old, mut new, mut bare, mut show) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        old.push(timed(|| exec("before")));
        new.push(timed(|| exec("after")));
        bare.push(timed(|| {
            let out = std::process::Command::new(w.oci_runtime())
                .arg("--root")
                .arg(&runc_root)
                .args(["exec", &after_id, "true"])
                .output()
                .expect("the runtime's exec");
            assert!(out.status.success());
        }));
        show.push(timed(|| {
            w.svc_ok(&["sandbox", "show", "after"]);
        }));
    }
    println!("exec, container backend, {rounds} rounds alternating (median [p90, p99])");
    line("svc sandbox exec -- true, adopted (hand-over)", &mut old);
    line("svc sandbox exec -- true, the init (fresh)", &mut new);
    let runtime = w.oci_runtime();
    let runtime = runtime.file_name().map_or_else(
        || runtime.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    line(&format!("{runtime} exec … true alone"), &mut bare);
    line("svc sandbox show (the CLI and API floor)", &mut show);
}
