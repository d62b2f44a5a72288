//! The name ↔ dialled-address binding of the proxy (ARCHITECTURE "The HTTPS path"): a
//! connection the guest dialled to one allowed host's address cannot present another allowed
//! name, as a TLS server name ([`server_name`]) or as a plain-HTTP `Host` ([`plain_host`]).
//!
//! Pure: the proxy asks the DNS guard's view (`proxy::Sandboxes::dialled_matches`) and passes
//! its answer in as a [`Dialled`].

use std::net::IpAddr;

use crate::hosts::{Allowlist, Authority};

/// Where the guest's connection was going, and whether the DNS guard answered the name in
/// question with that address (or the name is the address itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialled {
    /// The dialled address is not known (a proxy without the fence's redirect): nothing to
    /// bind to.
    Unknown,
    /// The guard answered the name with this address.
    Answered(IpAddr),
    /// The guard did not answer the name with this address.
    NotAnswered(IpAddr),
}

impl Dialled {
    /// The outcome of asking `answered(address)` about a connection dialled to `dialled`
    /// (`None`: unknown, then nothing is asked).
    pub fn observe(dialled: Option<IpAddr>, answered: impl FnOnce(IpAddr) -> bool) -> Self {
        match dialled {
            None => Self::Unknown,
            Some(a) if answered(a) => Self::Answered(a),
            Some(a) => Self::NotAnswered(a),
        }
    }
}

/// A name presented on a connection the guard did not answer it for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The name presented (normalised).
    pub name: String,
    /// The address the guest dialled.
    pub dialled: IpAddr,
}

/// Whether a TLS server name (already admitted, normalised) may be served on a connection
/// dialled as `dialled` says.
pub fn server_name(name: &str, dialled: Dialled) -> Result<(), Mismatch> {
    match dialled {
        Dialled::Unknown | Dialled::Answered(_) => Ok(()),
        Dialled::NotAnswered(dialled) => Err(Mismatch {
            name: name.to_owned(),
            dialled,
        }),
    }
}

/// The name a plain-HTTP request's `Host` must be bound to, if the binding applies: a missing
/// or unreadable `Host`, or a name off the sandbox's allowlist, is the request policy's to
/// refuse (`request::decide`), not the binding's.
pub fn host_to_bind(allowed: &Allowlist, host: Option<&str>) -> Option<String> {
    let authority = Authority::parse(host?, 80).ok()?;
    allowed.find_name(&authority.host)?;
    Some(authority.host_str())
}

/// Whether a plain-HTTP request for `name` (from [`host_to_bind`]) may be served on a
/// connection dialled as `dialled` says.
pub fn plain_host(name: &str, dialled: Dialled) -> Result<(), Mismatch> {
    server_name(name, dialled)
}

impl Mismatch {
    /// The HTTP status of a plain-HTTP request refused for it.
    pub const STATUS: u16 = 421;
    /// The audit record's and the refusal body's rule for a plain-HTTP request refused for it.
    pub const RULE: &'static str = "address-binding";

    /// Why a TLS connection is refused (the audit record's rule, as the proxy writes it).
    pub fn server_name_reason(&self) -> String {
        format!(
            "server name {} does not match the address dialled ({}), which the DNS guard did not \
             answer for it: refused",
            self.name, self.dialled
        )
    }

    /// Why a plain-HTTP request is refused.
    pub fn host_reason(&self) -> String {
        format!(
            "Host {} does not match the address dialled ({}), which the DNS guard did not \
             answer for it",
            self.name, self.dialled
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hosts::HostPattern;

    fn allow() -> Allowlist {
        Allowlist(
            ["api.example.com", "*.cdn.example.net", "192.0.2.7"]
                .iter()
                .map(|h| HostPattern::parse(h).unwrap())
                .collect(),
        )
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 20));

    #[test]
    fn observe_asks_only_about_a_known_address() {
        let cases: &[(&str, Option<IpAddr>, bool, Dialled)] = &[
            ("unknown_is_not_asked", None, false, Dialled::Unknown),
            ("answered", Some(A), true, Dialled::Answered(A)),
            ("not_answered", Some(A), false, Dialled::NotAnswered(A)),
        ];
        for (case, dialled, answer, want) in cases {
            let mut asked = None;
            let got = Dialled::observe(*dialled, |a| {
                asked = Some(a);
                *answer
            });
            assert_eq!(got, *want, "{case}");
            assert_eq!(asked, *dialled, "{case}");
        }
    }

    #[test]
    fn server_name_bindings() {
        let cases: &[(&str, Dialled, bool)] = &[
            ("no_dialled_address_binds_nothing", Dialled::Unknown, true),
            ("answered_for_the_name", Dialled::Answered(A), true),
            ("answered_for_another_name", Dialled::NotAnswered(A), false),
        ];
        for (case, dialled, ok) in cases {
            assert_eq!(server_name("a.example", *dialled).is_ok(), *ok, "{case}");
        }
        let refused = server_name("a.example", Dialled::NotAnswered(A)).unwrap_err();
        assert_eq!(
            refused.server_name_reason(),
            "server name a.example does not match the address dialled (192.0.2.20), which the \
             DNS guard did not answer for it: refused"
        );
    }

    #[test]
    fn plain_hosts_bound_only_when_allowed_and_readable() {
        let cases: &[(&str, Option<&str>, Option<&str>)] = &[
            ("no_host_is_the_policy_s", None, None),
            ("unreadable_host_is_the_policy_s", Some("a b"), None),
            (
                "host_off_the_list_is_the_policy_s",
                Some("other.example"),
                None,
            ),
            (
                "allowed_host",
                Some("API.example.com"),
                Some("api.example.com"),
            ),
            (
                "allowed_host_with_port",
                Some("api.example.com:8080"),
                Some("api.example.com"),
            ),
            (
                "wildcard_host",
                Some("x.cdn.example.net"),
                Some("x.cdn.example.net"),
            ),
            ("ip_literal", Some("192.0.2.7"), Some("192.0.2.7")),
        ];
        for (case, host, want) in cases {
            assert_eq!(host_to_bind(&allow(), *host).as_deref(), *want, "{case}");
        }
    }

    #[test]
    fn plain_host_refusal_names_the_host_and_the_address() {
        assert!(plain_host("api.example.com", Dialled::Unknown).is_ok());
        assert!(plain_host("api.example.com", Dialled::Answered(A)).is_ok());
        let refused = plain_host("api.example.com", Dialled::NotAnswered(A)).unwrap_err();
        assert_eq!((Mismatch::STATUS, Mismatch::RULE), (421, "address-binding"));
        assert_eq!(
            refused.host_reason(),
            "Host api.example.com does not match the address dialled (192.0.2.20), which the \
             DNS guard did not answer for it"
        );
    }
}
