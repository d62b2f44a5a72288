//! What callers do with running sandboxes: list and show them, run commands in them, pause and
//! resume them.

use std::{collections::HashMap, sync::Arc};

use super::{Supervisor, sandbox::Live, workspace::Phase};
use crate::{
    api::{self, PlaceholderView, SandboxView},
    audit::rfc3339,
    daemon::failure::Failure,
    limits::Channel,
    names::SandboxName,
    policy::{
        explain::{self, Described},
        mode::EgressMode,
        ownership::{self, Principal},
    },
    runtime::{ExecHandle, GuestCommand, RuntimeError},
};

impl Supervisor {
    /// Every sandbox (svcd's own uses: metrics, upgrade notes).
    pub fn list(&self) -> Result<Vec<SandboxView>, Failure> {
        let live = self.live();
        Ok(live.values().map(|l| self.view(l)).collect())
    }

    /// `GET /v1/sandboxes`: the sandboxes `who` sees (a non-root caller: its own).
    pub fn list_for(&self, who: &Principal) -> Result<Vec<SandboxView>, Failure> {
        let live = self.live();
        Ok(live
            .values()
            .filter(|l| ownership::sees(who, Some(l.owner)))
            .map(|l| self.view(l))
            .collect())
    }

    pub fn show(&self, name: &str) -> Result<SandboxView, Failure> {
        SandboxName::check(name).map_err(Failure::bad)?;
        let live = self.live();
        live.get(name)
            .map(|l| self.view(l))
            .ok_or_else(|| Failure::not_found(name))
    }

    /// What `svc egress explain --sandbox` decides against: the sandbox's policy as the
    /// proxy holds it now, and the sandbox it is (name, mode on its link, generation).
    pub fn policy_now(
        &self,
        name: &str,
    ) -> Result<(Arc<crate::policy::request::SandboxPolicy>, Described), Failure> {
        SandboxName::check(name).map_err(Failure::bad)?;
        let live = self.live();
        let l = live.get(name).ok_or_else(|| Failure::not_found(name))?;
        let mut described = Described::of(&l.policy);
        described.mode = explain::mode_name(l.mode).to_owned();
        described.name = Some(l.name.clone());
        described.policy_generation = Some(l.envelope.policy_generation);
        described.window_ends = (l.mode == EgressMode::AllowAll)
            .then(|| self.mode_now(l).window_ends.map(rfc3339))
            .flatten();
        Ok((l.policy.clone(), described))
    }

    pub(super) fn view(&self, l: &Live) -> SandboxView {
        let window_ends = (l.mode == EgressMode::AllowAll)
            .then(|| self.mode_now(l).window_ends.map(rfc3339))
            .flatten();
        let secrets: HashMap<&str, &str> = l
            .secrets
            .iter()
            .map(|(n, s)| (n.as_str(), s.as_str()))
            .collect();
        let placeholders = l
            .policy
            .placeholders
            .entries()
            .iter()
            .map(|e| {
                let env = e.env_name().unwrap_or_default();
                PlaceholderView {
                    brokered: secrets.contains_key(env.as_str()),
                    env,
                    kind: e.kind.name().to_owned(),
                    hosts: e.hosts.iter().map(ToString::to_string).collect(),
                }
            })
            .collect();
        SandboxView {
            name: l.name.clone(),
            id: l.id,
            state: if !self.backends.get(&l.envelope.backend).alive(&l.guest) {
                "dead".into()
            } else if l.paused {
                "paused".into()
            } else {
                "running".into()
            },
            backend: l.envelope.backend.clone(),
            backend_reason: l.envelope.backend_reason.clone(),
            accel: self.backends.get(&l.envelope.backend).accel(),
            live_mounts: l
                .envelope
                .live_mounts
                .iter()
                .map(|m| format!("{} -> {}", m.host.display(), m.guest.display()))
                .collect(),
            mode: match l.mode {
                EgressMode::Curated => "curated".into(),
                EgressMode::AllowAll => "allow-all".into(),
            },
            window_ends,
            allowed_hosts: if l.mode == EgressMode::Curated {
                l.policy.allowed.0.iter().map(ToString::to_string).collect()
            } else {
                Vec::new()
            },
            policy_generation: l.envelope.policy_generation,
            allowed_branches: l.envelope.allowed_branches.clone(),
            https_push_branches: l.policy.https_push_branches.is_some(),
            ssh_repos: l.envelope.ssh_repos.clone(),
            repo: l.envelope.repo.clone(),
            context_path: l.envelope.context_path.clone(),
            link: l.envelope.link.clone(),
            guest_v4: l.envelope.guest_v4,
            gateway_v4: l.envelope.gateway_v4,
            pid: l.guest.pid,
            created_at: l.created_at.clone(),
            owner_uid: l.owner,
            owner: super::ownership::owner(l.owner).name,
            placeholders,
            secrets: l.secrets.iter().map(|(n, s)| format!("{n}@{s}")).collect(),
            workspace: l.workspace.as_ref().map(|w| w.view()),
            pod: l.envelope.pod.clone(),
        }
    }

    /// Start a command for `svc sandbox exec`. Standard input and a terminal need an
    /// `interactive` (upgraded) connection to carry them.
    pub async fn exec(
        &self,
        name: &str,
        req: &api::ExecRequest,
        interactive: bool,
    ) -> Result<ExecHandle, Failure> {
        self.exec_as(name, req, interactive, Channel::Exec).await
    }

    /// [`Self::exec`], counted against the sandbox's cap of `channel` (exec streams, or
    /// Spotlight streams for a forwarded connection) while the command's handle lives.
    pub(super) async fn exec_as(
        &self,
        name: &str,
        req: &api::ExecRequest,
        interactive: bool,
        channel: Channel,
    ) -> Result<ExecHandle, Failure> {
        SandboxName::check(name).map_err(Failure::bad)?;
        if !interactive && (req.stdin || req.tty.is_some()) {
            return Err(Failure::bad(format!(
                "stdin and tty need an upgraded connection (Connection: Upgrade, Upgrade: {})",
                api::EXEC_UPGRADE
            )));
        }
        if let Some(t) = req.tty
            && (t.rows == 0 || t.cols == 0)
        {
            return Err(Failure::bad(format!(
                "tty size {}x{}: rows and columns must be at least 1",
                t.rows, t.cols
            )));
        }
        let (whose, guest, mut env, paused, backend, (root, hardening)) = {
            let live = self.live();
            let l = live.get(name).ok_or_else(|| Failure::not_found(name))?;
            let hardening = exec_grants(req, &l.envelope.backend)?;
            let backend = self.backends.get(&l.envelope.backend);
            let root = req
                .root
                .as_deref()
                .map(|id| self.exec_root(name, backend.as_ref(), id))
                .transpose()?;
            (
                crate::limits::Guest::new(l.id, l.incarnation.key.clone()),
                l.guest.clone(),
                l.env.clone(),
                l.paused,
                backend,
                (root, hardening),
            )
        };
        if paused {
            return Err(Failure::unsupported(format!(
                "sandbox {name:?} is paused: `svc sandbox resume {name}` first"
            )));
        }
        if let Some(why) = crate::policy::exec_args::unrunnable(req) {
            return Err(Failure::bad(why));
        }
        env.extend(req.env.iter().cloned());
        let slot = self
            .config
            .limits
            .acquire(&whose, channel)
            .map_err(|hit| Failure::limited(&hit))?;
        backend
            .exec(
                &guest,
                &GuestCommand {
                    argv: req.argv.clone(),
                    env,
                    cwd: req.cwd.clone(),
                    stdin: req.stdin,
                    tty: req.tty.map(|t| (t.rows, t.cols)),
                    user: req.user.clone().filter(|u| !u.is_root()),
                    root,
                    hardening,
                },
            )
            .await
            .map_err(|e| match e {
                RuntimeError::NotRunning => Failure::unsupported(format!(
                    "sandbox {name:?} is not running (its processes are gone): destroy it"
                )),
                other => Failure::internal(other.to_string()),
            })
            .map(|handle| handle.holding(slot))
    }

    /// pause / resume: the backend says whether it can.
    pub async fn lifecycle(self: &Arc<Self>, name: &str, op: &str) -> Result<SandboxView, Failure> {
        SandboxName::check(name).map_err(Failure::bad)?;
        let (guest, backend) = {
            let live = self.live();
            let l = live.get(name).ok_or_else(|| Failure::not_found(name))?;
            (l.guest.clone(), self.backends.get(&l.envelope.backend))
        };
        let pause = op == "pause";
        let r = if pause {
            backend.pause(&guest).await
        } else {
            backend.resume(&guest).await
        };
        r.map_err(|e| match e {
            RuntimeError::Unsupported { .. } => Failure::unsupported(e.to_string()),
            other => Failure::internal(other.to_string()),
        })?;
        if let Some(l) = self.live().get_mut(name) {
            l.paused = pause;
        }
        let kind = if pause {
            "sandbox.paused"
        } else {
            "sandbox.resumed"
        };
        self.event(kind, Some(name), serde_json::json!({}));
        if !pause {
            self.start_workspace(name, &[Phase::Start]);
        }
        self.show(name)
    }

    /// `POST /v1/sandboxes/{name}/fork`: snapshot the sandbox (paused meanwhile; it stays
    /// paused if it was) and start each clone from it — each a new sandbox with the source's
    /// envelope but its own link, addresses, CA, placeholders and identity.
    /// The clones belong to the source's owner (`policy::ownership::fork_owner`).
    pub async fn fork(
        self: &Arc<Self>,
        who: &Principal,
        source: &str,
        req: api::ForkRequest,
    ) -> Result<api::Forked, Failure> {
        SandboxName::check(source).map_err(Failure::bad)?;
        self.check_clones(&req.clones)?;
        let (guest, envelope, was_paused, source_owner) = {
            let live = self.live();
            let l = live.get(source).ok_or_else(|| Failure::not_found(source))?;
            (l.guest.clone(), l.envelope.clone(), l.paused, l.owner)
        };
        if let Some(why) = self.backends.why_no_fork(&envelope.backend) {
            return Err(Failure::unsupported(why));
        }
        let backend = self.backends.get(&envelope.backend);
        let started = std::time::Instant::now();
        let snap = self.snapshot(source, &backend, &guest, was_paused).await?;
        let snapshot_ms = started.elapsed().as_secs_f64() * 1000.0;
        if let Some(l) = self.live().get_mut(source) {
            l.paused = true;
        }
        let (clones, failed) = self
            .make_clones(who, source, &req.clones, &envelope, &snap, source_owner)
            .await;
        let _ = std::fs::remove_dir_all(&snap.dir);
        if !was_paused {
            match backend.resume(&guest).await {
                Ok(()) => {
                    if let Some(l) = self.live().get_mut(source) {
                        l.paused = false;
                    }
                }
                Err(e) => tracing::warn!(sandbox = %source, error = %e, "resuming after the fork"),
            }
        }
        let names: Vec<&str> = clones.iter().map(|c| c.view.name.as_str()).collect();
        self.event(
            "sandbox.forked",
            Some(source),
            serde_json::json!({"clones": names, "snapshot_ms": snapshot_ms}),
        );
        if let Some(f) = failed {
            return Err(Failure {
                message: format!(
                    "{} (clones made before it: {})",
                    f.message,
                    if names.is_empty() {
                        "none".to_owned()
                    } else {
                        names.join(", ")
                    }
                ),
                ..f
            });
        }
        Ok(api::Forked {
            source: source.to_owned(),
            snapshot_ms,
            clones,
        })
    }

    /// A fork's clone names: at least one, each valid, given once and free.
    fn check_clones(&self, clones: &[SandboxName]) -> Result<(), Failure> {
        if clones.is_empty() {
            return Err(Failure::bad(
                "fork needs the names of its clones: svc sandbox fork SOURCE CLONE…",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for c in clones {
            if !seen.insert(c) {
                return Err(Failure::bad(format!("clone name {c:?} is given twice")));
            }
            if self.live().contains_key(c.as_str()) {
                return Err(crate::store::StoreError::Exists(c.to_string()).into());
            }
        }
        Ok(())
    }

    /// Snapshot `source`'s guest for its clones (the backend says whether it can fork); on
    /// failure the snapshot's directory goes and a guest that was running runs again.
    async fn snapshot(
        &self,
        source: &str,
        backend: &Arc<dyn crate::runtime::Backend>,
        guest: &crate::runtime::GuestHandle,
        was_paused: bool,
    ) -> Result<crate::runtime::Snapshot, Failure> {
        let into = self
            .config
            .host
            .state_dir
            .join("snapshots")
            .join(format!("{source}-{}", std::process::id()));
        let snap = backend.snapshot(guest, &into).await.map_err(|e| match e {
            RuntimeError::Unsupported { .. } => Failure::unsupported(e.to_string()),
            other => Failure::internal(other.to_string()),
        });
        if snap.is_err() {
            let _ = std::fs::remove_dir_all(&into);
            if !was_paused {
                let _ = backend.resume(guest).await;
            }
        }
        snap
    }

    /// Start each clone from `snap`, in order, until one fails: the clones made, and the
    /// failure that stopped them.
    async fn make_clones(
        self: &Arc<Self>,
        who: &Principal,
        source: &str,
        names: &[SandboxName],
        envelope: &super::sandbox::Envelope,
        snap: &crate::runtime::Snapshot,
        source_owner: u32,
    ) -> (Vec<api::ForkedClone>, Option<Failure>) {
        let owner = ownership::fork_owner(source_owner);
        let secrets = self.sandbox_secrets(source).unwrap_or_default();
        let mut clones = Vec::new();
        for name in names {
            let create = api::CreateSandbox {
                name: name.clone(),
                allow_hosts: envelope.extra_hosts.clone(),
                repo: envelope.repo.clone(),
                egress: Some(envelope.egress),
                secrets: secrets.clone(),
                context_path: envelope.context_path.clone(),
                backend: Some(envelope.backend.clone()),
                runtime_required: None,
                ssh_repos: envelope.ssh_repos.clone(),
                workspace: envelope.workspace.clone(),
                // The source's project egress section (`sandbox create --workspace`), approved
                // and checked when the source was made: a clone's request is svcd's own.
                project: envelope
                    .egress_section
                    .clone()
                    .map(|egress| api::ProjectPerimeter {
                        root: String::new(),
                        perimeter: crate::policy::trust::Perimeter {
                            egress: Some(egress),
                            ..Default::default()
                        },
                        trust: false,
                    }),
                https_push_branches: envelope.https_push_branches,
                allowed_branches: envelope.allowed_branches.clone(),
                // Forks are the microvm backend's; a handed root file system the container's.
                rootfs: None,
                // A clone is a sandbox of its own, no pod's.
                pod: None,
            };
            let span = tracing::info_span!("sandbox", name = %name, fork_of = %source);
            let t = std::time::Instant::now();
            let restore = Some((snap.clone(), envelope.live_mounts.clone()));
            let made = self.create_in_span(create, restore, who, owner);
            match tracing::Instrument::instrument(made, span).await {
                Ok(v) => {
                    // A clone is a new start of the source's guest: onStart, not onSetup.
                    self.start_workspace(name, &[Phase::Start]);
                    clones.push(api::ForkedClone {
                        view: v,
                        ready_ms: t.elapsed().as_secs_f64() * 1000.0,
                    });
                }
                Err(f) => return (clones, Some(f)),
            }
        }
        (clones, None)
    }
}

/// What `req` may run as in a sandbox of `backend`: its user checked (`policy::exec_user`),
/// the hardening it is granted (`policy::exec_caps`: within what the backend's own processes
/// hold); a refusal named.
fn exec_grants(
    req: &api::ExecRequest,
    backend: &str,
) -> Result<svc_guest::caps::Hardening, Failure> {
    use crate::policy::{
        exec_caps::{ExecHardeningError, grant},
        exec_user::{ExecUserError, check},
    };
    if let Some(user) = &req.user {
        check(user, backend, crate::runtime::ids::ID_COUNT).map_err(|e| match e {
            ExecUserError::Bad(m) => Failure::bad(m),
            ExecUserError::Unsupported(m) => Failure::unsupported(m),
        })?;
    }
    let Some(asked) = &req.hardening else {
        return Ok(svc_guest::caps::Hardening::default());
    };
    // The container backend's processes hold its configuration's capabilities; the microvm
    // guest's root holds them all (its VM is the fence).
    let own = if backend == "container" {
        svc_guest::caps::Caps::mask(&crate::runtime::container::oci::CAPABILITIES)
            .map_err(Failure::internal)?
    } else {
        u64::MAX
    };
    grant(asked, backend, own).map_err(|e| match e {
        ExecHardeningError::Bad(m) => Failure::bad(m),
        ExecHardeningError::Unsupported(m) => Failure::unsupported(m),
    })
}
