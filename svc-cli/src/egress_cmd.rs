//! `svc egress explain`: how the perimeter decides one HTTP request for a sandbox description.
//! It is how a user debugs a 403, and how the rules are tested from outside.

use std::{io::Read as _, path::PathBuf, process::ExitCode};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use svc_control::{
    config::{
        egress::{self, RepoName},
        loader,
    },
    policy::{
        credentials::Scheme,
        host::{Authority, HostPattern},
        mode::{EgressMode, mode_for},
        request::{self, CredentialAction, HttpRequest, Outcome, SandboxPolicy},
    },
};

#[derive(Debug, Subcommand)]
pub enum EgressCommand {
    /// Explain the decision on one request: allow (with the credential action) or refuse (with
    /// the status), the rule that decided and why.
    ///
    /// The sandbox is described as `svc sandbox create` would make it: the built-in agent
    /// hosts, `--allow-host`s, `--repo`, and the egress section of `.svc/config.yaml`. Its
    /// placeholders are minted fresh; write `{placeholder:HOST}` in the URL, a header or the body to
    /// send the placeholder of HOST's credential (`{placeholder:code-host}` for
    /// CODE_HOST_TOKEN), or use `--bearer HOST`.
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
    /// A host the sandbox may reach (repeatable), as `svc sandbox create --allow-host`.
    #[arg(long = "allow-host", value_name = "HOST")]
    pub allow_hosts: Vec<String>,
    /// The bound repository, as `svc sandbox create --repo`.
    #[arg(long, value_name = "OWNER/REPO")]
    pub repo: Option<String>,
    /// The project's .svc/config.yaml (default: ./.svc/config.yaml when it exists).
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

pub fn run(cmd: EgressCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        // Exit 1 means refused: a request that cannot be explained is a usage error (2).
        EgressCommand::Explain(a) => Ok(explain(*a).unwrap_or_else(|e| {
            eprintln!("svc: error: {e:#}");
            ExitCode::from(2)
        })),
    }
}

/// The project's egress section: `--config`, else ./.svc/config.yaml when it exists.
fn load_egress(config: Option<&std::path::Path>) -> anyhow::Result<egress::EgressConfig> {
    let config_path = config.map(ToOwned::to_owned).or_else(|| {
        let p = PathBuf::from(loader::CONFIG_YAML);
        p.exists().then_some(p)
    });
    Ok(match &config_path {
        Some(p) => {
            let text = loader::read_optional(p)
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .with_context(|| format!("{} not found", p.display()))?;
            egress::parse(p, &text).map_err(|e| anyhow::anyhow!("{e}"))?
        }
        None => Default::default(),
    })
}

/// `--ssh`: the relay's decision on one git request.
fn explain_ssh(a: &ExplainArgs, line: &str) -> anyhow::Result<ExitCode> {
    use svc_control::policy::ssh::{self, RefUpdate};
    let egress = load_egress(a.config.as_deref())?;
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
        ExitCode::from(1)
    })
}

/// The relay's decision on one git request, with what it was decided against.
struct SshExplained<'a> {
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

fn explain(a: ExplainArgs) -> anyhow::Result<ExitCode> {
    if let Some(line) = &a.ssh {
        return explain_ssh(&a, line);
    }
    let (Some(method), Some(url)) = (&a.method, &a.url) else {
        bail!("give METHOD and URL, or --ssh");
    };
    let policy = described_policy(&a)?;
    let (scheme, authority, target) = split_url(&substitute(&policy, url)?)?;
    let headers = request_headers(&a, &policy)?;
    let body = request_body(&a, &policy)?;
    let header_refs: Vec<(&str, &[u8])> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_slice()))
        .collect();
    let sni = a
        .sni
        .clone()
        .or_else(|| (scheme == Scheme::Https).then(|| authority.clone()));
    let decision = request::decide(
        &policy,
        &HttpRequest {
            scheme,
            method,
            target: &target,
            authority: Some(&authority),
            sni: sni.as_deref(),
            alt_authority: None,
            headers: &header_refs,
            body_prefix: &body,
            body_complete: true,
            head_had_both_lengths: false,
            dialled_port: None,
        },
    );
    if a.json {
        print_decision_json(&decision, &policy)?;
    } else {
        print_decision(&decision, &policy);
    }
    Ok(if decision.allowed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The sandbox as `svc sandbox create` would make it from the arguments: the host config,
/// the workspace's egress section, `--allow-host`s and `--repo`.
fn described_policy(a: &ExplainArgs) -> anyhow::Result<SandboxPolicy> {
    let host =
        loader::load_host_config(a.host_config.as_deref()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let egress = load_egress(a.config.as_deref())?;
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
    Ok(SandboxPolicy::for_sandbox(&host, &extra, repo, egress)?)
}

/// The `--header`s (placeholders substituted) and the `--bearer` header.
fn request_headers(
    a: &ExplainArgs,
    policy: &SandboxPolicy,
) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
    for h in &a.headers {
        let (n, v) = h
            .split_once(':')
            .with_context(|| format!("header {h:?} is not `Name: value`"))?;
        headers.push((
            n.trim().to_owned(),
            substitute(policy, v.trim())?.into_bytes(),
        ));
    }
    if let Some(b) = &a.bearer {
        headers.push((
            "Authorization".into(),
            format!("Bearer {}", placeholder_of(policy, b)?).into_bytes(),
        ));
    }
    Ok(headers)
}

/// The `--body-file` (`-`: standard input), placeholders substituted; empty without one.
fn request_body(a: &ExplainArgs, policy: &SandboxPolicy) -> anyhow::Result<Vec<u8>> {
    let body = match &a.body_file {
        None => Vec::new(),
        Some(p) if p.as_os_str() == "-" => {
            let mut v = Vec::new();
            std::io::stdin().read_to_end(&mut v)?;
            v
        }
        Some(p) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
    };
    Ok(substitute(policy, &String::from_utf8_lossy(&body))?.into_bytes())
}

/// The decision and the sandbox it was made for, as one JSON document (`--json`).
fn print_decision_json(decision: &request::Decision, policy: &SandboxPolicy) -> anyhow::Result<()> {
    let mode = mode_for(policy.allowed.is_empty());
    let doc = serde_json::json!({
        "decision": decision,
        "sandbox": {
            "mode": mode,
            "allowedHosts": policy.allowed,
            "repo": policy.bound_repo,
        },
    });
    outln!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}

/// The decision for people: the verdict, the rule and why, then the sandbox.
fn print_decision(decision: &request::Decision, policy: &SandboxPolicy) {
    match &decision.outcome {
        Outcome::Allow { credential } => {
            let what = match credential {
                CredentialAction::Passthrough => "forwarded as is".to_owned(),
                CredentialAction::Swap { kind, .. } => format!(
                    "placeholder swapped for the real {} credential",
                    kind.name()
                ),
                CredentialAction::Strip => "Authorization stripped".to_owned(),
            };
            outln!("ALLOW ({what})");
        }
        Outcome::Deny { status } => outln!("DENY {status}"),
    }
    outln!("  rule:    {}", decision.rule.name());
    outln!("  reason:  {}", decision.reason);
    if let Some(h) = &decision.host {
        outln!("  host:    {h}");
    }
    if let Some(p) = &decision.path {
        outln!("  path:    {p}");
    }
    let mode = mode_for(policy.allowed.is_empty());
    let hosts: Vec<String> = policy.allowed.0.iter().map(ToString::to_string).collect();
    outln!(
        "  sandbox: {} mode, {} allowed host(s): {}",
        if mode == EgressMode::Curated {
            "Curated"
        } else {
            "AllowAll"
        },
        hosts.len(),
        hosts.join(", ")
    );
    if let Some(r) = &policy.bound_repo {
        outln!("           bound repository {}", r.as_str());
    }
}

/// `scheme://authority/target` → (scheme, authority, origin-form target).
fn split_url(url: &str) -> anyhow::Result<(Scheme, String, String)> {
    let (scheme, rest) = url
        .split_once("://")
        .with_context(|| format!("URL {url:?} has no scheme (https://…)"))?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "https" => Scheme::Https,
        "http" => Scheme::Http,
        other => bail!("URL scheme {other:?} is not http or https"),
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, target) = rest.split_at(end);
    if authority.is_empty() {
        bail!("URL {url:?} has no host");
    }
    let target = match target {
        "" => "/".to_owned(),
        t if t.starts_with('?') => format!("/{t}"),
        t => t.to_owned(),
    };
    Ok((scheme, authority.to_owned(), target))
}

fn placeholder_of(policy: &SandboxPolicy, which: &str) -> anyhow::Result<String> {
    use svc_control::policy::credentials::CredentialKind;
    let entries = policy.placeholders.entries();
    let found = match which {
        "code-host" => entries.iter().find(|e| e.kind == CredentialKind::CodeHost),
        "agent" => entries.iter().find(|e| e.kind == CredentialKind::AgentApi),
        host => {
            let a = Authority::parse(host, 443)
                .with_context(|| format!("placeholder host {host:?}"))?;
            entries
                .iter()
                .find(|e| e.kind == CredentialKind::Host && e.hosts.iter().any(|h| h.matches(&a)))
        }
    };
    found
        .map(|e| e.placeholder.expose().to_owned())
        .with_context(|| format!("the sandbox has no placeholder for {which:?}"))
}

/// Replace every `{placeholder:WHICH}` in `s`.
fn substitute(policy: &SandboxPolicy, s: &str) -> anyhow::Result<String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("{placeholder:") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "{placeholder:".len()..];
        let end = after.find('}').context("unterminated {placeholder:…}")?;
        out.push_str(&placeholder_of(policy, &after[..end])?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}
