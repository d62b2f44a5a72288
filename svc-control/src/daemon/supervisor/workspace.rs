//! Workspaces (`svc workspace up`): the lifecycle hooks svcd runs in a sandbox, their log and
//! their events.
//!
//! - **When**: `onSetup` once, when the sandbox is made; `onStart` after it, and again each
//!   time the guest starts again (a resume, each clone of a fork: a clone has its source's
//!   files, so `onSetup` does not run again); `onTeardown` when the sandbox is destroyed,
//!   before anything is taken down. An svcd restart is not a start: nothing re-runs.
//! - **How**: each entry is `/bin/sh -c COMMAND` in the sandbox, in `/workspace`, with the
//!   sandbox's environment plus `SVC_WORKSPACE` and `SVC_HOOK_PHASE`, under coreutils'
//!   `timeout` (in its own process group, all of it killed at `lifecycle.timeoutMs`). In order;
//!   the first that fails (non-zero exit, timeout) ends its phase: the rest of that phase and
//!   the phases after it do not run, the workspace is `failed` with the command and its exit
//!   code, and the sandbox stays up for debugging. `onTeardown` failures are reported and the
//!   destroy goes on.
//! - **Output**: every line the hooks write, with a record at each hook's start and end, goes
//!   to the workspace's log (`<state>/sandboxes/<name>/workspace.log`, JSON lines, rotated at
//!   8 MiB with one older file kept: see [`super::workspace_log`]) and to everyone following
//!   it (`GET /v1/sandboxes/{name}/workspace/log?follow`).

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use tokio::sync::broadcast;
use tracing::{info, warn};

use super::{
    Failure, Supervisor, now_text,
    task::TaskGuard,
    workspace_log::{LogFile, LogPast, last_seq},
};
use crate::api::{self, WorkspaceLogRecord, WorkspaceSpec};

/// How long a hook's output may go on after the hook exited (a background child holding it).
const OUTPUT_GRACE: Duration = Duration::from_millis(500);
/// svcd's own limit beyond the hook's timeout, should `timeout` in the guest not end it.
const HOST_GRACE: Duration = Duration::from_secs(15);

/// A phase of hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Setup,
    Start,
    /// The supervised services (no hooks).
    Services,
    Teardown,
}

impl Phase {
    const fn name(self) -> &'static str {
        match self {
            Self::Setup => "setup",
            Self::Start => "start",
            Self::Services => "services",
            Self::Teardown => "teardown",
        }
    }
    /// The workspace.json key of its hooks.
    const fn key(self) -> &'static str {
        match self {
            Self::Setup => "onSetup",
            Self::Start => "onStart",
            Self::Services => "services",
            Self::Teardown => "onTeardown",
        }
    }
    fn hooks(self, spec: &WorkspaceSpec) -> &[String] {
        match self {
            Self::Setup => &spec.lifecycle.on_setup,
            Self::Start => &spec.lifecycle.on_start,
            Self::Services => &[],
            Self::Teardown => &spec.lifecycle.on_teardown,
        }
    }
}

#[derive(Debug, Clone)]
pub(super) struct Status {
    pub(super) state: &'static str,
    pub(super) phase: Option<Phase>,
    pub(super) failure: Option<String>,
}

/// A sandbox's workspace while it runs: its spec, its log, where it stands.
#[derive(Debug)]
pub(super) struct WorkspaceRun {
    pub(super) spec: WorkspaceSpec,
    log_path: PathBuf,
    /// The log file and the last sequence number written.
    writer: Mutex<(LogFile, u64)>,
    /// Each record as written (one JSON line), to the followers.
    tx: broadcast::Sender<Bytes>,
    status: Mutex<Status>,
    /// The running setup/start task, if any (ended by destroy).
    task: Mutex<Option<TaskGuard>>,
    /// The services and the readiness they make (see `workspace_services`).
    pub(super) services: Mutex<super::services_state::ServicesState>,
    /// Turns true at the first `workspace.ready` (Spotlight forwards start then).
    pub(super) ready_seen: tokio::sync::watch::Sender<bool>,
    /// The forwards' accept loops.
    pub(super) forwards: Mutex<Vec<TaskGuard>>,
}

impl WorkspaceRun {
    /// A workspace whose log is `log_path`; `state` is `starting`, or `unknown` for one found
    /// again after an svcd restart.
    pub(super) fn new(spec: WorkspaceSpec, log_path: PathBuf, state: &'static str) -> Self {
        // Found again after a restart: numbering goes on from the records already written.
        let seq = last_seq(&log_path);
        Self {
            spec,
            writer: Mutex::new((LogFile::new(log_path.clone()), seq)),
            log_path,
            tx: broadcast::channel(4096).0,
            status: Mutex::new(Status {
                state,
                phase: None,
                failure: None,
            }),
            task: Mutex::new(None),
            services: Mutex::default(),
            ready_seen: tokio::sync::watch::Sender::new(false),
            forwards: Mutex::default(),
        }
    }

    pub(super) fn lock_status(&self) -> std::sync::MutexGuard<'_, Status> {
        self.status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn set(&self, state: &'static str, phase: Option<Phase>, failure: Option<String>) {
        *self.lock_status() = Status {
            state,
            phase,
            failure,
        };
    }

    pub(super) fn view(&self) -> api::WorkspaceView {
        let s = self.lock_status().clone();
        api::WorkspaceView {
            root: self.spec.root.clone(),
            guest_dir: api::WORKSPACE_GUEST_DIR.to_owned(),
            state: s.state.to_owned(),
            phase: s.phase.map(|p| p.name().to_owned()),
            failure: s.failure,
            log: self.log_path.display().to_string(),
            forwards: self
                .spec
                .forwards
                .iter()
                .map(|f| {
                    format!(
                        "127.0.0.1:{} -> {}:{}",
                        f.local_port, f.service, f.remote_port
                    )
                })
                .collect(),
            git_snapshot: self.spec.git_snapshot.clone(),
        }
    }

    /// Append one record to the log and send it to the followers.
    pub(super) fn record(
        &self,
        phase: Phase,
        kind: &str,
        fill: impl FnOnce(&mut WorkspaceLogRecord),
    ) {
        let mut w = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        w.1 += 1;
        let mut r = WorkspaceLogRecord {
            seq: w.1,
            time: now_text(),
            phase: phase.name().to_owned(),
            kind: kind.to_owned(),
            hook: None,
            service: None,
            restarts: None,
            command: None,
            stream: None,
            text: None,
            exit_code: None,
            duration_ms: None,
        };
        fill(&mut r);
        let Ok(mut line) = serde_json::to_vec(&r) else {
            return;
        };
        line.push(b'\n');
        if let Err(e) = w.0.append(&line) {
            warn!(path = %self.log_path.display(), error = %e, "cannot write the workspace log");
        }
        let _ = self.tx.send(Bytes::from(line));
    }

    /// Follow the log: the files as they are (read by the caller, piece by piece), then
    /// each new record, until the workspace is gone (`follow`) or at once.
    pub(super) fn follow(&self, follow: bool) -> LogFollow {
        // Hold the writer while opening so no record falls between the files and the channel.
        let w = self
            .writer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let rx = follow.then(|| self.tx.subscribe());
        let past = w.0.past();
        drop(w);
        (past, rx)
    }
}

/// What ended a hook other than success.
struct HookFailure {
    exit_code: Option<i32>,
    reason: String,
}

/// A workspace log as `GET /v1/sandboxes/{name}/workspace/log` sends it: the records so far
/// (open files and how much of each to send), and the channel of new ones when following.
pub type LogFollow = (LogPast, Option<broadcast::Receiver<Bytes>>);

impl Supervisor {
    /// `name`'s workspace log; see [`LogFollow`].
    pub fn workspace_log_follow(&self, name: &str, follow: bool) -> Result<LogFollow, Failure> {
        api::SandboxName::check(name).map_err(Failure::bad)?;
        let live = self.live();
        let l = live.get(name).ok_or_else(|| Failure::not_found(name))?;
        let run = l.workspace.as_ref().ok_or_else(|| {
            Failure::bad(format!(
                "sandbox {name:?} has no workspace (it was not made by `svc workspace up`)"
            ))
        })?;
        Ok(run.follow(follow))
    }

    /// Run `phases` of `name`'s workspace in the background, then report it ready. Nothing
    /// for a sandbox without a workspace.
    pub(super) fn start_workspace(self: &Arc<Self>, name: &str, phases: &'static [Phase]) {
        let Some(run) = self.live().get(name).and_then(|l| l.workspace.clone()) else {
            return;
        };
        run.set("starting", phases.first().copied(), None);
        let (sup, name_owned, run2) = (self.clone(), name.to_owned(), run.clone());
        let task = tokio::spawn(async move {
            let started = Instant::now();
            for phase in phases {
                if !sup.run_phase(&name_owned, &run2, *phase).await {
                    sup.workspace_failed(&name_owned, &run2, *phase);
                    return;
                }
            }
            sup.await_services(&name_owned, &run2, started);
        });
        *run.task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(TaskGuard(task.abort_handle()));
    }

    /// Report `run` failed in `phase` (the hook or service that failed is recorded already).
    pub(super) fn workspace_failed(&self, name: &str, run: &WorkspaceRun, phase: Phase) {
        let failure = run.lock_status().failure.clone().unwrap_or_default();
        run.record(phase, "workspace_failed", |r| r.text = Some(failure));
        warn!(sandbox = %name, "workspace failed; the sandbox stays up");
    }

    /// Announce `run` ready: once per start.
    pub(super) fn workspace_ready(&self, name: &str, run: &WorkspaceRun, started: Instant) {
        run.set("ready", None, None);
        run.record(Phase::Start, "ready", |_| {});
        run.ready_seen.send_replace(true);
        info!(sandbox = %name, "workspace ready");
        self.event(
            "workspace.ready",
            Some(name),
            serde_json::json!({
                "root": run.spec.root,
                "profile": run.spec.readiness.as_ref().map(|p| &p.name),
                "duration_ms": ms(started.elapsed()),
            }),
        );
    }

    /// Run the onTeardown hooks of `name`'s workspace, then stop its services (its setup or
    /// start hooks, if still running, are ended first). Waits for them; a failure is reported,
    /// not returned.
    pub(super) async fn teardown_workspace(&self, name: &str) {
        let Some(run) = self.live().get(name).and_then(|l| l.workspace.clone()) else {
            return;
        };
        let in_hooks = {
            let st = run.lock_status();
            st.state == "starting" && matches!(st.phase, Some(Phase::Setup | Phase::Start))
        };
        if in_hooks {
            drop(
                run.task
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .take(),
            );
        }
        let paused = self.live().get(name).is_some_and(|l| l.paused);
        if paused {
            if !Phase::Teardown.hooks(&run.spec).is_empty() {
                warn!(sandbox = %name, "the sandbox is paused: its onTeardown hooks do not run");
                run.record(Phase::Teardown, "phase_skipped", |r| {
                    r.text = Some("the sandbox is paused: onTeardown does not run".into());
                });
            }
        } else {
            run.set("stopping", Some(Phase::Teardown), None);
            self.run_phase(name, &run, Phase::Teardown).await;
            self.stop_services(&run).await;
        }
        drop(
            run.task
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        );
        run.services
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .end();
        run.forwards
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }

    /// Run one phase's hooks in order; whether every one succeeded.
    async fn run_phase(&self, name: &str, run: &WorkspaceRun, phase: Phase) -> bool {
        let hooks = Phase::hooks(phase, &run.spec).to_vec();
        let started = Instant::now();
        run.set(
            if phase == Phase::Teardown {
                "stopping"
            } else {
                "starting"
            },
            Some(phase),
            None,
        );
        for (i, command) in hooks.iter().enumerate() {
            let label = format!("{}[{i}] {command:?}", phase.key());
            run.record(phase, "hook_started", |r| {
                r.hook = Some(i);
                r.command = Some(command.clone());
            });
            info!(sandbox = %name, hook = %label, "workspace hook started");
            self.event(
                "workspace.hook_started",
                Some(name),
                serde_json::json!({"phase": phase.name(), "hook": i, "command": command}),
            );
            let t0 = Instant::now();
            match self.run_hook(name, run, phase, i, command).await {
                Ok(()) => run.record(phase, "hook_finished", |r| {
                    r.hook = Some(i);
                    r.command = Some(command.clone());
                    r.exit_code = Some(0);
                    r.duration_ms = Some(ms(t0.elapsed()));
                }),
                Err(f) => {
                    let failure = format!("{label} {}", f.reason);
                    warn!(sandbox = %name, %failure, "workspace hook failed");
                    run.record(phase, "hook_failed", |r| {
                        r.hook = Some(i);
                        r.command = Some(command.clone());
                        r.exit_code = f.exit_code;
                        r.text = Some(failure.clone());
                        r.duration_ms = Some(ms(t0.elapsed()));
                    });
                    self.event(
                        "workspace.hook_failed",
                        Some(name),
                        serde_json::json!({
                            "phase": phase.name(),
                            "hook": i,
                            "command": command,
                            "exit_code": f.exit_code,
                            "reason": f.reason,
                        }),
                    );
                    run.set("failed", Some(phase), Some(failure));
                    return false;
                }
            }
        }
        run.record(phase, "phase_finished", |r| {
            r.duration_ms = Some(ms(started.elapsed()));
        });
        true
    }

    /// Run one hook, its output into the log.
    async fn run_hook(
        &self,
        name: &str,
        run: &WorkspaceRun,
        phase: Phase,
        index: usize,
        command: &str,
    ) -> Result<(), HookFailure> {
        let timeout_ms = run.spec.lifecycle.timeout_ms.max(1);
        let req = hook_request(phase, command, timeout_ms);
        let mut handle = self
            .exec(name, &req, false)
            .await
            .map_err(|f| HookFailure {
                exit_code: None,
                reason: format!("could not start: {}", f.message),
            })?;
        let pumps: Vec<_> = [
            ("stdout", handle.stdout.take()),
            ("stderr", handle.stderr.take()),
        ]
        .into_iter()
        .filter_map(|(stream, r)| r.map(|r| (stream, r)))
        .map(|(stream, reader)| {
            svc_guest::services::pump(reader, |text| {
                run.record(phase, "output", |r| {
                    r.hook = Some(index);
                    r.stream = Some(stream.to_owned());
                    r.text = Some(text);
                });
            })
        })
        .collect();
        let t0 = Instant::now();
        let limit = Duration::from_millis(timeout_ms) + HOST_GRACE;
        let output = futures::future::join_all(pumps);
        tokio::pin!(output);
        let mut output_done = false;
        let waited = tokio::select! {
            w = tokio::time::timeout(limit, handle.wait()) => w,
            _ = &mut output, if !output_done => {
                output_done = true;
                tokio::time::timeout(limit.saturating_sub(t0.elapsed()), handle.wait()).await
            }
        };
        if !output_done {
            let _ = tokio::time::timeout(OUTPUT_GRACE, &mut output).await;
        }
        if waited.is_err() {
            handle.kill().await;
        }
        hook_verdict(waited, t0.elapsed(), timeout_ms)
    }
}

/// The exec request of a hook: `command` under the guest's timeout, in the workspace.
fn hook_request(phase: Phase, command: &str, timeout_ms: u64) -> api::ExecRequest {
    api::ExecRequest {
        user: None,
        root: None,
        hardening: None,
        argv: crate::workspace::under_guest_timeout(
            timeout_ms,
            ["/bin/sh".into(), "-c".into(), command.to_owned()],
        ),
        env: vec![
            ("SVC_WORKSPACE".into(), api::WORKSPACE_GUEST_DIR.into()),
            ("SVC_HOOK_PHASE".into(), phase.name().into()),
        ],
        cwd: Some(api::WORKSPACE_GUEST_DIR.into()),
        stdin: false,
        tty: None,
    }
}

/// How a hook that was waited for (`waited`, `Err`: svcd's own limit passed; its processes
/// were killed) after `elapsed` ended.
fn hook_verdict(
    waited: Result<Result<i32, crate::runtime::RuntimeError>, tokio::time::error::Elapsed>,
    elapsed: Duration,
    timeout_ms: u64,
) -> Result<(), HookFailure> {
    let timed_out = || HookFailure {
        exit_code: None,
        reason: format!(
            "timed out after {timeout_ms} ms (lifecycle.timeoutMs); its processes were killed"
        ),
    };
    match waited {
        Err(_) => Err(timed_out()),
        Ok(Err(e)) => Err(HookFailure {
            exit_code: None,
            reason: format!("could not be waited for: {e}"),
        }),
        Ok(Ok(0)) => Ok(()),
        Ok(Ok(code)) if crate::workspace::timed_out(code, elapsed, timeout_ms) => Err(timed_out()),
        Ok(Ok(code)) => Err(HookFailure {
            exit_code: Some(code),
            reason: format!("exited with {code}"),
        }),
    }
}

pub(super) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
