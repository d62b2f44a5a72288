//! Compose fallback (SPEC 1.6, 6): with no `.svc/workspace.json`, the workspace's compose file
//! gives the ports Spotlight forwards on `workspace.ready`.
//!
//! Only what that needs is read: `services.*.ports` (short and long syntax), `services.*.profiles`
//! and the interpolation those values use. `expose` is never published. Everything else in the
//! file is left to Compose.

use std::{collections::BTreeMap, net::IpAddr, path::Path};

use serde::Serialize;
use serde_norway::Value;

use super::{ConfigError, ConfigErrors, Location};

/// Compose file names in the order they are looked for; the first one present wins and the
/// others are reported as ignored (the order Docker Compose itself uses: the Compose
/// specification's names first, then SPEC 1.6's).
pub const FILE_NAMES: [&str; 4] = [
    "compose.yaml",
    "compose.yml",
    "docker-compose.yml",
    "docker-compose.yaml",
];

/// A transport protocol of a published port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Some(Self::Tcp),
            "udp" => Some(Self::Udp),
            "sctp" => Some(Self::Sctp),
            _ => None,
        }
    }
}

/// One port a compose service publishes, as a Spotlight forward: `remote_port` in the sandbox
/// to `local_port` on the host. When the file leaves the host port to Compose (`"3000"`,
/// `"127.0.0.1::5000"`), Spotlight uses the same number on the host.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ComposeForward {
    pub service: String,
    pub remote_port: u16,
    pub local_port: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_ip: Option<IpAddr>,
    pub protocol: Protocol,
}

/// What the compose file yields.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ComposePorts {
    pub forwards: Vec<ComposeForward>,
    /// Services left out because none of their profiles is active (`COMPOSE_PROFILES`).
    pub inactive_services: Vec<String>,
}

/// Variables for interpolation: the process environment over the workspace's `.env` file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    vars: BTreeMap<String, String>,
}

impl Environment {
    /// `.env` values, then `process` values on top (Compose: the shell wins over `.env`).
    pub fn new(
        dotenv: BTreeMap<String, String>,
        process: impl IntoIterator<Item = (String, String)>,
    ) -> Self {
        let mut vars = dotenv;
        vars.extend(process);
        Self { vars }
    }
    pub fn get(&self, name: &str) -> Option<&str> {
        self.vars.get(name).map(String::as_str)
    }
}

/// Parse a `.env` file: `KEY=VALUE` lines, `#` comments, optional `export `, single quotes
/// literal, double quotes with `\n`, `\t`, `\"`, `\\` escapes.
pub fn parse_dotenv(file: &Path, text: &str) -> Result<BTreeMap<String, String>, ConfigErrors> {
    let mut vars = BTreeMap::new();
    let mut errors = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let loc = Location {
            line: Some(i + 1),
            column: None,
            path: String::new(),
        };
        let Some((key, value)) = line.split_once('=') else {
            errors.push(ConfigError::new(
                file,
                loc,
                format!("expected KEY=VALUE, got {line:?}"),
            ));
            continue;
        };
        let key = key.trim();
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
        {
            errors.push(ConfigError::new(
                file,
                loc,
                format!("invalid variable name {key:?}"),
            ));
            continue;
        }
        let value = value.trim();
        let value = if let Some(inner) = value.strip_prefix('\'') {
            match inner.find('\'') {
                Some(end) => inner[..end].to_owned(),
                None => {
                    errors.push(ConfigError::new(file, loc, "unterminated single quote"));
                    continue;
                }
            }
        } else if let Some(inner) = value.strip_prefix('"') {
            match unescape_double(inner) {
                Some(v) => v,
                None => {
                    errors.push(ConfigError::new(file, loc, "unterminated double quote"));
                    continue;
                }
            }
        } else {
            match value.find(" #") {
                Some(i) => value[..i].trim_end().to_owned(),
                None => value.to_owned(),
            }
        };
        vars.insert(key.to_owned(), value);
    }
    if errors.is_empty() {
        Ok(vars)
    } else {
        Err(ConfigErrors(errors))
    }
}

fn unescape_double(s: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// Interpolate one string the way Compose does: `$$` is a literal `$`; `$VAR`, `${VAR}`;
/// `${VAR:-default}` (unset or empty), `${VAR-default}` (unset); `${VAR:?message}`,
/// `${VAR?message}` (error); `${VAR:+alt}`, `${VAR+alt}`. Defaults may nest. An unset
/// variable without a default becomes the empty string, as in Compose.
pub fn interpolate(input: &str, env: &Environment) -> Result<String, String> {
    let mut out = String::with_capacity(input.len());
    let bytes = input.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'$' {
            let next = input[i..].find('$').map_or(input.len(), |n| i + n);
            out.push_str(&input[i..next]);
            i = next;
            continue;
        }
        match bytes.get(i + 1) {
            Some(b'$') => {
                out.push('$');
                i += 2;
            }
            Some(b'{') => {
                let close = matching_brace(input, i + 1).ok_or_else(|| {
                    format!("invalid interpolation format for {input:?}: unterminated '${{'")
                })?;
                out.push_str(&expand_braced(&input[i + 2..close], env, input)?);
                i = close + 1;
            }
            Some(c) if c.is_ascii_alphabetic() || *c == b'_' => {
                let end = input[i + 1..]
                    .find(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
                    .map_or(input.len(), |n| i + 1 + n);
                out.push_str(env.get(&input[i + 1..end]).unwrap_or(""));
                i = end;
            }
            _ => {
                out.push('$');
                i += 1;
            }
        }
    }
    Ok(out)
}

/// Index of the `}` matching the `{` at `open`, counting nested `${`.
fn matching_brace(s: &str, open: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (j, b) in s.bytes().enumerate().skip(open) {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(j);
                }
            }
            _ => {}
        }
    }
    None
}

fn expand_braced(body: &str, env: &Environment, whole: &str) -> Result<String, String> {
    let name_end = body
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(body.len());
    let name = &body[..name_end];
    let rest = &body[name_end..];
    if name.is_empty() || name.as_bytes()[0].is_ascii_digit() {
        return Err(format!(
            "invalid interpolation format for {whole:?}: bad variable name in '${{{body}}}'"
        ));
    }
    let value = env.get(name);
    let set_nonempty = value.is_some_and(|v| !v.is_empty());
    let (op, arg) = match rest {
        "" => return Ok(value.unwrap_or("").to_owned()),
        r if r.starts_with(":-") || r.starts_with(":?") || r.starts_with(":+") => {
            (&r[..2], &r[2..])
        }
        r if r.starts_with('-') || r.starts_with('?') || r.starts_with('+') => (&r[..1], &r[1..]),
        _ => {
            return Err(format!(
                "invalid interpolation format for {whole:?}: unexpected {rest:?} after variable {name}"
            ));
        }
    };
    let present = if op.starts_with(':') {
        set_nonempty
    } else {
        value.is_some()
    };
    match op.trim_start_matches(':') {
        "-" => {
            if present {
                Ok(value.unwrap_or("").to_owned())
            } else {
                interpolate(arg, env)
            }
        }
        "+" => {
            if present {
                interpolate(arg, env)
            } else {
                Ok(String::new())
            }
        }
        _ => {
            if present {
                Ok(value.unwrap_or("").to_owned())
            } else {
                let msg = interpolate(arg, env)?;
                Err(format!(
                    "required variable {name} is missing a value: {msg}"
                ))
            }
        }
    }
}

/// Parse a compose file's text and extract its published ports.
pub fn parse(file: &Path, text: &str, env: &Environment) -> Result<ComposePorts, ConfigErrors> {
    let mut doc: Value = super::parse_yaml(file, text)?;
    doc.apply_merge().map_err(|e| {
        ConfigError::new(file, Location::default(), format!("YAML merge keys: {e}"))
    })?;
    let mut errors = Vec::new();
    let mut err = |path: String, message: String| {
        errors.push(ConfigError::new(file, Location::at(path), message));
    };
    let active: Vec<String> = env
        .get("COMPOSE_PROFILES")
        .map(|p| {
            p.split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        })
        .unwrap_or_default();
    let mut out = ComposePorts::default();
    let services = match doc.get("services") {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::Mapping(m)) => m,
        Some(_) => {
            err(
                "services".into(),
                "expected a mapping of service names to services".into(),
            );
            return Err(ConfigErrors(errors));
        }
    };
    for (name, service) in services {
        let Some(name) = name.as_str() else {
            err(
                "services".into(),
                format!("service names must be strings, got {name:?}"),
            );
            continue;
        };
        let base = format!("services.{name}");
        let service = match service {
            Value::Mapping(m) => m,
            Value::Null => continue,
            _ => {
                err(base, "expected a mapping".into());
                continue;
            }
        };
        if let Some(profiles) = service.get("profiles") {
            let Some(list) = profiles.as_sequence() else {
                err(
                    format!("{base}.profiles"),
                    "expected a list of profile names".into(),
                );
                continue;
            };
            let mut names = Vec::new();
            for (i, p) in list.iter().enumerate() {
                match p.as_str().map(|s| interpolate(s, env)) {
                    Some(Ok(s)) => names.push(s),
                    Some(Err(e)) => err(format!("{base}.profiles[{i}]"), e),
                    None => err(format!("{base}.profiles[{i}]"), "expected a string".into()),
                }
            }
            if !names.is_empty() && !names.iter().any(|n| active.contains(n)) {
                out.inactive_services.push(name.to_owned());
                continue;
            }
        }
        let Some(ports) = service.get("ports") else {
            continue;
        };
        let Some(ports) = ports.as_sequence() else {
            err(format!("{base}.ports"), "expected a list of ports".into());
            continue;
        };
        for (i, entry) in ports.iter().enumerate() {
            let path = format!("{base}.ports[{i}]");
            let parsed = match entry {
                Value::Number(n) => n
                    .as_u64()
                    .and_then(|n| u16::try_from(n).ok())
                    .filter(|&n| n != 0)
                    .map(|p| vec![forward(name, p, None, None, Protocol::Tcp)])
                    .ok_or_else(|| format!("expected a port from 1 to 65535, got {n}")),
                Value::String(s) => interpolate(s, env).and_then(|s| parse_short(name, &s)),
                Value::Mapping(m) => parse_long(name, m, env),
                other => Err(format!(
                    "expected a port string, number or mapping, got {}",
                    kind(other)
                )),
            };
            match parsed {
                Ok(fs) => out.forwards.extend(fs),
                Err(e) => err(path, e),
            }
        }
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(ConfigErrors(errors))
    }
}

fn forward(
    service: &str,
    target: u16,
    published: Option<u16>,
    host_ip: Option<IpAddr>,
    protocol: Protocol,
) -> ComposeForward {
    ComposeForward {
        service: service.to_owned(),
        remote_port: target,
        local_port: published.unwrap_or(target),
        host_ip,
        protocol,
    }
}

/// Short syntax: `[[HOST_IP:][HOST_PORTS]:]CONTAINER_PORTS[/PROTOCOL]`; ports may be ranges,
/// an IPv6 host address is written in brackets.
fn parse_short(service: &str, spec: &str) -> Result<Vec<ComposeForward>, String> {
    let bad = |why: &str| format!("invalid port {spec:?}: {why}");
    let spec_t = spec.trim();
    let (rest, protocol) = match spec_t.rsplit_once('/') {
        Some((r, p)) => (
            r,
            Protocol::parse(p).ok_or_else(|| bad("protocol must be tcp, udp or sctp"))?,
        ),
        None => (spec_t, Protocol::Tcp),
    };
    let (host_ip, rest) = if let Some(after) = rest.strip_prefix('[') {
        let (ip, after) = after
            .split_once(']')
            .ok_or_else(|| bad("unclosed '[' in host address"))?;
        let ip: IpAddr = ip
            .parse()
            .map_err(|_| bad("host address is not an IP address"))?;
        let after = after
            .strip_prefix(':')
            .ok_or_else(|| bad("expected ':' after the host address"))?;
        (Some(ip), after)
    } else {
        let parts: Vec<&str> = rest.split(':').collect();
        match parts.len() {
            1 | 2 => (None, rest),
            3 => {
                let ip: IpAddr = parts[0]
                    .parse()
                    .map_err(|_| bad("host address is not an IP address"))?;
                (Some(ip), &rest[parts[0].len() + 1..])
            }
            _ => return Err(bad("too many ':' (write IPv6 host addresses in brackets)")),
        }
    };
    let (host, container) = match rest.rsplit_once(':') {
        Some((h, c)) => (Some(h).filter(|h| !h.is_empty()), c),
        None if host_ip.is_some() => return Err(bad("missing container port")),
        None => (None, rest),
    };
    let container = parse_range(container).map_err(|e| bad(&e))?;
    let host = host.map(parse_range).transpose().map_err(|e| bad(&e))?;
    pair(service, container, host, host_ip, protocol).map_err(|e| bad(&e))
}

fn parse_long(
    service: &str,
    m: &serde_norway::Mapping,
    env: &Environment,
) -> Result<Vec<ComposeForward>, String> {
    const KEYS: [&str; 7] = [
        "target",
        "published",
        "host_ip",
        "protocol",
        "mode",
        "name",
        "app_protocol",
    ];
    for key in m.keys() {
        let k = key.as_str().unwrap_or("");
        if !KEYS.contains(&k) && !k.starts_with("x-") {
            return Err(format!(
                "unknown key {key:?} in long port syntax; expected one of {}",
                KEYS.join(", ")
            ));
        }
    }
    let text = |key: &str| -> Result<Option<String>, String> {
        match m.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => interpolate(s, env).map(Some),
            Some(Value::Number(n)) => Ok(Some(n.to_string())),
            Some(other) => Err(format!(
                "{key}: expected a string or number, got {}",
                kind(other)
            )),
        }
    };
    let target = text("target")?.ok_or("long port syntax needs `target`")?;
    let target = parse_port(&target).map_err(|e| format!("target: {e}"))?;
    let published = text("published")?
        .map(|p| parse_range(&p))
        .transpose()
        .map_err(|e| format!("published: {e}"))?;
    let host_ip = text("host_ip")?
        .map(|s| {
            s.trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<IpAddr>()
        })
        .transpose()
        .map_err(|_| "host_ip: not an IP address".to_owned())?;
    let protocol = match text("protocol")? {
        Some(p) => Protocol::parse(&p).ok_or("protocol: must be tcp, udp or sctp")?,
        None => Protocol::Tcp,
    };
    if let Some(mode) = text("mode")?
        && mode != "host"
        && mode != "ingress"
    {
        return Err(format!("mode: must be host or ingress, got {mode:?}"));
    }
    pair(service, (target, target), published, host_ip, protocol)
}

/// Pair container ports with host ports. Equal-length ranges pair one to one; a host range for
/// one container port publishes the first port of the range.
fn pair(
    service: &str,
    (c_lo, c_hi): (u16, u16),
    host: Option<(u16, u16)>,
    host_ip: Option<IpAddr>,
    protocol: Protocol,
) -> Result<Vec<ComposeForward>, String> {
    let c_len = c_hi - c_lo;
    match host {
        None => Ok((c_lo..=c_hi)
            .map(|c| forward(service, c, None, host_ip, protocol))
            .collect()),
        Some((h_lo, h_hi)) if h_hi - h_lo == c_len => Ok((c_lo..=c_hi)
            .zip(h_lo..=h_hi)
            .map(|(c, h)| forward(service, c, Some(h), host_ip, protocol))
            .collect()),
        Some((h_lo, _)) if c_len == 0 => {
            Ok(vec![forward(service, c_lo, Some(h_lo), host_ip, protocol)])
        }
        Some(_) => Err("host and container port ranges differ in length".into()),
    }
}

fn parse_range(s: &str) -> Result<(u16, u16), String> {
    match s.split_once('-') {
        Some((lo, hi)) => {
            let (lo, hi) = (parse_port(lo)?, parse_port(hi)?);
            if lo > hi {
                return Err(format!("range {s:?} runs backwards"));
            }
            Ok((lo, hi))
        }
        None => parse_port(s).map(|p| (p, p)),
    }
}

fn parse_port(s: &str) -> Result<u16, String> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{s:?} is not a port number"));
    }
    s.parse::<u16>()
        .ok()
        .filter(|&p| p != 0)
        .ok_or_else(|| format!("{s} is not a port from 1 to 65535"))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}
