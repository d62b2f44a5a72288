//! Placeholder credentials: minting, the guest's environment names, and
//! what a request may do with a placeholder.
//!
//! A placeholder is 64 lowercase hex characters from the OS CSPRNG, minted per allowed
//! non-agent host at sandbox start. The proxy swaps `Authorization: Bearer <placeholder>` for
//! the real bearer only over HTTPS and only on the placeholder's own host. A placeholder seen
//! anywhere else (another host, a query string, a cookie or other header, the body, Basic
//! auth, plain HTTP) is never swapped: the request is refused and audited as a leak attempt.
//!
//! Environment names: `SVC_CRED_<HOST>_TOKEN` / `SVC_CRED_<HOST>_EXPIRES_AT`, where `<HOST>` is
//! the normalised host upper-cased with every `.`, `-`, `:` (and IPv6 bracket) turned into `_`,
//! digits kept, and an explicit port appended as `_<PORT>`: `api.example.com:8443` →
//! `SVC_CRED_API_EXAMPLE_COM_8443_TOKEN`. Two hosts that map to the same name are an error.
//! Wildcard patterns get no placeholder (there is no single host to bind it to).

use std::{collections::HashMap, fmt};

use base64::Engine as _;
use serde::Serialize;

use crate::hosts::{Authority, HostKind, HostPattern};

/// Length of a placeholder in hex characters.
pub const PLACEHOLDER_LEN: usize = 64;
/// The synthetic far-future expiry the guest sees, so its tools never refresh.
pub const SYNTHETIC_EXPIRY: &str = "2099-12-31T23:59:59Z";

/// The value a sandbox's variable holds when it was given a stored OAuth secret's grant, not a
/// value: the NUL cannot be in a real value (`creds::check_value`), so nothing a user stores
/// reads as a reference.
const GRANT_REFERENCE: &str = "\0grant:";

/// The reference to version `version` of grant `name`, as a sandbox's variable holds it.
pub fn grant_reference(name: &str, version: u32) -> String {
    format!("{GRANT_REFERENCE}{name}@v{version}")
}

/// A sandbox variable's value read as a grant reference: (name, version).
pub fn parse_grant_reference(value: &str) -> Option<(String, u32)> {
    let rest = value.strip_prefix(GRANT_REFERENCE)?;
    let (name, v) = rest.rsplit_once("@v")?;
    Some((name.to_owned(), v.parse().ok()?))
}

/// A placeholder token. Not the secret it stands for, but still never logged in full.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Placeholder(String);

impl Placeholder {
    /// 32 bytes from the OS CSPRNG, as 64 lowercase hex characters.
    pub fn mint() -> Result<Self, getrandom::Error> {
        let mut bytes = [0u8; PLACEHOLDER_LEN / 2];
        getrandom::fill(&mut bytes)?;
        Ok(Self(bytes.iter().map(|b| format!("{b:02x}")).collect()))
    }

    /// Accept an existing placeholder (from the state store); it must have the right shape.
    pub fn parse(s: &str) -> Option<Self> {
        (s.len() == PLACEHOLDER_LEN
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
        .then(|| Self(s.to_owned()))
    }

    /// The full value, for the guest's environment only.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The first 8 characters, for logs and audit records.
    pub fn short(&self) -> &str {
        &self.0[..8]
    }
}

impl fmt::Debug for Placeholder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Placeholder({}…)", self.short())
    }
}

/// The kinds of credential a placeholder stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CredentialKind {
    /// `SVC_CRED_<HOST>_TOKEN`: one per allowed non-agent host.
    Host,
    /// `CODE_HOST_TOKEN`: swapped on the code host's API and uploads hosts and on git
    /// smart-HTTP to the code host; stripped on its archive downloads.
    CodeHost,
    /// `AGENT_AUTH_TOKEN`: the direct-API credential kind.
    AgentApi,
}

impl CredentialKind {
    /// The kind named by [`Self::name`].
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Host, Self::CodeHost, Self::AgentApi]
            .into_iter()
            .find(|k| k.name() == name)
    }

    pub const fn name(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::CodeHost => "code-host",
            Self::AgentApi => "agent-api",
        }
    }
}

/// One minted placeholder and the host(s) it may be swapped on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlaceholderEntry {
    pub placeholder: Placeholder,
    pub kind: CredentialKind,
    /// The hosts whose requests may carry it (one for `Host`; the code host, its API and its
    /// uploads host for `CodeHost`).
    pub hosts: Vec<HostPattern>,
}

impl PlaceholderEntry {
    /// The guest variable that holds this placeholder (`SVC_CRED_<HOST>_TOKEN`,
    /// `CODE_HOST_TOKEN`, `AGENT_AUTH_TOKEN`); `None` for a host entry with no exact host.
    pub fn env_name(&self) -> Option<String> {
        match self.kind {
            CredentialKind::CodeHost => Some("CODE_HOST_TOKEN".to_owned()),
            CredentialKind::AgentApi => Some("AGENT_AUTH_TOKEN".to_owned()),
            CredentialKind::Host => Some(format!("{}_TOKEN", env_stem(self.hosts.first()?)?)),
        }
    }
}

/// Errors naming placeholders for the guest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlaceholderError {
    #[error(
        "hosts {0} and {1} map to the same guest variable {2}; rename one or drop it from the allowlist"
    )]
    Collision(String, String, String),
    #[error("the OS random source failed: {0}")]
    Random(String),
}

/// The `SVC_CRED_<HOST>` stem for a host, or `None` for a wildcard pattern.
pub fn env_stem(host: &HostPattern) -> Option<String> {
    let base = match &host.kind {
        HostKind::Wildcard(_) => return None,
        HostKind::Exact(n) => n.clone(),
        HostKind::Ip(ip) => ip.to_string(),
    };
    let mut stem: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    if let Some(p) = host.port {
        stem.push('_');
        stem.push_str(&p.to_string());
    }
    Some(format!("SVC_CRED_{stem}"))
}

/// The placeholder table of one sandbox: every placeholder it was given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlaceholderTable {
    entries: Vec<PlaceholderEntry>,
    index: HashMap<String, usize>,
}

impl PlaceholderTable {
    pub fn new(entries: Vec<PlaceholderEntry>) -> Self {
        let index = entries
            .iter()
            .enumerate()
            .map(|(i, e)| (e.placeholder.0.clone(), i))
            .collect();
        Self { entries, index }
    }

    /// Mint one `Host` placeholder per exact (non-wildcard) host, plus the code-host and agent
    /// kinds where given. Fails on an environment-name collision.
    pub fn mint(
        hosts: &[HostPattern],
        code_host_hosts: &[HostPattern],
        agent_api: Option<&HostPattern>,
    ) -> Result<Self, PlaceholderError> {
        let mut names: HashMap<String, String> = HashMap::new();
        let mut entries = Vec::new();
        let fresh = || Placeholder::mint().map_err(|e| PlaceholderError::Random(e.to_string()));
        for h in hosts {
            let Some(stem) = env_stem(h) else { continue };
            if let Some(other) = names.insert(stem.clone(), h.to_string()) {
                if other != h.to_string() {
                    return Err(PlaceholderError::Collision(
                        other,
                        h.to_string(),
                        format!("{stem}_TOKEN"),
                    ));
                }
                continue;
            }
            entries.push(PlaceholderEntry {
                placeholder: fresh()?,
                kind: CredentialKind::Host,
                hosts: vec![h.clone()],
            });
        }
        if !code_host_hosts.is_empty() {
            entries.push(PlaceholderEntry {
                placeholder: fresh()?,
                kind: CredentialKind::CodeHost,
                hosts: code_host_hosts.to_vec(),
            });
        }
        if let Some(a) = agent_api {
            entries.push(PlaceholderEntry {
                placeholder: fresh()?,
                kind: CredentialKind::AgentApi,
                hosts: vec![a.clone()],
            });
        }
        Ok(Self::new(entries))
    }

    pub fn entries(&self) -> &[PlaceholderEntry] {
        &self.entries
    }

    pub fn lookup(&self, candidate: &str) -> Option<&PlaceholderEntry> {
        self.index.get(candidate).map(|&i| &self.entries[i])
    }

    /// The guest's environment: variable name → value.
    pub fn guest_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        for e in &self.entries {
            let Some(var) = e.env_name() else { continue };
            if e.kind == CredentialKind::Host
                && let Some(stem) = e.hosts.first().and_then(env_stem)
            {
                env.push((var, e.placeholder.0.clone()));
                env.push((format!("{stem}_EXPIRES_AT"), SYNTHETIC_EXPIRY.to_owned()));
            } else {
                env.push((var, e.placeholder.0.clone()));
            }
        }
        env
    }

    /// Every placeholder of this table that occurs in `haystack` (case-insensitive hex runs).
    pub fn find_in<'a>(&'a self, haystack: &[u8]) -> Vec<&'a PlaceholderEntry> {
        let mut found: Vec<&PlaceholderEntry> = Vec::new();
        if self.entries.is_empty() {
            return found;
        }
        let mut i = 0;
        while i < haystack.len() {
            if !haystack[i].is_ascii_hexdigit() {
                i += 1;
                continue;
            }
            let start = i;
            while i < haystack.len() && haystack[i].is_ascii_hexdigit() {
                i += 1;
            }
            if i - start >= PLACEHOLDER_LEN {
                for w in haystack[start..i].windows(PLACEHOLDER_LEN) {
                    let lower = String::from_utf8_lossy(w).to_ascii_lowercase();
                    if let Some(e) = self.lookup(&lower)
                        && !found.iter().any(|f| f.placeholder == e.placeholder)
                    {
                        found.push(e);
                    }
                }
            }
        }
        found
    }
}

/// Where in a request a placeholder can be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Https,
    Http,
}

/// The parts of a request the credential rules look at.
#[derive(Debug, Clone, Copy)]
pub struct CredentialView<'a> {
    pub scheme: Scheme,
    pub authority: &'a Authority,
    pub target: &'a str,
    pub headers: &'a [(&'a str, &'a [u8])],
    pub body_prefix: &'a [u8],
}

/// What to do with the request's credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialFinding {
    /// No placeholder anywhere.
    None,
    /// `Authorization: Bearer <placeholder>` on its own host over HTTPS.
    Bearer(Placeholder, CredentialKind),
    /// A placeholder where it must not be. The string says where.
    Leak(String),
}

/// Find every placeholder in a request and say whether it is a legitimate bearer.
pub fn examine(table: &PlaceholderTable, req: &CredentialView<'_>) -> CredentialFinding {
    let mut bearer: Option<&PlaceholderEntry> = None;
    for (name, value) in req.headers {
        let is_auth = name.eq_ignore_ascii_case("authorization");
        if is_auth {
            if let Some(e) = strip_bearer(value).and_then(|token| table.lookup(token)) {
                if bearer.is_some() {
                    return CredentialFinding::Leak("more than one Authorization header".into());
                }
                bearer = Some(e);
                continue;
            }
            if let Some(decoded) = basic_credentials(value)
                && !table.find_in(&decoded).is_empty()
            {
                return CredentialFinding::Leak("placeholder inside Basic authorization".into());
            }
        }
        if !table.find_in(value).is_empty() {
            return CredentialFinding::Leak(format!(
                "placeholder in the {} header",
                name.to_ascii_lowercase()
            ));
        }
    }
    if !table.find_in(req.target.as_bytes()).is_empty() {
        return CredentialFinding::Leak("placeholder in the request target".into());
    }
    if !table.find_in(req.body_prefix).is_empty() {
        return CredentialFinding::Leak("placeholder in the request body".into());
    }
    let Some(entry) = bearer else {
        return CredentialFinding::None;
    };
    if req.scheme == Scheme::Http {
        return CredentialFinding::Leak("placeholder over plain HTTP".into());
    }
    if !entry.hosts.iter().any(|h| h.matches(req.authority)) {
        return CredentialFinding::Leak(format!(
            "placeholder of {} sent to {}",
            entry
                .hosts
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            req.authority.host_str()
        ));
    }
    CredentialFinding::Bearer(entry.placeholder.clone(), entry.kind)
}

/// The token of `Bearer <token>` (scheme case-insensitive, one space), exactly.
fn strip_bearer(value: &[u8]) -> Option<&str> {
    let s = std::str::from_utf8(value).ok()?;
    let (scheme, token) = s.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer")
        && !token.is_empty()
        && !token.contains(char::is_whitespace))
    .then_some(token)
}

fn basic_credentials(value: &[u8]) -> Option<Vec<u8>> {
    let s = std::str::from_utf8(value).ok()?;
    let (scheme, b64) = s.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    base64::engine::general_purpose::STANDARD
        .decode(b64.trim())
        .ok()
        .or_else(|| {
            base64::engine::general_purpose::STANDARD_NO_PAD
                .decode(b64.trim())
                .ok()
        })
}

/// What the answer to a request the proxy swapped a credential into is scanned for, and what
/// each occurrence becomes (issue 28): an upstream that echoes request headers (an
/// httpbin-style `/headers`, a debug endpoint, an error page) must hand the guest back its
/// placeholder, never the real value.
///
/// Scanned for: the real value as sent, and the forms a verbatim echo takes inside a JSON
/// string (`"` `\` and control characters escaped, with and without `\/`), a percent-encoded
/// URL (upper- and lower-case hex) and HTML text (`&amp;` `&lt;` `&gt;` `&quot;` `&#39;`).
/// Each becomes the placeholder, which is hex and so reads the same in every one of those
/// forms. An upstream that transforms the value otherwise (base64, a change of case, pieces)
/// is not recognised: the guarantee is against echoes, not against an upstream that works to
/// disclose its caller's credential.
#[derive(Clone)]
pub struct EchoGuard {
    /// Distinct, non-empty; each held until dropped, then zeroed.
    patterns: Vec<zeroize::Zeroizing<Vec<u8>>>,
    replacement: Vec<u8>,
}

impl fmt::Debug for EchoGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EchoGuard({} forms)", self.patterns.len())
    }
}

impl EchoGuard {
    /// The guard for a request that carried `real` in place of `placeholder`.
    pub fn new(real: &str, placeholder: &Placeholder) -> Self {
        let mut patterns: Vec<zeroize::Zeroizing<Vec<u8>>> = Vec::new();
        let forms = [
            real.as_bytes().to_vec(),
            json_escaped(real, false),
            json_escaped(real, true),
            percent_encoded(real, b"0123456789ABCDEF"),
            percent_encoded(real, b"0123456789abcdef"),
            html_escaped(real),
        ];
        for form in forms {
            let form = zeroize::Zeroizing::new(form);
            if !form.is_empty() && !patterns.iter().any(|p| **p == *form) {
                patterns.push(form);
            }
        }
        Self {
            patterns,
            replacement: placeholder.expose().as_bytes().to_vec(),
        }
    }

    /// The byte strings to look for (never empty strings).
    pub fn patterns(&self) -> impl Iterator<Item = &[u8]> {
        self.patterns.iter().map(|p| p.as_slice())
    }

    /// What each occurrence is replaced with: the placeholder.
    pub fn replacement(&self) -> &[u8] {
        &self.replacement
    }

    /// The longest pattern's length (0 when there is nothing to look for).
    pub fn longest(&self) -> usize {
        self.patterns.iter().map(|p| p.len()).max().unwrap_or(0)
    }
}

/// The `Accept-Encoding` a request carrying a swapped credential goes upstream with, so that
/// the answer's body can be read for echoes.
pub const ECHO_ACCEPT_ENCODING: &str = "identity";

/// Request headers removed from a request carrying a swapped credential: a range request
/// would let the guest take an echo apart into pieces each shorter than the credential, none
/// of which the scan could recognise.
pub const ECHO_DROPPED_REQUEST_HEADERS: [&str; 2] = ["range", "if-range"];

/// Whether an answer to a request carrying a swapped credential can be scanned: its content
/// codings (`Content-Encoding`) must all be `identity` and its transfer codings
/// (`Transfer-Encoding`) `identity` or `chunked`. An upstream that compresses anyway is
/// refused rather than trusted (a compressed echo would pass any byte scan); the string says
/// which coding.
pub fn echo_scannable(
    content_encoding: &[&[u8]],
    transfer_encoding: &[&[u8]],
) -> Result<(), String> {
    let codings = |values: &[&[u8]]| -> Vec<String> {
        values
            .iter()
            .flat_map(|v| {
                String::from_utf8_lossy(v)
                    .split(',')
                    .map(|c| c.trim().to_ascii_lowercase())
                    .collect::<Vec<_>>()
            })
            .filter(|c| !c.is_empty())
            .collect()
    };
    if let Some(c) = codings(content_encoding)
        .into_iter()
        .find(|c| c != "identity")
    {
        return Err(format!(
            "the upstream answered a request carrying a swapped credential with Content-Encoding \
             {c:?} although asked for identity; a compressed body cannot be scanned for the \
             credential, so it is not passed on"
        ));
    }
    if let Some(c) = codings(transfer_encoding)
        .into_iter()
        .find(|c| c != "identity" && c != "chunked")
    {
        return Err(format!(
            "the upstream answered a request carrying a swapped credential with \
             Transfer-Encoding {c:?}; a compressed body cannot be scanned for the credential, so \
             it is not passed on"
        ));
    }
    Ok(())
}

fn json_escaped(s: &str, slash: bool) -> Vec<u8> {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '/' if slash => out.push_str("\\/"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.into_bytes()
}

fn percent_encoded(s: &str, hex: &[u8; 16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', hex[usize::from(b >> 4)], hex[usize::from(b & 15)]]);
        }
    }
    out
}

fn html_escaped(s: &str) -> Vec<u8> {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out.into_bytes()
}
