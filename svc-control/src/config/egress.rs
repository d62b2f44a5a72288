//! `.svc/config.yaml`, egress section.
//!
//! ```yaml
//! egress:
//!   allow: [archive.example.com]            # open passthrough
//!   policy:                                 # policy-gated, default-deny paths
//!     api.example.com:
//!       paths: ["/v1/models", "/v1/chat/**"]
//!     code.example.com:
//!       repos: [owner/repo]                 # repos the SSH relay may reach
//!   secrets:
//!     - name: CODE_HOST_TOKEN
//!       hosts: [api.code.example.com]       # brokered credential: policy-gated too
//!   httpsPushBranches: true                 # smart-HTTP pushes held to AllowedBranches
//! ```
//!
//! A host is open or policy-gated, never both: a host under `allow` that is also under `policy`
//! or a `secrets[].hosts` list (compared case-insensitively, ignoring a trailing dot and any
//! port) is refused with one fixed message (`clash_message`).

use std::{collections::BTreeMap, path::Path};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ConfigError, ConfigErrors, Location, UniqueMap};
use crate::hosts::HostPattern;

/// The whole `.svc/config.yaml` as written. Only the egress section is defined.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfigYamlFile {
    #[serde(default)]
    pub egress: Option<EgressFile>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressFile {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub policy: UniqueMap<PolicyEntryFile>,
    #[serde(default)]
    pub secrets: Vec<SecretFile>,
    /// Hold git pushes over HTTPS (smart-HTTP `git-receive-pack` to the bound repository) to
    /// AllowedBranches too, as over SSH (default: false, any ref of the bound repository).
    #[serde(
        default,
        rename = "httpsPushBranches",
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub https_push_branches: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyEntryFile {
    /// Allowed request paths: `*` matches within one segment, `**` across segments.
    #[serde(default)]
    pub paths: Vec<String>,
    /// `owner/repo` names the git SSH relay may reach on this host.
    #[serde(default)]
    pub repos: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SecretFile {
    /// The credential's name, e.g. `CODE_HOST_TOKEN`.
    pub name: String,
    /// Hosts the credential is brokered to.
    #[serde(default)]
    pub hosts: Vec<String>,
}

/// A validated egress section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct EgressConfig {
    /// Open hosts.
    pub allow: Vec<HostPattern>,
    /// Policy-gated hosts by their normalised name.
    pub policy: BTreeMap<String, PolicyEntry>,
    pub secrets: Vec<Secret>,
    /// `httpsPushBranches`: smart-HTTP pushes held to AllowedBranches (`policy::http_push`).
    pub https_push_branches: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyEntry {
    pub host: HostPattern,
    pub paths: Vec<PathPattern>,
    pub repos: Vec<RepoName>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Secret {
    pub name: String,
    pub hosts: Vec<HostPattern>,
}

impl EgressConfig {
    /// The section as it would be written: [`validate`] of it gives `self` back.
    pub fn to_file(&self) -> EgressFile {
        EgressFile {
            allow: self.allow.iter().map(ToString::to_string).collect(),
            policy: UniqueMap(
                self.policy
                    .values()
                    .map(|p| {
                        (
                            p.host.to_string(),
                            PolicyEntryFile {
                                paths: p.paths.iter().map(|x| x.as_str().to_owned()).collect(),
                                repos: p.repos.iter().map(|r| r.as_str().to_owned()).collect(),
                            },
                        )
                    })
                    .collect(),
            ),
            secrets: self
                .secrets
                .iter()
                .map(|s| SecretFile {
                    name: s.name.clone(),
                    hosts: s.hosts.iter().map(ToString::to_string).collect(),
                })
                .collect(),
            https_push_branches: self.https_push_branches,
        }
    }
}

/// A request-path pattern: starts with `/`; `*` within a segment, `**` a whole segment.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct PathPattern(String);

impl PathPattern {
    pub fn parse(s: &str) -> Result<Self, String> {
        if !s.starts_with('/') {
            return Err(format!("path pattern {s:?} must start with '/'"));
        }
        if s.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(format!(
                "path pattern {s:?} contains whitespace or control characters"
            ));
        }
        if s.contains(['?', '#']) {
            return Err(format!(
                "path pattern {s:?} must not contain a query or fragment"
            ));
        }
        for seg in s.split('/') {
            if seg.contains("**") && seg != "**" {
                return Err(format!("path pattern {s:?}: '**' must be a whole segment"));
            }
            if seg == "." || seg == ".." {
                return Err(format!(
                    "path pattern {s:?} must not contain '.' or '..' segments"
                ));
            }
        }
        Ok(Self(s.to_owned()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// `owner/repo` on a code host. Compared case-insensitively, as code hosts do.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct RepoName(String);

impl RepoName {
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "repository {s:?} must be owner/repo (letters, digits, '.', '-', '_'; not starting with '.' or '-')"
            )
        };
        let s_trim = s.strip_suffix(".git").unwrap_or(s);
        let (owner, repo) = s_trim.split_once('/').ok_or_else(bad)?;
        let part_ok = |p: &str| {
            !p.is_empty()
                && p.len() <= 100
                && !p.starts_with(['.', '-'])
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        if part_ok(owner) && part_ok(repo) && owner != ".." && repo != ".." {
            Ok(Self(format!(
                "{}/{}",
                owner.to_ascii_lowercase(),
                repo.to_ascii_lowercase()
            )))
        } else {
            Err(bad())
        }
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The refusal, word for word, of a host that is both open and policy-gated.
pub fn clash_message(host: &str) -> String {
    format!(
        "svc config: host \"{host}\" is listed under egress.allow and egress.policy; a host can be open (allow) or policy-gated (policy/secrets), not both — remove it from egress.allow."
    )
}

/// Parse and validate the text of a `.svc/config.yaml`.
pub fn parse(file: &Path, text: &str) -> Result<EgressConfig, ConfigErrors> {
    let parsed: ConfigYamlFile = if text.trim().is_empty() {
        ConfigYamlFile::default()
    } else {
        super::parse_yaml(file, text)?
    };
    validate(file, parsed.egress.unwrap_or_default())
}

/// Validate an egress section as written (`file` only names it in messages): what [`parse`]
/// does after reading the YAML, and what svcd does with the section a creation request carries.
pub fn validate(file: &Path, e: EgressFile) -> Result<EgressConfig, ConfigErrors> {
    let mut errors = Vec::new();
    let mut err = |path: String, message: String| {
        errors.push(ConfigError::new(file, Location::at(path), message));
    };
    let policy = policy_entries(e.policy, &mut err);
    let secrets = secrets(&e.secrets, &mut err);
    let allow = open_hosts(&e.allow, &policy, &secrets, &mut err);
    if errors.is_empty() {
        Ok(EgressConfig {
            allow,
            policy,
            secrets,
            https_push_branches: e.https_push_branches,
        })
    } else {
        Err(ConfigErrors(errors))
    }
}

/// `egress.policy`, by each host's normalised name: a host listed twice is refused.
fn policy_entries(
    entries: UniqueMap<PolicyEntryFile>,
    err: &mut impl FnMut(String, String),
) -> BTreeMap<String, PolicyEntry> {
    let mut policy: BTreeMap<String, PolicyEntry> = BTreeMap::new();
    for (host, entry) in entries.0 {
        let path = format!("egress.policy.{host}");
        let pattern = match HostPattern::parse(&host) {
            Ok(p) => p,
            Err(why) => {
                err(path, why.to_string());
                continue;
            }
        };
        let (paths, repos) = entry.validate(&path, err);
        let key = pattern.host_key();
        if policy.contains_key(&key) {
            err(
                path,
                format!(
                    "host {key:?} is listed twice under egress.policy (names are compared case-insensitively, ignoring a trailing dot and port)"
                ),
            );
            continue;
        }
        policy.insert(
            key,
            PolicyEntry {
                host: pattern,
                paths,
                repos,
            },
        );
    }
    policy
}

impl PolicyEntryFile {
    /// The entry's path patterns and repositories that parse; an error at `path` for each
    /// other.
    fn validate(
        &self,
        path: &str,
        err: &mut impl FnMut(String, String),
    ) -> (Vec<PathPattern>, Vec<RepoName>) {
        let mut paths = Vec::new();
        for (i, p) in self.paths.iter().enumerate() {
            match PathPattern::parse(p) {
                Ok(p) => paths.push(p),
                Err(why) => err(format!("{path}.paths[{i}]"), why),
            }
        }
        let mut repos = Vec::new();
        for (i, r) in self.repos.iter().enumerate() {
            match RepoName::parse(r) {
                Ok(r) => repos.push(r),
                Err(why) => err(format!("{path}.repos[{i}]"), why),
            }
        }
        (paths, repos)
    }
}

/// `egress.secrets`: each name an environment variable name, each host a host pattern.
fn secrets(written: &[SecretFile], err: &mut impl FnMut(String, String)) -> Vec<Secret> {
    let mut secrets = Vec::new();
    for (i, s) in written.iter().enumerate() {
        if !is_env_name(&s.name) {
            err(
                format!("egress.secrets[{i}].name"),
                format!(
                    "secret name {:?} must be upper-case letters, digits and '_', starting with a letter",
                    s.name
                ),
            );
        }
        let mut hosts = Vec::new();
        for (j, h) in s.hosts.iter().enumerate() {
            match HostPattern::parse(h) {
                Ok(h) => hosts.push(h),
                Err(why) => err(format!("egress.secrets[{i}].hosts[{j}]"), why.to_string()),
            }
        }
        secrets.push(Secret {
            name: s.name.clone(),
            hosts,
        });
    }
    secrets
}

/// `egress.allow`: each a host pattern, none of them policy-gated (a clash is refused).
fn open_hosts(
    allow: &[String],
    policy: &BTreeMap<String, PolicyEntry>,
    secrets: &[Secret],
    err: &mut impl FnMut(String, String),
) -> Vec<HostPattern> {
    let mut open = Vec::new();
    for (i, h) in allow.iter().enumerate() {
        let path = format!("egress.allow[{i}]");
        let pattern = match HostPattern::parse(h) {
            Ok(p) => p,
            Err(why) => {
                err(path, why.to_string());
                continue;
            }
        };
        let key = pattern.host_key();
        let gated = policy.contains_key(&key)
            || secrets
                .iter()
                .any(|s| s.hosts.iter().any(|sh| sh.host_key() == key));
        if gated {
            err(path, clash_message(h.trim()));
            continue;
        }
        open.push(pattern);
    }
    open
}

fn is_env_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_uppercase())
        && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}
