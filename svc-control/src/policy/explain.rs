//! `svc egress explain`: one request as a person writes it (method, URL, headers, body, with
//! `{placeholder:HOST}` for the sandbox's placeholders), decided by [`request::decide`] — the
//! proxy's own function — against a sandbox's policy: one described offline by the CLI, or a
//! running sandbox's as svcd holds it now (`POST /v1/sandboxes/{name}/explain`).

use serde::{Deserialize, Serialize};

use crate::hosts::Authority;

use super::{
    credentials::{CredentialKind, Scheme},
    mode::{EgressMode, mode_for},
    request::{self, CredentialAction, Decision, HttpRequest, Outcome, SandboxPolicy},
};

/// One request to explain, as the guest would send it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExplainRequest {
    /// The HTTP method, e.g. `GET`.
    pub method: String,
    /// `http(s)://authority/target`; `{placeholder:WHICH}` is replaced.
    pub url: String,
    /// `Name: value` headers; `{placeholder:WHICH}` in a value is replaced.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<String>,
    /// Send `Authorization: Bearer <placeholder>` with the placeholder of this host (or
    /// `code-host`, `agent`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer: Option<String>,
    /// The whole body; `{placeholder:WHICH}` is replaced.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub body: String,
    /// The TLS server name (default: the URL's authority on https).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
}

/// Why a request cannot be explained (it is malformed as written, not refused).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExplainError {
    #[error("URL {0:?} has no scheme (https://…)")]
    NoScheme(String),
    #[error("URL scheme {0:?} is not http or https")]
    Scheme(String),
    #[error("URL {0:?} has no host")]
    NoHost(String),
    #[error("header {0:?} is not `Name: value`")]
    Header(String),
    #[error("unterminated {{placeholder:…}}")]
    Unterminated,
    #[error("placeholder host {0:?} is not a host name")]
    PlaceholderHost(String),
    #[error("the sandbox has no placeholder for {0:?}")]
    NoPlaceholder(String),
}

/// The decision on `req` against `policy`: the proxy's [`request::decide`] on the request
/// with the sandbox's placeholders written in.
pub fn explain(policy: &SandboxPolicy, req: &ExplainRequest) -> Result<Decision, ExplainError> {
    let (scheme, authority, target) = split_url(&substitute(policy, &req.url)?)?;
    let mut headers: Vec<(String, Vec<u8>)> = Vec::new();
    for h in &req.headers {
        let (n, v) = h
            .split_once(':')
            .ok_or_else(|| ExplainError::Header(h.clone()))?;
        headers.push((
            n.trim().to_owned(),
            substitute(policy, v.trim())?.into_bytes(),
        ));
    }
    if let Some(b) = &req.bearer {
        headers.push((
            "Authorization".into(),
            format!("Bearer {}", placeholder_of(policy, b)?).into_bytes(),
        ));
    }
    let body = substitute(policy, &req.body)?.into_bytes();
    let header_refs: Vec<(&str, &[u8])> = headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_slice()))
        .collect();
    let sni = req
        .sni
        .clone()
        .or_else(|| (scheme == Scheme::Https).then(|| authority.clone()));
    Ok(request::decide(
        policy,
        &HttpRequest {
            scheme,
            method: &req.method,
            target: &target,
            authority: Some(&authority),
            sni: sni.as_deref(),
            alt_authority: None,
            headers: &header_refs,
            body_prefix: &body,
            body_complete: true,
            head_had_both_lengths: false,
            // The URL's own port is the one a guest would dial.
            dialled_port: None,
        },
    ))
}

/// What `svc egress explain` answers: the decision and the sandbox it was made against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explained {
    pub decision: Verdict,
    pub sandbox: Described,
}

/// A decision as it is shown (the JSON of [`Decision`], readable back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// `allow` or `deny`.
    pub verdict: String,
    /// An allowed request's credential action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<CredentialShown>,
    /// A refused request's HTTP status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// The rule that decided (`allow-all` when no proxy decides: an AllowAll sandbox).
    pub rule: String,
    pub reason: String,
    pub host: Option<String>,
    pub path: Option<String>,
}

/// What the proxy does with an allowed request's credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialShown {
    /// `passthrough`, `swap` or `strip`.
    pub action: String,
    /// The credential kind swapped in (`swap` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        self.verdict == "allow"
    }
}

impl From<&Decision> for Verdict {
    fn from(d: &Decision) -> Self {
        let (verdict, credential, status) = match &d.outcome {
            Outcome::Allow { credential } => {
                let (action, kind) = match credential {
                    CredentialAction::Passthrough => ("passthrough", None),
                    CredentialAction::Swap { kind, .. } => ("swap", Some(kind.name().to_owned())),
                    CredentialAction::Strip => ("strip", None),
                };
                let shown = CredentialShown {
                    action: action.to_owned(),
                    kind,
                };
                ("allow", Some(shown), None)
            }
            Outcome::Deny { status } => ("deny", None, Some(*status)),
        };
        Self {
            verdict: verdict.to_owned(),
            credential,
            status,
            rule: d.rule.name(),
            reason: d.reason.clone(),
            host: d.host.clone(),
            path: d.path.clone(),
        }
    }
}

/// The sandbox a decision was made against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Described {
    /// `curated` or `allow-all`.
    pub mode: String,
    pub allowed_hosts: Vec<String>,
    pub repo: Option<String>,
    /// A running sandbox's name (absent offline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A running sandbox's allowlist generation: how many live changes it has had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_generation: Option<u32>,
    /// When a running AllowAll sandbox's window ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ends: Option<String>,
}

impl Described {
    /// `policy` as it is shown; its mode is the one its allowlist implies.
    pub fn of(policy: &SandboxPolicy) -> Self {
        Self {
            mode: mode_name(mode_for(policy.allowed.is_empty())).to_owned(),
            allowed_hosts: policy.allowed.0.iter().map(ToString::to_string).collect(),
            repo: policy.bound_repo.as_ref().map(|r| r.as_str().to_owned()),
            name: None,
            policy_generation: None,
            window_ends: None,
        }
    }

    pub fn is_curated(&self) -> bool {
        self.mode == mode_name(EgressMode::Curated)
    }
}

/// A mode as it is written (`curated`, `allow-all`).
pub fn mode_name(mode: EgressMode) -> &'static str {
    match mode {
        EgressMode::Curated => "curated",
        EgressMode::AllowAll => "allow-all",
    }
}

/// The answer for a sandbox whose link is AllowAll: no proxy decides; every host is open
/// except the refused destination classes.
pub fn allow_all(window_ends: Option<&str>) -> Verdict {
    let until = window_ends.map_or_else(String::new, |w| format!(" until {w}"));
    Verdict {
        verdict: "allow".into(),
        credential: Some(CredentialShown {
            action: "passthrough".into(),
            kind: None,
        }),
        status: None,
        rule: "allow-all".into(),
        reason: format!(
            "the sandbox is allow-all{until}: no proxy, no credentials, every host except the \
             refused destination classes (host, link-local, metadata, other sandboxes)"
        ),
        host: None,
        path: None,
    }
}

/// `scheme://authority/target` → (scheme, authority, origin-form target).
fn split_url(url: &str) -> Result<(Scheme, String, String), ExplainError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| ExplainError::NoScheme(url.to_owned()))?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "https" => Scheme::Https,
        "http" => Scheme::Http,
        other => return Err(ExplainError::Scheme(other.to_owned())),
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, target) = rest.split_at(end);
    if authority.is_empty() {
        return Err(ExplainError::NoHost(url.to_owned()));
    }
    let target = match target {
        "" => "/".to_owned(),
        t if t.starts_with('?') => format!("/{t}"),
        t => t.to_owned(),
    };
    Ok((scheme, authority.to_owned(), target))
}

/// The placeholder of `which`: a host, `code-host` or `agent`.
fn placeholder_of(policy: &SandboxPolicy, which: &str) -> Result<String, ExplainError> {
    let entries = policy.placeholders.entries();
    let found = match which {
        "code-host" => entries.iter().find(|e| e.kind == CredentialKind::CodeHost),
        "agent" => entries.iter().find(|e| e.kind == CredentialKind::AgentApi),
        host => {
            let a = Authority::parse(host, 443)
                .map_err(|_| ExplainError::PlaceholderHost(host.to_owned()))?;
            entries
                .iter()
                .find(|e| e.kind == CredentialKind::Host && e.hosts.iter().any(|h| h.matches(&a)))
        }
    };
    found
        .map(|e| e.placeholder.expose().to_owned())
        .ok_or_else(|| ExplainError::NoPlaceholder(which.to_owned()))
}

/// Replace every `{placeholder:WHICH}` in `s`.
fn substitute(policy: &SandboxPolicy, s: &str) -> Result<String, ExplainError> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("{placeholder:") {
        out.push_str(&rest[..i]);
        let after = &rest[i + "{placeholder:".len()..];
        let end = after.find('}').ok_or(ExplainError::Unterminated)?;
        out.push_str(&placeholder_of(policy, &after[..end])?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::host::HostConfig, hosts::HostPattern};

    fn policy(hosts: &[&str]) -> SandboxPolicy {
        let extra: Vec<HostPattern> = hosts
            .iter()
            .map(|h| HostPattern::parse(h).expect("a host"))
            .collect();
        SandboxPolicy::for_sandbox(&HostConfig::default(), &extra, None, Default::default())
            .expect("a policy")
    }

    #[test]
    fn an_allowed_host_is_allowed_and_another_refused_by_the_allowlist() {
        let p = policy(&["api.example.org"]);
        let ask = |url: &str| {
            let req = ExplainRequest {
                method: "GET".into(),
                url: url.into(),
                ..ExplainRequest::default()
            };
            Verdict::from(&explain(&p, &req).expect("explained"))
        };
        let ok = ask("https://api.example.org/v1");
        assert!(ok.allowed(), "{ok:?}");
        let no = ask("https://elsewhere.example.org/");
        assert_eq!(
            (no.verdict.as_str(), no.status, no.rule.as_str()),
            ("deny", Some(403), "host-not-allowed")
        );
    }

    #[test]
    fn the_verdict_is_the_decisions_json() {
        let p = policy(&["api.example.org"]);
        let req = ExplainRequest {
            method: "GET".into(),
            url: "https://api.example.org/".into(),
            bearer: Some("api.example.org".into()),
            ..ExplainRequest::default()
        };
        let d = explain(&p, &req).expect("explained");
        assert_eq!(
            serde_json::to_value(Verdict::from(&d)).expect("json"),
            serde_json::to_value(&d).expect("json")
        );
    }

    #[test]
    fn a_malformed_request_names_what_is_wrong() {
        let p = policy(&[]);
        let cases = [
            (
                "example.org/",
                ExplainError::NoScheme("example.org/".into()),
            ),
            ("ftp://example.org/", ExplainError::Scheme("ftp".into())),
            ("https:///x", ExplainError::NoHost("https:///x".into())),
            (
                "https://example.org/{placeholder:nowhere.example",
                ExplainError::Unterminated,
            ),
            (
                "https://example.org/{placeholder:nowhere.example}",
                ExplainError::NoPlaceholder("nowhere.example".into()),
            ),
        ];
        for (url, want) in cases {
            let req = ExplainRequest {
                method: "GET".into(),
                url: url.into(),
                ..ExplainRequest::default()
            };
            assert_eq!(explain(&p, &req), Err(want), "{url}");
        }
    }
}
