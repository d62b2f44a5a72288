//! The per-request decision of the HTTPS proxy: one function, [`decide`].
//!
//! Order: authority binding (Host / `:authority` against the SNI), method, host allowlist,
//! target canonicalisation, placeholders, then the host's gate: agent host, code-host family
//! (SPEC 5.5), policy-gated (`egress.policy` / `egress.secrets`), or open.
//!
//! Built-in `--repo` policy (the bound repository, plus any `repos` listed for the host under
//! `egress.policy`): on the code host, git smart-HTTP for those repos; on the API host, GET and
//! HEAD under `/repos/<owner>/<repo>` and `POST /repos/<owner>/<repo>/pulls` (SPEC 5.5.9); on
//! the uploads host, `POST /repos/<owner>/<repo>/releases/<id>/assets`. For any repository:
//! GET and HEAD of archives and release downloads on the code host, with the placeholder
//! stripped. On the API host: `GET /` and the viewer-login GraphQL query. Everything else on
//! these hosts is 403 unless an `egress.policy` path pattern for the host allows it; the
//! refusals of SPEC 5.5.5 (other GraphQL, a non-GET/HEAD on an archive path, smart-HTTP on a
//! foreign repo) hold even then.
//!
//! A host listed only under `egress.secrets[].hosts` is policy-gated with every path allowed:
//! its gate is the credential broker (the placeholder is swapped there and nowhere else).

use serde::Serialize;

use super::{
    credentials::{
        self, CredentialFinding, CredentialKind, CredentialView, Placeholder, PlaceholderTable,
        Scheme,
    },
    graphql,
    host::{Allowlist, Authority, HostPattern},
    paths,
    target::{self, Target},
};
use crate::config::{
    egress::{EgressConfig, RepoName},
    host::CodeHostFamily,
};

/// Everything the decision needs to know about one sandbox.
#[derive(Debug, Clone)]
pub struct SandboxPolicy {
    /// The envelope's AllowedHosts (Curated: non-empty).
    pub allowed: Allowlist,
    pub agent_hosts: Allowlist,
    pub bound_repo: Option<RepoName>,
    pub code: CodeHostFamily,
    pub egress: EgressConfig,
    pub placeholders: PlaceholderTable,
    /// AllowedBranches for smart-HTTP pushes too (`policy::http_push`), when the sandbox
    /// asked for it; `None`: a push to the bound repository may update any ref (SPEC 5.5).
    pub https_push_branches: Option<Vec<String>>,
}

impl SandboxPolicy {
    /// The policy of a Curated sandbox, as svcd builds it at creation: the allowlist (see
    /// [`Self::allowed_hosts`]) and a fresh placeholder table. Every allowed host that is not an
    /// agent host and not in the code-host family gets its own placeholder; with a bound repo,
    /// the code host, its API and its uploads host share `CODE_HOST_TOKEN`; the first agent
    /// host gets `AGENT_AUTH_TOKEN`.
    pub fn for_sandbox(
        host: &crate::config::host::HostConfig,
        extra_hosts: &[HostPattern],
        bound_repo: Option<RepoName>,
        egress: EgressConfig,
    ) -> Result<Self, credentials::PlaceholderError> {
        let agent = Allowlist(host.agent_hosts.clone());
        let code = host.code.clone();
        let allowed =
            Self::allowed_hosts(&agent, extra_hosts, &code, bound_repo.is_some(), &egress);
        let family = [
            code.code_host.clone(),
            code.api_host.clone(),
            code.uploads_host.clone(),
        ];
        let own: Vec<HostPattern> = allowed
            .0
            .iter()
            .filter(|h| !agent.0.contains(h) && !family.contains(h))
            .cloned()
            .collect();
        let code_hosts: &[HostPattern] = if bound_repo.is_some() { &family } else { &[] };
        let placeholders = PlaceholderTable::mint(&own, code_hosts, agent.0.first())?;
        Ok(Self {
            allowed,
            agent_hosts: agent,
            bound_repo,
            code,
            egress,
            placeholders,
            https_push_branches: None,
        })
    }

    /// The allowlist of a Curated sandbox: the agent hosts, the extra hosts, the code-host
    /// family when a repo is bound, and every host `.svc/config.yaml` names.
    pub fn allowed_hosts(
        agent: &Allowlist,
        extra: &[HostPattern],
        code: &CodeHostFamily,
        bound: bool,
        egress: &EgressConfig,
    ) -> Allowlist {
        let mut all: Vec<HostPattern> = agent.0.clone();
        all.extend(extra.iter().cloned());
        if bound {
            all.extend([
                code.code_host.clone(),
                code.api_host.clone(),
                code.uploads_host.clone(),
                code.archive_host.clone(),
            ]);
        }
        all.extend(egress.allow.iter().cloned());
        all.extend(egress.policy.values().map(|p| p.host.clone()));
        all.extend(egress.secrets.iter().flat_map(|s| s.hosts.iter().cloned()));
        let mut seen = std::collections::HashSet::new();
        all.retain(|h| seen.insert(h.to_string()));
        Allowlist(all)
    }
}

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

/// Decide one request.
pub fn decide(policy: &SandboxPolicy, req: &HttpRequest<'_>) -> Decision {
    let mut d = Deciding {
        host: None,
        path: None,
    };

    // 0. Request shape: anything two HTTP parsers could frame or route differently.
    if let Some(why) = malformed(req.headers, req.head_had_both_lengths) {
        return d.deny(400, Rule::RequestMalformed, why.into());
    }

    // 1. Authority binding.
    let default_port = if req.scheme == Scheme::Https { 443 } else { 80 };
    let Some(raw_authority) = req.authority else {
        return d.deny(
            400,
            Rule::AuthorityMissing,
            "the request has no Host / :authority".into(),
        );
    };
    let authority = match Authority::parse(raw_authority, default_port) {
        Ok(a) => a,
        Err(e) => {
            return d.deny(
                400,
                Rule::AuthorityInvalid,
                format!("Host {raw_authority:?}: {e}"),
            );
        }
    };
    d.host = Some(authority.host_str());
    if let Some(sni) = req.sni {
        match Authority::parse(sni, default_port) {
            Ok(s) if s.host == authority.host => {}
            Ok(s) => {
                return d.deny(
                    421,
                    Rule::AuthorityMismatch,
                    format!(
                        "Host {} does not match the TLS server name {}",
                        authority.host_str(),
                        s.host_str()
                    ),
                );
            }
            Err(e) => {
                return d.deny(
                    421,
                    Rule::AuthorityMismatch,
                    format!("TLS server name {sni:?}: {e}"),
                );
            }
        }
    }

    if let Some(alt) = req.alt_authority {
        match Authority::parse(alt, default_port) {
            Ok(a) if a.host == authority.host => {}
            _ => {
                return d.deny(
                    421,
                    Rule::AuthorityMismatch,
                    format!("Host {alt:?} disagrees with :authority {raw_authority:?}"),
                );
            }
        }
    }

    // 2. Method.
    let method = req.method;
    if method.eq_ignore_ascii_case("TRACE")
        || method.eq_ignore_ascii_case("TRACK")
        || method.eq_ignore_ascii_case("CONNECT")
    {
        return d.deny(
            403,
            Rule::MethodRefused,
            format!("method {method} is never forwarded"),
        );
    }

    // 3. Host allowlist.
    if policy.allowed.find(&authority).is_none() {
        return d.deny(
            403,
            Rule::HostNotAllowed,
            format!("{} is not in this sandbox's allowlist", authority),
        );
    }

    // 4. Target.
    let target = match target::canonicalize(req.target) {
        Ok(t) => t,
        Err(e) => return d.deny(403, Rule::TargetInvalid, e.to_string()),
    };
    d.path = Some(target.path());

    // 5. Placeholders.
    let finding = credentials::examine(
        &policy.placeholders,
        &CredentialView {
            scheme: req.scheme,
            authority: &authority,
            target: req.target,
            headers: req.headers,
            body_prefix: req.body_prefix,
        },
    );
    let bearer = match finding {
        CredentialFinding::Leak(why) => {
            return d.deny(
                403,
                Rule::CredentialLeak,
                format!("credential leak attempt: {why}"),
            );
        }
        CredentialFinding::Bearer(p, kind) => Some((p, kind)),
        CredentialFinding::None => None,
    };
    let swap = || match &bearer {
        Some((p, kind)) => CredentialAction::Swap {
            placeholder: p.clone(),
            kind: *kind,
        },
        None => CredentialAction::Passthrough,
    };

    // 6. The host's gate.
    if policy.agent_hosts.find(&authority).is_some() {
        return d.allow(swap(), Rule::AgentHost, "agent host".into());
    }
    let code = &policy.code;
    let host_key = authority.host_str();
    let policy_entry = policy.egress.policy.get(&host_key);
    let in_family = [&code.code_host, &code.api_host, &code.uploads_host]
        .iter()
        .any(|h| h.matches(&authority));
    if in_family && (policy.bound_repo.is_some() || policy_entry.is_some()) {
        let mut repos: Vec<&RepoName> = policy.bound_repo.iter().collect();
        for e in policy.egress.policy.values() {
            if code.code_host.matches(&Authority {
                host: e.host.kind.clone(),
                port: authority.port,
            }) {
                repos.extend(e.repos.iter());
            }
        }
        return code_host(
            &mut d,
            policy,
            &authority,
            method,
            &target,
            req,
            &repos,
            swap(),
        );
    }
    if let Some(entry) = policy_entry {
        if entry.paths.iter().any(|p| paths::matches(p, &target)) {
            return d.allow(
                swap(),
                Rule::PolicyPath,
                format!("path allowed by egress.policy for {host_key}"),
            );
        }
        return d.deny(
            403,
            Rule::PolicyDefaultDeny,
            format!(
                "{} is not among the paths egress.policy allows for {host_key}",
                target.path()
            ),
        );
    }
    if policy
        .egress
        .secrets
        .iter()
        .any(|s| s.hosts.iter().any(|h| h.matches(&authority)))
    {
        return d.allow(swap(), Rule::SecretHost, "brokered-credential host".into());
    }
    d.allow(swap(), Rule::OpenHost, "open host".into())
}

/// Why a request's headers are refused, if they are: both Content-Length and
/// Transfer-Encoding, more than one Content-Length, more than one Host, or a header name or
/// value with a CR, LF or NUL (request smuggling, header injection).
fn malformed(headers: &[(&str, &[u8])], head_had_both_lengths: bool) -> Option<&'static str> {
    let count = |name: &str| {
        headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .count()
    };
    if head_had_both_lengths || (count("content-length") > 0 && count("transfer-encoding") > 0) {
        return Some("both Content-Length and Transfer-Encoding (request smuggling)");
    }
    if count("content-length") > 1 {
        return Some("more than one Content-Length (request smuggling)");
    }
    if count("host") > 1 {
        return Some("more than one Host header");
    }
    let bad = |b: u8| matches!(b, b'\r' | b'\n' | 0);
    if headers
        .iter()
        .any(|(n, v)| n.bytes().any(|b| bad(b) || b == b' ') || v.iter().any(|b| bad(*b)))
    {
        return Some("a header name or value holds CR, LF or NUL, or a name holds a space");
    }
    None
}

/// What a request's `Upgrade` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpgradeAsk {
    /// No protocol upgrade.
    None,
    /// An HTTP/1.1 WebSocket handshake: forwarded after the same checks as any request, then
    /// relayed both ways.
    WebSocket,
    /// Any other upgrade (`h2c`, TLS, …) or a malformed WebSocket handshake: refused (400).
    Refused(String),
}

/// Whether a request's protocol upgrade may pass: a WebSocket handshake (`GET`, HTTP/1.1,
/// `Upgrade: websocket`, `Connection: upgrade`) does; every other upgrade is refused, never
/// silently dropped.
pub fn upgrade(method: &str, http11: bool, headers: &[(&str, &[u8])]) -> UpgradeAsk {
    let values = |name: &str| -> Vec<String> {
        headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .flat_map(|(_, v)| {
                String::from_utf8_lossy(v)
                    .split(',')
                    .map(|t| t.trim().to_ascii_lowercase())
                    .collect::<Vec<_>>()
            })
            .filter(|t| !t.is_empty())
            .collect()
    };
    let upgrade = values("upgrade");
    if upgrade.is_empty() {
        return UpgradeAsk::None;
    }
    if upgrade != ["websocket"] {
        return UpgradeAsk::Refused(format!(
            "upgrade to {} is refused: only WebSocket upgrades pass the perimeter",
            upgrade.join(", ")
        ));
    }
    if !http11 || !method.eq_ignore_ascii_case("GET") {
        return UpgradeAsk::Refused("a WebSocket handshake is an HTTP/1.1 GET".into());
    }
    if !values("connection").iter().any(|t| t == "upgrade") {
        return UpgradeAsk::Refused("Upgrade: websocket without Connection: upgrade".into());
    }
    UpgradeAsk::WebSocket
}

#[allow(
    clippy::too_many_arguments,
    reason = "one call site; the parts are the decision's inputs"
)]
fn code_host(
    d: &mut Deciding,
    policy: &SandboxPolicy,
    authority: &Authority,
    method: &str,
    target: &Target,
    req: &HttpRequest<'_>,
    repos: &[&RepoName],
    swap: CredentialAction,
) -> Decision {
    let code = &policy.code;
    let parts = target.parts();
    let get_or_head = method == "GET" || method == "HEAD";
    let bound = |o: &str, r: &str| match RepoName::parse(&format!("{o}/{r}")) {
        Ok(name) => repos.iter().any(|b| **b == name),
        Err(_) => false,
    };
    let generic = |d: &mut Deciding, swap: CredentialAction| {
        let entry = policy.egress.policy.get(&authority.host_str());
        if entry.is_some_and(|e| e.paths.iter().any(|p| paths::matches(p, target))) {
            return d.allow(
                swap,
                Rule::PolicyPath,
                "path allowed by egress.policy".into(),
            );
        }
        d.deny(
            403,
            Rule::CodeHostDefaultDeny,
            format!("{method} {} is outside the code-host rules", target.path()),
        )
    };

    if code.code_host.matches(authority) {
        // git smart-HTTP.
        let smart = match parts.as_slice() {
            [o, r, "info", "refs"] if method == "GET" && !target.trailing_slash => {
                match target.query_value("service") {
                    Some("git-upload-pack" | "git-receive-pack") => Some((*o, *r)),
                    _ => None,
                }
            }
            [o, r, "git-upload-pack" | "git-receive-pack"]
                if method == "POST" && !target.trailing_slash =>
            {
                Some((*o, *r))
            }
            _ => None,
        };
        if let Some((o, r)) = smart {
            if bound(o, r)
                && let Some(branches) = &policy.https_push_branches
                && parts.last() == Some(&"git-receive-pack")
            {
                return push(d, branches, req, swap, o, r);
            }
            return if bound(o, r) {
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
        if is_archive {
            return if get_or_head {
                d.allow(
                    CredentialAction::Strip,
                    Rule::Archive,
                    "archive or release download (credential stripped)".into(),
                )
            } else {
                d.deny(
                    403,
                    Rule::ArchiveMethod,
                    format!("{method} on an archive path"),
                )
            };
        }
        return generic(d, swap);
    }

    if code.api_host.matches(authority) {
        match parts.as_slice() {
            [] if method == "GET" && target.query.is_none() => {
                return d.allow(swap, Rule::ApiRoot, "API root".into());
            }
            ["graphql"] if !target.trailing_slash => {
                if method != "POST" {
                    return d.deny(
                        403,
                        Rule::GraphqlRefused,
                        format!("{method} /graphql (only POST with the viewer-login query)"),
                    );
                }
                let encoded = req.headers.iter().any(|(n, v)| {
                    n.eq_ignore_ascii_case("content-encoding")
                        && !v.eq_ignore_ascii_case(b"identity")
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
                return match graphql::check_viewer_login(req.body_prefix) {
                    Ok(()) => d.allow(swap, Rule::GraphqlViewer, "the viewer-login query".into()),
                    Err(why) => d.deny(403, Rule::GraphqlRefused, why),
                };
            }
            ["repos", o, r, ..] if get_or_head && bound(o, r) => {
                return d.allow(
                    swap,
                    Rule::RestBoundRepo,
                    format!("read of the bound repository {o}/{r}"),
                );
            }
            ["repos", o, r, "pulls"]
                if method == "POST" && !target.trailing_slash && bound(o, r) =>
            {
                return d.allow(
                    swap,
                    Rule::RestBoundRepo,
                    format!("pull request on the bound repository {o}/{r}"),
                );
            }
            _ => return generic(d, swap),
        }
    }

    // Uploads host.
    match parts.as_slice() {
        ["repos", o, r, "releases", _, "assets"] if method == "POST" && bound(o, r) => d.allow(
            swap,
            Rule::UploadsBoundRepo,
            format!("release asset upload to {o}/{r}"),
        ),
        _ => generic(d, swap),
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

struct Deciding {
    host: Option<String>,
    path: Option<String>,
}

impl Deciding {
    fn allow(&mut self, credential: CredentialAction, rule: Rule, reason: String) -> Decision {
        Decision {
            outcome: Outcome::Allow { credential },
            rule,
            reason,
            host: self.host.take(),
            path: self.path.take(),
            push: None,
        }
    }
    fn deny(&mut self, status: u16, rule: Rule, reason: String) -> Decision {
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
