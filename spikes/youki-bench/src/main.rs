//! youki's `libcontainer` driven in-process, for `cargo xtask bench runtime` (issue 31).
//!
//! One line per request on stdin, one answer line on stdout (`ok` or `err MESSAGE`):
//! `create ROOT ID BUNDLE` (the bundle's container created, not started), `start ROOT ID`,
//! `exec ROOT ID PROGRAM…` (run to its end; `err` if it failed), `kill ROOT ID` (SIGKILL to
//! every process, then wait for init), `delete ROOT ID` (force). The process lives across
//! requests, so what is timed is the library, not a program start-up: the point of an
//! in-process runtime.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use libcontainer::container::Container;
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::signal::Signal;
use libcontainer::syscall::syscall::SyscallType;
use libcontainer::workload::default::DefaultExecutor;

type Res = Result<(), Box<dyn std::error::Error>>;

fn builder(root: &str, id: &str) -> Result<ContainerBuilder, Box<dyn std::error::Error>> {
    let null = || std::fs::OpenOptions::new().read(true).write(true).open("/dev/null");
    Ok(ContainerBuilder::new(id.to_owned(), SyscallType::default())
        .with_executor(DefaultExecutor {})
        .with_root_path(root)?
        .with_stdin(null()?)
        .with_stdout(null()?)
        .with_stderr(null()?)
        .validate_id()?)
}

fn load(root: &str, id: &str) -> Result<Container, Box<dyn std::error::Error>> {
    Ok(Container::load(PathBuf::from(root).join(id))?)
}

/// Reap whatever of ours has ended (the killed inits are our children).
fn reap() {
    // SAFETY: waitpid with WNOHANG on any child; no memory is shared.
    while unsafe { libc_waitpid(-1, std::ptr::null_mut(), 1) } > 0 {}
}

unsafe extern "C" {
    #[link_name = "waitpid"]
    fn libc_waitpid(pid: i32, status: *mut i32, options: i32) -> i32;
}

fn handle(words: &[&str]) -> Res {
    match words {
        ["create", root, id, bundle] => {
            builder(root, id)?
                .as_init(*bundle)
                .with_systemd(false)
                .with_detach(true)
                .build()?;
            Ok(())
        }
        ["start", root, id] => Ok(load(root, id)?.start()?),
        ["exec", root, id, args @ ..] => {
            let pid = builder(root, id)?
                .as_tenant()
                .with_detach(false)
                .with_container_args(args.iter().map(|s| (*s).to_owned()).collect())
                .build()?;
            let mut status = 0;
            // SAFETY: waits for the child libcontainer just started.
            let got = unsafe { libc_waitpid(pid.as_raw(), &mut status, 0) };
            if got != pid.as_raw() || status != 0 {
                return Err(format!("exec {args:?}: wait status {status}").into());
            }
            Ok(())
        }
        ["kill", root, id] => {
            let mut c = load(root, id)?;
            let pid = c.pid();
            c.kill(Signal::try_from("KILL")?, true)?;
            if let Some(pid) = pid {
                // SAFETY: the container's init is our child (created by this process).
                unsafe { libc_waitpid(pid.as_raw(), std::ptr::null_mut(), 0) };
            }
            Ok(())
        }
        ["delete", root, id] => {
            load(root, id)?.delete(true)?;
            reap();
            Ok(())
        }
        _ => Err(format!("unknown request {words:?}").into()),
    }
}

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .init();
    let stdin = std::io::stdin();
    let mut out = std::io::stdout().lock();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match handle(&words) {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("err {}", e.to_string().replace('\n', " ")),
        };
        if writeln!(out, "{answer}").and_then(|()| out.flush()).is_err() {
            break;
        }
    }
}
