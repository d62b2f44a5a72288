//! `[credentials]`: the host's code-host token and who may use it, the coding agent's home
//! and its credential guardian, the host key, and the timing of svcd's token refreshes.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use super::{checks, defaults};

/// The key of the OAuth object in the coding agent's credentials file, by default.
pub const DEFAULT_ENTRY: &str = "claudeAiOauth";

/// `[credentials]` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialsFile {
    /// The host's code-host token (one line): what `svc sandbox create --repo` brokers as
    /// CODE_HOST_TOKEN when no `--secret CODE_HOST_TOKEN@…` is given. Read at each creation.
    pub code_host_token_file: Option<PathBuf>,
    /// A group whose members' sandboxes may use the host's code-host token (root's always
    /// may; without it no other caller's may).
    pub code_host_token_group: Option<String>,
    /// The coding agent's home on the host (e.g. `/home/alice/.claude`): mounted
    /// read-write into every sandbox made while this is set (microvm backend: virtiofs).
    pub agent_home: Option<PathBuf>,
    /// Where the guest sees it (default: `/root/` and the host directory's name).
    pub agent_home_guest: Option<PathBuf>,
    /// The host key stored secrets and sandboxes' values are sealed with (32 bytes, root's
    /// alone; made on first start).
    pub key_file: Option<PathBuf>,
    /// The code-host CLI whose login `--repo` falls back to (`gh`; `""` turns it off).
    pub code_host_cli: Option<PathBuf>,
    /// The agent platform's OAuth token endpoint (`https://…`): with `agent_home`, it turns
    /// the credential guardian on.
    pub agent_token_endpoint: Option<String>,
    /// The `client_id` the guardian sends with its refresh grant, if the platform wants one.
    pub agent_client_id: Option<String>,
    /// The key of the OAuth object in `.credentials.json` (default `claudeAiOauth`).
    pub agent_credentials_entry: Option<String>,
    /// Seconds between looks at tokens svcd refreshes: the guardian's and brokered OAuth
    /// secrets' (default 60).
    pub refresh_poll_secs: Option<u64>,
    /// Seconds before expiry a token is refreshed (default 1800; a brokered OAuth
    /// token shorter-lived than twice this is refreshed at half its life).
    pub refresh_lead_secs: Option<u64>,
}

/// The coding agent's credential guardian, validated (on when `agent_home` and
/// `agent_token_endpoint` are set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuardianConfig {
    pub token_endpoint: String,
    pub client_id: Option<String>,
    pub entry: String,
    pub poll: Duration,
    pub lead: Duration,
}

/// `[credentials]`, validated but for `key_file` (checked with svcd's other paths); its
/// fields land flat in `HostConfig`.
pub(super) struct Credentials {
    pub code_host_token_file: Option<PathBuf>,
    pub code_host_token_group: Option<(u32, String)>,
    pub agent_home: Option<(PathBuf, PathBuf)>,
    pub code_host_cli: Option<PathBuf>,
    pub guardian: Option<GuardianConfig>,
    pub refresh_poll: Duration,
    pub refresh_lead: Duration,
}

impl CredentialsFile {
    /// Check each key, reporting every error through `err`.
    pub(super) fn validate(self, err: &mut impl FnMut(&str, String)) -> Credentials {
        let (refresh_poll, refresh_lead) = self.refresh_timing(err);
        let guardian = self.guardian((refresh_poll, refresh_lead), err);
        if let Some(p) = &self.code_host_token_file {
            checks::check_absolute("credentials.code_host_token_file", p, err);
        }
        let code_host_token_group = self.code_host_token_group.and_then(|g| token_group(g, err));
        let agent_home = self
            .agent_home
            .map(|host| agent_home(host, self.agent_home_guest, err));
        Credentials {
            code_host_token_file: self.code_host_token_file,
            code_host_token_group,
            agent_home,
            code_host_cli: code_host_cli(self.code_host_cli),
            guardian,
            refresh_poll,
            refresh_lead,
        }
    }

    /// (poll, lead) of svcd's token refreshes.
    fn refresh_timing(&self, err: &mut impl FnMut(&str, String)) -> (Duration, Duration) {
        let poll = self
            .refresh_poll_secs
            .unwrap_or(defaults::REFRESH_POLL_SECS);
        if !(1..=3600).contains(&poll) {
            err(
                "credentials.refresh_poll_secs",
                format!("expected 1 to 3600 seconds, got {poll}"),
            );
        }
        let lead = self
            .refresh_lead_secs
            .unwrap_or(defaults::REFRESH_LEAD_SECS);
        if !(60..=86_400).contains(&lead) {
            err(
                "credentials.refresh_lead_secs",
                format!("expected 60 to 86400 seconds, got {lead}"),
            );
        }
        (Duration::from_secs(poll), Duration::from_secs(lead))
    }

    /// The credential guardian, when `agent_token_endpoint` is set.
    fn guardian(
        &self,
        (poll, lead): (Duration, Duration),
        err: &mut impl FnMut(&str, String),
    ) -> Option<GuardianConfig> {
        let entry = self
            .agent_credentials_entry
            .clone()
            .unwrap_or_else(|| DEFAULT_ENTRY.to_owned());
        if entry.is_empty() {
            err("credentials.agent_credentials_entry", "is empty".into());
        }
        let endpoint = self.agent_token_endpoint.clone()?;
        if let Err(e) = parse_token_endpoint(&endpoint) {
            err("credentials.agent_token_endpoint", e);
        }
        if self.agent_home.is_none() {
            err(
                "credentials.agent_token_endpoint",
                "the guardian keeps credentials.agent_home's token fresh: set agent_home too"
                    .into(),
            );
        }
        Some(GuardianConfig {
            token_endpoint: endpoint,
            client_id: self.agent_client_id.clone(),
            entry,
            poll,
            lead,
        })
    }
}

/// The group allowed the host's code-host token, as (gid, name), if it exists on this host.
fn token_group(g: String, err: &mut impl FnMut(&str, String)) -> Option<(u32, String)> {
    match nix::unistd::Group::from_name(&g) {
        Ok(Some(found)) => Some((found.gid.as_raw(), g)),
        _ => {
            err(
                "credentials.code_host_token_group",
                format!("no group {g:?} on this host (getent group {g})"),
            );
            None
        }
    }
}

/// The agent's home as (host directory, guest path): the guest path defaults to `/root/`
/// and the host directory's name; both absolute, without `..`.
fn agent_home(
    host: PathBuf,
    guest: Option<PathBuf>,
    err: &mut impl FnMut(&str, String),
) -> (PathBuf, PathBuf) {
    let guest = guest.unwrap_or_else(|| {
        Path::new("/root").join(host.file_name().unwrap_or(std::ffi::OsStr::new("agent")))
    });
    for (key, p) in [
        ("credentials.agent_home", &host),
        ("credentials.agent_home_guest", &guest),
    ] {
        if !p.is_absolute() || p.components().any(|c| c == std::path::Component::ParentDir) {
            err(
                key,
                format!(
                    "expected an absolute path without `..`, got {}",
                    p.display()
                ),
            );
        }
    }
    (host, guest)
}

/// The code-host CLI: `gh` unless set; `""` turns it off.
fn code_host_cli(value: Option<PathBuf>) -> Option<PathBuf> {
    match value {
        Some(p) if p.as_os_str().is_empty() => None,
        Some(p) => Some(p),
        None => Some(PathBuf::from(defaults::CODE_HOST_CLI)),
    }
}

/// Parse a token endpoint's URL: `https://HOST[:PORT]/PATH`.
pub fn parse_token_endpoint(s: &str) -> Result<http::Uri, String> {
    let u: http::Uri = s
        .parse()
        .map_err(|e| format!("token endpoint {s:?}: {e}"))?;
    if u.scheme_str() != Some("https") || u.host().is_none_or(str::is_empty) {
        return Err(format!(
            "token endpoint {s:?}: expected an https:// URL with a host"
        ));
    }
    Ok(u)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_endpoints_with_a_host_are_taken() {
        assert!(parse_token_endpoint("https://console.agent.test/v1/oauth/token").is_ok());
        for bad in [
            "http://console.agent.test/token",
            "https:///token",
            "console.agent.test",
            "",
        ] {
            assert!(parse_token_endpoint(bad).is_err(), "{bad:?}");
        }
    }
}
