//! What the DNS guard may do with a question (issue 5), decided here like every other rule.
//!
//! - A name the sandbox may not reach: **REFUSED**, answered locally, never forwarded (the
//!   upstream must never see it). REFUSED rather than NXDOMAIN: the name may well exist, and an
//!   agent should learn that the perimeter, not the DNS, said no.
//! - An allowed name: A, AAAA and CNAME are resolved upstream.
//! - HTTPS and SVCB for an allowed name: an empty answer (NOERROR, no records). Their ECH keys
//!   and address hints would let a client route around the guard's commit and the proxy's SNI
//!   check; an empty answer makes clients fall back to A/AAAA.
//! - ANY: REFUSED (RFC 8482 lets a server decline it). AXFR, IXFR: REFUSED. Other types for an
//!   allowed name: an empty answer; they open nothing in the fence and are a data channel the
//!   guard does not need to carry.
//! - Anything but one IN-class question in a standard query: FORMERR / NOTIMP / REFUSED.

use serde::Serialize;

use crate::hosts::{Allowlist, HostKind, HostPattern, normalize_name};

/// The guard's decision on a question.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "decision")]
pub enum DnsDecision {
    /// Resolve upstream; commit and answer. Carries the ports the answer's addresses open:
    /// those of every pattern that allows the name ([`Allowlist::host_ports`]).
    Resolve {
        #[serde(skip)]
        ports: Vec<u16>,
    },
    /// Answer NOERROR with no records.
    Empty { reason: &'static str },
    /// Answer REFUSED.
    Refuse { reason: &'static str },
}

/// Record types by number (IANA).
pub mod qtype {
    pub const A: u16 = 1;
    pub const CNAME: u16 = 5;
    pub const AAAA: u16 = 28;
    pub const SVCB: u16 = 64;
    pub const HTTPS: u16 = 65;
    pub const IXFR: u16 = 251;
    pub const AXFR: u16 = 252;
    pub const ANY: u16 = 255;
}

/// Decide a question for a sandbox with allowlist `allowed`. `name` is the question's name as
/// written (any case, trailing dot or not).
pub fn decide(allowed: &Allowlist, name: &str, record_type: u16) -> DnsDecision {
    decide_with(name, record_type, |normal| {
        Some(allowed.host_ports(&HostKind::Exact(normal.to_owned()))).filter(|p| !p.is_empty())
    })
}

/// Decide a question for a sandbox in AllowAll mode: every valid name resolves (the fence, not
/// the guard, keeps the refused destination classes out, and the guard still removes their
/// addresses from answers); the record-type rules are the same as in Curated mode.
pub fn decide_allow_all(name: &str, record_type: u16) -> DnsDecision {
    decide_with(name, record_type, |normal| {
        HostPattern::parse(normal).ok().map(|p| p.ports().to_vec())
    })
}

fn decide_with(
    name: &str,
    record_type: u16,
    find: impl FnOnce(&str) -> Option<Vec<u16>>,
) -> DnsDecision {
    match record_type {
        qtype::ANY => {
            return DnsDecision::Refuse {
                reason: "ANY queries are not answered",
            };
        }
        qtype::AXFR | qtype::IXFR => {
            return DnsDecision::Refuse {
                reason: "zone transfers are not allowed",
            };
        }
        _ => {}
    }
    let Ok(normal) = normalize_name(name) else {
        return DnsDecision::Refuse {
            reason: "not a valid host name",
        };
    };
    // A name matches a pattern whatever the pattern's port; its answer opens the ports of
    // every pattern that matches it.
    let Some(ports) = find(&normal) else {
        return DnsDecision::Refuse {
            reason: "name not allowed for this sandbox",
        };
    };
    match record_type {
        qtype::A | qtype::AAAA | qtype::CNAME => DnsDecision::Resolve { ports },
        qtype::HTTPS | qtype::SVCB => DnsDecision::Empty {
            reason: "HTTPS/SVCB records (ECH keys, address hints) are withheld",
        },
        _ => DnsDecision::Empty {
            reason: "only A, AAAA and CNAME are answered",
        },
    }
}

/// What the DNS guard answered one address with, for one sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Binding {
    /// The names (normalised) the address answered for.
    pub names: std::collections::HashSet<String>,
    /// The address was in the sandbox's fence before svcd (re)started: which names it answered
    /// for is not known any more.
    pub unknown: bool,
}

/// The SNI/address binding of the proxy (ARCHITECTURE "The HTTPS path"): a connection the
/// guest dialled to `dialled` may present server name `name` only if the DNS guard answered
/// `name` with that address (`binding`), or `name` is that address itself. An address learned
/// before a restart matches any allowed name until the guest resolves again.
pub fn dialled_matches(name: &str, dialled: std::net::IpAddr, binding: Option<&Binding>) -> bool {
    if name.parse::<std::net::IpAddr>() == Ok(dialled) {
        return true;
    }
    binding.is_some_and(|b| b.unknown || b.names.contains(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow() -> Allowlist {
        Allowlist(
            [
                "api.example.com",
                "*.cdn.example.net",
                "git.example.org:8443",
                "192.0.2.7",
            ]
            .iter()
            .map(|h| HostPattern::parse(h).unwrap())
            .collect(),
        )
    }

    #[test]
    fn dialled_address_bindings() {
        let bound = |names: &[&str], unknown| Binding {
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            unknown,
        };
        let a: std::net::IpAddr = "192.0.2.20".parse().unwrap();
        let cases: &[(&str, &str, Option<Binding>, bool)] = &[
            (
                "answered_for_it",
                "a.example",
                Some(bound(&["a.example"], false)),
                true,
            ),
            (
                "shared_address",
                "b.example",
                Some(bound(&["a.example", "b.example"], false)),
                true,
            ),
            (
                "answered_for_another",
                "b.example",
                Some(bound(&["a.example"], false)),
                false,
            ),
            ("never_answered", "a.example", None, false),
            (
                "learned_before_a_restart",
                "b.example",
                Some(bound(&[], true)),
                true,
            ),
            ("ip_literal_itself", "192.0.2.20", None, true),
            ("another_ip_literal", "192.0.2.21", None, false),
        ];
        for (case, name, binding, want) in cases {
            assert_eq!(dialled_matches(name, a, binding.as_ref()), *want, "{case}");
        }
    }

    #[test]
    fn an_answer_opens_the_ports_of_the_patterns_that_allowed_it() {
        let resolve = |ports: &[u16]| DnsDecision::Resolve {
            ports: ports.to_vec(),
        };
        assert_eq!(
            decide(&allow(), "API.example.com.", qtype::A),
            resolve(&[443, 80])
        );
        assert_eq!(
            decide(&allow(), "git.example.org", qtype::AAAA),
            resolve(&[8443])
        );
        let mut two = allow();
        two.0
            .push(HostPattern::parse("git.example.org:22").unwrap());
        assert_eq!(
            decide(&two, "git.example.org", qtype::A),
            resolve(&[8443, 22])
        );
        assert_eq!(
            decide_allow_all("anything.example.org", qtype::A),
            resolve(&[443, 80])
        );
    }

    #[test]
    fn allow_all_resolves_any_valid_name_with_the_same_type_rules() {
        use DnsDecision::*;
        let cases: &[(&str, &str, u16, &str)] = &[
            ("any_name", "anything.example.org", qtype::A, "resolve"),
            ("aaaa", "Anything.Example.ORG.", qtype::AAAA, "resolve"),
            (
                "https_withheld",
                "anything.example.org",
                qtype::HTTPS,
                "empty",
            ),
            ("any_refused", "anything.example.org", qtype::ANY, "refuse"),
            ("axfr_refused", "example.org", qtype::AXFR, "refuse"),
            ("not_a_name", "bad name", qtype::A, "refuse"),
        ];
        for (case, name, t, want) in cases {
            let got = match decide_allow_all(name, *t) {
                Resolve { .. } => "resolve",
                Empty { .. } => "empty",
                Refuse { .. } => "refuse",
            };
            assert_eq!(got, *want, "{case}");
        }
    }

    #[test]
    fn decisions() {
        use DnsDecision::*;
        let cases: &[(&str, &str, u16, &str)] = &[
            ("allowed_a", "api.example.com", qtype::A, "resolve"),
            ("allowed_aaaa", "api.example.com", qtype::AAAA, "resolve"),
            ("allowed_cname", "api.example.com", qtype::CNAME, "resolve"),
            (
                "allowed_case_and_dot",
                "API.Example.COM.",
                qtype::A,
                "resolve",
            ),
            (
                "wildcard_subdomain",
                "img.cdn.example.net",
                qtype::A,
                "resolve",
            ),
            ("wildcard_not_apex", "cdn.example.net", qtype::A, "refuse"),
            ("pattern_with_port", "git.example.org", qtype::A, "resolve"),
            ("not_allowed", "evil.example.org", qtype::A, "refuse"),
            (
                "exfil_label",
                "c2VjcmV0.evil.example.org",
                qtype::A,
                "refuse",
            ),
            (
                "subdomain_of_exact",
                "x.api.example.com",
                qtype::A,
                "refuse",
            ),
            (
                "suffix_trick",
                "api.example.com.evil.org",
                qtype::A,
                "refuse",
            ),
            ("ip_literal_name", "192.0.2.7", qtype::A, "refuse"),
            ("https_record", "api.example.com", qtype::HTTPS, "empty"),
            ("svcb_record", "api.example.com", qtype::SVCB, "empty"),
            ("txt_record", "api.example.com", 16, "empty"),
            ("mx_record", "api.example.com", 15, "empty"),
            ("txt_for_not_allowed", "evil.example.org", 16, "refuse"),
            ("any", "api.example.com", qtype::ANY, "refuse"),
            ("axfr", "api.example.com", qtype::AXFR, "refuse"),
            ("ixfr", "api.example.com", qtype::IXFR, "refuse"),
            ("bad_name", "exa mple.com", qtype::A, "refuse"),
            ("empty_name", "", qtype::A, "refuse"),
        ];
        for (name, q, t, want) in cases {
            let got = match decide(&allow(), q, *t) {
                Resolve { .. } => "resolve",
                Empty { .. } => "empty",
                Refuse { .. } => "refuse",
            };
            assert_eq!(got, *want, "{name}");
        }
    }
}
