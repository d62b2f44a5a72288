//! The netns backend: a sandbox is a set of namespaces on the host (net, mount, pid, uts, ipc)
//! made by util-linux `unshare`, whose PID 1 is `svcd sandbox-init`: it sets the hostname,
//! bind-mounts the sandbox's resolv.conf and CA bundle over the host's, says `ready`, and
//! reaps orphans until it is killed. Commands run in it through `nsenter`. The guest's
//! processes are in their own session, so they outlive svcd; a restarted svcd finds them by
//! pid and start time.

use std::{
    io::Write as _,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::io::AsyncBufReadExt as _;

use super::{Backend, BoxFuture, GuestCommand, GuestHandle, GuestSpec, RuntimeError};

/// Directories the guest gets as its own empty tmpfs.
const PRIVATE_DIRS: [&str; 2] = ["/tmp", "/root"];

/// How long a guest's init may take to say `ready`.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The netns backend.
#[derive(Debug, Clone)]
pub struct Netns {
    /// The program run as the guest's PID 1 with argument `sandbox-init` (svcd itself).
    pub init: PathBuf,
}

impl Netns {
    fn start_err(spec: &GuestSpec, message: impl Into<String>) -> RuntimeError {
        RuntimeError::Start {
            name: spec.name.clone(),
            message: message.into(),
        }
    }
}

/// `/proc/PID/stat` field 22 (start time), if the process exists.
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

impl Backend for Netns {
    fn name(&self) -> &'static str {
        "netns"
    }

    fn start<'a>(
        &'a self,
        spec: &'a GuestSpec,
    ) -> BoxFuture<'a, Result<GuestHandle, RuntimeError>> {
        Box::pin(async move {
            std::fs::create_dir_all(&spec.dir)
                .map_err(|e| Self::start_err(spec, format!("{}: {e}", spec.dir.display())))?;
            let log = std::fs::File::create(spec.dir.join("init.log"))
                .map_err(|e| Self::start_err(spec, format!("init.log: {e}")))?;
            let mut cmd = std::process::Command::new("unshare");
            cmd.args([
                "--net",
                "--mount",
                "--pid",
                "--uts",
                "--ipc",
                "--fork",
                "--kill-child",
                "--propagation",
                "private",
                "--mount-proc",
                "--",
            ])
            .arg(&self.init)
            .args(["sandbox-init", "--hostname", &spec.name]);
            for (host, guest) in &spec.files {
                cmd.arg("--bind")
                    .arg(format!("{}={}", host.display(), guest.display()));
            }
            // A private, empty /tmp and home: the host's are not the sandbox's to read or fill.
            for dir in PRIVATE_DIRS {
                cmd.args(["--tmpfs", dir]);
            }
            cmd.stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(log)
                // Its own process group and session: a signal to svcd's group never reaches it.
                .process_group(0);
            let mut child = tokio::process::Command::from(cmd)
                .kill_on_drop(false)
                .spawn()
                .map_err(|e| Self::start_err(spec, format!("running unshare: {e}")))?;
            let unshare_pid = child.id().unwrap_or(0);
            let stdout = child
                .stdout
                .take()
                .ok_or_else(|| Self::start_err(spec, "no stdout"))?;
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            let first = tokio::time::timeout(START_TIMEOUT, lines.next_line()).await;
            let said = match first {
                Ok(Ok(Some(line))) => line,
                other => {
                    let _ = child.start_kill();
                    let log =
                        std::fs::read_to_string(spec.dir.join("init.log")).unwrap_or_default();
                    return Err(Self::start_err(
                        spec,
                        format!(
                            "the guest's init did not say ready ({}): {}",
                            match other {
                                Err(_) => "timed out".to_owned(),
                                Ok(Err(e)) => e.to_string(),
                                _ => "it exited".to_owned(),
                            },
                            log.trim()
                        ),
                    ));
                }
            };
            if said != "ready" {
                let _ = child.start_kill();
                return Err(Self::start_err(
                    spec,
                    format!("the guest's init said {said:?}"),
                ));
            }
            // `unshare --fork` waits for its child, which is PID 1 of the new pid namespace.
            let Some(pid) = children(unshare_pid).first().copied() else {
                let _ = child.start_kill();
                return Err(Self::start_err(spec, "the guest's init vanished"));
            };
            let start = start_time(pid).ok_or_else(|| Self::start_err(spec, "no /proc entry"))?;
            // tokio reaps the unshare process when it exits; the guest does not depend on it.
            drop(child);
            Ok(GuestHandle { pid, start })
        })
    }

    fn alive(&self, guest: GuestHandle) -> bool {
        start_time(guest.pid) == Some(guest.start)
    }

    fn stop(&self, guest: GuestHandle) -> BoxFuture<'_, Result<(), RuntimeError>> {
        Box::pin(async move {
            if !self.alive(guest) {
                return Ok(());
            }
            // SIGKILL to a pid namespace's init kills every process in it.
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(guest.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            )
            .map_err(|e| RuntimeError::Stop {
                pid: guest.pid,
                message: e.to_string(),
            })?;
            for _ in 0..200 {
                if !self.alive(guest) {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(RuntimeError::Stop {
                pid: guest.pid,
                message: "still running 2 s after SIGKILL".into(),
            })
        })
    }

    fn command(
        &self,
        guest: GuestHandle,
        cmd: &GuestCommand,
    ) -> Result<tokio::process::Command, RuntimeError> {
        if !self.alive(guest) {
            return Err(RuntimeError::NotRunning);
        }
        if cmd.argv.is_empty() {
            return Err(RuntimeError::Exec("no command given".into()));
        }
        let mut c = tokio::process::Command::new("nsenter");
        c.arg(format!("--target={}", guest.pid))
            .args(["--net", "--mount", "--pid", "--uts", "--ipc"])
            .arg(format!("--wd={}", cmd.cwd.as_deref().unwrap_or("/")))
            .arg("--")
            .args(&cmd.argv)
            .env_clear()
            .envs(cmd.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        Ok(c)
    }

    fn unsupported(&self, operation: &'static str) -> RuntimeError {
        RuntimeError::Unsupported {
            backend: "netns",
            operation,
            hint: " (namespaces cannot be snapshotted; the microvm backend can)",
        }
    }
}

/// The guest's PID 1 (`svcd sandbox-init`): set the hostname, bind-mount `binds`
/// (`HOST=GUEST`), mount an empty tmpfs on each of `tmpfs` (after the binds, whose sources may
/// live under them), print `ready`, then reap orphans forever. It never returns on success.
pub fn sandbox_init(
    hostname: &str,
    binds: &[String],
    tmpfs: &[String],
) -> Result<std::convert::Infallible, String> {
    nix::unistd::sethostname(hostname).map_err(|e| format!("sethostname {hostname}: {e}"))?;
    for b in binds {
        let (host, guest) = b
            .split_once('=')
            .ok_or_else(|| format!("--bind {b:?}: expected HOST=GUEST"))?;
        let target = Path::new(guest);
        if !target.exists() {
            eprintln!("sandbox-init: {guest} does not exist on this host; not mounted");
            continue;
        }
        nix::mount::mount(
            Some(Path::new(host)),
            target,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| format!("bind-mounting {host} over {guest}: {e}"))?;
    }
    for dir in tmpfs {
        let mode = if dir == "/tmp" {
            "mode=1777"
        } else {
            "mode=0700"
        };
        nix::mount::mount(
            Some("tmpfs"),
            Path::new(dir),
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(mode),
        )
        .map_err(|e| format!("mounting a tmpfs on {dir}: {e}"))?;
    }
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "ready").map_err(|e| format!("saying ready: {e}"))?;
        out.flush().map_err(|e| format!("saying ready: {e}"))?;
    }
    // Close stdout so nothing holds svcd's pipe.
    let devnull = std::fs::File::open("/dev/null").map_err(|e| e.to_string())?;
    let _ = nix::unistd::dup2_stdout(devnull);
    loop {
        match nix::sys::wait::wait() {
            Ok(_) => {}
            Err(nix::errno::Errno::ECHILD) => std::thread::sleep(Duration::from_secs(1)),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}
