//! The git-over-SSH relay's rules: which SSH requests a sandbox may make, which
//! refs a push may touch. Pure: the relay (`git_relay`) feeds it what the guest's shim sent and
//! the push's command list, and enforces what it says before a byte reaches the server.
//!
//! - A request is git's own: `[-o SendEnv=GIT_PROTOCOL] [-4|-6] [-p PORT] [USER@]HOST CMD`, where
//!   CMD is `git-upload-pack '<path>'` or `git-receive-pack '<path>'` (also spelt `git
//!   upload-pack …`), the path single-quoted as git quotes it and unquoted exactly once. Anything
//!   else — another command (a shell, `scp`, `sftp`, `git-upload-archive`,
//!   `git-lfs-authenticate`), another option (`-oProxyCommand=…`), a host or path starting with
//!   `-`, a newline, NUL or `..` — is refused.
//! - AllowedBranches are globs with git's wildmatch semantics on whole ref names: `*` matches
//!   within one path component, `**` across components (`refs/heads/svc/**` matches
//!   `refs/heads/svc/a` and `refs/heads/svc/a/b`, not `refs/heads/svc` itself), `?` one
//!   character, `[…]` a class.

pub use super::receive_pack::{
    MAX_COMMANDS, PushCommands, PushError, RefUpdate, git_reading, parse_push,
};

/// The default AllowedBranches.
pub const DEFAULT_BRANCHES: &str = "refs/heads/svc/**";

/// The exact refusal for a repository outside the policy.
pub fn policy_refusal(host: &str, repo: &str) -> String {
    format!("svc: refused by egress policy: {host} {repo} not in .svc/config.yaml egress.policy")
}

/// The exact refusal for a ref outside AllowedBranches.
pub fn ref_refusal(name: &str) -> String {
    format!("svc: refused: ref {name} not in allowed branches")
}

/// The line every git SSH request of a sandbox whose relay is off gets.
pub const RELAY_OFF: &str = "svc: refused: git over SSH is off for this sandbox (its \
                             workspace's auth.defaults.sshAgentForward is false)";

/// Whether the relay serves a sandbox at all. `workspace_forward` is its workspace's
/// `auth.defaults.sshAgentForward` (false unless set), `None` for a sandbox made without a
/// workspace. A workspace's sandbox has the relay only when the workspace asks for it; a
/// sandbox made without one always has it, each request then decided by [`explain`]. `Err`:
/// the line git's stderr gets for every request.
pub fn relay_on(workspace_forward: Option<bool>) -> Result<(), &'static str> {
    match workspace_forward {
        Some(false) => Err(RELAY_OFF),
        Some(true) | None => Ok(()),
    }
}

/// Which rule decided an SSH request (`svc egress explain --ssh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SshRule {
    /// Not a git request the relay runs (a shell, another command, an option).
    Request,
    /// The host and repository are (not) in `egress.policy`.
    EgressPolicy,
    /// A pushed ref is (not) in AllowedBranches.
    AllowedBranches,
}

/// How the relay decides one request, with the refs a push would update: `Ok` with the
/// request, or the rule and the exact line git's stderr gets.
pub fn explain(
    repos: &[(String, String)],
    branches: &[String],
    args: &[String],
    updates: &[RefUpdate],
) -> Result<(SshRequest, SshRule), (SshRule, String)> {
    let request =
        parse_request(args).map_err(|e| (SshRule::Request, format!("svc: refused: {e}")))?;
    if !repo_allowed(repos, &request.host, &request.repo) {
        return Err((
            SshRule::EgressPolicy,
            policy_refusal(&request.host, &request.repo),
        ));
    }
    if request.service == Service::ReceivePack {
        if let Some(bad) = first_refused(branches, updates) {
            return Err((SshRule::AllowedBranches, ref_refusal(&bad.name)));
        }
        return Ok((request, SshRule::AllowedBranches));
    }
    Ok((request, SshRule::EgressPolicy))
}

/// What the guest asked the relay to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshRequest {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
    pub service: Service,
    /// The path as given, unquoted (`/acme/widget.git`, `acme/widget`).
    pub path: String,
    /// `owner/repo`, without a leading `/` or a trailing `.git`.
    pub repo: String,
}

/// The two git services a relay runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    UploadPack,
    ReceivePack,
}

impl Service {
    pub const fn command(self) -> &'static str {
        match self {
            Self::UploadPack => "git-upload-pack",
            Self::ReceivePack => "git-receive-pack",
        }
    }
}

/// Why a request is refused (the message git's stderr gets, after `svc: refused: `).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SshRefusal {
    #[error("ssh option {0:?} is not allowed (only -o SendEnv=GIT_PROTOCOL, -4, -6, -p PORT)")]
    Option(String),
    #[error("bad port {0:?}")]
    Port(String),
    #[error("no host given")]
    NoHost,
    #[error("bad host {0:?}")]
    Host(String),
    #[error("no command given (interactive shells are not relayed)")]
    NoCommand,
    #[error("only git-upload-pack and git-receive-pack are relayed, not {0:?}")]
    Command(String),
    #[error("bad repository path {0:?}: {1}")]
    Path(String, &'static str),
    #[error("more arguments than a host and one command")]
    Extra,
}

/// Shorten what the guest sent before it goes into a message.
fn shown(s: &str) -> String {
    let mut out: String = s.chars().take(80).collect();
    if s.chars().count() > 80 {
        out.push('…');
    }
    out
}

/// Parse the arguments git gave the shim (argv after the program name).
pub fn parse_request(args: &[String]) -> Result<SshRequest, SshRefusal> {
    let mut i = 0;
    let mut port = None;
    while let Some(a) = args.get(i) {
        match a.as_str() {
            "-4" | "-6" => i += 1,
            "-o" => {
                let v = args.get(i + 1).map(String::as_str).unwrap_or_default();
                if v != "SendEnv=GIT_PROTOCOL" {
                    return Err(SshRefusal::Option(shown(&format!("-o {v}"))));
                }
                i += 2;
            }
            "-p" => {
                let v = args.get(i + 1).map(String::as_str).unwrap_or_default();
                port = Some(
                    v.parse::<u16>()
                        .ok()
                        .filter(|p| *p != 0 && v.bytes().all(|b| b.is_ascii_digit()))
                        .ok_or_else(|| SshRefusal::Port(shown(v)))?,
                );
                i += 2;
            }
            other if other.starts_with('-') => return Err(SshRefusal::Option(shown(other))),
            _ => break,
        }
    }
    let target = args.get(i).ok_or(SshRefusal::NoHost)?;
    let (user, host) = match target.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, target.as_str()),
    };
    let name_ok = |s: &str| {
        !s.is_empty()
            && !s.starts_with('-')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
    };
    if !name_ok(host) || user.is_some_and(|u| !name_ok(u)) {
        return Err(SshRefusal::Host(shown(target)));
    }
    let command = args.get(i + 1).ok_or(SshRefusal::NoCommand)?;
    if args.len() > i + 2 {
        return Err(SshRefusal::Extra);
    }
    let (service, quoted) = if let Some(rest) = command.strip_prefix("git-upload-pack ") {
        (Service::UploadPack, rest)
    } else if let Some(rest) = command.strip_prefix("git upload-pack ") {
        (Service::UploadPack, rest)
    } else if let Some(rest) = command.strip_prefix("git-receive-pack ") {
        (Service::ReceivePack, rest)
    } else if let Some(rest) = command.strip_prefix("git receive-pack ") {
        (Service::ReceivePack, rest)
    } else {
        let name = command.split_whitespace().next().unwrap_or_default();
        return Err(SshRefusal::Command(shown(name)));
    };
    let path = unquote(quoted).ok_or_else(|| {
        SshRefusal::Path(shown(quoted), "not one single-quoted path as git quotes it")
    })?;
    let repo = repo_of(&path).map_err(|why| SshRefusal::Path(shown(&path), why))?;
    Ok(SshRequest {
        user: user.map(str::to_owned),
        host: host.to_owned(),
        port,
        service,
        path,
        repo,
    })
}

/// Undo git's `sq_quote_buf`: `'…'` where `'` is written `'\''` and `!` is written `'\!'`.
/// Exactly one quoted word; `None` for anything else.
fn unquote(s: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = s.chars();
    if chars.next()? != '\'' {
        return None;
    }
    loop {
        match chars.next()? {
            '\'' => match chars.next() {
                None => return Some(out),
                Some('\\') => {
                    let c = chars.next()?;
                    if c != '\'' && c != '!' {
                        return None;
                    }
                    out.push(c);
                    if chars.next()? != '\'' {
                        return None;
                    }
                }
                Some(_) => return None,
            },
            c => out.push(c),
        }
    }
}

/// `owner/repo` from a path: `/owner/repo.git`, `owner/repo`, `~/…` refused.
fn repo_of(path: &str) -> Result<String, &'static str> {
    if path.contains(['\n', '\r', '\0']) {
        return Err("holds a line break or NUL");
    }
    if path.starts_with('-') {
        return Err("starts with '-'");
    }
    let trimmed = path.trim_start_matches('/');
    let trimmed = trimmed.strip_suffix('/').unwrap_or(trimmed);
    let trimmed = trimmed.strip_suffix(".git").unwrap_or(trimmed);
    let parts: Vec<&str> = trimmed.split('/').collect();
    if parts
        .iter()
        .any(|p| *p == ".." || *p == "." || p.is_empty())
    {
        return Err("holds an empty, '.' or '..' component");
    }
    let [owner, repo] = parts.as_slice() else {
        return Err("is not owner/repo");
    };
    let ok = |s: &str| {
        !s.starts_with('-')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
    };
    if !ok(owner) || !ok(repo) {
        return Err("has characters a repository name does not");
    }
    Ok(format!("{owner}/{repo}"))
}

/// Whether (`host`, `repo`) is one of a sandbox's `egress.policy` pairs (names compare
/// case-insensitively, as the code host compares them).
pub fn repo_allowed(repos: &[(String, String)], host: &str, repo: &str) -> bool {
    repos
        .iter()
        .any(|(h, r)| h.eq_ignore_ascii_case(host) && r.eq_ignore_ascii_case(repo))
}

/// The first update of a push whose ref matches none of `branches`: the push is refused for it.
/// A name git's `check-ref-format` refuses (`..`, a component starting with `.` or ending in
/// `.lock`, `//`, `@{`, controls, space and `~^:?*[\`) is refused whatever the globs say:
/// `refs/heads/svc/../main` never counts as under `refs/heads/svc/`.
pub fn first_refused<'a>(branches: &[String], updates: &'a [RefUpdate]) -> Option<&'a RefUpdate> {
    updates
        .iter()
        .find(|u| !ref_name_ok(&u.name) || !branches.iter().any(|b| ref_matches(b, &u.name)))
}

/// Whether `name` is a full ref name git itself would accept (`git check-ref-format`).
pub fn ref_name_ok(name: &str) -> bool {
    name.starts_with("refs/")
        && !name.ends_with('/')
        && !name.ends_with('.')
        && !name.contains("..")
        && !name.contains("@{")
        && name != "@"
        && !name
            .chars()
            .any(|c| c.is_control() || c == ' ' || "~^:?*[\\".contains(c))
        && name
            .split('/')
            .all(|c| !c.is_empty() && !c.starts_with('.') && !c.ends_with(".lock"))
}

/// Whether git's `GIT_PROTOCOL` value may be passed on to the server: short, and only the
/// characters git's own values use (`version=2`, `key=value:key2=value2`).
pub fn git_protocol_ok(v: &str) -> bool {
    v.len() < 100
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"=:._-".contains(&b))
}

/// Whether `name` (a full ref name) matches the glob `pattern` (git's wildmatch with
/// path-name semantics).
pub fn ref_matches(pattern: &str, name: &str) -> bool {
    wildmatch(pattern.as_bytes(), name.as_bytes())
}

fn wildmatch(p: &[u8], t: &[u8]) -> bool {
    match p.first() {
        None => t.is_empty(),
        Some(b'*') if p.get(1) == Some(&b'*') => {
            // `**/` matches zero or more whole components; a trailing `**` everything left.
            let rest = &p[2..];
            if rest.is_empty() {
                return true;
            }
            let rest = rest.strip_prefix(b"/").unwrap_or(rest);
            if wildmatch(rest, t) {
                return true;
            }
            (0..t.len()).any(|i| t[i] == b'/' && wildmatch(rest, &t[i + 1..]))
        }
        Some(b'*') => {
            let rest = &p[1..];
            for i in 0..=t.len() {
                if wildmatch(rest, &t[i..]) {
                    return true;
                }
                if i < t.len() && t[i] == b'/' {
                    return false;
                }
            }
            false
        }
        Some(b'?') => t.first().is_some_and(|c| *c != b'/') && wildmatch(&p[1..], &t[1..]),
        Some(b'[') => {
            let Some(end) = p.iter().skip(1).position(|c| *c == b']').map(|e| e + 1) else {
                return t.first() == Some(&b'[') && wildmatch(&p[1..], &t[1..]);
            };
            let Some(&c) = t.first() else { return false };
            if c == b'/' {
                return false;
            }
            let class = &p[1..end];
            let (negate, class) = match class.first() {
                Some(b'!' | b'^') => (true, &class[1..]),
                _ => (false, class),
            };
            let mut hit = false;
            let mut k = 0;
            while k < class.len() {
                if k + 2 < class.len() && class[k + 1] == b'-' {
                    hit |= class[k] <= c && c <= class[k + 2];
                    k += 3;
                } else {
                    hit |= class[k] == c;
                    k += 1;
                }
            }
            hit != negate && wildmatch(&p[end + 1..], &t[1..])
        }
        Some(&c) => t.first() == Some(&c) && wildmatch(&p[1..], &t[1..]),
    }
}
