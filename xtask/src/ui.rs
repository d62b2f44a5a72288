//! Output and command helpers shared by the xtask commands.

use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

pub fn heading(text: &str) {
    println!("\n\x1b[1m== {text}\x1b[0m");
}
pub fn ok(text: &str) {
    println!("  \x1b[32m✓\x1b[0m {text}");
}
pub fn info(text: &str) {
    println!("  · {text}");
}
pub fn warn(text: &str) {
    println!("  \x1b[33m!\x1b[0m {text}");
}
pub fn fail(text: &str) {
    eprintln!("\x1b[31m✗ {text}\x1b[0m");
}

/// Run a command with inherited output; fail with its command line on a non-zero exit.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let shown = format!("{cmd:?}");
    println!("  $ {}", pretty(cmd));
    let status = cmd.status().with_context(|| format!("starting {shown}"))?;
    if !status.success() {
        bail!("{} failed ({status})", pretty(cmd));
    }
    Ok(())
}

/// [`run`], for at most `limit`: a command still running then is killed with every process
/// it started, and the run fails naming the limit — a hung test fails the run in minutes with
/// its name on screen (cargo test prints "has been running for over 60 seconds") instead of
/// holding it until an outer timeout that says nothing. (It stays in the terminal's process
/// group, so Ctrl-C still reaches it.)
pub fn run_within(cmd: &mut Command, limit: std::time::Duration) -> anyhow::Result<()> {
    println!("  $ {}", pretty(cmd));
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", pretty(cmd)))?;
    let started = std::time::Instant::now();
    let deadline = started + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let tree = descendants(child.id());
            for pid in std::iter::once(child.id()).chain(tree) {
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .stderr(Stdio::null())
                    .status();
            }
            let _ = child.wait();
            bail!(
                "{} was still running after {} minutes and was killed: a test hung (the \
                 lines above saying \"has been running for over 60 seconds\" name it)",
                pretty(cmd),
                limit.as_secs() / 60
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    let took = started.elapsed().as_secs();
    info(&format!("took {}m {:02}s", took / 60, took % 60));
    if !status.success() {
        bail!("{} failed ({status})", pretty(cmd));
    }
    Ok(())
}

/// Every process below `root`, from /proc (a parent's pid is the fourth field of
/// /proc/PID/stat, after the command name in parentheses).
fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let ppid = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parents.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.split_off(1)
}

/// Run a command quietly and return its stdout; fail with its stderr.
pub fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {}", pretty(cmd)))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            pretty(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn pretty(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}
