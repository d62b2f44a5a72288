//! What `request::decide` reads and answers: one request as the proxy saw it, the
//! decision (outcome, rule, reason) and the credential action of an allowed request.

use serde::Serialize;

use super::credentials::{CredentialKind, Placeholder, Scheme};

/// One HTTP request as the proxy saw it.
#[derive(Debug, Clone, Copy)]
pub struct HttpRequest<'a> {
    pub scheme: Scheme,
    pub method: &'a str,
    /// The raw request target.
    pub target: &'a str,
    /// `Host` (HTTP/1.1) or `:authority` (HTTP/2).
    pub authority: Option<&'a str>,
    /// The TLS SNI the connection was opened for (`None` on plain HTTP).
    pub sni: Option<&'a str>,
    /// A second statement of the authority, which must agree with `authority`: an HTTP/2
    /// request's `Host` header beside `:authority`.
    pub alt_authority: Option<&'a str>,
    pub headers: &'a [(&'a str, &'a [u8])],
    /// The start of the body (the whole body when `body_complete`).
    pub body_prefix: &'a [u8],
    pub body_complete: bool,
    /// The request head as it arrived carried both Content-Length and Transfer-Encoding
    /// (an HTTP/1.1 parser drops one of them before `headers` are seen; the proxy's framing
    /// witness saw the raw head).
    pub head_had_both_lengths: bool,
    /// The port the guest's connection was dialled to (`SO_ORIGINAL_DST`), where the proxy
    /// sends the request: the authority's port (or its scheme's default) must be it. `None`
    /// when no connection was dialled (`svc egress explain`).
    pub dialled_port: Option<u16>,
}

/// What the proxy does with an allowed request's credential.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "action")]
pub enum CredentialAction {
    /// Forward as is (no placeholder present).
    Passthrough,
    /// Replace `Authorization: Bearer <placeholder>` with the real bearer of this kind.
    Swap {
        #[serde(skip)]
        placeholder: Placeholder,
        kind: CredentialKind,
    },
    /// Remove the `Authorization` header (archive downloads).
    Strip,
}

/// Allow (with a credential action) or refuse (with an HTTP status).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "verdict")]
pub enum Outcome {
    Allow { credential: CredentialAction },
    Deny { status: u16 },
}

/// Every rule that can decide, for audit records and 403 bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    RequestMalformed,
    AuthorityMissing,
    AuthorityInvalid,
    AuthorityMismatch,
    MethodRefused,
    HostNotAllowed,
    TargetInvalid,
    CredentialLeak,
    AgentHost,
    OpenHost,
    PolicyPath,
    PolicyDefaultDeny,
    SecretHost,
    SmartHttp,
    SmartHttpForeignRepo,
    /// A smart-HTTP push updates a ref outside AllowedBranches, or its command list could not
    /// be read as git reads it (`policy::http_push`).
    SmartHttpPushRefused,
    Archive,
    ArchiveMethod,
    ApiRoot,
    GraphqlViewer,
    GraphqlRefused,
    RestBoundRepo,
    UploadsBoundRepo,
    CodeHostDefaultDeny,
}

impl Rule {
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    }
}

/// The decision on one request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Decision {
    #[serde(flatten)]
    pub outcome: Outcome,
    pub rule: Rule,
    pub reason: String,
    /// The normalised host, when it could be read.
    pub host: Option<String>,
    /// The canonical path (no query), when it could be read.
    pub path: Option<String>,
    /// A smart-HTTP push's command list, when AllowedBranches were checked on it: every ref
    /// it updates (for the audit) and the client's capabilities (for the refusal's form).
    #[serde(skip)]
    pub push: Option<super::receive_pack::PushCommands>,
}

impl Decision {
    pub fn allowed(&self) -> bool {
        matches!(self.outcome, Outcome::Allow { .. })
    }
    pub fn status(&self) -> Option<u16> {
        match self.outcome {
            Outcome::Deny { status } => Some(status),
            Outcome::Allow { .. } => None,
        }
    }
}

/// A decision being made: the host and path read so far, which every decision carries.
#[derive(Debug, Default)]
pub(super) struct Deciding {
    pub(super) host: Option<String>,
    pub(super) path: Option<String>,
}

impl Deciding {
    pub(super) fn allow(
        &mut self,
        credential: CredentialAction,
        rule: Rule,
        reason: String,
    ) -> Decision {
        Decision {
            outcome: Outcome::Allow { credential },
            rule,
            reason,
            host: self.host.take(),
            path: self.path.take(),
            push: None,
        }
    }
    pub(super) fn deny(&mut self, status: u16, rule: Rule, reason: String) -> Decision {
        Decision {
            outcome: Outcome::Deny { status },
            rule,
            reason,
            host: self.host.take(),
            path: self.path.take(),
            push: None,
        }
    }
}
