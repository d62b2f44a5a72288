//! `cargo xtask bench runtime` (issue 31): the OCI runtimes side by side on the bundle svcd
//! makes — the guest's user namespace mapped onto `svc-sandbox`'s id range, the shifted base
//! image under a per-sandbox overlay, its own network namespace, cgroup limits on the hybrid
//! layout, the seccomp filter: the same `config.json` from `runtime::container::oci`. Each
//! round times, for every runtime in turn (the order rotates each round), create, start, one
//! exec of `true`, and kill + delete; then one proof per runtime of an idmapped bind mount of
//! the unshifted base image. A runtime is a runc-compatible CLI (`LABEL=PROGRAM`) or, with
//! `--lib`, `youki-bench` (youki's libcontainer in-process, spoken to by lines on a pipe).

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use svc_control::runtime::container::{INIT, oci, rootfs};

const USAGE: &str = "usage: runtime-bench [--rounds N] [--warm-up N] [--lib LABEL=PROGRAM]... \
                     [LABEL=PROGRAM]...

  LABEL=PROGRAM        a runc-compatible runtime CLI (runc, crun), named LABEL in the table
  --lib LABEL=PROGRAM  youki-bench: libcontainer in-process, driven over its stdin/stdout
  --rounds N           timed rounds per runtime (default 30)
  --warm-up N          untimed rounds first (default 3)
  --help               this text

Run as root; the base image is `cargo xtask images`'s (SVC_TEST_IMAGE overrides it).";

/// The steps timed, in order.
const STEPS: [&str; 4] = ["create", "start", "exec true", "kill + delete"];

/// How a runtime is driven.
enum Driver {
    /// A runc-compatible command line: one process per step.
    Cli(PathBuf),
    /// `youki-bench`: one process for the whole run, one line per step.
    Lib {
        child: Child,
        input: ChildStdin,
        output: BufReader<ChildStdout>,
    },
}

/// One runtime under test: how it is driven, its state directory and its figures per step.
struct Runtime {
    label: String,
    driver: Driver,
    state: PathBuf,
    figures: [Vec<Duration>; 4],
    /// Why it ran no sandbox, if it failed one (it is left out of the rounds after).
    refused: Option<String>,
}

impl Runtime {
    fn new(label: &str, program: &str, lib: bool, work: &Path) -> Self {
        let state = work.join(format!("state-{label}"));
        std::fs::create_dir_all(&state).expect("state dir");
        let driver = if lib {
            let mut child = Command::new(program)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("{program}: {e}"));
            let input = child.stdin.take().expect("stdin");
            let output = BufReader::new(child.stdout.take().expect("stdout"));
            Driver::Lib {
                child,
                input,
                output,
            }
        } else {
            Driver::Cli(PathBuf::from(program))
        };
        Self {
            label: label.to_owned(),
            driver,
            state,
            figures: Default::default(),
            refused: None,
        }
    }

    /// One step: `words` is the request (`create ID BUNDLE`, `start ID`, `exec ID ARGS…`,
    /// `kill ID`, `delete ID`); `pid_file` where the CLI writes the init's pid.
    fn step(&mut self, words: &[&str], pid_file: &Path) -> Result<(), String> {
        match &mut self.driver {
            Driver::Cli(program) => cli_step(program, &self.state, words, pid_file),
            Driver::Lib { input, output, .. } => {
                let state = self.state.to_str().expect("utf-8 state dir");
                let line = format!("{} {state} {}\n", words[0], words[1..].join(" "));
                input
                    .write_all(line.as_bytes())
                    .and_then(|()| input.flush())
                    .map_err(|e| format!("youki-bench: {e}"))?;
                let mut answer = String::new();
                output
                    .read_line(&mut answer)
                    .map_err(|e| format!("youki-bench: {e}"))?;
                match answer.trim_end() {
                    "ok" => Ok(()),
                    other => Err(other.trim_start_matches("err ").to_owned()),
                }
            }
        }
    }
}

/// A step by a runc-compatible CLI. `kill` is `kill ID KILL` and the wait for the init to end
/// (this process is its subreaper); `delete` then finds a stopped container.
fn cli_step(program: &Path, state: &Path, words: &[&str], pid_file: &Path) -> Result<(), String> {
    let mut c = Command::new(program);
    c.arg("--root").arg(state);
    match words {
        ["create", id, bundle] => {
            c.args([
                "create",
                "--no-new-keyring",
                "--bundle",
                bundle,
                "--pid-file",
            ])
            .arg(pid_file)
            .arg(id);
        }
        ["kill", id] => {
            c.args(["kill", id, "KILL"]);
        }
        _ => {
            c.args(words);
        }
    }
    // Its messages to a file, never a pipe: a created container's init keeps the runtime's
    // standard streams, and a pipe would stay open as long as it runs.
    let log = pid_file.with_file_name("runtime.err");
    let err = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let status = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .status()
        .map_err(|e| format!("{}: {e}", program.display()))?;
    if !status.success() {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        return Err(format!("{status}: {}", said.trim()));
    }
    if words[0] == "kill" {
        let pid: i32 = std::fs::read_to_string(pid_file)
            .map_err(|e| format!("{}: {e}", pid_file.display()))?
            .trim()
            .parse()
            .map_err(|e| format!("{}: {e}", pid_file.display()))?;
        wait_gone(pid);
    }
    Ok(())
}

/// Wait for `pid` to end: reap it if it is ours, else watch `/proc` until it goes.
fn wait_gone(pid: i32) {
    let pid = nix::unistd::Pid::from_raw(pid);
    if nix::sys::wait::waitpid(pid, None).is_err() {
        let proc = PathBuf::from(format!("/proc/{pid}"));
        while proc.exists() {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// Reap whatever else of ours has ended (runtimes' intermediate processes reparented here).
fn reap() {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    while let Ok(s) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
        if s == WaitStatus::StillAlive {
            break;
        }
    }
}

/// The bundle svcd writes for a sandbox named `id`, on an overlay of `lower` under `dir`;
/// `extra` mounts appended (the idmap proof's). For libcontainer 0.7 (`lib`) without
/// `rootfsPropagation` (`rprivate`), which its create refuses ("failed to prepare rootfs").
fn bundle(
    dir: &Path,
    id: &str,
    lower: &Path,
    range: rootfs::IdRange,
    extra: &[serde_json::Value],
    lib: bool,
) {
    let layers = rootfs::Layers::under(dir);
    layers.mount(lower, range).expect("overlay");
    let map = oci::IdMapping {
        container_id: 0,
        host_id: range.uid,
        size: rootfs::ID_COUNT,
    };
    let spec = oci::sandbox(&oci::SandboxBundle {
        hostname: id,
        uid_map: map,
        gid_map: oci::IdMapping {
            host_id: range.gid,
            ..map
        },
        files: &[],
        shared: &[],
        sub_binds: &[],
        init: INIT.iter().map(|s| (*s).to_owned()).collect(),
        cgroups_path: format!("/svc-rtbench/{id}"),
        limits: oci::Limits {
            memory_bytes: 4096 << 20,
            pids_max: 4096,
            cpu_millis: 2000,
        },
    });
    let mut json = serde_json::to_value(&spec).expect("json");
    if let Some(mounts) = json["mounts"].as_array_mut() {
        mounts.extend(extra.iter().cloned());
    }
    if let Some(linux) = json["linux"].as_object_mut().filter(|_| lib) {
        linux.remove("rootfsPropagation");
    }
    std::fs::write(
        dir.join("bundle/config.json"),
        serde_json::to_vec(&json).expect("json"),
    )
    .expect("config.json");
}

/// Undo [`bundle`].
fn clean(dir: &Path) {
    rootfs::Layers::under(dir).unmount().expect("unmount");
    let _ = std::fs::remove_dir_all(dir);
    reap();
}

/// One timed round of `rt`: create, start, exec `true`, kill + delete.
fn round(
    rt: &mut Runtime,
    dir: &Path,
    id: &str,
    lower: &Path,
    range: rootfs::IdRange,
) -> Result<[Duration; 4], String> {
    let lib = matches!(rt.driver, Driver::Lib { .. });
    bundle(dir, id, lower, range, &[], lib);
    let b = dir.join("bundle");
    let b = b.to_str().expect("utf-8");
    let pid = dir.join("pid");
    let mut times = [Duration::ZERO; 4];
    let steps: [&[&str]; 4] = [
        &["create", id, b],
        &["start", id],
        &["exec", id, "true"],
        &["kill", id],
    ];
    for (i, words) in steps.iter().enumerate() {
        let t = Instant::now();
        let done = rt.step(words, &pid).and_then(|()| match i {
            3 => rt.step(&["delete", id], &pid),
            _ => Ok(()),
        });
        if let Err(e) = done {
            let _ = rt.step(&["delete", "--force", id], &pid);
            clean(dir);
            return Err(format!("{}: {e}", words[0]));
        }
        times[i] = t.elapsed();
    }
    clean(dir);
    Ok(times)
}

/// Can `rt` bind the unshifted base image (owned by real root) read-only, idmapped onto the
/// guest's range? Inside, its files are then root's; unmapped, they are nobody's.
fn idmap_proof(
    rt: &mut Runtime,
    dir: &Path,
    lower: &Path,
    image: &Path,
    range: rootfs::IdRange,
) -> String {
    let map =
        serde_json::json!([{"containerID": 0, "hostID": range.uid, "size": rootfs::ID_COUNT}]);
    let mount = serde_json::json!({
        "destination": "/base",
        "type": "bind",
        "source": image.join("rootfs"),
        "options": ["bind", "ro", "idmap"],
        "uidMappings": map,
        "gidMappings": map,
    });
    let id = format!("idmap-{}", rt.label);
    let lib = matches!(rt.driver, Driver::Lib { .. });
    bundle(dir, &id, lower, range, &[mount], lib);
    let b = dir.join("bundle");
    let pid = dir.join("pid");
    let verdict = match rt.step(&["create", &id, b.to_str().expect("utf-8")], &pid) {
        Err(e) => format!("refused at create: {e}"),
        Ok(()) => {
            let owned = rt.step(&["exec", &id, "test", "-O", "/base/usr/bin/env"], &pid);
            let writable = rt.step(&["exec", &id, "touch", "/base/x"], &pid);
            let _ = rt.step(&["kill", &id], &pid);
            let _ = rt.step(&["delete", &id], &pid);
            match (owned, writable) {
                (Ok(()), Err(_)) => "yes: the image's files are root's inside, read-only".into(),
                (Ok(()), Ok(())) => "idmapped but WRITABLE".into(),
                (Err(_), _) => {
                    "no: mounted, but the files are nobody's inside (not idmapped)".into()
                }
            }
        }
    };
    clean(dir);
    verdict
}

fn quantile(v: &[Duration], q: f64) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "a rank"
    )]
    let i = ((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

/// The runtimes of the command line, and the rounds and warm-up rounds.
fn parse(args: &[String], work: &Path) -> Result<(Vec<Runtime>, usize, usize), String> {
    let (mut runtimes, mut rounds, mut warm) = (vec![], 30, 3);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |what: &str| it.next().cloned().ok_or(format!("{what} needs a value"));
        match a.as_str() {
            "--help" => return Err(USAGE.to_owned()),
            "--rounds" => {
                rounds = value("--rounds")?
                    .parse()
                    .map_err(|e| format!("--rounds: {e}"))?
            }
            "--warm-up" => {
                warm = value("--warm-up")?
                    .parse()
                    .map_err(|e| format!("--warm-up: {e}"))?
            }
            "--lib" => {
                let v = value("--lib")?;
                let (label, program) = v
                    .split_once('=')
                    .ok_or(format!("--lib {v}: not LABEL=PROGRAM"))?;
                runtimes.push(Runtime::new(label, program, true, work));
            }
            v => {
                let (label, program) = v
                    .split_once('=')
                    .ok_or(format!("{v}: not LABEL=PROGRAM\n\n{USAGE}"))?;
                runtimes.push(Runtime::new(label, program, false, work));
            }
        }
    }
    if runtimes.is_empty() || rounds == 0 {
        return Err(format!("no runtime or no rounds\n\n{USAGE}"));
    }
    Ok((runtimes, rounds, warm))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let work = std::env::temp_dir().join(format!("svc-rtbench-{}", std::process::id()));
    let (mut runtimes, rounds, warm) = parse(&args, &work).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(2)
    });
    // Every container's init is reparented here when its runtime's create ends: reap it.
    nix::sys::prctl::set_child_subreaper(true).expect("subreaper");
    let image = svc_tests::world::image_dir();
    let text = std::fs::read_to_string("/etc/subuid").unwrap_or_default();
    let root = rootfs::subordinate_range(&text, "svc-sandbox").unwrap_or(200_000);
    let range = rootfs::IdRange {
        uid: root,
        gid: root,
    };
    let lower = rootfs::shifted_image(&image, range).expect("shifted image");
    let n = runtimes.len();
    for r in 0..warm + rounds {
        for k in 0..n {
            let rt = &mut runtimes[(r + k) % n];
            if rt.refused.is_some() {
                continue;
            }
            let id = format!("{}-{r}", rt.label);
            let times = match round(rt, &work.join(&id), &id, &lower, range) {
                Ok(t) => t,
                Err(e) => {
                    rt.refused = Some(e);
                    continue;
                }
            };
            if r >= warm {
                for (f, t) in rt.figures.iter_mut().zip(times) {
                    f.push(t);
                }
            }
        }
    }
    let proofs: Vec<String> = runtimes
        .iter_mut()
        .map(|rt| idmap_proof(rt, &work.join("idmap"), &lower, &image, range))
        .collect();
    report(&runtimes, rounds, warm, &proofs);
    for rt in &mut runtimes {
        if let Driver::Lib { child, .. } = &mut rt.driver {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
    let _ = std::fs::remove_dir_all(&work);
}

fn report(runtimes: &[Runtime], rounds: usize, warm: usize, proofs: &[String]) {
    println!(
        "OCI runtimes on svcd's sandbox bundle, {rounds} rounds each after {warm} warm-up, \
         alternating (ms: median / p90 / p99)"
    );
    print!("{:<28}", "runtime");
    for s in STEPS.iter().chain(&["all four"]) {
        print!("{s:>24}");
    }
    println!();
    for rt in runtimes {
        print!("{:<28}", rt.label);
        if let Some(e) = &rt.refused {
            println!("failed: {e}");
            continue;
        }
        let total: Vec<Duration> = (0..rt.figures[0].len())
            .map(|i| rt.figures.iter().map(|f| f[i]).sum())
            .collect();
        for f in rt.figures.iter().chain([&total]) {
            let cell = format!(
                "{} / {} / {}",
                ms(quantile(f, 0.5)),
                ms(quantile(f, 0.9)),
                ms(quantile(f, 0.99))
            );
            print!("{cell:>24}");
        }
        println!();
    }
    println!("\nidmapped read-only bind of the unshifted base image onto the guest's range:");
    for (rt, p) in runtimes.iter().zip(proofs) {
        println!("  {:<26}{p}", rt.label);
    }
}
