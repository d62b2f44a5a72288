//! Host names and host patterns: one normal form for every comparison svc makes.
//!
//! Normal form: IDNA (UTS #46) to ASCII, lower case, no trailing dot. A pattern is an exact
//! name, a wildcard `*.suffix` (which matches names *below* the suffix, never the suffix itself),
//! or an IP literal; any of them may carry a `:port`.

use std::{fmt, net::IpAddr, str::FromStr};

/// What a host pattern names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostKind {
    /// One DNS name, normalised.
    Exact(String),
    /// `*.suffix`: any name with at least one more label in front of `suffix` (normalised).
    Wildcard(String),
    /// An IP literal (IPv6 written in brackets when a port follows).
    Ip(IpAddr),
}

/// A parsed, normalised host pattern from configuration or the API.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostPattern {
    pub kind: HostKind,
    pub port: Option<u16>,
}

/// Why a host pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    #[error("host is empty")]
    Empty,
    #[error(
        "host {0:?} is not a valid DNS name (labels of 1 to 63 letters, digits or '-', 253 bytes at most)"
    )]
    InvalidName(String),
    #[error("port in {0:?} is not a number from 1 to 65535")]
    InvalidPort(String),
    #[error(
        "wildcard {0:?} is not allowed: only '*.' followed by a name of two or more labels, and never '*' alone"
    )]
    BadWildcard(String),
}

impl HostPattern {
    /// Parse and normalise a host pattern.
    pub fn parse(input: &str) -> Result<Self, HostError> {
        let trimmed = input.trim();
        if trimmed.is_empty() {
            return Err(HostError::Empty);
        }
        let (host, port) = split_port(trimmed)?;
        if let Ok(ip) = host.parse::<IpAddr>() {
            return Ok(Self {
                kind: HostKind::Ip(ip),
                port,
            });
        }
        if let Some(suffix) = host.strip_prefix("*.") {
            let suffix =
                normalize_name(suffix).map_err(|_| HostError::BadWildcard(input.to_owned()))?;
            if !suffix.contains('.') {
                return Err(HostError::BadWildcard(input.to_owned()));
            }
            return Ok(Self {
                kind: HostKind::Wildcard(suffix),
                port,
            });
        }
        if host.contains('*') {
            return Err(HostError::BadWildcard(input.to_owned()));
        }
        Ok(Self {
            kind: HostKind::Exact(normalize_name(host)?),
            port,
        })
    }

    /// The key two patterns clash on when listed in two places: the normalised host, ignoring
    /// the port.
    pub fn host_key(&self) -> String {
        match &self.kind {
            HostKind::Exact(n) => n.clone(),
            HostKind::Wildcard(s) => format!("*.{s}"),
            HostKind::Ip(ip) => ip.to_string(),
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.kind, self.port) {
            (HostKind::Ip(IpAddr::V6(ip)), Some(p)) => write!(f, "[{ip}]:{p}"),
            (_, Some(p)) => write!(f, "{}:{p}", self.host_key()),
            (_, None) => f.write_str(&self.host_key()),
        }
    }
}

impl serde::Serialize for HostPattern {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl FromStr for HostPattern {
    type Err = HostError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// Normalise one DNS name: IDNA to ASCII, lower case, trailing dot removed, labels checked.
pub fn normalize_name(name: &str) -> Result<String, HostError> {
    let bare = name.strip_suffix('.').unwrap_or(name);
    if bare.is_empty() {
        return Err(HostError::InvalidName(name.to_owned()));
    }
    let ascii = if bare.is_ascii() {
        bare.to_ascii_lowercase()
    } else {
        idna::domain_to_ascii(bare).map_err(|_| HostError::InvalidName(name.to_owned()))?
    };
    let valid = ascii.len() <= 253
        && ascii.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        });
    if valid {
        Ok(ascii)
    } else {
        Err(HostError::InvalidName(name.to_owned()))
    }
}

fn split_port(input: &str) -> Result<(&str, Option<u16>), HostError> {
    let bad_port = || HostError::InvalidPort(input.to_owned());
    if let Some(rest) = input.strip_prefix('[') {
        let (ip, after) = rest
            .split_once(']')
            .ok_or_else(|| HostError::InvalidName(input.to_owned()))?;
        return match after {
            "" => Ok((ip, None)),
            p => {
                let p = p.strip_prefix(':').ok_or_else(bad_port)?;
                Ok((ip, Some(parse_port(p).ok_or_else(bad_port)?)))
            }
        };
    }
    // A bare IPv6 literal has several colons and no port.
    if input.matches(':').count() > 1 {
        return Ok((input, None));
    }
    match input.split_once(':') {
        Some((host, p)) => Ok((host, Some(parse_port(p).ok_or_else(bad_port)?))),
        None => Ok((input, None)),
    }
}

fn parse_port(p: &str) -> Option<u16> {
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse::<u16>().ok().filter(|&p| p != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(s: &str) -> HostKind {
        HostKind::Exact(s.to_owned())
    }

    #[test]
    fn normalisation_cases() {
        let cases: &[(&str, &str, HostKind, Option<u16>)] = &[
            (
                "lower_case_is_kept",
                "example.com",
                exact("example.com"),
                None,
            ),
            (
                "upper_case_is_folded",
                "ExAmple.COM",
                exact("example.com"),
                None,
            ),
            (
                "trailing_dot_is_dropped",
                "example.com.",
                exact("example.com"),
                None,
            ),
            (
                "port_is_split",
                "example.com:8443",
                exact("example.com"),
                Some(8443),
            ),
            (
                "idna_is_punycoded",
                "bücher.example",
                exact("xn--bcher-kva.example"),
                None,
            ),
            (
                "surrounding_space_is_trimmed",
                " example.com ",
                exact("example.com"),
                None,
            ),
            (
                "ipv4_literal",
                "192.0.2.1",
                HostKind::Ip("192.0.2.1".parse().unwrap()),
                None,
            ),
            (
                "ipv6_literal",
                "2001:db8::1",
                HostKind::Ip("2001:db8::1".parse().unwrap()),
                None,
            ),
            (
                "ipv6_with_port",
                "[2001:db8::1]:443",
                HostKind::Ip("2001:db8::1".parse().unwrap()),
                Some(443),
            ),
            (
                "wildcard",
                "*.Example.com",
                HostKind::Wildcard("example.com".into()),
                None,
            ),
        ];
        for (name, input, kind, port) in cases {
            let got = HostPattern::parse(input).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(&got.kind, kind, "{name}");
            assert_eq!(&got.port, port, "{name}");
        }
    }

    #[test]
    fn refusal_cases() {
        let cases: &[(&str, &str)] = &[
            ("empty", ""),
            ("only_dot", "."),
            ("double_dot", "a..b"),
            ("label_too_long", &format!("{}.com", "a".repeat(64))),
            ("space_inside", "exa mple.com"),
            ("slash", "example.com/path"),
            ("port_zero", "example.com:0"),
            ("port_too_big", "example.com:65536"),
            ("port_not_a_number", "example.com:https"),
            ("star_alone", "*"),
            ("wildcard_on_tld", "*.com"),
            ("star_in_middle", "a.*.example.com"),
            ("leading_hyphen", "-a.example.com"),
        ];
        for (name, input) in cases {
            assert!(
                HostPattern::parse(input).is_err(),
                "{name}: {input:?} must be refused"
            );
        }
    }
}
