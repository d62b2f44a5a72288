//! A workspace's services: `svc-supervise` started in the sandbox once the hooks have run, its
//! reports read into the workspace's log, events and readiness.
//!
//! Readiness: after each start's hooks, the workspace is ready once every service of its
//! readiness profile (every service, without one) is up: healthy, if it has a health check,
//! else running for a second (`svc_guest::services::SETTLE`). A service of the profile that fails before then fails the workspace (the sandbox
//! stays up); one that fails after it is reported (`workspace.service_failed`) and the
//! workspace reads `degraded`. A resume runs onStart again but leaves the services running:
//! ready again as soon as the hooks are done and the services still fit.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::watch;
use tracing::{info, warn};

use super::{
    Supervisor,
    services_state::ServiceState,
    task::TaskGuard,
    workspace::{Phase, WorkspaceRun},
};
use crate::api;
use svc_guest::services::{BINARY, Report, Spec};

/// How long svcd waits for the supervisor beyond its services' longest stop timeout.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The services readiness waits for.
fn needed(spec: &api::WorkspaceSpec) -> Vec<String> {
    let all: Vec<String> = spec.services.iter().map(|s| s.name.clone()).collect();
    crate::workspace::readiness::needed(spec.readiness.as_ref(), &all)
}

/// Whether every needed service is up.
fn fits(spec: &api::WorkspaceSpec, states: &BTreeMap<String, ServiceState>) -> bool {
    let up = states.iter().map(|(n, s)| (n.clone(), s.up)).collect();
    crate::workspace::readiness::ready(&needed(spec), &up)
}

impl Supervisor {
    /// After a start's hooks: ready now (no services), or once the services fit; starts the
    /// supervisor unless it is already running (a resume).
    pub(super) fn await_services(
        self: &Arc<Self>,
        name: &str,
        run: &Arc<WorkspaceRun>,
        started: Instant,
    ) {
        if run.spec.services.is_empty() {
            self.workspace_ready(name, run, started);
            return;
        }
        run.set("starting", Some(Phase::Services), None);
        let start = {
            let mut st = run
                .services
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            st.pending = Some(started);
            !st.alive()
        };
        if start {
            self.start_services(name, run);
        }
        self.check_ready(name, run);
    }

    /// Announce ready if a start waits for it and the services fit.
    fn check_ready(&self, name: &str, run: &WorkspaceRun) {
        let started = {
            let mut st = run
                .services
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match st.pending {
                Some(t) if fits(&run.spec, &st.states) => {
                    st.pending = None;
                    t
                }
                _ => return,
            }
        };
        self.workspace_ready(name, run, started);
    }

    /// Start `svc-supervise` in the sandbox and read its reports in a task of its own.
    fn start_services(self: &Arc<Self>, name: &str, run: &Arc<WorkspaceRun>) {
        let (stop_tx, stop_rx) = watch::channel(false);
        let (done_tx, done_rx) = watch::channel(false);
        let (sup, name_owned, run2) = (self.clone(), name.to_owned(), run.clone());
        let task = tokio::spawn(async move {
            sup.supervise(&name_owned, &run2, stop_rx).await;
            let _ = done_tx.send(true);
        });
        run.services
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .task = Some((TaskGuard(task.abort_handle()), stop_tx, done_rx));
    }

    async fn supervise(&self, name: &str, run: &WorkspaceRun, mut stop: watch::Receiver<bool>) {
        let spec = Spec {
            services: run.spec.services.clone(),
        };
        let req = api::ExecRequest {
            user: None,
            root: None,
            hardening: None,
            argv: vec![
                BINARY.into(),
                "--spec".into(),
                serde_json::to_string(&spec).unwrap_or_default(),
            ],
            env: vec![("SVC_WORKSPACE".into(), api::WORKSPACE_GUEST_DIR.into())],
            cwd: Some(api::WORKSPACE_GUEST_DIR.into()),
            stdin: false,
            tty: None,
        };
        let mut handle = match self.exec(name, &req, false).await {
            Ok(h) => h,
            Err(f) => {
                let failure = format!("could not start the service supervisor: {}", f.message);
                run.record(Phase::Services, "service_failed", |r| {
                    r.text = Some(failure.clone());
                });
                run.set("failed", Some(Phase::Services), Some(failure));
                self.workspace_failed(name, run, Phase::Services);
                return;
            }
        };
        info!(sandbox = %name, services = run.spec.services.len(), "services started");
        let stderr = handle.stderr.take().map(|r| {
            svc_guest::services::pump(r, |text| {
                run.record(Phase::Services, "output", |r| {
                    r.service = Some("svc-supervise".into());
                    r.stream = Some("stderr".into());
                    r.text = Some(text);
                });
            })
        });
        let stdout = handle
            .stdout
            .take()
            .map(|r| svc_guest::services::pump(r, |line| self.on_report(name, run, &line)));
        let reading = async {
            if let Some(s) = stdout {
                s.await;
            }
        };
        let errors = async {
            if let Some(s) = stderr {
                s.await;
            }
        };
        let both = futures::future::join(reading, errors);
        tokio::pin!(both);
        tokio::select! {
            _ = &mut both => {}
            () = async { let _ = stop.wait_for(|v| *v).await; } => {
                handle.signal(nix::sys::signal::Signal::SIGTERM);
                let longest = run.spec.services.iter().map(|s| s.stop_timeout_ms).max().unwrap_or(0);
                let limit = Duration::from_millis(longest) + STOP_GRACE;
                if tokio::time::timeout(limit, &mut both).await.is_err() {
                    warn!(sandbox = %name, "the service supervisor did not stop in time; killed");
                }
            }
        }
        if tokio::time::timeout(Duration::from_secs(2), handle.wait())
            .await
            .is_err()
        {
            handle.kill().await;
        }
    }

    /// Stop the services (SIGTERM to the supervisor, which stops each with its stop timeout)
    /// and wait for it.
    pub(super) async fn stop_services(&self, run: &WorkspaceRun) {
        let done = {
            let st = run
                .services
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let Some((_, stop, done)) = &st.task else {
                return;
            };
            let _ = stop.send(true);
            done.clone()
        };
        let longest = run
            .spec
            .services
            .iter()
            .map(|s| s.stop_timeout_ms)
            .max()
            .unwrap_or(0);
        let mut done = done;
        let _ = tokio::time::timeout(
            Duration::from_millis(longest) + STOP_GRACE + Duration::from_secs(3),
            done.wait_for(|d| *d),
        )
        .await;
    }

    /// One line of the supervisor's report.
    fn on_report(&self, name: &str, run: &WorkspaceRun, line: &str) {
        let Ok(r) = serde_json::from_str::<Report>(line) else {
            supervisor_output(run, line.to_owned());
            return;
        };
        // Reports come from inside the guest, which can write its own into the supervisor's
        // output: one naming no service of the workspace is only logged (as the supervisor's
        // output), and the events the rest raise are held to a rate.
        if !run.spec.services.iter().any(|s| s.name == r.service) {
            supervisor_output(run, line.chars().take(1024).collect());
            return;
        }
        if r.event == "output" {
            run.record(Phase::Services, "output", |rec| {
                rec.service = Some(r.service.clone());
                rec.stream = r.stream.clone();
                rec.text = r.text.clone();
            });
            return;
        }
        run.record(Phase::Services, &format!("service_{}", r.event), |rec| {
            rec.service = Some(r.service.clone());
            rec.exit_code = r.code;
            rec.restarts = r.restarts;
            rec.text = r.text.clone();
        });
        self.service_event(name, &r);
        let why = || {
            format!(
                "service {} failed: {}",
                r.service,
                r.text.clone().unwrap_or_default()
            )
        };
        match track(run, &r) {
            Some(true) => {
                run.set("failed", Some(Phase::Services), Some(why()));
                self.workspace_failed(name, run, Phase::Services);
            }
            Some(false) => {
                if run.lock_status().state == "ready" {
                    run.set("degraded", None, Some(why()));
                }
            }
            None => self.check_ready(name, run),
        }
    }

    /// The event a service's report raises, if any, when the sandbox's rate admits it (every
    /// report counts against the rate).
    fn service_event(&self, name: &str, r: &Report) {
        let whose = (self.live().get(name))
            .map(|l| crate::limits::Guest::new(l.id, l.incarnation.key.clone()));
        if !whose.is_none_or(|g| self.config.limits.admit_service_event(&g)) {
            return;
        }
        let kind = match r.event.as_str() {
            "started" => "workspace.service_started",
            "restarting" => "workspace.service_restarted",
            "failed" => "workspace.service_failed",
            "healthy" => "workspace.service_healthy",
            "unhealthy" => "workspace.service_unhealthy",
            _ => return,
        };
        let detail = serde_json::json!({
            "service": r.service,
            "pid": r.pid,
            "exit_code": r.code,
            "restarts": r.restarts,
            "delay_ms": r.delay_ms,
            "reason": r.text,
        });
        self.event(kind, Some(name), detail);
    }
}

/// A line of the supervisor's own output, in the workspace's log.
fn supervisor_output(run: &WorkspaceRun, text: String) {
    run.record(Phase::Services, "output", |rec| {
        rec.service = Some("svc-supervise".into());
        rec.stream = Some("stdout".into());
        rec.text = Some(text);
    });
}

/// The service's state after report `r`; whether a needed service failed: before the
/// workspace was ready (`Some(true)`: the workspace fails), after (`Some(false)`), or not.
fn track(run: &WorkspaceRun, r: &Report) -> Option<bool> {
    let mut st = run
        .services
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let s = st.states.entry(r.service.clone()).or_default();
    match r.event.as_str() {
        "started" => *s = ServiceState::default(),
        "running" | "healthy" => s.up = true,
        "exited" | "stopped" | "unhealthy" | "failed" => s.up = false,
        _ => {}
    }
    let failed = r.event == "failed" && needed(&run.spec).contains(&r.service);
    if failed && st.pending.is_some() {
        st.pending = None;
        Some(true)
    } else if failed {
        Some(false)
    } else {
        None
    }
}
