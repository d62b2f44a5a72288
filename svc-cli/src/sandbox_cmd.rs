//! `svc sandbox …`, `svc supervisor-upgrade`: the commands that talk to svcd.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use http::Method;
use svc_control::api::{self, CreateSandbox, Destroyed, EgressChoice, Health, SandboxView};

use crate::{
    client::{Client, SocketArg, runtime},
    secret_cmd::read_secret,
};

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Create a sandbox. Curated by default: the built-in agent hosts, plus what --allow-host
    /// and --repo add; everything else is closed.
    #[command(after_help = "\
Egress modes (--egress):
  curated    the allowlist only (agent hosts, --allow-host, --repo's code-host family); HTTPS
             to them goes through the intercepting proxy, placeholders are swapped for the
             credentials given with --secret
  allow-all  every host except the refused destination classes (host, link-local, metadata,
             other sandboxes), no proxy, no credentials; for 24 hours from creation or svcd's
             last start, then curated with the agent hosts

--context-path PATH creates an allow-all sandbox for 72 hours (no allowlist, no proxy, no
credentials); svc says so on stderr, with when the window ends, every time (on a terminal or
not). It is not a configuration file: for a project's configuration use --workspace DIR or
`svc workspace up DIR`. (-f/--file, its old name, is refused.)

Secrets (--secret VAR@SOURCE, repeatable): VAR is a credential variable the sandbox gets
(CODE_HOST_TOKEN with --repo, AGENT_AUTH_TOKEN, SVC_CRED_<HOST>_TOKEN per --allow-host); the
guest sees a placeholder, the proxy swaps it for the value on VAR's hosts only. SOURCE:
  env:NAME   the environment variable NAME of this svc process
  file:PATH  the contents of PATH (one trailing newline removed)
  store:NAME the named secret store (svc secret set NAME; read by svcd at creation)
The value is read here and sent to svcd over its socket; it never enters the sandbox.
With --repo and no CODE_HOST_TOKEN secret, svcd brokers the host's own code-host token when
its configuration names one (credentials.code_host_token_file).

Examples:
  svc sandbox create dev
  svc sandbox create --repo acme/widget --secret CODE_HOST_TOKEN@env:GH_TOKEN dev
  svc sandbox create --allow-host pypi.org --allow-host files.pythonhosted.org build
  svc sandbox create --context-path ./project scratch")]
    Create(CreateArgs),
    /// List sandboxes.
    #[command(visible_alias = "ls")]
    List {
        #[command(flatten)]
        output: crate::output::OutputArgs,
    },
    /// Show one sandbox: its envelope, addresses, placeholders (never values).
    #[command(visible_alias = "inspect")]
    Show {
        /// The sandbox's name.
        name: String,
        #[command(flatten)]
        output: crate::output::OutputArgs,
    },
    /// Run a command in a sandbox, like `docker exec`: output streams here, stdin and signals
    /// go there, the exit code is svc's.
    Exec(crate::exec_cmd::ExecArgs),
    /// Destroy a sandbox: its processes, link, fence entries, nftables entry, files and state.
    #[command(visible_aliases = ["rm", "delete"])]
    Destroy {
        /// The sandbox's name.
        name: String,
        /// Print what was removed as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Pause a sandbox: freeze every process in it (the container runtime's freezer, or the
    /// VM's CPUs); its network entries stay.
    Pause {
        /// The sandbox's name.
        name: String,
    },
    /// Change a running Curated sandbox's allowlist without restarting it: the DNS guard, the
    /// proxy and the fence switch together. A removed host stops working at once (its fence
    /// entries go, connections to it are reset, kept-alive ones refused from the next
    /// request); an added host works from the next DNS question, and new `exec`s get its
    /// placeholder (running processes keep the environment they started with). The agent
    /// hosts, the `--repo` family, the mode and the credentials need a new sandbox.
    #[command(
        after_help = "Examples:\n  svc sandbox allow dev --add-host pypi.org --add-host files.pythonhosted.org\n  svc sandbox allow dev --remove-host allowed.example.com --json"
    )]
    Allow {
        /// The sandbox's name.
        name: String,
        /// A host to add (repeatable): NAME, NAME:PORT, *.NAME, or an IP literal.
        #[arg(long = "add-host", value_name = "HOST")]
        add: Vec<String>,
        /// A host to remove (repeatable): one given with --allow-host or an earlier --add-host.
        #[arg(long = "remove-host", value_name = "HOST")]
        remove: Vec<String>,
        /// Print the sandbox after the change as JSON.
        #[arg(long)]
        json: bool,
    },
    /// What a sandbox uses now, from its cgroups (like `docker stats --no-stream`): CPU time,
    /// memory use and limit, processes. A microvm's are its VM's: memory of its memory cgroup,
    /// CPU time of its QEMU.
    Stats {
        /// The sandbox's name.
        name: String,
        /// Print the figures (and the host pids of its processes) as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Resume a paused sandbox.
    Resume {
        /// The sandbox's name.
        name: String,
    },
    /// Fork a microvm sandbox: snapshot it and start each CLONE from the snapshot, each a new
    /// sandbox with the source's allowlist, mode and secrets but its own link, addresses, CA,
    /// placeholders and host name. The source is paused while it is saved and resumed after
    /// (unless it was paused). Commands running in the source keep running there; in the clones
    /// they are ended. Containers cannot be forked.
    #[command(after_help = "Example:\n  svc sandbox fork base try-a try-b")]
    Fork {
        /// The sandbox to fork.
        name: String,
        /// Names of the clones (one or more).
        #[arg(required = true)]
        clones: Vec<String>,
        /// Print the snapshot and its clones as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// The new sandbox's name (letters, digits and '-').
    pub name: String,
    /// Add a host to the allowlist (repeatable): NAME, NAME:PORT, *.NAME, or an IP literal.
    #[arg(long = "allow-host")]
    pub allow_host: Vec<String>,
    /// Bind a code-host repository (owner/repo): adds the code-host family and
    /// CODE_HOST_TOKEN.
    #[arg(long)]
    pub repo: Option<String>,
    /// Egress mode: curated or allow-all.
    #[arg(long, value_parser = parse_egress)]
    pub egress: Option<EgressChoice>,
    /// Broker a credential: VAR@SOURCE (repeatable; see below).
    #[arg(long)]
    pub secret: Vec<String>,
    /// Create an allow-all sandbox for 72 hours for this context path: every host except the
    /// refused destination classes, no proxy, no credentials. A warning on stderr says until
    /// when, every time (on a terminal or not).
    #[arg(long = "context-path", value_name = "PATH")]
    pub context_path: Option<PathBuf>,
    /// The old name of --context-path, refused: to kubectl and compose users `-f` names a
    /// configuration file, and this made an allow-all sandbox instead.
    #[arg(short = 'f', long = "file", hide = true, value_name = "PATH", value_parser = refuse_file)]
    pub file: Option<PathBuf>,
    /// The backend: container (the default; netns is its old name) or microvm. Overrides the
    /// workspace's runtime block.
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(svc_control::runtime::choices()))]
    pub backend: Option<String>,
    /// Make the sandbox with the perimeter of the project in DIR, the same as `svc workspace
    /// up DIR` makes: its .svc/config.yaml egress section (the `allow` hosts, the
    /// `egress.policy` path rules and the repositories git may reach over SSH, the `secrets`
    /// hosts, `httpsPushBranches`) and the backend from its .svc/workspace.json `runtime`
    /// block (the first of `required` this svcd offers; empty or absent: automatic). Unlike
    /// `workspace up`, DIR is not shared into the sandbox and no hooks or services run.
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// With --workspace: approve the project's perimeter as it is now without asking.
    #[arg(long, requires = "workspace")]
    pub trust: bool,
    /// Hold git pushes over HTTPS to the allowed branches too, as over SSH (default: any ref
    /// of the --repo); .svc/config.yaml `egress.httpsPushBranches: true` asks the same.
    #[arg(long)]
    pub https_push_branches: bool,
    /// Run the sandbox on the root file system in DIR (an unpacked image: its /bin/sh, its
    /// programs), or on an image's layer directories TOP:…:BOTTOM, instead of svcd's base
    /// image. DIR is read-only beneath the sandbox's own writable layer and never changes;
    /// the perimeter is the same. Root only (each DIR a directory given by its canonical
    /// absolute path); container backend only.
    #[arg(long, value_name = "DIR")]
    pub rootfs: Option<PathBuf>,
    /// Print the created sandbox as JSON.
    #[arg(long)]
    pub json: bool,
}

fn parse_egress(s: &str) -> Result<EgressChoice, String> {
    EgressChoice::parse(s)
}

/// `-f`/`--file`: refused, naming what it did and what to use instead.
fn refuse_file(_: &str) -> Result<PathBuf, String> {
    Err(FILE_RENAMED.to_owned())
}

/// Why `-f`/`--file` is refused.
const FILE_RENAMED: &str = "-f/--file is no longer accepted: it did not read a configuration \
     file, it made an allow-all sandbox for 72 hours; say --context-path PATH if you mean that, \
     or --workspace DIR (or svc workspace up DIR) for a project's configuration";

pub fn run(cmd: SandboxCommand, socket: &SocketArg) -> anyhow::Result<ExitCode> {
    let client = Client::new(&socket.socket);
    let rt = runtime()?;
    let result = rt.block_on(async move {
        match cmd {
            SandboxCommand::Create(a) => create(&client, a).await,
            SandboxCommand::List { output } => list(&client, output.format()).await,
            SandboxCommand::Show { name, output } => {
                let s: SandboxView = client
                    .call::<(), _>(Method::GET, &format!("/v1/sandboxes/{name}"), None)
                    .await?;
                crate::output::one(output.format(), &s, print_sandbox)
            }
            SandboxCommand::Destroy { name, json } => {
                let d: Destroyed = client
                    .call::<(), _>(Method::DELETE, &format!("/v1/sandboxes/{name}"), None)
                    .await?;
                emit(json, &d, |d| {
                    outln!("destroyed {}: {}", d.name, d.removed.join(", "));
                })
            }
            SandboxCommand::Exec(a) => crate::exec_cmd::run(&client, a).await,
            SandboxCommand::Pause { name } => lifecycle(&client, &name, "pause").await,
            SandboxCommand::Allow {
                name,
                add,
                remove,
                json,
            } => allow(&client, &name, api::AllowChange { add, remove }, json).await,
            SandboxCommand::Resume { name } => lifecycle(&client, &name, "resume").await,
            SandboxCommand::Stats { name, json } => {
                crate::stats_cmd::run(&client, &name, json).await
            }
            SandboxCommand::Fork { name, clones, json } => fork(&client, &name, clones, json).await,
        }
    });
    // A read of our standard input may still be waiting (exec -i): do not wait for it.
    rt.shutdown_background();
    result
}

/// `svc sandbox list`: one line per sandbox, or all of them as `-o` asks.
async fn list(client: &Client, format: crate::output::Format) -> anyhow::Result<ExitCode> {
    let all: Vec<SandboxView> = client
        .call::<(), _>(Method::GET, "/v1/sandboxes", None)
        .await?;
    crate::output::list(format, &all, crate::sandbox_table::print)
}

/// `svc sandbox allow`: one live allowlist change.
async fn allow(
    client: &Client,
    name: &str,
    change: api::AllowChange,
    json: bool,
) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        !change.add.is_empty() || !change.remove.is_empty(),
        "give --add-host or --remove-host (see svc sandbox allow --help)"
    );
    let s: SandboxView = client
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{name}/allow"),
            Some(&change),
        )
        .await?;
    emit(json, &s, |s| {
        outln!(
            "{}: allowlist generation {}: {}",
            s.name,
            s.policy_generation,
            s.allowed_hosts.join(", ")
        );
    })
}

/// `svc sandbox fork`: a snapshot of the sandbox and its clones.
async fn fork(
    client: &Client,
    name: &str,
    clones: Vec<String>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let f: api::Forked = client
        .call(
            Method::POST,
            &format!("/v1/sandboxes/{name}/fork"),
            Some(&api::ForkRequest::new(clones).map_err(anyhow::Error::msg)?),
        )
        .await?;
    emit(json, &f, |f| {
        outln!("snapshot of {}: {:.0} ms", f.source, f.snapshot_ms);
        for c in &f.clones {
            outln!(
                "fork: {} is {} ({}, guest {}) in {:.0} ms",
                c.view.name,
                c.view.state,
                c.view.link,
                c.view.guest_v4,
                c.ready_ms
            );
        }
    })
}

async fn create(client: &Client, a: CreateArgs) -> anyhow::Result<ExitCode> {
    let name = api::SandboxName::new(a.name).map_err(|e| anyhow::anyhow!(e))?;
    let secrets = a
        .secret
        .iter()
        .map(|s| read_secret(s))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let context_path = match &a.context_path {
        Some(p) => Some(
            std::fs::canonicalize(p)
                .with_context(|| format!("--context-path {}", p.display()))?
                .display()
                .to_string(),
        ),
        None => None,
    };
    let project = match &a.workspace {
        None => None,
        Some(dir) => {
            let project = match crate::project::Project::load(dir)? {
                Ok(p) => p,
                Err(code) => return Ok(code),
            };
            match project.approve(client, a.trust).await? {
                Ok(approved) => Some((project, approved)),
                Err(code) => return Ok(code),
            }
        }
    };
    let mut req = CreateSandbox {
        name,
        allow_hosts: a.allow_host,
        repo: a.repo,
        egress: a.egress,
        secrets,
        context_path,
        backend: a.backend,
        runtime_required: None,
        ssh_repos: Vec::new(),
        workspace: None,
        project: None,
        https_push_branches: a.https_push_branches,
        allowed_branches: Vec::new(),
        rootfs: match &a.rootfs {
            // Each made absolute, its links left for svcd to refuse.
            Some(d) => Some(
                d.display()
                    .to_string()
                    .split(':')
                    .map(|l| std::path::absolute(l).map(|p| p.display().to_string()))
                    .collect::<std::io::Result<Vec<_>>>()
                    .with_context(|| format!("--rootfs {}", d.display()))?
                    .join(":"),
            ),
            None => None,
        },
        pod: None,
    };
    if let Some((project, approved)) = project {
        project.apply(approved, &mut req);
    }
    let s: SandboxView = client
        .call(Method::POST, "/v1/sandboxes", Some(&req))
        .await?;
    if s.context_path.is_some() {
        warn_allow_all(&s);
    }
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        outln!("created sandbox {} ({})", s.name, s.mode);
        print_sandbox(&s);
        outln!();
        outln!(
            "run a command in it:  svc sandbox exec {} -- sh -c '…'",
            s.name
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `--context-path`: the sandbox is open to every host for 72 hours, said on stderr whether
/// or not it is a terminal (a script's log keeps it too).
fn warn_allow_all(s: &SandboxView) {
    let until = s
        .window_ends
        .as_deref()
        .map_or_else(|| "72 hours from now".to_owned(), |w| format!("until {w}"));
    eprintln!(
        "warning: sandbox {} is allow-all for 72 hours ({until}; --context-path): every host \
         except the refused destination classes, no proxy, no credentials; then curated with \
         the agent hosts",
        s.name
    );
}

/// Print `value` as JSON for scripts, or for people with `human`.
fn emit<T: serde::Serialize>(
    json: bool,
    value: &T,
    human: impl FnOnce(&T),
) -> anyhow::Result<ExitCode> {
    if json {
        outln!("{}", serde_json::to_string_pretty(value)?);
    } else {
        human(value);
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn print_sandbox(s: &SandboxView) {
    outln!("  name:              {}", s.name);
    outln!("  id:                {}", s.id);
    outln!("  state:             {}", s.state);
    if let Some(pod) = &s.pod {
        outln!("  pod:               {pod} (Kubernetes namespace/name)");
    }
    if s.backend_reason.is_empty() {
        outln!("  backend:           {}", s.backend);
    } else {
        outln!("  backend:           {} ({})", s.backend, s.backend_reason);
    }
    if let Some(accel) = &s.accel {
        outln!("  accelerator:       {accel}");
    }
    for m in &s.live_mounts {
        outln!("  live mount:        {m}");
    }
    match &s.window_ends {
        Some(w) => outln!("  egress:            {} until {w}", s.mode),
        None => outln!("  egress:            {}", s.mode),
    }
    if !s.allowed_hosts.is_empty() {
        outln!("  allowed hosts:     {}", s.allowed_hosts.join(", "));
    }
    if s.policy_generation > 0 {
        outln!(
            "  allowlist:         changed live {} time(s) (svc sandbox allow)",
            s.policy_generation
        );
    }
    let over = if s.https_push_branches {
        "SSH and HTTPS"
    } else {
        "SSH"
    };
    let branches = s.allowed_branches.join(", ");
    outln!("  allowed branches:  {branches} ({over} pushes)");
    for r in &s.ssh_repos {
        outln!("  git over ssh:      {} {}", r.host, r.repo);
    }
    if let Some(r) = &s.repo {
        outln!("  repo:              {r}");
    }
    if let Some(c) = &s.context_path {
        outln!("  context path:      {c}");
    }
    outln!(
        "  network:           {} (gateway and resolver {}), host link {}",
        s.guest_v4,
        s.gateway_v4,
        s.link
    );
    outln!("  init pid:          {}", s.pid);
    outln!("  created:           {}", s.created_at);
    outln!(
        "  owner:             uid {}",
        crate::out::owner_text(s.owner_uid, s.owner.as_deref())
    );
    print_credentials(s);
    if let Some(w) = &s.workspace {
        print_workspace(w, &s.name);
    }
}

/// The sandbox's credential placeholders and the secrets it was given.
fn print_credentials(s: &SandboxView) {
    for p in &s.placeholders {
        outln!(
            "  credential:        {} ({}; {}) {}",
            p.env,
            p.kind,
            p.hosts.join(", "),
            if p.brokered {
                "swapped for the brokered secret"
            } else {
                "no secret brokered: stripped"
            }
        );
    }
    for sec in &s.secrets {
        outln!("  secret:            {sec}");
    }
}

/// The workspace of sandbox `name`: where, in which state, its forwards and log.
fn print_workspace(w: &api::WorkspaceView, name: &str) {
    outln!("  workspace:         {} -> {}", w.root, w.guest_dir);
    let phase = w
        .phase
        .as_deref()
        .map_or(String::new(), |p| format!(" ({p})"));
    outln!("  workspace state:   {}{phase}", w.state);
    if let Some(f) = &w.failure {
        outln!("  workspace failure: {f}");
    }
    for f in &w.forwards {
        outln!("  forward:           {f}");
    }
    outln!("  workspace log:     svc workspace logs {name}");
}

async fn lifecycle(client: &Client, name: &str, op: &str) -> anyhow::Result<ExitCode> {
    let s: SandboxView = client
        .call::<(), _>(Method::POST, &format!("/v1/sandboxes/{name}/{op}"), None)
        .await?;
    outln!("{op}: {} is {}", s.name, s.state);
    Ok(ExitCode::SUCCESS)
}

/// `svc supervisor-upgrade [--force]`.
pub fn upgrade(socket: &SocketArg, force: bool) -> anyhow::Result<ExitCode> {
    let client = Client::new(&socket.socket);
    runtime()?.block_on(async move {
        let before: Health = client
            .call(
                Method::POST,
                "/v1/supervisor/upgrade",
                Some(&api::Upgrade { force }),
            )
            .await?;
        for note in &before.notes {
            eprintln!("note: {note}");
        }
        eprintln!("svcd (pid {}) is re-executing…", before.pid);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            if let Ok(h) = client
                .call::<(), Health>(Method::GET, "/v1/health", None)
                .await
                && h.started_at != before.started_at
            {
                outln!(
                    "svcd upgraded: version {}, pid {}, {} sandboxes re-adopted",
                    h.version,
                    h.pid,
                    h.sandboxes
                );
                return Ok(ExitCode::SUCCESS);
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "svcd did not come back within 60 s; check its log (journalctl -u svcd)"
            );
        }
    })
}
