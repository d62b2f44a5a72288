//! `svc egress explain`: how the perimeter decides one HTTP request for a sandbox description,
//! or for a running sandbox as svcd holds it now (`--sandbox NAME`). It is how a user debugs a
//! 403, and how the rules are tested from outside.

use std::{io::Read as _, path::PathBuf, process::ExitCode};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use http::Method;
use svc_control::{
    config::{
        egress::{self, RepoName},
        loader,
    },
    hosts::HostPattern,
    policy::{
        explain::{self, Described, ExplainRequest, Explained, Verdict},
        request::SandboxPolicy,
    },
};

use crate::client::{Client, SocketArg, runtime};

#[derive(Debug, Subcommand)]
pub enum EgressCommand {
    /// Explain the decision on one request: allow (with the credential action) or refuse (with
    /// the status), the rule that decided and why.
    ///
    /// The sandbox is described as `svc sandbox create` would make it: the built-in agent
    /// hosts, `--allow-host`s, `--repo`, and the egress section of `.svc/config.yaml`; which
    /// files were read (or that none was, and the defaults hold) is said on stderr. Its
    /// placeholders are minted fresh; write `{placeholder:HOST}` in the URL, a header or the body to
    /// send the placeholder of HOST's credential (`{placeholder:code-host}` for
    /// CODE_HOST_TOKEN), or use `--bearer HOST`.
    ///
    /// With --sandbox NAME, svcd decides against that running sandbox's policy as it is now
    /// (its allowlist generation is shown), with the sandbox's own placeholders.
    ///
    /// With --ssh, explain a git-over-SSH request the relay would get instead: the host and
    /// repository against `.svc/config.yaml` egress.policy, and with --ref the refs a push
    /// updates against the allowed branches (refs/heads/svc/**).
    ///
    /// Exits 0 when the request would be allowed, 1 when refused, 2 on bad arguments.
    #[command(
        verbatim_doc_comment,
        after_help = "Examples:
  svc egress explain GET https://api.github.com/repos/acme/widget --repo acme/widget
  svc egress explain --sandbox dev GET https://pypi.org/simple/
  svc egress explain --ssh \"git@github.com git-receive-pack 'acme/widget.git'\" --ref refs/heads/main"
    )]
    Explain(Box<ExplainArgs>),
}

#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// HTTP method, e.g. GET or POST.
    #[arg(required_unless_present = "ssh")]
    pub method: Option<String>,
    /// The URL the guest requests, e.g. https://github.com/acme/widget.git/info/refs?service=git-upload-pack
    #[arg(required_unless_present = "ssh")]
    pub url: Option<String>,
    /// A git-over-SSH request as git makes it: `[USER@]HOST COMMAND`, e.g.
    /// "git@github.com git-receive-pack 'acme/widget.git'".
    #[arg(long, value_name = "[USER@]HOST COMMAND", conflicts_with_all = ["method", "url"])]
    pub ssh: Option<String>,
    /// A ref the push updates (repeatable; with --ssh), e.g. refs/heads/main.
    #[arg(long = "ref", value_name = "REFNAME", requires = "ssh")]
    pub refs: Vec<String>,
    /// Decide against this running sandbox's policy as svcd holds it now (after live
    /// `svc sandbox allow` changes; its generation is shown), with its own placeholders,
    /// instead of a sandbox described by the other arguments. Yours, or any as root.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["ssh", "allow_hosts", "repo", "config", "host_config"])]
    pub sandbox: Option<String>,
    /// A host the sandbox may reach (repeatable), as `svc sandbox create --allow-host`.
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allow_hosts: Vec<String>,
    /// The bound repository, as `svc sandbox create --repo`.
    #[arg(long, value_name = "OWNER/REPO")]
    pub repo: Option<String>,
    /// The project's .svc/config.yaml (default: ./.svc/config.yaml when it exists). Which
    /// files were read is said on stderr (and in --json as `read`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// svcd's host configuration (default: /etc/svc/svcd.toml when it exists).
    #[arg(long, value_name = "FILE")]
    pub host_config: Option<PathBuf>,
    /// A request header, `Name: value` (repeatable).
    #[arg(short = 'H', long = "header", value_name = "NAME: VALUE")]
    pub headers: Vec<String>,
    /// Send `Authorization: Bearer <placeholder>` with the placeholder of HOST (or
    /// `code-host`, `agent`).
    #[arg(long, value_name = "HOST")]
    pub bearer: Option<String>,
    /// The request body, from a file (`-` for standard input).
    #[arg(long, value_name = "FILE")]
    pub body_file: Option<PathBuf>,
    /// The TLS server name the guest used (default: the URL's host).
    #[arg(long)]
    pub sni: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: EgressCommand, socket: &SocketArg) -> anyhow::Result<ExitCode> {
    match cmd {
        // Exit 1 means refused: a request that cannot be explained is a usage error (2).
        EgressCommand::Explain(a) => Ok(explain(*a, socket).unwrap_or_else(|e| {
            eprintln!("svc: error: {e:#}");
            ExitCode::from(crate::exit::USAGE)
        })),
    }
}

/// The project's egress section: `--config`, else ./.svc/config.yaml when it exists; and
/// the file it was read from (said on stderr).
fn load_egress(
    config: Option<&std::path::Path>,
) -> anyhow::Result<(egress::EgressConfig, Option<PathBuf>)> {
    let config_path = config.map(ToOwned::to_owned).or_else(|| {
        let p = PathBuf::from(loader::CONFIG_YAML);
        p.exists().then_some(p)
    });
    let egress = match &config_path {
        Some(p) => {
            eprintln!("reading {}", p.display());
            let text = loader::read_optional(p)
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .with_context(|| format!("{} not found", p.display()))?;
            egress::parse(p, &text).map_err(|e| anyhow::anyhow!("{e}"))?
        }
        None => {
            eprintln!("no {} found, using defaults", loader::CONFIG_YAML);
            Default::default()
        }
    };
    Ok((egress, config_path))
}

/// svcd's host configuration: `--host-config`, else /etc/svc/svcd.toml when it exists; and
/// the file it was read from (said on stderr).
fn load_host(
    host_config: Option<&std::path::Path>,
) -> anyhow::Result<(svc_control::config::host::HostConfig, Option<PathBuf>)> {
    let default = std::path::Path::new(svc_control::config::host::DEFAULT_PATH);
    let path = host_config
        .map(ToOwned::to_owned)
        .or_else(|| default.exists().then(|| default.to_owned()));
    match &path {
        Some(p) => eprintln!("reading {}", p.display()),
        None => eprintln!("no {} found, using defaults", default.display()),
    }
    let host = loader::load_host_config(path.as_deref()).map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok((host, path))
}

/// `--ssh`: the relay's decision on one git request.
fn explain_ssh(a: &ExplainArgs, line: &str) -> anyhow::Result<ExitCode> {
    use svc_control::policy::ssh::{self, RefUpdate};
    let (egress, project) = load_egress(a.config.as_deref())?;
    let repos: Vec<(String, String)> = egress
        .policy
        .values()
        .flat_map(|p| {
            p.repos
                .iter()
                .map(|r| (p.host.to_string(), r.as_str().to_owned()))
        })
        .collect();
    let (target, command) = line
        .trim()
        .split_once(char::is_whitespace)
        .with_context(|| format!("--ssh {line:?}: expected `[USER@]HOST COMMAND`"))?;
    let args = vec![target.to_owned(), command.trim().to_owned()];
    let zero = "0".repeat(40);
    let updates: Vec<RefUpdate> = a
        .refs
        .iter()
        .map(|name| RefUpdate {
            old: zero.clone(),
            new: "1".repeat(40),
            name: name.clone(),
        })
        .collect();
    let branches = vec![ssh::DEFAULT_BRANCHES.to_owned()];
    let result = ssh::explain(&repos, &branches, &args, &updates);
    if let Ok((r, _)) = &result
        && r.service == ssh::Service::UploadPack
        && !a.refs.is_empty()
    {
        bail!(
            "--ref applies to pushes (git-receive-pack), not {}",
            r.service.command()
        );
    }
    let explained = SshExplained {
        read: FilesRead {
            project,
            host: None,
        },
        result: &result,
        refs: &a.refs,
        repos: &repos,
        branches: &branches,
    };
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&explained.json())?);
    } else {
        explained.print();
    }
    Ok(if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::FAILURE)
    })
}

/// The relay's decision on one git request, with what it was decided against.
struct SshExplained<'a> {
    /// The project configuration read (the relay's decision reads no host configuration).
    read: FilesRead,
    result: &'a SshResult,
    refs: &'a [String],
    repos: &'a [(String, String)],
    branches: &'a [String],
}

/// What `policy::ssh::explain` answers.
type SshResult = Result<
    (
        svc_control::policy::ssh::SshRequest,
        svc_control::policy::ssh::SshRule,
    ),
    (svc_control::policy::ssh::SshRule, String),
>;

impl SshExplained<'_> {
    /// The rule that decided, and git's line for a refusal.
    fn rule_and_message(&self) -> (svc_control::policy::ssh::SshRule, Option<String>) {
        match self.result {
            Ok((_, rule)) => (*rule, None),
            Err((rule, line)) => (*rule, Some(line.clone())),
        }
    }

    /// `--json`: one document.
    fn json(&self) -> serde_json::Value {
        let (rule, message) = self.rule_and_message();
        let request = self.result.as_ref().ok().map(|(r, _)| {
            serde_json::json!({
                "host": r.host, "repo": r.repo, "command": r.service.command(), "port": r.port,
            })
        });
        serde_json::json!({
            "decision": if self.result.is_ok() { "allow" } else { "deny" },
            "rule": rule,
            "message": message,
            "request": request,
            "refs": self.refs,
            "read": self.read,
            "policy": {
                "repos": self.repos.iter().map(|(h, r)| format!("{h} {r}")).collect::<Vec<_>>(),
                "allowedBranches": self.branches,
            },
        })
    }

    /// For people: the verdict, what git sees, the rule, the request and the policy.
    fn print(&self) {
        use svc_control::policy::ssh::SshRule;
        let (rule, message) = self.rule_and_message();
        let rule_name = match rule {
            SshRule::Request => "request",
            SshRule::EgressPolicy => "egress-policy",
            SshRule::AllowedBranches => "allowed-branches",
        };
        match &message {
            None => outln!("ALLOW"),
            Some(line) => {
                outln!("DENY");
                outln!("  git sees: {line}");
            }
        }
        outln!("  rule:     {rule_name}");
        if let Ok((r, _)) = self.result {
            outln!(
                "  request:  {} {} on {}",
                r.service.command(),
                r.repo,
                r.host
            );
        }
        for name in self.refs {
            outln!("  ref:      {name}");
        }
        if self.repos.is_empty() {
            outln!("  policy:   no repositories (.svc/config.yaml egress.policy.<host>.repos)");
        } else {
            let shown: Vec<String> = self.repos.iter().map(|(h, r)| format!("{h} {r}")).collect();
            outln!("  policy:   {}", shown.join(", "));
        }
        outln!("  branches: {}", self.branches.join(", "));
    }
}

fn explain(a: ExplainArgs, socket: &SocketArg) -> anyhow::Result<ExitCode> {
    if let Some(line) = &a.ssh {
        return explain_ssh(&a, line);
    }
    let (Some(method), Some(url)) = (&a.method, &a.url) else {
        bail!("give METHOD and URL, or --ssh");
    };
    let req = ExplainRequest {
        method: method.clone(),
        url: url.clone(),
        headers: a.headers.clone(),
        bearer: a.bearer.clone(),
        body: request_body(&a)?,
        sni: a.sni.clone(),
    };
    let (explained, read) = match &a.sandbox {
        Some(name) => (live(socket, name, &req)?, None),
        None => {
            let (policy, read) = described_policy(&a)?;
            let decision = explain::explain(&policy, &req)?;
            let explained = Explained {
                decision: Verdict::from(&decision),
                sandbox: Described::of(&policy),
            };
            (explained, Some(read))
        }
    };
    if a.json {
        let mut doc = serde_json::to_value(&explained)?;
        if let (Some(read), Some(o)) = (read, doc.as_object_mut()) {
            o.insert("read".into(), serde_json::to_value(read)?);
        }
        outln!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        print_decision(&explained);
    }
    Ok(if explained.decision.allowed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::FAILURE)
    })
}

/// `--sandbox NAME`: svcd decides against the running sandbox's policy as it is now.
fn live(socket: &SocketArg, name: &str, req: &ExplainRequest) -> anyhow::Result<Explained> {
    let client = Client::new(&socket.socket);
    runtime()?.block_on(async move {
        client
            .call(
                Method::POST,
                &format!("/v1/sandboxes/{name}/explain"),
                Some(req),
            )
            .await
    })
}

/// The files an offline explanation was read from (`null`: none, the defaults).
#[derive(serde::Serialize)]
struct FilesRead {
    project: Option<PathBuf>,
    host: Option<PathBuf>,
}

/// The sandbox as `svc sandbox create` would make it from the arguments: the host config,
/// the workspace's egress section, `--allow-host`s and `--repo`; and the files read.
fn described_policy(a: &ExplainArgs) -> anyhow::Result<(SandboxPolicy, FilesRead)> {
    let (host, host_path) = load_host(a.host_config.as_deref())?;
    let (egress, project_path) = load_egress(a.config.as_deref())?;
    let extra = a
        .allow_hosts
        .iter()
        .map(|h| HostPattern::parse(h).with_context(|| format!("--allow-host {h:?}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let repo = a
        .repo
        .as_deref()
        .map(|r| RepoName::parse(r).map_err(|e| anyhow::anyhow!("--repo: {e}")))
        .transpose()?;
    let read = FilesRead {
        project: project_path,
        host: host_path,
    };
    Ok((
        SandboxPolicy::for_sandbox(&host, &extra, repo, egress)?,
        read,
    ))
}

/// The `--body-file` (`-`: standard input), as text; empty without one.
fn request_body(a: &ExplainArgs) -> anyhow::Result<String> {
    let body = match &a.body_file {
        None => Vec::new(),
        Some(p) if p.as_os_str() == "-" => {
            let mut v = Vec::new();
            std::io::stdin().read_to_end(&mut v)?;
            v
        }
        Some(p) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
    };
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The decision for people: the verdict, the rule and why, then the sandbox.
fn print_decision(e: &Explained) {
    let d = &e.decision;
    match (&d.credential, d.status) {
        (_, Some(status)) => outln!("DENY {status}"),
        (c, None) => {
            let what = match c.as_ref().map(|c| (c.action.as_str(), c.kind.as_deref())) {
                Some(("swap", kind)) => format!(
                    "placeholder swapped for the real {} credential",
                    kind.unwrap_or("?")
                ),
                Some(("strip", _)) => "Authorization stripped".to_owned(),
                _ => "forwarded as is".to_owned(),
            };
            outln!("ALLOW ({what})");
        }
    }
    outln!("  rule:    {}", d.rule);
    outln!("  reason:  {}", d.reason);
    if let Some(h) = &d.host {
        outln!("  host:    {h}");
    }
    if let Some(p) = &d.path {
        outln!("  path:    {p}");
    }
    let s = &e.sandbox;
    let mode = if s.is_curated() {
        "Curated"
    } else {
        "AllowAll"
    };
    let which = match (&s.name, s.policy_generation) {
        (Some(n), Some(g)) => format!("{n}, allowlist generation {g}, "),
        (Some(n), None) => format!("{n}, "),
        _ => String::new(),
    };
    outln!(
        "  sandbox: {which}{mode} mode, {} allowed host(s): {}",
        s.allowed_hosts.len(),
        s.allowed_hosts.join(", ")
    );
    if let Some(r) = &s.repo {
        outln!("           bound repository {r}");
    }
}
