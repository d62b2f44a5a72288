//! The per-request decision of the HTTPS proxy: one function, [`decide`].
//!
//! Order: authority binding (Host / `:authority` against the SNI), method, host allowlist,
//! target canonicalisation, placeholders, then the host's gate: agent host, code-host family
//!, policy-gated (`egress.policy` / `egress.secrets`), or open.
//!
//! Built-in `--repo` policy (the bound repository, plus any `repos` listed for the host under
//! `egress.policy`): on the code host, git smart-HTTP for those repos; on the API host, GET and
//! HEAD under `/repos/<owner>/<repo>` and `POST /repos/<owner>/<repo>/pulls`; on
//! the uploads host, `POST /repos/<owner>/<repo>/releases/<id>/assets`. For any repository:
//! GET and HEAD of archives and release downloads on the code host, with the placeholder
//! stripped. On the API host: `GET /` and the viewer-login GraphQL query. Everything else on
//! these hosts is 403 unless an `egress.policy` path pattern for the host allows it; these
//! refusals (other GraphQL, a non-GET/HEAD on an archive path, smart-HTTP on a
//! foreign repo) hold even then.
//!
//! A host listed only under `egress.secrets[].hosts` is policy-gated with every path allowed:
//! its gate is the credential broker (the placeholder is swapped there and nowhere else).

use std::ops::ControlFlow::{self, Break, Continue};

use super::{
    code_host::CodeHostAsk,
    credentials::{self, CredentialFinding, CredentialView, Scheme},
    decision::Deciding,
    paths,
    target::{self, Target},
};
pub use super::{
    decision::{CredentialAction, Decision, HttpRequest, Outcome, Rule},
    sandbox_policy::SandboxPolicy,
    upgrade::{UpgradeAsk, upgrade},
};
use crate::{config::egress::RepoName, hosts::Authority};

/// One step of the decision: on to the next with what it read, or the decision made.
type Step<T> = ControlFlow<Decision, T>;

/// Decide one request.
pub fn decide(policy: &SandboxPolicy, req: &HttpRequest<'_>) -> Decision {
    let mut d = Deciding::default();
    match steps(policy, req, &mut d) {
        Continue(decision) | Break(decision) => decision,
    }
}

/// The steps in their order (see the module's doc); the first to decide ends it.
fn steps(policy: &SandboxPolicy, req: &HttpRequest<'_>, d: &mut Deciding) -> Step<Decision> {
    // 0. Request shape: anything two HTTP parsers could frame or route differently.
    if let Some(why) = malformed(req.headers, req.head_had_both_lengths) {
        return Break(d.deny(400, Rule::RequestMalformed, why.into()));
    }
    // Read once here: a refusal of the authority's binding is recorded with its path too.
    let target = target::canonicalize(req.target);
    d.path = target.as_ref().ok().map(Target::path);
    let authority = bind_authority(req, d)?;
    method(req.method, d)?;
    // 3. Host allowlist.
    if policy.allowed.find(&authority).is_none() {
        return Break(d.deny(
            403,
            Rule::HostNotAllowed,
            format!("{} is not in this sandbox's allowlist", authority),
        ));
    }
    // 4. Target.
    let target = match target {
        Ok(t) => t,
        Err(e) => return Break(d.deny(403, Rule::TargetInvalid, e.to_string())),
    };
    let swap = placeholders(policy, req, &authority, d)?;
    Continue(gate(policy, req, &authority, &target, swap, d))
}

/// Step 1, authority binding: a readable Host / `:authority`, the same host as the TLS server
/// name and as an HTTP/2 request's second statement of it.
fn bind_authority(req: &HttpRequest<'_>, d: &mut Deciding) -> Step<Authority> {
    let default_port = if req.scheme == Scheme::Https { 443 } else { 80 };
    let Some(raw_authority) = req.authority else {
        return Break(d.deny(
            400,
            Rule::AuthorityMissing,
            "the request has no Host / :authority".into(),
        ));
    };
    let authority = match Authority::parse(raw_authority, default_port) {
        Ok(a) => a,
        Err(e) => {
            return Break(d.deny(
                400,
                Rule::AuthorityInvalid,
                format!("Host {raw_authority:?}: {e}"),
            ));
        }
    };
    d.host = Some(authority.host_str());
    if let Some(sni) = req.sni {
        let why = match Authority::parse(sni, default_port) {
            Ok(s) if s.host == authority.host => None,
            Ok(s) => Some(format!(
                "Host {} does not match the TLS server name {}",
                authority.host_str(),
                s.host_str()
            )),
            Err(e) => Some(format!("TLS server name {sni:?}: {e}")),
        };
        if let Some(why) = why {
            return Break(d.deny(421, Rule::AuthorityMismatch, why));
        }
    }
    if let Some(why) = dialled_port_mismatch(&authority, req.dialled_port) {
        return Break(d.deny(421, Rule::AuthorityMismatch, why));
    }
    if let Some(alt) = req.alt_authority {
        match Authority::parse(alt, default_port) {
            Ok(a) if a.host == authority.host => {}
            _ => {
                return Break(d.deny(
                    421,
                    Rule::AuthorityMismatch,
                    format!("Host {alt:?} disagrees with :authority {raw_authority:?}"),
                ));
            }
        }
    }
    Continue(authority)
}

/// Why a request's authority does not name the port its connection was dialled to, if it does
/// not: the proxy sends it to the dialled port, so the allowlist must decide on that one (a
/// name allowed on 8443 is not served on 443 of the same address).
fn dialled_port_mismatch(authority: &Authority, dialled_port: Option<u16>) -> Option<String> {
    let dialled = dialled_port?;
    (authority.port != dialled).then(|| {
        format!(
            "Host {}:{} does not match the port dialled ({dialled})",
            authority.host_str(),
            authority.port
        )
    })
}

/// Step 2, method: TRACE, TRACK and CONNECT never pass.
fn method(method: &str, d: &mut Deciding) -> Step<()> {
    if method.eq_ignore_ascii_case("TRACE")
        || method.eq_ignore_ascii_case("TRACK")
        || method.eq_ignore_ascii_case("CONNECT")
    {
        return Break(d.deny(
            403,
            Rule::MethodRefused,
            format!("method {method} is never forwarded"),
        ));
    }
    Continue(())
}

/// Step 5, placeholders: a leak is refused; a bearer placeholder is swapped if the request passes.
fn placeholders(
    policy: &SandboxPolicy,
    req: &HttpRequest<'_>,
    authority: &Authority,
    d: &mut Deciding,
) -> Step<CredentialAction> {
    let finding = credentials::examine(
        &policy.placeholders,
        &CredentialView {
            scheme: req.scheme,
            authority,
            target: req.target,
            headers: req.headers,
            body_prefix: req.body_prefix,
        },
    );
    match finding {
        CredentialFinding::Leak(why) => Break(d.deny(
            403,
            Rule::CredentialLeak,
            format!("credential leak attempt: {why}"),
        )),
        CredentialFinding::Bearer(placeholder, kind) => {
            Continue(CredentialAction::Swap { placeholder, kind })
        }
        CredentialFinding::None => Continue(CredentialAction::Passthrough),
    }
}

/// Step 6, the host's gate: agent host, code-host family, policy-gated, brokered-credential, open.
fn gate(
    policy: &SandboxPolicy,
    req: &HttpRequest<'_>,
    authority: &Authority,
    target: &Target,
    swap: CredentialAction,
    d: &mut Deciding,
) -> Decision {
    if policy.agent_hosts.find(authority).is_some() {
        return d.allow(swap, Rule::AgentHost, "agent host".into());
    }
    let code = &policy.code;
    let host_key = authority.host_str();
    let policy_entry = policy.egress.policy.get(&host_key);
    let in_family = [&code.code_host, &code.api_host, &code.uploads_host]
        .iter()
        .any(|h| h.matches(authority));
    if in_family && (policy.bound_repo.is_some() || policy_entry.is_some()) {
        let repos = code_host_repos(policy, authority);
        let ask = CodeHostAsk {
            policy,
            authority,
            method: req.method,
            target,
            req,
            repos: &repos,
        };
        return ask.decide(d, swap);
    }
    if let Some(entry) = policy_entry {
        if entry.paths.iter().any(|p| paths::matches(p, target)) {
            return d.allow(
                swap,
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
        .any(|s| s.hosts.iter().any(|h| h.matches(authority)))
    {
        return d.allow(swap, Rule::SecretHost, "brokered-credential host".into());
    }
    d.allow(swap, Rule::OpenHost, "open host".into())
}

/// The repositories the code-host rules serve: the bound one, and those `egress.policy` lists
/// for the code host.
fn code_host_repos<'a>(policy: &'a SandboxPolicy, authority: &Authority) -> Vec<&'a RepoName> {
    let mut repos: Vec<&RepoName> = policy.bound_repo.iter().collect();
    for e in policy.egress.policy.values() {
        if policy.code.code_host.matches(&Authority {
            host: e.host.kind.clone(),
            port: authority.port,
        }) {
            repos.extend(e.repos.iter());
        }
    }
    repos
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
