//! Host names and host patterns: one normal form for every comparison svc makes (a leaf:
//! `config` parses them, `policy` decides with them).
//!
//! Normal form: IDNA (UTS #46) to ASCII, lower case, no trailing dot. A pattern is an exact
//! name, a wildcard `*.suffix` (which matches names *below* the suffix, never the suffix itself,
//! and is refused when the suffix is a public suffix such as `com`, `co.uk` or `github.io`), or
//! an IP literal; any of them may carry a `:port`. A pattern without a port allows the web
//! ports [`DEFAULT_PORTS`].

use std::{fmt, net::IpAddr, str::FromStr};

/// Ports a host pattern without an explicit port allows: HTTPS, and HTTP for redirects.
pub const DEFAULT_PORTS: [u16; 2] = [443, 80];

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
    #[error("wildcard {0:?} is not allowed: {1:?} is a public suffix, shared by unrelated owners")]
    PublicSuffixWildcard(String, String),
    #[error("{0:?} is a host pattern, not a host name")]
    NotAName(String),
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
            if is_public_suffix(&suffix) {
                return Err(HostError::PublicSuffixWildcard(input.to_owned(), suffix));
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

    /// Whether this pattern allows `host` (already normalised, see [`Authority`]) on `port`.
    pub fn matches(&self, host: &Authority) -> bool {
        self.allows_host(&host.host) && self.allows_port(host.port)
    }

    /// Whether this pattern allows the host `host` (normalised) on some port.
    pub fn allows_host(&self, host: &HostKind) -> bool {
        match (&self.kind, host) {
            (HostKind::Exact(p), HostKind::Exact(h)) => p == h,
            (HostKind::Wildcard(suffix), HostKind::Exact(h)) => h
                .strip_suffix(suffix.as_str())
                .is_some_and(|front| front.len() > 1 && front.ends_with('.')),
            (HostKind::Ip(p), HostKind::Ip(h)) => p == h,
            _ => false,
        }
    }

    /// The ports the pattern allows: its own, or [`DEFAULT_PORTS`] when it has none.
    pub fn ports(&self) -> &[u16] {
        match &self.port {
            Some(p) => std::slice::from_ref(p),
            None => &DEFAULT_PORTS,
        }
    }

    /// Whether the pattern allows `port`: its own port, or [`DEFAULT_PORTS`] when it has none.
    pub fn allows_port(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        }
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

/// A concrete destination: a normalised name or IP literal, and a port. Built from an SNI, a
/// `Host` header or `:authority`, or a URL.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Authority {
    /// Never [`HostKind::Wildcard`].
    pub host: HostKind,
    pub port: u16,
}

impl Authority {
    /// Parse `host[:port]` (`[v6]:port` for IPv6), with `default_port` when none is written.
    pub fn parse(input: &str, default_port: u16) -> Result<Self, HostError> {
        let p = HostPattern::parse(input)?;
        if matches!(p.kind, HostKind::Wildcard(_)) {
            return Err(HostError::NotAName(input.to_owned()));
        }
        Ok(Self {
            host: p.kind,
            port: p.port.unwrap_or(default_port),
        })
    }

    /// The normalised host without the port.
    pub fn host_str(&self) -> String {
        match &self.host {
            HostKind::Exact(n) | HostKind::Wildcard(n) => n.clone(),
            HostKind::Ip(ip) => ip.to_string(),
        }
    }
}

impl fmt::Display for Authority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostKind::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
            _ => write!(f, "{}:{}", self.host_str(), self.port),
        }
    }
}

/// An allowlist of host patterns.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(transparent)]
pub struct Allowlist(pub Vec<HostPattern>);

impl Allowlist {
    /// The first pattern that allows `host`, if any.
    pub fn find(&self, host: &Authority) -> Option<&HostPattern> {
        self.0.iter().find(|p| p.matches(host))
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The first pattern that allows the name `host` on any of its ports (for a server name or a
    /// DNS question, which carry no port).
    pub fn find_name(&self, host: &HostKind) -> Option<&HostPattern> {
        self.0.iter().find(|p| p.allows_host(host))
    }

    /// The ports the addresses of `host` open in the fence: those of every pattern that allows
    /// it, each once, in allowlist order. An exact name and a wildcard above it, or one name
    /// listed with two ports, each add theirs; the first match alone would leave the others'
    /// ports shut. Empty when no pattern allows the host.
    pub fn host_ports(&self, host: &HostKind) -> Vec<u16> {
        let mut ports = Vec::new();
        for p in self.0.iter().filter(|p| p.allows_host(host)) {
            for port in p.ports() {
                if !ports.contains(port) {
                    ports.push(*port);
                }
            }
        }
        ports
    }
}

/// Whether `name` (normalised) is a public suffix: `com`, `co.uk`, `github.io`, …
pub fn is_public_suffix(name: &str) -> bool {
    psl::suffix(name.as_bytes()).is_some_and(|s| s.as_bytes() == name.as_bytes())
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

    fn auth(s: &str) -> Authority {
        Authority::parse(s, 443).unwrap()
    }

    #[test]
    fn matching_cases() {
        let cases: &[(&str, &str, &str, bool)] = &[
            ("exact_same", "api.example.com", "api.example.com", true),
            (
                "exact_case_folded",
                "api.example.com",
                "API.Example.COM",
                true,
            ),
            (
                "exact_trailing_dot",
                "api.example.com",
                "api.example.com.",
                true,
            ),
            (
                "exact_other_name",
                "api.example.com",
                "api.example.org",
                false,
            ),
            (
                "exact_does_not_cover_subdomain",
                "example.com",
                "api.example.com",
                false,
            ),
            (
                "exact_suffix_trick",
                "example.com",
                "evilexample.com",
                false,
            ),
            (
                "default_ports_https",
                "api.example.com",
                "api.example.com:443",
                true,
            ),
            (
                "default_ports_http",
                "api.example.com",
                "api.example.com:80",
                true,
            ),
            (
                "default_ports_not_other",
                "api.example.com",
                "api.example.com:8443",
                false,
            ),
            (
                "explicit_port_only",
                "api.example.com:8443",
                "api.example.com:8443",
                true,
            ),
            (
                "explicit_port_not_443",
                "api.example.com:8443",
                "api.example.com",
                false,
            ),
            (
                "wildcard_subdomain",
                "*.cdn.example.com",
                "a.cdn.example.com",
                true,
            ),
            (
                "wildcard_deep_subdomain",
                "*.cdn.example.com",
                "a.b.cdn.example.com",
                true,
            ),
            (
                "wildcard_not_apex",
                "*.cdn.example.com",
                "cdn.example.com",
                false,
            ),
            (
                "wildcard_suffix_trick",
                "*.cdn.example.com",
                "evilcdn.example.com",
                false,
            ),
            (
                "wildcard_not_parent",
                "*.cdn.example.com",
                "example.com",
                false,
            ),
            ("ip_literal", "192.0.2.1", "192.0.2.1", true),
            ("ip_literal_other", "192.0.2.1", "192.0.2.2", false),
            ("ip_does_not_match_name", "192.0.2.1", "one.example", false),
            ("ipv6_literal", "2001:db8::1", "[2001:db8::1]:443", true),
            ("idna_name", "bücher.example", "xn--bcher-kva.example", true),
        ];
        for (name, pattern, host, expected) in cases {
            let p = HostPattern::parse(pattern).unwrap();
            assert_eq!(
                p.matches(&auth(host)),
                *expected,
                "{name}: {pattern} vs {host}"
            );
        }
    }

    #[test]
    fn a_name_opens_the_ports_of_every_pattern_that_allows_it() {
        let list = |hosts: &[&str]| {
            Allowlist(
                hosts
                    .iter()
                    .map(|h| HostPattern::parse(h).unwrap())
                    .collect(),
            )
        };
        let name = |n: &str| HostKind::Exact(n.to_owned());
        let cases: &[(&str, &[&str], &str, &[u16])] = &[
            ("no_port", &["a.example"], "a.example", &[443, 80]),
            ("own_port", &["a.example:5432"], "a.example", &[5432]),
            (
                "listed_with_two_ports",
                &["a.example", "a.example:8443"],
                "a.example",
                &[443, 80, 8443],
            ),
            (
                "exact_and_wildcard_above_it",
                &["*.cdn.example:8443", "x.cdn.example"],
                "x.cdn.example",
                &[8443, 443, 80],
            ),
            (
                "wildcard_ports_not_for_the_apex",
                &["*.cdn.example:8443", "cdn.example"],
                "cdn.example",
                &[443, 80],
            ),
            (
                "each_port_once",
                &["a.example:443", "a.example", "a.example:443"],
                "a.example",
                &[443, 80],
            ),
            (
                "other_names_add_nothing",
                &["a.example", "b.example:22"],
                "a.example",
                &[443, 80],
            ),
            ("not_allowed", &["b.example"], "a.example", &[]),
        ];
        for (case, hosts, host, want) in cases {
            assert_eq!(list(hosts).host_ports(&name(host)), *want, "{case}");
        }
    }

    #[test]
    fn authority_refuses_wildcards() {
        assert!(Authority::parse("*.example.com", 443).is_err());
        assert_eq!(auth("Example.com.").to_string(), "example.com:443");
        assert_eq!(auth("[2001:db8::1]:8443").to_string(), "[2001:db8::1]:8443");
    }

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
            ("wildcard_on_two_label_public_suffix", "*.co.uk"),
            ("wildcard_on_private_public_suffix", "*.github.io"),
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
