//! The workspace's services, supervised inside the guest (`svc-supervise`, started by svcd
//! through the guest's exec once the workspace's hooks have run).
//!
//! Each service is `/bin/sh -c COMMAND` in its own process group; it is `running` once it has
//! stayed up for [`SETTLE`] (or, with a health check, `healthy` once the check passes). When it
//! exits (for any
//! reason) and `autoRestart` is on, it is started again after `restartDelayMs`, up to
//! `maxRestarts` times; one more exit and it is `failed`. Before a restart, whatever is left of
//! its process group is killed (so a port it held is free). A health check, if given, runs
//! every `intervalMs` once the service is started (`healthy` on its first success, `unhealthy`
//! when it fails after that). SIGTERM or SIGINT to the supervisor stops every service: SIGTERM
//! to its group, SIGKILL after `stopTimeoutMs`.
//!
//! Everything is reported as JSON lines on standard output ([`Report`]); svcd reads them into
//! the workspace's log, its events and its readiness. One supervisor per guest: a new one
//! stops the one recorded in [`PID_FILE`] first (a fork's clone starts its own).

use std::{collections::BTreeMap, time::Duration};

use serde::{Deserialize, Serialize};
use tokio::{io::AsyncReadExt as _, process::Command, sync::mpsc, sync::watch};

/// The directory of the supervisor's state in the guest: its pid ([`PID_FILE`]) and each
/// running service's process group ([`GROUPS_DIR`]: one empty file per group id), so a
/// supervisor that follows can stop the one before and end what a vanished one left behind.
pub const STATE_DIR: &str = "/run";
pub const PID_FILE: &str = "svc-supervise.pid";
pub const GROUPS_DIR: &str = "svc-supervise.groups";
/// Where the supervisor is installed in svc's images.
pub const BINARY: &str = "/usr/local/bin/svc-supervise";
/// How long a service without a health check must stay up to count as running
/// (supervisord's `startsecs`).
pub const SETTLE: Duration = Duration::from_secs(1);
/// Longest output line reported whole.
const MAX_LINE: usize = 16 * 1024;

/// What to supervise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub services: Vec<ServiceSpec>,
}

/// One service, its restart policy resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceSpec {
    pub name: String,
    /// A shell command.
    pub command: String,
    /// Working directory (default `/workspace`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    pub stop_timeout_ms: u64,
    pub auto_restart: bool,
    pub max_restarts: u32,
    pub restart_delay_ms: u64,
}

/// A health check: a shell command, healthy when it exits 0 within `timeoutMs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthCheck {
    pub command: String,
    pub interval_ms: u64,
    pub timeout_ms: u64,
}

/// One line of the supervisor's report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub service: String,
    /// `started`, `running` (up for [`SETTLE`], without a health check), `output`, `exited`,
    /// `restarting`, `failed`, `healthy`, `unhealthy`, `stopped`.
    pub event: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Exit code (128 + signal when a signal ended it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<i32>,
    /// Restarts so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    /// `stdout` or `stderr`, for output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    /// An output line, or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl Report {
    fn new(service: &str, event: &str) -> Self {
        Self {
            service: service.to_owned(),
            event: event.to_owned(),
            pid: None,
            code: None,
            restarts: None,
            delay_ms: None,
            stream: None,
            text: None,
        }
    }
}

/// Supervise `spec` until `stop` turns true; every report goes to `out`. `state` is the
/// supervisor's state directory ([`STATE_DIR`]).
pub async fn supervise(
    spec: Spec,
    out: mpsc::UnboundedSender<Report>,
    stop: watch::Receiver<bool>,
    state: &std::path::Path,
) {
    let groups = state.join(GROUPS_DIR);
    let tasks: Vec<_> = spec
        .services
        .into_iter()
        .map(|s| tokio::spawn(run_service(s, out.clone(), stop.clone(), groups.to_owned())))
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}

/// Kill what is left of process group `pgid`.
fn kill_group(pgid: u32, signal: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pgid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

/// Run service `s` (and restart it, as its policy says) until it fails for good or `stop`
/// turns true; its reports to `out`, its process groups recorded under `groups`.
async fn run_service(
    s: ServiceSpec,
    out: mpsc::UnboundedSender<Report>,
    mut stop: watch::Receiver<bool>,
    groups: std::path::PathBuf,
) {
    let send = |r: Report| {
        let _ = out.send(r);
    };
    let mut restarts = 0u32;
    loop {
        if *stop.borrow() {
            return;
        }
        let mut running = match Running::start(&s, &out, &groups, restarts) {
            Ok(r) => r,
            Err(why) => {
                let mut r = Report::new(&s.name, "failed");
                r.restarts = Some(restarts);
                r.text = Some(why);
                return send(r);
            }
        };
        let status = running.wait_or_stop(&s, &mut stop, &send).await;
        if let Some(h) = &running.health {
            h.abort();
        }
        let Some(status) = status else {
            return send(running.stop(&s).await);
        };
        let code = running.reap(status).await;
        let mut r = Report::new(&s.name, "exited");
        r.code = Some(code);
        r.restarts = Some(restarts);
        send(r);
        if !s.auto_restart || restarts >= s.max_restarts {
            return send(failed(&s, code, restarts));
        }
        restarts += 1;
        let mut r = Report::new(&s.name, "restarting");
        r.restarts = Some(restarts);
        r.delay_ms = Some(s.restart_delay_ms);
        r.code = Some(code);
        send(r);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(s.restart_delay_ms)) => {}
            _ = stop.wait_for(|v| *v) => {
                send(Report::new(&s.name, "stopped"));
                return;
            }
        }
    }
}

/// The report of a service that exited with `code` and is not restarted again.
fn failed(s: &ServiceSpec, code: i32, restarts: u32) -> Report {
    let mut r = Report::new(&s.name, "failed");
    r.code = Some(code);
    r.restarts = Some(restarts);
    r.text = Some(if s.auto_restart {
        format!(
            "exited with {code} after {restarts} restart(s) (maxRestarts {})",
            s.max_restarts
        )
    } else {
        format!("exited with {code} (autoRestart is off)")
    });
    r
}

/// One run of a service: its process (leading its own group, recorded in `group_file`), the
/// tasks reporting its output and its health.
struct Running {
    child: tokio::process::Child,
    pid: u32,
    group_file: std::path::PathBuf,
    pumps: Vec<tokio::task::JoinHandle<()>>,
    health: Option<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Start `s` (its `restarts`-th restart): `started` reported, its output and health
    /// checked from now on. Why not, if it cannot start.
    fn start(
        s: &ServiceSpec,
        out: &mpsc::UnboundedSender<Report>,
        groups: &std::path::Path,
        restarts: u32,
    ) -> Result<Self, String> {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(&s.command)
            .current_dir(s.cwd.as_deref().unwrap_or("/workspace"))
            .envs(&s.env)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0);
        let mut child = cmd
            .spawn()
            .map_err(|e| format!("could not start /bin/sh -c {:?}: {e}", s.command))?;
        let pid = child.id().unwrap_or(0);
        let group_file = groups.join(pid.to_string());
        let _ = std::fs::create_dir_all(groups).and_then(|()| std::fs::write(&group_file, b""));
        let mut r = Report::new(&s.name, "started");
        r.pid = Some(pid);
        r.restarts = Some(restarts);
        let _ = out.send(r);
        let pumps = report_output(&mut child, &s.name, out);
        let health = s.health_check.clone().map(|h| {
            let cwd = s.cwd.clone().unwrap_or_else(|| "/workspace".into());
            tokio::spawn(check_health(s.name.clone(), h, cwd, out.clone()))
        });
        Ok(Self {
            child,
            pid,
            group_file,
            pumps,
            health,
        })
    }

    /// Wait for the service to exit (its status) or for `stop` (`None`). Without a health
    /// check, a service is `running` once it has stayed up [`SETTLE`].
    async fn wait_or_stop(
        &mut self,
        s: &ServiceSpec,
        stop: &mut watch::Receiver<bool>,
        send: &impl Fn(Report),
    ) -> Option<std::process::ExitStatus> {
        let settle = tokio::time::sleep(SETTLE);
        tokio::pin!(settle);
        let mut settled = s.health_check.is_some();
        loop {
            tokio::select! {
                st = self.child.wait() => break st.ok(),
                _ = stop.wait_for(|v| *v) => break None,
                () = &mut settle, if !settled => {
                    settled = true;
                    send(Report::new(&s.name, "running"));
                }
            }
        }
    }

    /// Stop the service: SIGTERM to its group, SIGKILL after the stop timeout. Its `stopped`
    /// report.
    async fn stop(mut self, s: &ServiceSpec) -> Report {
        kill_group(self.pid, rustix::process::Signal::TERM);
        let graceful =
            tokio::time::timeout(Duration::from_millis(s.stop_timeout_ms), self.child.wait())
                .await
                .is_ok();
        kill_group(self.pid, rustix::process::Signal::KILL);
        let _ = self.child.wait().await;
        let _ = std::fs::remove_file(&self.group_file);
        let mut r = Report::new(&s.name, "stopped");
        if !graceful {
            r.text = Some(format!(
                "killed: still running {} ms after SIGTERM (stopTimeoutMs)",
                s.stop_timeout_ms
            ));
        }
        r
    }

    /// What is left of a service that exited with `status` ended, its output read to its
    /// end (briefly); its exit code (128 + signal when a signal ended it).
    async fn reap(self, status: std::process::ExitStatus) -> i32 {
        // What it started in its group goes with it (a port it held is free again).
        kill_group(self.pid, rustix::process::Signal::KILL);
        let _ = std::fs::remove_file(&self.group_file);
        for p in self.pumps {
            let _ = tokio::time::timeout(Duration::from_millis(500), p).await;
        }
        status.code().unwrap_or_else(|| {
            128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
        })
    }
}

/// Report each line `child` writes on its standard output and error as `output`.
fn report_output(
    child: &mut tokio::process::Child,
    name: &str,
    out: &mpsc::UnboundedSender<Report>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut pumps = Vec::new();
    for (stream, reader) in [
        ("stdout", child.stdout.take().map(|r| Box::pin(r) as Reader)),
        ("stderr", child.stderr.take().map(|r| Box::pin(r) as Reader)),
    ] {
        if let Some(reader) = reader {
            let (out, name) = (out.clone(), name.to_owned());
            pumps.push(tokio::spawn(pump(reader, move |text| {
                let mut r = Report::new(&name, "output");
                r.stream = Some(stream.to_owned());
                r.text = Some(text);
                let _ = out.send(r);
            })));
        }
    }
    pumps
}

type Reader = std::pin::Pin<Box<dyn tokio::io::AsyncRead + Send>>;

/// Run `h` every interval; report `healthy` on the first success (and after an unhealthy
/// spell), `unhealthy` when it fails after having been healthy.
async fn check_health(
    service: String,
    h: HealthCheck,
    cwd: String,
    out: mpsc::UnboundedSender<Report>,
) {
    let mut healthy = false;
    loop {
        let ok = tokio::time::timeout(
            Duration::from_millis(h.timeout_ms),
            Command::new("/bin/sh")
                .arg("-c")
                .arg(&h.command)
                .current_dir(&cwd)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .status(),
        )
        .await
        .is_ok_and(|s| s.is_ok_and(|s| s.success()));
        if ok != healthy {
            healthy = ok;
            let _ = out.send(Report::new(
                &service,
                if ok { "healthy" } else { "unhealthy" },
            ));
        }
        tokio::time::sleep(Duration::from_millis(h.interval_ms)).await;
    }
}

/// Read `reader` to its end, handing each line (without its break; invalid UTF-8 replaced; a
/// line longer than 16 KiB in pieces) to `line`.
pub async fn pump(mut reader: Reader, mut line: impl FnMut(String)) {
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        loop {
            let window = &pending[..pending.len().min(MAX_LINE + 1)];
            let rest = if let Some(at) = window.iter().position(|b| *b == b'\n') {
                let rest = pending.split_off(at + 1);
                pending.pop();
                rest
            } else if pending.len() >= MAX_LINE {
                pending.split_off(MAX_LINE)
            } else {
                break;
            };
            line(String::from_utf8_lossy(&pending).into_owned());
            pending = rest;
        }
    }
    if !pending.is_empty() {
        line(String::from_utf8_lossy(&pending).into_owned());
    }
}

/// Stop the supervisor recorded in `state`'s [`PID_FILE`] (if it is one) and wait up to
/// `limit` for it to go, end the service groups left in [`GROUPS_DIR`], then record `own`.
pub async fn take_over(own: u32, limit: Duration, state: &std::path::Path) -> Result<(), String> {
    let (pid_file, groups) = (state.join(PID_FILE), state.join(GROUPS_DIR));
    if let Some(old) = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|t| t.trim().parse::<u32>().ok())
        .filter(|p| *p != own)
    {
        let is_supervisor = std::fs::read_to_string(format!("/proc/{old}/comm"))
            .is_ok_and(|c| c.trim() == "svc-supervise");
        if is_supervisor {
            if let Some(pid) = i32::try_from(old)
                .ok()
                .and_then(rustix::process::Pid::from_raw)
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            }
            let t0 = std::time::Instant::now();
            while std::path::Path::new(&format!("/proc/{old}")).exists() {
                if t0.elapsed() > limit {
                    return Err(format!(
                        "the previous supervisor (pid {old}) did not stop within {} ms",
                        limit.as_millis()
                    ));
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    // Groups a supervisor left without stopping them (it was killed, or its guest was
    // cloned): SIGTERM, a moment, SIGKILL.
    let left: Vec<u32> = std::fs::read_dir(&groups)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
                .collect()
        })
        .unwrap_or_default();
    for g in &left {
        kill_group(*g, rustix::process::Signal::TERM);
    }
    if !left.is_empty() {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for g in &left {
        kill_group(*g, rustix::process::Signal::KILL);
        let _ = std::fs::remove_file(groups.join(g.to_string()));
    }
    std::fs::write(&pid_file, format!("{own}\n"))
        .map_err(|e| format!("{}: {e}", pid_file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(name: &str, command: &str) -> ServiceSpec {
        ServiceSpec {
            name: name.into(),
            command: command.into(),
            cwd: Some("/".into()),
            env: BTreeMap::new(),
            health_check: None,
            stop_timeout_ms: 2000,
            auto_restart: true,
            max_restarts: 2,
            restart_delay_ms: 50,
        }
    }

    async fn collect(spec: Spec, stop_after: Option<Duration>) -> Vec<Report> {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = watch::channel(false);
        let state = test_state();
        let dir = state.clone();
        let run = tokio::spawn(async move { supervise(spec, tx, stop_rx, &dir).await });
        if let Some(d) = stop_after {
            tokio::time::sleep(d).await;
            let _ = stop_tx.send(true);
        }
        let _ = run.await;
        let _ = std::fs::remove_dir_all(&state);
        let mut got = Vec::new();
        while let Ok(r) = rx.try_recv() {
            got.push(r);
        }
        got
    }

    fn test_state() -> std::path::PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "svc-supervise-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&d).expect("state dir");
        d
    }

    #[tokio::test]
    async fn a_new_supervisor_ends_the_groups_a_vanished_one_left() {
        let state = test_state();
        // A service group whose supervisor is gone (killed, or its guest cloned).
        let mut left = std::process::Command::new("sleep");
        std::os::unix::process::CommandExt::process_group(&mut left, 0);
        let mut left = left.arg("30").spawn().expect("sleep");
        let groups = state.join(GROUPS_DIR);
        std::fs::create_dir_all(&groups).expect("groups");
        std::fs::write(groups.join(left.id().to_string()), b"").expect("group file");
        std::fs::write(state.join(PID_FILE), "999999999\n").expect("pid file");
        take_over(std::process::id(), Duration::from_secs(1), &state)
            .await
            .expect("take over");
        let status = left.wait().expect("wait");
        assert!(
            !status.success(),
            "the left-over service was ended: {status:?}"
        );
        assert_eq!(
            std::fs::read_to_string(state.join(PID_FILE))
                .expect("pid file")
                .trim(),
            std::process::id().to_string()
        );
        assert!(std::fs::read_dir(&groups).expect("groups").next().is_none());
        let _ = std::fs::remove_dir_all(&state);
    }

    #[tokio::test]
    async fn output_is_cut_into_lines_and_long_lines_into_pieces() {
        let mut input = b"one\ntwo\r\n\xffbad\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', MAX_LINE + 10));
        input.extend(b"\nlast");
        let mut got = Vec::new();
        pump(Box::pin(std::io::Cursor::new(input)), |l| got.push(l)).await;
        assert_eq!(got[0], "one");
        assert_eq!(got[1], "two\r");
        assert_eq!(got[2], "\u{fffd}bad");
        assert_eq!(got[3].len(), MAX_LINE);
        assert_eq!(got[4], "x".repeat(10));
        assert_eq!(got[5], "last");
        assert_eq!(got.len(), 6);
    }

    #[tokio::test]
    async fn a_crashing_service_is_restarted_max_restarts_times_then_failed() {
        let got = collect(
            Spec {
                services: vec![service("crash", "echo up; exit 7")],
            },
            None,
        )
        .await;
        let events: Vec<&str> = got
            .iter()
            .filter(|r| r.event != "output")
            .map(|r| r.event.as_str())
            .collect();
        assert_eq!(
            events,
            [
                "started",
                "exited",
                "restarting",
                "started",
                "exited",
                "restarting",
                "started",
                "exited",
                "failed"
            ]
        );
        let failed = got.last().map(|r| (r.code, r.restarts));
        assert_eq!(failed, Some((Some(7), Some(2))));
        assert_eq!(got.iter().filter(|r| r.event == "output").count(), 3);
    }

    #[tokio::test]
    async fn stop_ends_a_service_and_its_children_even_if_it_ignores_sigterm() {
        let mut s = service("stubborn", "trap '' TERM; sleep 30 & sleep 31; wait");
        s.stop_timeout_ms = 300;
        let got = collect(Spec { services: vec![s] }, Some(Duration::from_millis(300))).await;
        let last = got.last().expect("a report");
        assert_eq!(last.event, "stopped");
        assert!(
            last.text.as_deref().unwrap_or("").contains("killed"),
            "{last:?}"
        );
        let pid = got.first().and_then(|r| r.pid).expect("started with a pid");
        // Its group is gone once the orphans are reaped: nothing of it is left running.
        let mut gone = false;
        for _ in 0..100 {
            let alive = std::fs::read_dir("/proc")
                .expect("/proc")
                .flatten()
                .any(|e| {
                    std::fs::read_to_string(e.path().join("stat")).is_ok_and(|st| {
                        // pid (comm) state ppid pgrp …: a live (not zombie) member of the group.
                        st.rsplit_once(") ").is_some_and(|(_, rest)| {
                            let f: Vec<&str> = rest.split(' ').collect();
                            f.first() != Some(&"Z") && f.get(2) == Some(&pid.to_string().as_str())
                        })
                    })
                });
            if !alive {
                gone = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            gone,
            "a member of the service's process group is still running"
        );
    }

    #[tokio::test]
    async fn health_is_reported_when_it_first_passes() {
        let mut s = service("web", "sleep 30");
        s.health_check = Some(HealthCheck {
            command: "test -e /proc/self".into(),
            interval_ms: 50,
            timeout_ms: 1000,
        });
        let got = collect(Spec { services: vec![s] }, Some(Duration::from_millis(400))).await;
        let events: Vec<&str> = got.iter().map(|r| r.event.as_str()).collect();
        assert_eq!(events, ["started", "healthy", "stopped"]);
    }
}
