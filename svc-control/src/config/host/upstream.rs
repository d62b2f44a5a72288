//! `[upstream]`: how svcd's proxy reaches the internet (directly unless `proxy` is set).

use std::{net::IpAddr, path::PathBuf};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::checks;

/// `[upstream]`: how svcd's proxy reaches the internet (directly unless `proxy` is set).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamFile {
    /// The operator's HTTP forward proxy, `http://host:port`: HTTPS goes through it as
    /// `CONNECT` tunnels, plain HTTP as absolute-form requests.
    pub proxy: Option<String>,
    /// A root-only file holding `user:password` for the forward proxy (Basic).
    pub proxy_credentials_file: Option<PathBuf>,
    /// Hosts dialled directly: `*`, domains (`example.com`, `.example.com`), addresses, CIDRs.
    pub no_proxy: Option<Vec<String>>,
}

impl UpstreamFile {
    /// An `http://host:port` URL without path or credentials, a root-readable credentials
    /// file path, `no_proxy` entries that parse; `None` when no forward proxy is set.
    pub(super) fn validate(
        self,
        err: &mut impl FnMut(&str, String),
    ) -> Option<UpstreamProxyConfig> {
        let Some(url) = self.proxy else {
            if self.proxy_credentials_file.is_some() || self.no_proxy.is_some() {
                err(
                    "upstream.proxy",
                    "proxy_credentials_file and no_proxy need upstream.proxy".into(),
                );
            }
            return None;
        };
        if !is_plain_http_proxy(&url) {
            err(
                "upstream.proxy",
                format!(
                    "expected http://host:port (credentials go in proxy_credentials_file), got {url:?}"
                ),
            );
        }
        if let Some(p) = &self.proxy_credentials_file {
            checks::check_absolute("upstream.proxy_credentials_file", p, err);
        }
        let no_proxy = self.no_proxy.unwrap_or_default();
        for (i, n) in no_proxy.iter().enumerate() {
            if let Err(e) = NoProxy::parse(n) {
                err(&format!("upstream.no_proxy[{i}]"), e);
            }
        }
        Some(UpstreamProxyConfig {
            url,
            credentials_file: self.proxy_credentials_file,
            no_proxy,
        })
    }
}

/// `http://host:port`, with no path, query or user information.
fn is_plain_http_proxy(url: &str) -> bool {
    url.parse::<http::Uri>().is_ok_and(|u| {
        u.scheme_str() == Some("http")
            && u.host().is_some_and(|h| !h.is_empty())
            && u.port_u16().is_some()
            && u.path_and_query().is_none_or(|p| p.as_str() == "/")
            && !u.authority().is_some_and(|a| a.as_str().contains('@'))
    })
}

/// The forward proxy's settings, validated (the credentials are read when svcd starts).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct UpstreamProxyConfig {
    /// `http://host:port`.
    pub url: String,
    pub credentials_file: Option<std::path::PathBuf>,
    pub no_proxy: Vec<String>,
}

/// One `no_proxy` entry, as curl and most tools read them: `*` (everything), a domain
/// (`example.com` or `.example.com`: the name and every name below it), an IP address or a
/// CIDR (hosts written as addresses in it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoProxy {
    All,
    Domain(String),
    Net(IpNet),
}

impl NoProxy {
    /// Parse one entry; what is wrong with it.
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t == "*" {
            return Ok(Self::All);
        }
        if let Ok(n) = t.parse::<IpNet>() {
            return Ok(Self::Net(n));
        }
        if let Ok(ip) = t.parse::<IpAddr>() {
            return Ok(Self::Net(IpNet::from(ip)));
        }
        let d = t
            .trim_start_matches('.')
            .trim_end_matches('.')
            .to_ascii_lowercase();
        if d.is_empty()
            || !d
                .split('.')
                .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        {
            return Err(format!(
                "no_proxy entry {s:?}: expected *, a domain (example.com, .example.com), an IP address or a CIDR"
            ));
        }
        Ok(Self::Domain(d))
    }

    /// Whether `host` (a name or an address, as in a URI) is dialled directly.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        match self {
            Self::All => true,
            Self::Net(n) => host.parse::<IpAddr>().is_ok_and(|ip| n.contains(&ip)),
            Self::Domain(d) => {
                let h = host.trim_end_matches('.').to_ascii_lowercase();
                h == *d || h.ends_with(&format!(".{d}"))
            }
        }
    }
}
