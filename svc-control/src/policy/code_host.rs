//! The code-host family's rules: git smart-HTTP and archives on the code host, the
//! API host's root, viewer-login GraphQL and bound-repository REST, release-asset uploads; an
//! `egress.policy` path pattern for the host allows the rest, else 403.

use super::{
    decision::{CredentialAction, Deciding, Decision, HttpRequest, Rule},
    graphql, paths,
    sandbox_policy::SandboxPolicy,
    target::Target,
};
use crate::config::egress::RepoName;
use crate::hosts::Authority;

/// One request to a host of the code-host family, with what the decision read of it so far.
pub(super) struct CodeHostAsk<'a> {
    pub(super) policy: &'a SandboxPolicy,
    pub(super) authority: &'a Authority,
    pub(super) method: &'a str,
    pub(super) target: &'a Target,
    pub(super) req: &'a HttpRequest<'a>,
    /// The repositories served: the bound one and those `egress.policy` lists.
    pub(super) repos: &'a [&'a RepoName],
}

impl CodeHostAsk<'_> {
    /// The decision on a code-host, API-host or uploads-host request.
    pub(super) fn decide(&self, d: &mut Deciding, swap: CredentialAction) -> Decision {
        let code = &self.policy.code;
        if code.code_host.matches(self.authority) {
            return self.code_host(d, swap);
        }
        if code.api_host.matches(self.authority) {
            return self.api_host(d, swap);
        }
        self.uploads_host(d, swap)
    }

    /// Whether `o/r` is one of the repositories served.
    fn bound(&self, o: &str, r: &str) -> bool {
        match RepoName::parse(&format!("{o}/{r}")) {
            Ok(name) => self.repos.iter().any(|b| **b == name),
            Err(_) => false,
        }
    }

    fn get_or_head(&self) -> bool {
        self.method == "GET" || self.method == "HEAD"
    }

    /// What no code-host rule decided: an `egress.policy` path for the host, else 403.
    fn generic(&self, d: &mut Deciding, swap: CredentialAction) -> Decision {
        let entry = self.policy.egress.policy.get(&self.authority.host_str());
        if entry.is_some_and(|e| e.paths.iter().any(|p| paths::matches(p, self.target))) {
            return d.allow(
                swap,
                Rule::PolicyPath,
                "path allowed by egress.policy".into(),
            );
        }
        d.deny(
            403,
            Rule::CodeHostDefaultDeny,
            format!(
                "{} {} is outside the code-host rules",
                self.method,
                self.target.path()
            ),
        )
    }

    /// The code host: git smart-HTTP on the repositories served, archives and release
    /// downloads for any repository (GET and HEAD, credential stripped).
    fn code_host(&self, d: &mut Deciding, swap: CredentialAction) -> Decision {
        let parts = self.target.parts();
        if let Some((o, r)) = self.smart_http(&parts) {
            if self.bound(o, r)
                && let Some(branches) = &self.policy.https_push_branches
                && parts.last() == Some(&"git-receive-pack")
            {
                return push(d, branches, self.req, swap, o, r);
            }
            return if self.bound(o, r) {
                d.allow(
                    swap,
                    Rule::SmartHttp,
                    format!("git smart-HTTP on the bound repository {o}/{r}"),
                )
            } else {
                d.deny(
                    403,
                    Rule::SmartHttpForeignRepo,
                    format!("git smart-HTTP on {o}/{r}, which is not the sandbox's repository"),
                )
            };
        }
        let is_archive = matches!(
            parts.as_slice(),
            [_, _, "archive", _, ..] | [_, _, "releases", "download", _, ..]
        );
        if !is_archive {
            return self.generic(d, swap);
        }
        if self.get_or_head() {
            d.allow(
                CredentialAction::Strip,
                Rule::Archive,
                "archive or release download (credential stripped)".into(),
            )
        } else {
            d.deny(
                403,
                Rule::ArchiveMethod,
                format!("{} on an archive path", self.method),
            )
        }
    }

    /// The repository (owner, name) of a git smart-HTTP request, if it is one.
    fn smart_http<'p>(&self, parts: &[&'p str]) -> Option<(&'p str, &'p str)> {
        let method = self.method;
        match parts {
            [o, r, "info", "refs"] if method == "GET" && !self.target.trailing_slash => {
                match self.target.query_value("service") {
                    Some("git-upload-pack" | "git-receive-pack") => Some((*o, *r)),
                    _ => None,
                }
            }
            [o, r, "git-upload-pack" | "git-receive-pack"]
                if method == "POST" && !self.target.trailing_slash =>
            {
                Some((*o, *r))
            }
            _ => None,
        }
    }

    /// The API host: its root, the viewer-login GraphQL query, reads of and pull requests on
    /// the repositories served.
    fn api_host(&self, d: &mut Deciding, swap: CredentialAction) -> Decision {
        let (method, target) = (self.method, self.target);
        match self.target.parts().as_slice() {
            [] if method == "GET" && target.query.is_none() => {
                d.allow(swap, Rule::ApiRoot, "API root".into())
            }
            ["graphql"] if !target.trailing_slash => self.graphql(d, swap),
            ["repos", o, r, ..] if self.get_or_head() && self.bound(o, r) => d.allow(
                swap,
                Rule::RestBoundRepo,
                format!("read of the bound repository {o}/{r}"),
            ),
            ["repos", o, r, "pulls"]
                if method == "POST" && !target.trailing_slash && self.bound(o, r) =>
            {
                d.allow(
                    swap,
                    Rule::RestBoundRepo,
                    format!("pull request on the bound repository {o}/{r}"),
                )
            }
            _ => self.generic(d, swap),
        }
    }

    /// `/graphql` on the API host: only a POST of the viewer-login query, read whole and
    /// uncompressed.
    fn graphql(&self, d: &mut Deciding, swap: CredentialAction) -> Decision {
        let req = self.req;
        if self.method != "POST" {
            return d.deny(
                403,
                Rule::GraphqlRefused,
                format!(
                    "{} /graphql (only POST with the viewer-login query)",
                    self.method
                ),
            );
        }
        let encoded = req.headers.iter().any(|(n, v)| {
            n.eq_ignore_ascii_case("content-encoding") && !v.eq_ignore_ascii_case(b"identity")
        });
        if encoded {
            return d.deny(
                403,
                Rule::GraphqlRefused,
                "compressed GraphQL bodies are not inspected, so not allowed".into(),
            );
        }
        if !req.body_complete {
            return d.deny(
                403,
                Rule::GraphqlRefused,
                format!("GraphQL body larger than {} bytes", graphql::MAX_BODY_BYTES),
            );
        }
        match graphql::check_viewer_login(req.body_prefix) {
            Ok(()) => d.allow(swap, Rule::GraphqlViewer, "the viewer-login query".into()),
            Err(why) => d.deny(403, Rule::GraphqlRefused, why),
        }
    }

    /// The uploads host: release-asset uploads to the repositories served.
    fn uploads_host(&self, d: &mut Deciding, swap: CredentialAction) -> Decision {
        match self.target.parts().as_slice() {
            ["repos", o, r, "releases", _, "assets"]
                if self.method == "POST" && self.bound(o, r) =>
            {
                d.allow(
                    swap,
                    Rule::UploadsBoundRepo,
                    format!("release asset upload to {o}/{r}"),
                )
            }
            _ => self.generic(d, swap),
        }
    }
}

/// A push to the bound repository over smart-HTTP, held to AllowedBranches.
fn push(
    d: &mut Deciding,
    branches: &[String],
    req: &HttpRequest<'_>,
    swap: CredentialAction,
    o: &str,
    r: &str,
) -> Decision {
    use super::http_push::{PushVerdict, check};
    let (mut decision, commands) =
        match check(branches, req.headers, req.body_prefix, req.body_complete) {
            PushVerdict::Allowed(c) => (
                d.allow(
                    swap,
                    Rule::SmartHttp,
                    format!("git push to the bound repository {o}/{r}, every ref allowed"),
                ),
                Some(c),
            ),
            PushVerdict::Refused { line, commands } => {
                (d.deny(403, Rule::SmartHttpPushRefused, line), commands)
            }
        };
    decision.push = commands;
    decision
}
