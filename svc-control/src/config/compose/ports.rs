//! The port syntaxes of a compose service's `ports` (number, short string, long mapping),
//! each entry turned into Spotlight forwards.

use std::net::IpAddr;

use serde::Serialize;
use serde_norway::Value;

use super::interpolate::{Environment, interpolate};

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

/// One entry of `ports`: a number, a short-syntax string or a long-syntax mapping.
pub(super) fn port_entry(
    service: &str,
    entry: &Value,
    env: &Environment,
) -> Result<Vec<ComposeForward>, String> {
    match entry {
        Value::Number(n) => n
            .as_u64()
            .and_then(|n| u16::try_from(n).ok())
            .filter(|&n| n != 0)
            .map(|p| vec![forward(service, p, None, None, Protocol::Tcp)])
            .ok_or_else(|| format!("expected a port from 1 to 65535, got {n}")),
        Value::String(s) => interpolate(s, env).and_then(|s| parse_short(service, &s)),
        Value::Mapping(m) => parse_long(service, m, env),
        other => Err(format!(
            "expected a port string, number or mapping, got {}",
            kind(other)
        )),
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
