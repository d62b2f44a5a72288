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
