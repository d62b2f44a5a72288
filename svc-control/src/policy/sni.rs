//! The proxy's SNI gate: whether a ClientHello's server name may be served for a sandbox at
//! all, before any TLS is terminated. No ECH, a server name that is a host name, on the
//! sandbox's allowlist on the port the guest dialled (the proxy sends its requests there; any
//! port when the dialled one is unknown), then bound to the address the guest dialled
//! ([`bind`], with `policy::binding`).
//!
//! Pure: the proxy reads the ClientHello (`proxy::client_hello`) and asks the DNS guard's view,
//! and passes both in as values.

use super::binding::{self, Dialled};
use crate::hosts::{Allowlist, Authority};

/// What the gate reads of a ClientHello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello<'a> {
    /// The SNI server name, as sent.
    pub server_name: Option<&'a str>,
    /// The ClientHello offers Encrypted Client Hello (its real server name is hidden).
    pub ech: bool,
    /// The port the guest's connection was dialled to (`SO_ORIGINAL_DST`), if known.
    pub port: Option<u16>,
}

/// Why a TLS connection is refused at the gate. Its text is the audit record's rule, as the
/// proxy has always written it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("ClientHello offers ECH: refused")]
    Ech,
    #[error("ClientHello has no server name: refused")]
    NoServerName,
    #[error("server name {0:?} is not a host name")]
    NotAHostName(String),
    #[error("server name {0} is not allowed for this sandbox")]
    NotAllowed(String),
    #[error("server name {0} is not allowed on port {1} for this sandbox")]
    NotAllowedOnPort(String, u16),
    #[error("{}", .0.server_name_reason())]
    NotDialled(binding::Mismatch),
}

/// The server name (normalised) a ClientHello may be served for, on a sandbox allowing
/// `allowed`; then [`bind`] it to the dialled address.
pub fn admit(allowed: &Allowlist, hello: Hello<'_>) -> Result<String, Refusal> {
    if hello.ech {
        return Err(Refusal::Ech);
    }
    let Some(sni) = hello.server_name else {
        return Err(Refusal::NoServerName);
    };
    let Ok(authority) = Authority::parse(sni, 443) else {
        return Err(Refusal::NotAHostName(sni.to_owned()));
    };
    if allowed.find_name(&authority.host).is_none() {
        return Err(Refusal::NotAllowed(authority.host_str()));
    }
    if let Some(port) = hello.port
        && allowed
            .find(&Authority {
                host: authority.host.clone(),
                port,
            })
            .is_none()
    {
        return Err(Refusal::NotAllowedOnPort(authority.host_str(), port));
    }
    Ok(authority.host_str())
}

/// Whether an admitted server name may be served on a connection dialled as `dialled` says
/// (the DNS guard's answer for exactly that name).
pub fn bind(name: &str, dialled: Dialled) -> Result<(), Refusal> {
    binding::server_name(name, dialled).map_err(Refusal::NotDialled)
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::hosts::HostPattern;

    fn allow() -> Allowlist {
        Allowlist(
            [
                "api.example.com",
                "*.cdn.example.net",
                "git.example.org:8443",
            ]
            .iter()
            .map(|h| HostPattern::parse(h).unwrap())
            .collect(),
        )
    }

    fn hello(server_name: Option<&str>, ech: bool) -> Hello<'_> {
        Hello {
            server_name,
            ech,
            port: None,
        }
    }

    fn dialled(server_name: &str, port: u16) -> Hello<'_> {
        Hello {
            server_name: Some(server_name),
            ech: false,
            port: Some(port),
        }
    }

    #[test]
    fn the_gate_admits_only_allowed_host_names() {
        let cases: &[(&str, Hello<'_>, Result<&str, &str>)] = &[
            (
                "allowed_name",
                hello(Some("api.example.com"), false),
                Ok("api.example.com"),
            ),
            (
                "normalised",
                hello(Some("API.Example.com."), false),
                Ok("api.example.com"),
            ),
            (
                "wildcard",
                hello(Some("a.cdn.example.net"), false),
                Ok("a.cdn.example.net"),
            ),
            (
                "allowed_on_another_port_only",
                hello(Some("git.example.org"), false),
                Ok("git.example.org"),
            ),
            (
                "allowed_on_the_port_dialled",
                dialled("git.example.org", 8443),
                Ok("git.example.org"),
            ),
            (
                "allowed_on_443_dialled_on_443",
                dialled("api.example.com", 443),
                Ok("api.example.com"),
            ),
            (
                "allowed_on_8443_dialled_on_443",
                dialled("git.example.org", 443),
                Err("server name git.example.org is not allowed on port 443 for this sandbox"),
            ),
            (
                "allowed_on_443_dialled_on_8443",
                dialled("api.example.com", 8443),
                Err("server name api.example.com is not allowed on port 8443 for this sandbox"),
            ),
            (
                "not_allowed_at_all_says_so_whatever_the_port",
                dialled("other.example", 443),
                Err("server name other.example is not allowed for this sandbox"),
            ),
            (
                "ech_even_for_an_allowed_name",
                hello(Some("api.example.com"), true),
                Err("ClientHello offers ECH: refused"),
            ),
            (
                "no_server_name",
                hello(None, false),
                Err("ClientHello has no server name: refused"),
            ),
            (
                "not_a_host_name",
                hello(Some("a b"), false),
                Err(r#"server name "a b" is not a host name"#),
            ),
            (
                "not_the_sandbox_s",
                hello(Some("Other.example"), false),
                Err("server name other.example is not allowed for this sandbox"),
            ),
            (
                "wildcard_suffix_itself",
                hello(Some("cdn.example.net"), false),
                Err("server name cdn.example.net is not allowed for this sandbox"),
            ),
        ];
        for (case, hello, want) in cases {
            let got = admit(&allow(), *hello).map_err(|r| r.to_string());
            assert_eq!(got.as_deref().map_err(String::as_str), *want, "{case}");
        }
    }

    #[test]
    fn an_admitted_name_is_bound_to_the_dialled_address() {
        let a: IpAddr = "192.0.2.20".parse().unwrap();
        assert_eq!(bind("api.example.com", Dialled::Unknown), Ok(()));
        assert_eq!(bind("api.example.com", Dialled::Answered(a)), Ok(()));
        assert_eq!(
            bind("api.example.com", Dialled::NotAnswered(a))
                .unwrap_err()
                .to_string(),
            "server name api.example.com does not match the address dialled (192.0.2.20), \
             which the DNS guard did not answer for it: refused"
        );
    }
}
