//! A sandbox policy fixture shared by the policy tables: the default code-host family
//! (github.com, api.github.com, uploads.github.com, codeload.github.com), bound repo
//! `acme/widget`, an egress config with a generic policy-gated host and a brokered secret.
#![allow(
    dead_code,
    reason = "each test file uses a different part of the fixture"
)]

use std::path::Path;

use svc_control::{
    config::{egress, host::HostConfig},
    hosts::HostPattern,
    policy::{
        credentials::Scheme,
        request::{self, Decision, HttpRequest, SandboxPolicy},
    },
};

pub const CONFIG_YAML: &str = "egress:
  allow: [open.example.com, codeload.github.com]
  policy:
    api.example.com:
      paths: [\"/v1/models\", \"/v1/chat/**\", \"/v2/*/items\", \"/files/*.txt\"]
    git.internal.example:
      repos: [team/tool]
  secrets:
    - name: BROKER_TOKEN
      hosts: [broker.example.com]
";

pub struct Fixture {
    pub policy: SandboxPolicy,
}

pub fn hp(s: &str) -> HostPattern {
    HostPattern::parse(s).unwrap()
}

impl Fixture {
    pub fn new() -> Self {
        Self::with(Some("acme/widget"), CONFIG_YAML)
    }

    pub fn with(bound: Option<&str>, config_yaml: &str) -> Self {
        let egress = egress::parse(Path::new("config.yaml"), config_yaml).unwrap();
        let extra = [hp("extra.example.com"), hp("*.cdn.example.net")];
        let bound_repo = bound.map(|b| egress::RepoName::parse(b).unwrap());
        let policy =
            SandboxPolicy::for_sandbox(&HostConfig::default(), &extra, bound_repo, egress).unwrap();
        Self { policy }
    }

    /// The placeholder of a kind/host, as the guest would send it.
    pub fn placeholder_for(&self, host: &str) -> String {
        let a = svc_control::hosts::Authority::parse(host, 443).unwrap();
        self.policy
            .placeholders
            .entries()
            .iter()
            .find(|e| e.hosts.iter().any(|h| h.matches(&a)))
            .map(|e| e.placeholder.expose().to_owned())
            .unwrap_or_else(|| panic!("no placeholder for {host}"))
    }

    pub fn code_token(&self) -> String {
        self.placeholder_for("api.github.com")
    }

    pub fn decide(&self, r: &Req) -> Decision {
        let headers: Vec<(&str, &[u8])> = r
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_bytes()))
            .collect();
        request::decide(
            &self.policy,
            &HttpRequest {
                scheme: r.scheme,
                method: &r.method,
                target: &r.target,
                authority: r.authority.as_deref(),
                sni: r.sni.as_deref(),
                alt_authority: None,
                headers: &headers,
                body_prefix: r.body.as_bytes(),
                body_complete: r.body_complete,
                head_had_both_lengths: r.head_had_both_lengths,
                dialled_port: r.dialled_port,
            },
        )
    }
}

/// A request under test, built with a small fluent API.
#[derive(Clone)]
pub struct Req {
    pub scheme: Scheme,
    pub method: String,
    pub target: String,
    pub authority: Option<String>,
    pub sni: Option<String>,
    pub headers: Vec<(String, String)>,
    pub body: String,
    pub body_complete: bool,
    /// The raw head carried both lengths (the HTTP parser kept only Transfer-Encoding).
    pub head_had_both_lengths: bool,
    /// The port the connection was dialled to (`None`: not checked).
    pub dialled_port: Option<u16>,
}

pub fn req(method: &str, host: &str, target: &str) -> Req {
    Req {
        scheme: Scheme::Https,
        method: method.to_owned(),
        target: target.to_owned(),
        authority: Some(host.to_owned()),
        sni: Some(host.to_owned()),
        headers: Vec::new(),
        body: String::new(),
        body_complete: true,
        head_had_both_lengths: false,
        dialled_port: None,
    }
}

impl Req {
    pub fn dialled_port(mut self, port: u16) -> Self {
        self.dialled_port = Some(port);
        self
    }

    pub fn both_lengths_in_head(mut self) -> Self {
        self.head_had_both_lengths = true;
        self
    }

    pub fn header(mut self, n: &str, v: &str) -> Self {
        self.headers.push((n.to_owned(), v.to_owned()));
        self
    }
    pub fn bearer(self, token: &str) -> Self {
        self.header("Authorization", &format!("Bearer {token}"))
    }
    pub fn body(mut self, b: &str) -> Self {
        self.body = b.to_owned();
        self
    }
    pub fn sni(mut self, s: Option<&str>) -> Self {
        self.sni = s.map(str::to_owned);
        self
    }
    pub fn authority(mut self, a: Option<&str>) -> Self {
        self.authority = a.map(str::to_owned);
        self
    }
    pub fn plain_http(mut self) -> Self {
        self.scheme = Scheme::Http;
        self.sni = None;
        self
    }
    pub fn incomplete(mut self) -> Self {
        self.body_complete = false;
        self
    }
}

/// Expected result of a case: allowed with an action, or a status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    Pass,
    Swap,
    Strip,
    Deny(u16),
}

pub fn check(f: &Fixture, cases: &[(&str, Req, Want, &str)]) {
    use svc_control::policy::request::{CredentialAction, Outcome};
    let mut failures = Vec::new();
    for (name, r, want, rule) in cases {
        let d = f.decide(r);
        let got = match &d.outcome {
            Outcome::Allow {
                credential: CredentialAction::Passthrough,
            } => Want::Pass,
            Outcome::Allow {
                credential: CredentialAction::Swap { .. },
            } => Want::Swap,
            Outcome::Allow {
                credential: CredentialAction::Strip,
            } => Want::Strip,
            Outcome::Deny { status } => Want::Deny(*status),
        };
        if got != *want || d.rule.name() != *rule {
            failures.push(format!(
                "{name}: want {want:?} by {rule}, got {got:?} by {} ({})",
                d.rule.name(),
                d.reason
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
