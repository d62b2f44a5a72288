//! `[network]`: the pools the per-sandbox links are cut from, and the destinations the
//! operator allows beyond policy's classes.

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use super::defaults;

/// `[network]` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkFile {
    /// Pool the per-sandbox IPv4 /30 links are cut from.
    pub ipv4_pool: Option<String>,
    /// Pool the per-sandbox IPv6 /64 links are cut from.
    pub ipv6_pool: Option<String>,
    /// Destination CIDRs the operator explicitly allows although policy's destination classes
    /// would refuse them (e.g. a private registry mirror).
    pub allow_cidrs: Option<Vec<String>>,
}

/// `[network]`, validated (its fields land flat in `HostConfig`).
pub(super) struct Network {
    pub ipv4_pool: Ipv4Net,
    pub ipv6_pool: Ipv6Net,
    pub allow_cidrs: Vec<IpNet>,
}

impl NetworkFile {
    /// Check each key, reporting every error through `err`.
    pub(super) fn validate(self, err: &mut impl FnMut(&str, String)) -> Network {
        Network {
            ipv4_pool: ipv4_pool(self.ipv4_pool.as_deref(), err),
            ipv6_pool: ipv6_pool(self.ipv6_pool.as_deref(), err),
            allow_cidrs: allow_cidrs(self.allow_cidrs.unwrap_or_default(), err),
        }
    }
}

fn ipv4_pool(value: Option<&str>, err: &mut impl FnMut(&str, String)) -> Ipv4Net {
    let v4 = value.unwrap_or(defaults::IPV4_POOL);
    match v4.parse::<Ipv4Net>() {
        Ok(n) if n.prefix_len() <= 28 => n,
        Ok(_) => {
            err(
                "network.ipv4_pool",
                format!("pool {v4} is too small: a prefix of /28 or shorter is needed"),
            );
            Ipv4Net::default()
        }
        Err(_) => {
            err(
                "network.ipv4_pool",
                format!(
                    "expected an IPv4 CIDR such as {}, got {v4:?}",
                    defaults::IPV4_POOL
                ),
            );
            Ipv4Net::default()
        }
    }
}

fn ipv6_pool(value: Option<&str>, err: &mut impl FnMut(&str, String)) -> Ipv6Net {
    let v6 = value.unwrap_or(defaults::IPV6_POOL);
    match v6.parse::<Ipv6Net>() {
        Ok(n) if n.prefix_len() <= 56 => n,
        Ok(_) => {
            err(
                "network.ipv6_pool",
                format!("pool {v6} is too small: a prefix of /56 or shorter is needed"),
            );
            Ipv6Net::default()
        }
        Err(_) => {
            err(
                "network.ipv6_pool",
                format!(
                    "expected an IPv6 CIDR such as {}, got {v6:?}",
                    defaults::IPV6_POOL
                ),
            );
            Ipv6Net::default()
        }
    }
}

fn allow_cidrs(cidrs: Vec<String>, err: &mut impl FnMut(&str, String)) -> Vec<IpNet> {
    let mut allow = Vec::new();
    for (i, c) in cidrs.iter().enumerate() {
        match c.parse::<IpNet>() {
            Ok(n) => allow.push(n),
            Err(_) => err(
                &format!("network.allow_cidrs[{i}]"),
                format!("expected a CIDR, got {c:?}"),
            ),
        }
    }
    allow
}
