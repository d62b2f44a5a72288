//! Creation, in the order it happens: `create` checks the request and takes Spotlight's
//! ports; `create_in_span` reads the request once as `policy::creation` sees it, brokers the
//! host's code-host token, `plan`s (backend, policy, envelope), reserves the state row and
//! `build`s (files, guest and link, relay, registry, nftables, state); a failed build is
//! rolled back by `rollback`: everything built so far removed, the row deleted.

use std::{
    collections::HashMap,
    net::Ipv4Addr,
    sync::Arc,
    time::{Instant, SystemTime},
};

use tracing::{Instrument as _, info, info_span, warn};

use super::{
    Failure, Supervisor, gitdir,
    sandbox::{
        self, Envelope, Live, Phases, SandboxLinks, guest_env, link_record, stored_placeholders,
        write_guest_files,
    },
    spotlight,
    state::RunningRow,
    workspace,
};
use crate::{
    api::{self, CreateSandbox, EgressChoice, SandboxView, SecretValue},
    audit::rfc3339,
    config::egress::EgressConfig,
    policy::{creation, mode::EgressMode, ownership::Principal, request::SandboxPolicy},
    proxy::ca::SandboxCa,
    runtime::{GuestSpec, SharedDir, Snapshot, Started},
};

/// What a valid request makes: its envelope (stored) and its policy (in force).
pub(super) struct Plan {
    pub(super) envelope: Envelope,
    pub(super) policy: SandboxPolicy,
}

/// A fork's clone: the snapshot it starts from and its source's shared directories.
pub(super) type Restore = (Snapshot, Vec<SharedDir>);

impl Supervisor {
    /// `POST /v1/sandboxes`. Logged in a span `sandbox{name}`.
    /// `who` is the API peer: the sandbox is theirs, and so must a workspace's project
    /// directory and the stored secrets it binds be (or be shared with them).
    pub async fn create(
        self: &Arc<Self>,
        req: CreateSandbox,
        who: &Principal,
    ) -> Result<SandboxView, Failure> {
        let mut listeners = Vec::new();
        self.check_project_trust(&req, Some(who.uid))?;
        if let Some(w) = &req.workspace {
            self.check_project_dir(&w.root, Some(who.uid))?;
            if let Some(id) = &w.auth.git_identity {
                id.check().map_err(Failure::bad)?;
            }
            // Spotlight's host ports, taken now: one in use refuses the creation.
            listeners = spotlight::bind_all(&w.forwards, who)?;
        }
        let span = info_span!("sandbox", name = %req.name);
        let started = Instant::now();
        let name = req.name.to_string();
        let result = self
            .create_in_span(req, None, who, who.uid)
            .instrument(span)
            .await;
        if result.is_ok() {
            self.config.metrics.created(started.elapsed());
            if let Some(run) = self.live().get(&name).and_then(|l| l.workspace.clone()) {
                self.start_forwards(&name, &run, listeners);
            }
            self.start_workspace(&name, &[workspace::Phase::Setup, workspace::Phase::Start]);
        }
        result
    }

    /// `policy::project` on the directory as the host shows it now.
    pub(super) fn check_project_dir(&self, root: &str, caller: Option<u32>) -> Result<(), Failure> {
        use std::os::unix::fs::MetadataExt;
        let canonical = std::fs::canonicalize(root).ok();
        let meta = canonical.as_ref().and_then(|c| std::fs::metadata(c).ok());
        let host = &self.config.host;
        crate::policy::project::check(
            &crate::policy::project::ProjectDir {
                asked: root,
                canonical: canonical.as_deref(),
                is_dir: meta.as_ref().is_some_and(std::fs::Metadata::is_dir),
                owner_uid: meta.as_ref().map_or(u32::MAX, MetadataExt::uid),
            },
            caller,
            &[
                ("state", host.state_dir.as_path()),
                ("audit", host.audit_dir.as_path()),
            ],
        )
        .map_err(|e| Failure::bad(e.to_string()))
    }

    /// Create a sandbox for `owner` at `who`'s request; a fork's clone starts from `restore`
    /// instead of booting.
    pub(super) async fn create_in_span(
        &self,
        mut req: CreateSandbox,
        restore: Option<Restore>,
        who: &Principal,
        owner: u32,
    ) -> Result<SandboxView, Failure> {
        self.resolve_store_secrets(who, &mut req)?;
        let (mut plan, brokered) = {
            // The request as `policy::creation` reads it, built once: whether it brokers the
            // host's token, then (with that token, and the workspace's egress section) its plan.
            let secrets = creation::Secret::all_of(&req.secrets);
            let input = creation::Request::of_api(&req, &secrets, None);
            let brokered = self.host_code_token(who, &input, req.pod.as_ref()).await?;
            let plan = self.plan(&req, input, &secrets, brokered.as_ref(), who)?;
            (plan, brokered)
        };
        req.secrets.extend(brokered);
        if let Some((_, mounts)) = &restore {
            // A clone has its source's devices, whatever the configuration says now.
            plan.envelope.live_mounts.clone_from(mounts);
        }
        if let Some(pooled) = self.pooled_for(&plan, restore.is_some()).await {
            return self.claim(&req, plan, pooled, owner).await;
        }
        let backend = plan.envelope.backend.clone();
        let created = SystemTime::now();
        let created_at = rfc3339(created);
        let incarnation = crate::audit::Incarnation::fresh_key();
        let prelim =
            serde_json::to_string(&plan.envelope).map_err(|e| Failure::internal(e.to_string()))?;
        let id = self.store().reserve_for(
            &req.name,
            &prelim,
            &created_at,
            &incarnation,
            self.max_id(),
            owner,
        )?;
        let when = (created, created_at, incarnation);
        let snapshot = restore.map(|(s, _)| s);
        match self.build(&req, plan, id, when, snapshot, owner).await {
            Ok(view) => Ok(view),
            Err(f) => {
                warn!(sandbox = %req.name, error = %f.message, "creation failed; removing what was built");
                self.rollback(&req.name, id, &backend).await;
                Err(f)
            }
        }
    }

    /// Undo a creation that failed after its row was reserved: everything built (registry,
    /// fence, guest, link, nftables, files) and the row.
    pub(super) async fn rollback(&self, name: &str, id: u32, backend: &str) {
        self.teardown(name, id, &format!("svc{id}"), backend).await;
        let _ = self.store().delete(name);
    }

    // ------------------------------------------------------------------ token

    /// `--repo` brokers the host's code-host token (`credentials.code_host_token_file`) as
    /// CODE_HOST_TOKEN when `policy::creation` says so: the secret to add to the request.
    ///
    /// Where CODE_HOST_TOKEN comes from, first found wins: the request's own
    /// `--secret CODE_HOST_TOKEN@store:|env:|file:…`; `credentials.code_host_token_file`; the
    /// host's code-host CLI login (`gh auth token --hostname <code_host>`, `credentials.
    /// code_host_cli`). None of them: refused now, naming each — not a 401 later.
    /// The host's token is the operator's (`policy::ownership::host_code_token`): a caller
    /// other than root and `credentials.code_host_token_group` gives its own, and so does a
    /// request for a pod (`pod`), whoever makes it.
    async fn host_code_token(
        &self,
        who: &Principal,
        input: &creation::Request<'_>,
        pod: Option<&crate::api::PodRef>,
    ) -> Result<Option<SecretValue>, Failure> {
        if !creation::brokers_host_code_token(input) {
            return Ok(None);
        }
        crate::policy::ownership::host_code_token(
            who,
            self.config.host.code_host_token_group.as_ref(),
            pod.map(|p| p.namespace.as_str()),
        )
        .map_err(|e| Failure::forbidden(e.to_string()))?;
        let (source, value) = if let Some(path) = &self.config.host.code_host_token_file {
            let text = std::fs::read_to_string(path).map_err(|e| {
                Failure::internal(format!(
                    "reading the host's code-host token {} (credentials.code_host_token_file): {e}",
                    path.display()
                ))
            })?;
            (
                format!("host:{}", path.display()),
                text.trim_end_matches(['\r', '\n']).to_owned(),
            )
        } else if let Some(token) = self.code_host_cli_token().await {
            token
        } else {
            let host = self.config.host.code.code_host.to_string();
            return Err(Failure::bad(format!(
                "--repo {} needs the code host's token (CODE_HOST_TOKEN) and none was found: give \
                 --secret CODE_HOST_TOKEN@store:NAME (svc secret set NAME), @env:VAR or @file:PATH; \
                 or set credentials.code_host_token_file in svcd.toml; or log in the host's code-host \
                 CLI for root (gh auth login --hostname {host})",
                input.repo.unwrap_or("")
            )));
        };
        Ok(Some(SecretValue {
            name: creation::CODE_HOST_TOKEN.into(),
            source,
            value,
        }))
    }

    /// The host's code-host CLI login: `<code_host_cli> auth token --hostname <code_host>`
    /// (GitHub's `gh`), if the CLI is there and logged in. (source, token).
    async fn code_host_cli_token(&self) -> Option<(String, String)> {
        let cli = self.config.host.code_host_cli.as_ref()?;
        let host = self.config.host.code.code_host.to_string();
        // A local read of the CLI's own login; bounded all the same.
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            tokio::process::Command::new(cli)
                .args(["auth", "token", "--hostname", &host])
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .ok()?
        .ok()?;
        let token = String::from_utf8(out.stdout).ok()?.trim().to_owned();
        (out.status.success() && !token.is_empty() && !token.contains(char::is_whitespace))
            .then(|| (format!("host:{} auth token", cli.display()), token))
    }

    // ------------------------------------------------------------------- plan

    /// The request checked by `policy::creation` (`input`, with the `brokered` host token),
    /// and the envelope it makes.
    fn plan(
        &self,
        req: &CreateSandbox,
        input: creation::Request<'_>,
        secrets: &[creation::Secret<'_>],
        brokered: Option<&SecretValue>,
        who: &Principal,
    ) -> Result<Plan, Failure> {
        let (backend, backend_reason) = self.choose_backend(req)?;
        let rootfs = super::rootfs::check(req.rootfs.as_deref(), who, backend)?;
        if let Some(pod) = &req.pod {
            crate::policy::ownership::names_a_pod(who, &pod.to_string())
                .map_err(Failure::forbidden)?;
        }
        let project_egress = project_egress(req)?;
        let mut all = secrets.to_vec();
        all.extend(brokered.map(|s| creation::Secret {
            name: &s.name,
            source: &s.source,
            value: &s.value,
        }));
        let input = creation::Request {
            secrets: &all,
            project_egress: project_egress.as_ref(),
            ..input
        };
        let plan =
            creation::plan(&self.config.host, &input).map_err(|e| Failure::bad(e.to_string()))?;
        let ssh_repos = ssh_repos(req, project_egress.as_ref())?;
        // The project's git directory: what host git executes stays read-only in the guest.
        let workspace_mount = match &req.workspace {
            Some(w) => Some(gitdir::workspace_mount(
                w,
                self.backends.get(backend).describe(),
            )?),
            None => None,
        };
        let envelope = Envelope {
            backend: backend.to_owned(),
            backend_reason,
            live_mounts: self.live_mounts(who, workspace_mount),
            extra_hosts: plan.extra_hosts.iter().map(ToString::to_string).collect(),
            repo: req.repo.clone(),
            egress: match plan.egress {
                EgressMode::Curated => EgressChoice::Curated,
                EgressMode::AllowAll => EgressChoice::AllowAll,
            },
            context_path: req.context_path.clone(),
            allowed_branches: creation::branches(&req.allowed_branches)
                .map_err(|e| Failure::bad(e.to_string()))?,
            https_push_branches: req.https_push_branches,
            ssh_repos,
            workspace: req.workspace.clone(),
            egress_section: req
                .workspace
                .is_none()
                .then(|| project_egress_file(req))
                .flatten(),
            rootfs,
            policy_generation: 0,
            link: String::new(),
            guest_v4: Ipv4Addr::UNSPECIFIED,
            gateway_v4: Ipv4Addr::UNSPECIFIED,
            placeholders: stored_placeholders(&plan.policy),
            runtime_id: None,
            pod: req.pod.clone(),
        };
        let mut policy = plan.policy;
        policy.https_push_branches = envelope.https_push_branches(&policy.egress);
        Ok(Plan { envelope, policy })
    }

    /// The backend the request gets, and why: `--backend`, else the workspace's
    /// `runtime.required`, else the default. An unavailable one is refused saying why.
    fn choose_backend(&self, req: &CreateSandbox) -> Result<(&'static str, String), Failure> {
        let backends = &self.backends;
        let offered = backends.offered();
        let why_not = |b: &str| backends.why_not(b).unwrap_or_else(|| "offered".into());
        if let (None, Some(required)) = (&req.backend, &req.runtime_required) {
            let required: Vec<&'static str> = required.iter().map(|b| b.name()).collect();
            return creation::select_runtime(&required, &backends.preference(), &offered, why_not)
                .map_err(|e| Failure::unsupported(e.to_string()));
        }
        let asked = req.backend.as_deref();
        let b =
            creation::backend(asked, &offered, |n| backends.canonical(n)).map_err(|e| match e {
                creation::CreationError::BackendUnavailable(name, _) => {
                    match backends.canonical(name).and_then(|n| backends.why_not(n)) {
                        Some(why) => Failure::unsupported(format!("{e}: {why}")),
                        None => Failure::unsupported(e.to_string()),
                    }
                }
                other => Failure::bad(other.to_string()),
            })?;
        let reason = if asked.is_some() {
            format!("--backend {b}")
        } else {
            "the default (svcd's embedded backend)".to_owned()
        };
        Ok((b, reason))
    }

    /// The coding agent's live mount, fixed now (never added later), and the workspace's: the
    /// microvm backend shares them over virtio-fs, the container backend as idmapped binds.
    /// The agent's home goes only into its owner's (and root's) sandboxes: another member's
    /// is made without it (`policy::ownership::shares_agent_home`).
    fn live_mounts(&self, who: &Principal, workspace: Option<SharedDir>) -> Vec<SharedDir> {
        self.config
            .host
            .agent_home
            .iter()
            .filter(|(host, _)| agent_home_for(host, who))
            .map(|(host, guest)| SharedDir::plain(host.clone(), guest.clone()))
            .chain(workspace)
            .collect()
    }

    // ------------------------------------------------------------------ build

    /// Build the planned sandbox `id`: its files and CA, its guest on its fenced link, its
    /// relay, its registry entry, its nftables element, its state row; then say it was made.
    async fn build(
        &self,
        req: &CreateSandbox,
        plan: Plan,
        id: u32,
        (created, created_at, incarnation): (SystemTime, String, String),
        restore: Option<Snapshot>,
        owner: u32,
    ) -> Result<SandboxView, Failure> {
        let name = req.name.to_string();
        let (gateway, guest) = self.addresses(id);
        let mut envelope = plan.envelope;
        envelope.link = format!("svc{id}");
        envelope.guest_v4 = guest;
        envelope.gateway_v4 = gateway;
        let mut phases = Phases::start();
        let mode = self.mode_of(&envelope, created).mode;
        let ca = Arc::new(
            SandboxCa::generate(&name).map_err(|e| Failure::internal(format!("CA: {e}")))?,
        );
        let files = self.guest_files(&name, gateway, &ca).await?;
        phases.mark("files");
        let started = self
            .start_guest(&name, id, &envelope, mode, files, restore)
            .await?;
        phases.mark("guest");
        let mut live = super::sandbox::live_of(
            req,
            (id, owner),
            super::sandbox::Made {
                envelope,
                started,
                ca,
                policy: plan.policy,
                mode,
                when: (created, created_at, incarnation),
            },
        );
        self.publish(&mut live, &req.secrets, &mut phases).await?;
        Ok(self.announce(&live, &phases))
    }

    /// The sandbox's directory cleared of an earlier one's leftovers, and the files its guest
    /// sees read-only written there.
    pub(super) async fn guest_files(
        &self,
        name: &str,
        gateway: Ipv4Addr,
        ca: &SandboxCa,
    ) -> Result<Vec<(std::path::PathBuf, std::path::PathBuf)>, Failure> {
        let dir = self.sandbox_dir(name);
        sandbox::clear_leftover(&dir, name).await?;
        write_guest_files(&dir, name, gateway, &ca.ca_pem())
            .map_err(|e| Failure::internal(format!("{}: {e}", dir.display())))
    }

    /// Start the guest on its backend, its link made and fenced meanwhile.
    pub(super) async fn start_guest(
        &self,
        name: &str,
        id: u32,
        envelope: &Envelope,
        mode: EgressMode,
        files: Vec<(std::path::PathBuf, std::path::PathBuf)>,
        restore: Option<Snapshot>,
    ) -> Result<Started, Failure> {
        let spec = GuestSpec {
            name: name.to_owned(),
            id,
            dir: self.sandbox_dir(name),
            files,
            restore,
            shared: envelope.live_mounts.clone(),
            rootfs: envelope.rootfs.clone(),
        };
        let links = SandboxLinks {
            links: &self.links,
            fence: &self.fence,
            link: &envelope.link,
            record: link_record(id, envelope, 0, mode),
        };
        self.backends
            .get(&envelope.backend)
            .start(&spec, &links)
            .await
            .map_err(|e| Failure::internal(e.to_string()))
    }

    /// Make the started sandbox reachable: its environment, guardian and workspace run, its
    /// relay, its registry entry, its nftables element, and its row marked running.
    pub(super) async fn publish(
        &self,
        live: &mut Live,
        secrets: &[SecretValue],
        phases: &mut Phases,
    ) -> Result<(), Failure> {
        let name = live.name.clone();
        live.workspace = live.envelope.workspace.clone().map(|spec| {
            Arc::new(workspace::WorkspaceRun::new(
                spec,
                self.workspace_log(&name),
                "starting",
            ))
        });
        live.env = guest_env(live);
        live.guardian = self.start_guardian(live);
        self.serve_git_ssh(live)
            .await
            .map_err(|e| Failure::internal(format!("the git SSH relay: {e}")))?;
        phases.mark("relay");
        self.live().insert(name.clone(), live.clone());
        let values: HashMap<String, String> = secrets
            .iter()
            .map(|s| (s.name.clone(), s.value.clone()))
            .collect();
        // The link was fenced while the guest started (`SandboxLinks::prepare`).
        self.register(live, values);
        phases.mark("register");
        self.live().insert(name.clone(), live.clone());
        // A claimed pooled sandbox's link is in the set from its making; it is added again
        // (an element already there is no change) so a table removed meanwhile (a firewall
        // reload) is written again before the sandbox is used.
        self.sync_nft(Some((&live.envelope.link, true))).await?;
        phases.mark("nft");
        let envelope_json =
            serde_json::to_string(&live.envelope).map_err(|e| Failure::internal(e.to_string()))?;
        let sealed = self.sealed_for(&name, secrets)?;
        let row = RunningRow {
            envelope: &envelope_json,
            ca_cert: &live.ca.ca_pem(),
            ca_key: &live.ca.ca_key_pem(),
            pid: live.guest.pid,
            pid_start: live.guest.start,
        };
        self.store().set_running(&name, row, &sealed)?;
        phases.mark("state");
        Ok(())
    }

    /// Log and tell the followers that `live` was made; its view.
    pub(super) fn announce(&self, live: &Live, phases: &Phases) -> SandboxView {
        let view = self.view(live);
        let (name, id, link) = (&live.name, live.id, &live.envelope.link);
        let guest = live.envelope.guest_v4;
        info!(sandbox = %name, id, link = %link, guest = %guest, mode = %view.mode, phases = %phases, "sandbox created");
        self.event(
            "sandbox.created",
            Some(name),
            serde_json::json!({"id": id, "mode": view.mode, "link": link}),
        );
        // A sandbox without a workspace has nothing more to wait for: ready now. A workspace
        // is ready when its hooks have run (`start_workspace`).
        if live.envelope.workspace.is_none() {
            self.event("workspace.ready", Some(name), serde_json::json!({}));
        }
        view
    }
}

/// The project's `.svc/config.yaml` egress section as the request carries it: its workspace's
/// (`svc workspace up`), else its approved perimeter's (`svc sandbox create --workspace`), so
/// both make the same perimeter.
fn project_egress_file(req: &CreateSandbox) -> Option<crate::config::egress::EgressFile> {
    match &req.workspace {
        Some(w) => w.egress.clone(),
        None => req
            .project
            .as_ref()
            .and_then(|p| p.perimeter.egress.clone()),
    }
}

/// The project's egress section, checked again here: the request is the caller's word for
/// what the file says.
fn project_egress(req: &CreateSandbox) -> Result<Option<EgressConfig>, Failure> {
    project_egress_file(req)
        .map(|f| {
            crate::config::egress::validate(
                std::path::Path::new(crate::config::loader::CONFIG_YAML),
                f,
            )
            .map_err(|e| Failure::bad(e.to_string()))
        })
        .transpose()
}

/// The relay's repositories: the request's, and the section's `egress.policy` repos.
fn ssh_repos(
    req: &CreateSandbox,
    project_egress: Option<&EgressConfig>,
) -> Result<Vec<api::SshRepo>, Failure> {
    let mut asked: Vec<(String, String)> = req
        .ssh_repos
        .iter()
        .map(|r| (r.host.clone(), r.repo.clone()))
        .collect();
    for p in project_egress.iter().flat_map(|e| e.policy.values()) {
        asked.extend(
            p.repos
                .iter()
                .map(|r| (p.host.to_string(), r.as_str().to_owned())),
        );
    }
    Ok(creation::ssh_repos(&asked)
        .map_err(|e| Failure::bad(e.to_string()))?
        .into_iter()
        .map(|(host, repo)| api::SshRepo { host, repo })
        .collect())
}

/// Whether the coding agent's home `dir` goes into a sandbox `who` creates: its owner's and
/// root's (a directory svcd cannot stat is nobody's but root's).
fn agent_home_for(dir: &std::path::Path, who: &Principal) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let owner = std::fs::metadata(dir).map_or(0, |m| m.uid());
    crate::policy::ownership::shares_agent_home(who, owner)
}
