//! Creation rules: which `svc sandbox create` flags combine, the egress mode a request implies,
//! the credential variables a sandbox gets and whether each secret fits one, and when `--repo`
//! brokers the host's own code-host token. Pure: svcd asks, and so can a test or a tool.

use super::{credentials::PlaceholderEntry, mode::EgressMode, request::SandboxPolicy};
use crate::api::{CreateSandbox, EgressChoice, SecretValue};
use crate::config::{
    egress::{EgressConfig, RepoName},
    host::HostConfig,
};
use crate::hosts::HostPattern;

/// The variable `--repo` brokers.
pub const CODE_HOST_TOKEN: &str = "CODE_HOST_TOKEN";

/// A creation request, as the decisions need it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// `--egress`, if given.
    pub egress: Option<EgressMode>,
    /// `--file` / `--context-path` was given.
    pub context_path: bool,
    pub allow_hosts: &'a [String],
    pub repo: Option<&'a str>,
    pub secrets: &'a [Secret<'a>],
    /// The workspace's `.svc/config.yaml` egress section (`svc workspace up`), validated.
    pub project_egress: Option<&'a EgressConfig>,
}

impl<'a> Request<'a> {
    /// An API creation request (`POST /v1/sandboxes`, a pod's annotations) as the decisions
    /// read it: `secrets` are its own ([`Secret::all_of`]), `project_egress` the workspace's.
    pub fn of_api(
        req: &'a CreateSandbox,
        secrets: &'a [Secret<'a>],
        project_egress: Option<&'a EgressConfig>,
    ) -> Self {
        Request {
            egress: req.egress.map(|e| match e {
                EgressChoice::Curated => EgressMode::Curated,
                EgressChoice::AllowAll => EgressMode::AllowAll,
            }),
            context_path: req.context_path.is_some(),
            allow_hosts: &req.allow_hosts,
            repo: req.repo.as_deref(),
            secrets,
            project_egress,
        }
    }
}

/// One `--secret VAR@SOURCE`, value included (checked, never shown).
#[derive(Clone, Copy)]
pub struct Secret<'a> {
    pub name: &'a str,
    pub source: &'a str,
    pub value: &'a str,
}

impl<'a> Secret<'a> {
    /// An API request's secrets as the decisions read them.
    pub fn all_of(secrets: &'a [SecretValue]) -> Vec<Self> {
        secrets
            .iter()
            .map(|s| Secret {
                name: &s.name,
                source: &s.source,
                value: &s.value,
            })
            .collect()
    }
}

impl std::fmt::Debug for Secret<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// What a valid request makes.
#[derive(Debug, Clone)]
pub struct Plan {
    pub egress: EgressMode,
    /// `--allow-host` hosts, parsed.
    pub extra_hosts: Vec<HostPattern>,
    pub repo: Option<RepoName>,
    /// The Curated policy with freshly minted placeholders (unused in AllowAll).
    pub policy: SandboxPolicy,
}

/// Why a request is refused; each message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CreationError {
    #[error(
        "allow-all egress opens every host and seeds no credentials: --allow-host, --repo and \
         --secret apply to curated sandboxes only"
    )]
    AllowAllWithCuratedFlags,
    #[error(
        "allow-all egress opens every host: the workspace's .svc/config.yaml egress section \
         (allow, policy, secrets) applies to curated sandboxes only"
    )]
    AllowAllWithProjectEgress,
    #[error(
        "--file/--context-path creates an allow-all sandbox; it cannot be combined with \
         --egress curated"
    )]
    ContextPathWithCurated,
    #[error("--allow-host {host:?}: {reason}")]
    BadHost { host: String, reason: String },
    #[error("--repo {repo:?}: {reason} (expected owner/repo)")]
    BadRepo { repo: String, reason: String },
    #[error("give hosts to add or remove (--add-host, --remove-host)")]
    NoChange,
    #[error(
        "this sandbox is in AllowAll mode: every host is open and there is no allowlist to \
         change (it falls back to Curated with the agent hosts when its window ends)"
    )]
    ChangeInAllowAll,
    #[error("--remove-host {host}: {reason}")]
    CannotRemove { host: String, reason: String },
    #[error("ssh repository {host} {repo}: {reason}")]
    BadSshRepo {
        host: String,
        repo: String,
        reason: String,
    },
    #[error(
        "allowed branch {0:?}: expected a git ref pattern under refs/ (e.g. refs/heads/svc/**): \
         no space, control character, '..', '@{{', ':', '~', '^' or '\\', no empty component \
         and none starting with '.'"
    )]
    BadBranch(String),
    #[error("{0}")]
    Placeholders(String),
    #[error("--secret {0} is given twice")]
    SecretTwice(String),
    #[error(
        "--secret {name}: this sandbox has no such credential variable{hint}; its variables are: \
         {variables}"
    )]
    NoSuchVariable {
        name: String,
        hint: &'static str,
        variables: String,
    },
    #[error("--secret {name} from {origin}: the value is empty or holds a line break or NUL")]
    BadSecretValue { name: String, origin: String },
    #[error("--backend {0:?}: expected container or microvm (netns is container's old name)")]
    UnknownBackend(String),
    #[error("--backend {0}: this svcd does not offer that backend (it offers: {1})")]
    BackendUnavailable(&'static str, String),
    #[error("the workspace's runtime.required cannot be met here: {0}")]
    RuntimeUnsatisfiable(String),
}

/// A live change of a Curated sandbox's allowlist: its `--allow-host` hosts (as stored) with
/// `add` added and `remove` removed, normalised and without repeats. Only those hosts change:
/// the coding agent's built-in hosts stay, and so does the code-host family a `--repo`
/// sandbox is bound to (the repository, the mode and the credentials need a new sandbox).
pub fn change_allowlist(
    current: &[String],
    add: &[String],
    remove: &[String],
    agent: &crate::hosts::Allowlist,
    code: &crate::config::host::CodeHostFamily,
    bound_repo: bool,
) -> Result<Vec<HostPattern>, CreationError> {
    if add.is_empty() && remove.is_empty() {
        return Err(CreationError::NoChange);
    }
    let parse = |h: &String| {
        HostPattern::parse(h).map_err(|e| CreationError::BadHost {
            host: h.clone(),
            reason: e.to_string(),
        })
    };
    let mut hosts: Vec<HostPattern> = current
        .iter()
        .filter_map(|h| HostPattern::parse(h).ok())
        .collect();
    for h in remove {
        let p = parse(h)?;
        let Some(i) = hosts.iter().position(|x| *x == p) else {
            let family = [
                &code.code_host,
                &code.api_host,
                &code.uploads_host,
                &code.archive_host,
            ];
            let reason = if agent.0.contains(&p) {
                "it is one of the coding agent's built-in hosts (svcd.toml hosts.agent): every \
                 Curated sandbox keeps them"
                    .to_owned()
            } else if bound_repo && family.contains(&&p) {
                "it comes with the sandbox's --repo (the code-host family): recreate the sandbox \
                 without --repo to drop it"
                    .to_owned()
            } else {
                "it is not one of the hosts this sandbox was given (--allow-host or svc sandbox \
                 allow --add-host)"
                    .to_owned()
            };
            return Err(CreationError::CannotRemove {
                host: h.clone(),
                reason,
            });
        };
        hosts.remove(i);
    }
    for h in add {
        let p = parse(h)?;
        if !hosts.contains(&p) {
            hosts.push(p);
        }
    }
    Ok(hosts)
}

/// The repositories a sandbox's git may reach over SSH (`egress.policy` repos): each host a
/// plain name (the port comes from the remote URL), each repository `owner/repo`; the
/// normalised pairs, without repeats.
pub fn ssh_repos(given: &[(String, String)]) -> Result<Vec<(String, String)>, CreationError> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (host, repo) in given {
        let bad = |reason: String| CreationError::BadSshRepo {
            host: host.clone(),
            repo: repo.clone(),
            reason,
        };
        let pattern = HostPattern::parse(host).map_err(|e| bad(e.to_string()))?;
        let name = match (&pattern.kind, pattern.port) {
            (crate::hosts::HostKind::Exact(name), None) => name.clone(),
            (crate::hosts::HostKind::Ip(ip), None) => ip.to_string(),
            (_, Some(_)) => {
                return Err(bad(
                    "give the host without a port (git's remote URL says the port)".into(),
                ));
            }
            _ => {
                return Err(bad("give one host name or address (no wildcard)".into()));
            }
        };
        let repo = RepoName::parse(repo).map_err(bad)?.as_str().to_owned();
        if !out.iter().any(|(h, r)| *h == name && *r == repo) {
            out.push((name, repo));
        }
    }
    Ok(out)
}

/// A sandbox's AllowedBranches: the ref patterns (git's wildmatch globs) SSH pushes (and,
/// when asked, smart-HTTP pushes) may update. None given: the default, `refs/heads/svc/**`.
/// A pattern must be a ref name git accepts once its glob characters (`*`, `?`, `[`, `]`)
/// are set aside; repeats are dropped.
pub fn branches(given: &[String]) -> Result<Vec<String>, CreationError> {
    if given.is_empty() {
        return Ok(vec![super::ssh::DEFAULT_BRANCHES.to_owned()]);
    }
    let mut out: Vec<String> = Vec::new();
    for pattern in given {
        let plain = pattern.replace(['*', '?', '[', ']'], "x");
        if !super::ssh::ref_name_ok(&plain) {
            return Err(CreationError::BadBranch(pattern.clone()));
        }
        if !out.contains(pattern) {
            out.push(pattern.clone());
        }
    }
    Ok(out)
}

/// The backend a request gets: the one asked for if this svcd offers it (`canonical` names
/// the kind a name stands for: `netns` is `container`'s old name), else the first offered.
pub fn backend(
    asked: Option<&str>,
    offered: &[&'static str],
    canonical: impl Fn(&str) -> Option<&'static str>,
) -> Result<&'static str, CreationError> {
    let list = || offered.join(", ");
    let Some(asked) = asked else {
        return offered
            .first()
            .copied()
            .ok_or_else(|| CreationError::BackendUnavailable("any", list()));
    };
    let wanted = canonical(asked).ok_or_else(|| CreationError::UnknownBackend(asked.to_owned()))?;
    if offered.contains(&wanted) {
        Ok(wanted)
    } else {
        Err(CreationError::BackendUnavailable(wanted, list()))
    }
}

/// The backend a workspace's `runtime` block selects, and why, in words for the
/// user. `required` empty: automatic — the first of `preference` (strongest isolation first)
/// this svcd offers, saying why each before it is not (`why_not`). Otherwise the first
/// backend of `required` this svcd offers (`selection: prefer-first`, the only selection);
/// none offered is an error naming each and why it is not. Names are canonical.
pub fn select_runtime(
    required: &[&'static str],
    preference: &[&'static str],
    offered: &[&'static str],
    why_not: impl Fn(&str) -> String,
) -> Result<(&'static str, String), CreationError> {
    if required.is_empty() {
        return automatic(preference, offered, why_not);
    }
    let mut skipped = Vec::new();
    for b in required {
        if offered.contains(b) {
            let reason = if skipped.is_empty() {
                format!("runtime.required lists {b} first and this svcd offers it")
            } else {
                format!(
                    "runtime.required, prefer-first: {b} ({})",
                    skipped.join("; ")
                )
            };
            return Ok((b, reason));
        }
        skipped.push(format!("{b} is not offered: {}", why_not(b)));
    }
    Err(CreationError::RuntimeUnsatisfiable(skipped.join("; ")))
}

/// `runtime.required` empty: the first offered of `preference`.
fn automatic(
    preference: &[&'static str],
    offered: &[&'static str],
    why_not: impl Fn(&str) -> String,
) -> Result<(&'static str, String), CreationError> {
    let mut passed = Vec::new();
    for b in preference {
        if offered.contains(b) {
            let reason = if passed.is_empty() {
                format!(
                    "runtime.required is empty: automatic, {b} (the stronger boundary) is offered"
                )
            } else {
                format!(
                    "runtime.required is empty: automatic, {b} ({})",
                    passed.join("; ")
                )
            };
            return Ok((b, reason));
        }
        passed.push(why_not(b));
    }
    Err(CreationError::RuntimeUnsatisfiable(passed.join("; ")))
}

/// The mode a request implies: `--file` means AllowAll, else `--egress`, else Curated.
pub fn egress_mode(asked: Option<EgressMode>, context_path: bool) -> EgressMode {
    if context_path {
        EgressMode::AllowAll
    } else {
        asked.unwrap_or(EgressMode::Curated)
    }
}

/// Whether svcd should broker the host's own code-host token for this request: `--repo` in a
/// Curated sandbox with no `--secret CODE_HOST_TOKEN@…` of its own.
pub fn brokers_host_code_token(req: &Request<'_>) -> bool {
    req.repo.is_some()
        && egress_mode(req.egress, req.context_path) == EgressMode::Curated
        && !req.secrets.iter().any(|s| s.name == CODE_HOST_TOKEN)
}

/// Check a request and mint what it makes.
pub fn plan(host: &HostConfig, req: &Request<'_>) -> Result<Plan, CreationError> {
    let egress = egress_mode(req.egress, req.context_path);
    if egress == EgressMode::AllowAll {
        if !req.allow_hosts.is_empty() || req.repo.is_some() || !req.secrets.is_empty() {
            return Err(CreationError::AllowAllWithCuratedFlags);
        }
        if req.egress == Some(EgressMode::Curated) {
            return Err(CreationError::ContextPathWithCurated);
        }
        if req
            .project_egress
            .is_some_and(|e| *e != EgressConfig::default())
        {
            return Err(CreationError::AllowAllWithProjectEgress);
        }
    }
    let extra_hosts = req
        .allow_hosts
        .iter()
        .map(|h| {
            HostPattern::parse(h).map_err(|e| CreationError::BadHost {
                host: h.clone(),
                reason: e.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let repo = req
        .repo
        .map(|r| {
            RepoName::parse(r).map_err(|e| CreationError::BadRepo {
                repo: r.to_owned(),
                reason: e.to_string(),
            })
        })
        .transpose()?;
    let policy = SandboxPolicy::for_sandbox(
        host,
        &extra_hosts,
        repo.clone(),
        req.project_egress.cloned().unwrap_or_default(),
    )
    .map_err(|e| CreationError::Placeholders(e.to_string()))?;
    check_secrets(&policy, req.secrets)?;
    Ok(Plan {
        egress,
        extra_hosts,
        repo,
        policy,
    })
}

/// Every secret names a variable the sandbox gets, once, with a value that fits a header.
fn check_secrets(policy: &SandboxPolicy, secrets: &[Secret<'_>]) -> Result<(), CreationError> {
    let variables: Vec<String> = policy
        .placeholders
        .entries()
        .iter()
        .filter_map(PlaceholderEntry::env_name)
        .collect();
    let mut seen = std::collections::HashSet::new();
    for s in secrets {
        if !seen.insert(s.name) {
            return Err(CreationError::SecretTwice(s.name.to_owned()));
        }
        if !variables.iter().any(|v| v == s.name) {
            return Err(CreationError::NoSuchVariable {
                name: s.name.to_owned(),
                hint: if s.name == CODE_HOST_TOKEN {
                    " (CODE_HOST_TOKEN needs --repo owner/repo)"
                } else {
                    ""
                },
                variables: variables.join(", "),
            });
        }
        // A stored OAuth secret is given as a reference to its grant (with a NUL no real value
        // holds); only the store makes those.
        let grant = s.source.starts_with("store:")
            && super::credentials::parse_grant_reference(s.value).is_some();
        if !grant && (s.value.is_empty() || s.value.contains(['\r', '\n', '\0'])) {
            return Err(CreationError::BadSecretValue {
                name: s.name.to_owned(),
                origin: s.source.to_owned(),
            });
        }
    }
    Ok(())
}
