//! `cargo xtask bench sandbox`: time from `svc sandbox create` to a sandbox whose first HTTPS
//! request succeeds, and destroy time, netns backend, median over 20 — beside, in the same
//! run, the floor: a bare network namespace with a veth and addresses made with `ip` (what any
//! netns sandbox needs before svc adds anything), and the cost of one `svc sandbox exec`.

use std::time::{Duration, Instant};

use svc_tests::world::World;

const ROUNDS: usize = 20;

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p90(v: &mut [Duration]) -> Duration {
    v.sort();
    v[(v.len() * 9) / 10 - 1]
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

fn main() {
    let w = World::start();
    // Warm up: one sandbox created, used and destroyed (first-use costs are not the figure).
    w.svc_ok(&["sandbox", "create", "warm"]);
    w.svc_ok(&[
        "sandbox",
        "exec",
        "warm",
        "--",
        "curl",
        "-sS",
        "https://api.agent.test/",
    ]);
    w.svc_ok(&["sandbox", "destroy", "warm"]);

    let (mut create, mut ready, mut first, mut destroy, mut exec_true) =
        (vec![], vec![], vec![], vec![], vec![]);
    for i in 0..ROUNDS {
        let name = format!("b{i}");
        let t0 = Instant::now();
        w.svc_ok(&["sandbox", "create", &name]);
        let t1 = Instant::now();
        // The first HTTPS request: DNS through the guard, the fence, the proxy, upstream TLS.
        loop {
            let out = w.svc(&[
                "sandbox",
                "exec",
                &name,
                "--",
                "curl",
                "-sS",
                "--max-time",
                "5",
                "https://api.agent.test/",
            ]);
            if out.status.success() {
                break;
            }
            assert!(t1.elapsed() < Duration::from_secs(10), "never became ready");
        }
        let t2 = Instant::now();
        let e0 = Instant::now();
        w.svc_ok(&["sandbox", "exec", &name, "--", "true"]);
        exec_true.push(e0.elapsed());
        let d0 = Instant::now();
        w.svc_ok(&["sandbox", "destroy", &name]);
        destroy.push(d0.elapsed());
        create.push(t1 - t0);
        first.push(t2 - t1);
        ready.push(t2 - t0);
    }

    // The floor, in the same run: a bare namespace, a veth into it, addresses, up; and removal.
    let (mut bare_up, mut bare_down) = (vec![], vec![]);
    for i in 0..ROUNDS {
        let ns = format!("svbench{i}");
        let t0 = Instant::now();
        run("ip", &["netns", "add", &ns]);
        run(
            "ip",
            &[
                "link", "add", "svbh0", "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ],
        );
        run("ip", &["addr", "add", "10.250.0.1/30", "dev", "svbh0"]);
        run("ip", &["link", "set", "svbh0", "up"]);
        run(
            "ip",
            &["-n", &ns, "addr", "add", "10.250.0.2/30", "dev", "eth0"],
        );
        run("ip", &["-n", &ns, "link", "set", "eth0", "up"]);
        bare_up.push(t0.elapsed());
        let t1 = Instant::now();
        run("ip", &["netns", "del", &ns]);
        let _ = std::process::Command::new("ip")
            .args(["link", "del", "svbh0"])
            .output();
        bare_down.push(t1.elapsed());
    }

    println!("sandbox lifecycle, netns backend, {ROUNDS} rounds (medians; p90 in brackets)");
    println!(
        "  svc sandbox create (API answered)          {} [{}]",
        ms(median(&mut create)),
        ms(p90(&mut create))
    );
    println!(
        "  then first HTTPS request succeeds          {} [{}]",
        ms(median(&mut first)),
        ms(p90(&mut first))
    );
    println!(
        "  create → first HTTPS request succeeded     {} [{}]   target ≤ 150 ms",
        ms(median(&mut ready)),
        ms(p90(&mut ready))
    );
    println!(
        "  svc sandbox destroy                        {} [{}]",
        ms(median(&mut destroy)),
        ms(p90(&mut destroy))
    );
    println!(
        "  one `svc sandbox exec -- true` (overhead)  {} [{}]",
        ms(median(&mut exec_true)),
        ms(p90(&mut exec_true))
    );
    println!("floor, same run: bare netns + veth + addresses with `ip`");
    println!(
        "  set up                                     {} [{}]",
        ms(median(&mut bare_up)),
        ms(p90(&mut bare_up))
    );
    println!(
        "  removed                                    {} [{}]",
        ms(median(&mut bare_down)),
        ms(p90(&mut bare_down))
    );
}
