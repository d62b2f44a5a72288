//! `[hosts]`: the coding agent's built-in hosts and the code-host family (the docs'
//! `{agent_api_host}`, `{code_host}`, …): nothing else in svc names them.

use serde::{Deserialize, Serialize};

use super::defaults;
use crate::hosts::{HostKind, HostPattern};

/// `[hosts]` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HostsFile {
    /// The coding agent's built-in hosts ({agent_api_host}, {agent_platform_host}).
    pub agent: Option<Vec<String>>,
    pub code_host: Option<String>,
    pub code_api_host: Option<String>,
    pub code_uploads_host: Option<String>,
    pub code_archive_host: Option<String>,
}

/// The code-hosting site and its API, upload and archive hosts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CodeHostFamily {
    pub code_host: HostPattern,
    pub api_host: HostPattern,
    pub uploads_host: HostPattern,
    pub archive_host: HostPattern,
}

/// `[hosts]`, validated (its fields land in `HostConfig`'s `agent_hosts` and `code`).
pub(super) struct Hosts {
    pub agent: Vec<HostPattern>,
    pub code: CodeHostFamily,
}

impl HostsFile {
    /// Check each host, reporting every error through `err`.
    pub(super) fn validate(self, err: &mut impl FnMut(&str, String)) -> Hosts {
        let agent = self
            .agent
            .unwrap_or_else(|| defaults::AGENT_HOSTS.map(String::from).to_vec())
            .into_iter()
            .enumerate()
            .map(|(i, h)| host(&format!("hosts.agent[{i}]"), Some(h), "", err))
            .collect();
        let code = CodeHostFamily {
            code_host: host("hosts.code_host", self.code_host, defaults::CODE_HOST, err),
            api_host: host(
                "hosts.code_api_host",
                self.code_api_host,
                defaults::CODE_API_HOST,
                err,
            ),
            uploads_host: host(
                "hosts.code_uploads_host",
                self.code_uploads_host,
                defaults::CODE_UPLOADS_HOST,
                err,
            ),
            archive_host: host(
                "hosts.code_archive_host",
                self.code_archive_host,
                defaults::CODE_ARCHIVE_HOST,
                err,
            ),
        };
        Hosts { agent, code }
    }
}

impl CodeHostFamily {
    /// What is valid but likely not meant, as (key, message): the code host or its API set
    /// to a site that is not GitHub while the upload and archive hosts are still GitHub's
    /// defaults, which guests may then still reach.
    pub fn warnings(&self) -> Vec<(&'static str, String)> {
        let github = |h: &HostPattern| {
            let name = h.to_string();
            name == defaults::CODE_HOST || name.ends_with(".github.com")
        };
        let moved = [
            ("hosts.code_host", &self.code_host),
            ("hosts.code_api_host", &self.api_host),
        ]
        .into_iter()
        .find(|(_, h)| !github(h));
        let Some((key, host)) = moved else {
            return Vec::new();
        };
        [
            ("code_uploads_host", &self.uploads_host),
            ("code_archive_host", &self.archive_host),
        ]
        .into_iter()
        .filter(|(_, h)| github(h))
        .map(|(left, h)| {
            (
                key,
                format!(
                    "{key} is {host}, not GitHub, but hosts.{left} is still {h}: guests may still \
                     reach it; set hosts.{left} to {host}'s own host (the code host family is \
                     code_host, code_api_host, code_uploads_host and code_archive_host)"
                ),
            )
        })
        .collect()
    }
}

/// `value` (or `default`) as a host pattern; on error, an empty exact name.
fn host(
    key: &str,
    value: Option<String>,
    default: &str,
    err: &mut impl FnMut(&str, String),
) -> HostPattern {
    let v = value.unwrap_or_else(|| default.to_owned());
    HostPattern::parse(&v).unwrap_or_else(|e| {
        err(key, e.to_string());
        HostPattern {
            kind: HostKind::Exact(String::new()),
            port: None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn family(code: &str, api: &str, uploads: Option<&str>, archive: Option<&str>) -> HostsFile {
        HostsFile {
            agent: None,
            code_host: Some(code.into()),
            code_api_host: Some(api.into()),
            code_uploads_host: uploads.map(Into::into),
            code_archive_host: archive.map(Into::into),
        }
    }

    #[test]
    fn a_mixed_code_host_family_is_warned_of_by_key() {
        let gitlab = "gitlab.example.org";
        let api = "gitlab.example.org";
        let cases: [(&str, HostsFile, &[&str]); 4] = [
            ("github", HostsFile::default(), &[]),
            (
                "gitlab, defaults left",
                family(gitlab, api, None, None),
                &["code_uploads_host", "code_archive_host"],
            ),
            (
                "gitlab, archive set",
                family(gitlab, api, None, Some("gitlab.example.org")),
                &["code_uploads_host"],
            ),
            (
                "gitlab, all set",
                family(gitlab, api, Some(gitlab), Some(gitlab)),
                &[],
            ),
        ];
        for (name, file, keys) in cases {
            let mut errors = Vec::new();
            let hosts = file.validate(&mut |k: &str, m: String| errors.push(format!("{k}: {m}")));
            assert!(errors.is_empty(), "{name}: {errors:?}");
            let warnings = hosts.code.warnings();
            assert_eq!(warnings.len(), keys.len(), "{name}: {warnings:?}");
            for ((key, message), left) in warnings.iter().zip(keys) {
                assert_eq!(*key, "hosts.code_host", "{name}");
                assert!(
                    message.starts_with(&format!(
                        "hosts.code_host is gitlab.example.org, not GitHub, but hosts.{left} is still "
                    )) && message.contains(&format!("set hosts.{left} to")),
                    "{name}: {message}"
                );
            }
        }
    }
}
