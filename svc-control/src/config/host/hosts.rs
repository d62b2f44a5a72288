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
