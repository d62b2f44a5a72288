//! `[dns]`: the DNS guard's upstream resolvers and its port.

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
};

use serde::{Deserialize, Serialize};

use super::defaults;

/// `[dns]` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DnsFile {
    /// Upstream resolvers (`IP` or `IP:port`); empty or absent: the nameservers of `resolv_conf`.
    pub upstreams: Option<Vec<String>>,
    pub resolv_conf: Option<PathBuf>,
    /// Port the DNS guard listens on (the fence redirects guests' DNS to it).
    pub guard_port: Option<u16>,
}

/// `[dns]`, validated but for `resolv_conf` (checked with svcd's other paths).
pub(super) struct Dns {
    pub upstreams: Vec<SocketAddr>,
    pub guard_port: u16,
}

impl DnsFile {
    /// Check the upstreams and the guard's port, reporting every error through `err`.
    pub(super) fn validate(&self, err: &mut impl FnMut(&str, String)) -> Dns {
        let mut upstreams = Vec::new();
        for (i, u) in self.upstreams.iter().flatten().enumerate() {
            match parse_upstream(u) {
                Some(a) => upstreams.push(a),
                None => err(
                    &format!("dns.upstreams[{i}]"),
                    format!("expected IP or IP:port (IPv6 as [addr]:port), got {u:?}"),
                ),
            }
        }
        let guard_port = self.guard_port.unwrap_or(defaults::GUARD_PORT);
        if guard_port == 0 {
            err(
                "dns.guard_port",
                "expected a port from 1 to 65535, got 0".into(),
            );
        }
        Dns {
            upstreams,
            guard_port,
        }
    }
}

/// `IP` (port 53) or `IP:port` / `[IPv6]:port`.
pub fn parse_upstream(s: &str) -> Option<SocketAddr> {
    s.parse::<SocketAddr>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)))
}

/// Nameservers of a resolv.conf text, as upstream addresses.
pub fn resolv_conf_nameservers(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|ip| ip.split('%').next()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}
