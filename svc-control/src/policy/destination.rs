//! Destination address classes (both egress modes): addresses a sandbox never reaches unless
//! the operator explicitly allows a CIDR in the host configuration (`network.allow_cidrs`).
//!
//! Refused classes: unspecified, loopback, link-local (cloud metadata included), multicast,
//! broadcast, private networks (RFC 1918, unique-local, shared CGNAT space), the IPv6 forms
//! that carry an IPv4 address (mapped, compatible, NAT64 `64:ff9b::/96` and `64:ff9b:1::/48`,
//! 6to4 `2002::/16`, Teredo `2001::/32`), reserved space, the host's own addresses and every
//! sandbox's subnet. An embedded IPv4 address is never looked through: the whole IPv6 form is
//! refused, so a guest cannot reach an IPv4 address the fence would not let it reach directly.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::Serialize;

/// Why an address is refused, or `Public`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AddressClass {
    Public,
    Unspecified,
    Loopback,
    /// 169.254.169.254, fd00:ec2::254 (and the rest of link-local / the AWS IPv6 endpoint).
    CloudMetadata,
    LinkLocal,
    Multicast,
    Broadcast,
    Private,
    /// IPv4-mapped, IPv4-compatible, NAT64, 6to4, Teredo.
    Ipv4Embedding,
    /// Documentation ranges are public for policy (tests use them); these are the rest of the
    /// reserved space: 0/8, 240/4, benchmarking 198.18/15, IETF 192.0.0/24, discard 100::/64.
    Reserved,
    /// One of the host's own addresses.
    Host,
    /// Inside a sandbox subnet (another sandbox, or this sandbox's own link).
    Sandbox,
}

impl AddressClass {
    pub const fn is_public(self) -> bool {
        matches!(self, Self::Public)
    }
}

/// What the host looks like to the classifier: its own addresses and the sandbox pools, plus
/// the operator's explicit exceptions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostNetwork {
    pub host_addresses: Vec<IpAddr>,
    pub sandbox_pools: Vec<IpNet>,
    pub allow_cidrs: Vec<IpNet>,
}

/// The verdict on one destination address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DestinationVerdict {
    pub class: AddressClass,
    /// Refused classes can be allowed by an operator CIDR.
    pub allowed_by_operator: bool,
}

impl DestinationVerdict {
    pub const fn reachable(self) -> bool {
        self.class.is_public() || self.allowed_by_operator
    }
}

/// Every refused class as CIDRs, for the fence's tries and the nftables forward layer.
pub const REFUSED_CIDRS: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/8",
    "64:ff9b::/96",
    "64:ff9b:1::/48",
    "100::/64",
    "2001::/32",
    "2002::/16",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
];

/// The CIDRs the fence refuses for every sandbox (the classes above, the host's addresses and
/// the sandbox pools), and the operator's exceptions, which reopen part of a class but never a
/// host address or a sandbox pool (those are listed again after the exceptions, so the longest
/// prefix names them).
pub fn fence_cidrs(net: &HostNetwork) -> (Vec<IpNet>, Vec<IpNet>) {
    let mut deny: Vec<IpNet> = REFUSED_CIDRS
        .iter()
        .filter_map(|c| c.parse().ok())
        .collect();
    deny.extend(net.sandbox_pools.iter().copied());
    deny.extend(net.host_addresses.iter().map(|a| IpNet::from(*a)));
    let allow = net
        .allow_cidrs
        .iter()
        .filter(|c| {
            !net.sandbox_pools
                .iter()
                .any(|p| p.contains(*c) || c.contains(p))
        })
        .copied()
        .collect();
    (deny, allow)
}

/// Classify a destination for a sandbox.
pub fn classify(addr: IpAddr, net: &HostNetwork) -> DestinationVerdict {
    let class = if net.host_addresses.contains(&addr) {
        AddressClass::Host
    } else if net.sandbox_pools.iter().any(|p| p.contains(&addr)) {
        AddressClass::Sandbox
    } else {
        address_class(addr)
    };
    DestinationVerdict {
        class,
        allowed_by_operator: !class.is_public()
            && net.allow_cidrs.iter().any(|c| c.contains(&addr)),
    }
}

/// The class of an address on its own, without host context.
pub fn address_class(addr: IpAddr) -> AddressClass {
    match addr {
        IpAddr::V4(v4) => v4_class(v4),
        IpAddr::V6(v6) => v6_class(v6),
    }
}

fn v4_class(a: Ipv4Addr) -> AddressClass {
    let o = a.octets();
    if a.is_unspecified() || o[0] == 0 {
        AddressClass::Unspecified
    } else if a.is_loopback() {
        AddressClass::Loopback
    } else if a == Ipv4Addr::new(169, 254, 169, 254) || a == Ipv4Addr::new(169, 254, 170, 2) {
        AddressClass::CloudMetadata
    } else if a.is_link_local() {
        AddressClass::LinkLocal
    } else if a.is_multicast() {
        AddressClass::Multicast
    } else if a.is_broadcast() {
        AddressClass::Broadcast
    } else if a.is_private() || (o[0] == 100 && (o[1] & 0xc0) == 64) {
        AddressClass::Private
    } else if o[0] >= 240
        || (o[0] == 198 && (o[1] & 0xfe) == 18)
        || (o[0] == 192 && o[1] == 0 && o[2] == 0)
    {
        AddressClass::Reserved
    } else {
        AddressClass::Public
    }
}

fn v6_class(a: Ipv6Addr) -> AddressClass {
    let s = a.segments();
    if a.is_unspecified() {
        AddressClass::Unspecified
    } else if a.is_loopback() {
        AddressClass::Loopback
    } else if a == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
        AddressClass::CloudMetadata
    } else if (s[0] & 0xffc0) == 0xfe80 {
        AddressClass::LinkLocal
    } else if (s[0] & 0xff00) == 0xff00 {
        AddressClass::Multicast
    } else if is_ipv4_embedding(a) {
        AddressClass::Ipv4Embedding
    } else if (s[0] & 0xfe00) == 0xfc00 || (s[0] & 0xffc0) == 0xfec0 {
        AddressClass::Private
    } else if s[0] == 0x100 && s[1] == 0 && s[2] == 0 && s[3] == 0 {
        AddressClass::Reserved
    } else if (s[0] & 0xff00) == 0 {
        // The rest of ::/8 is reserved (the mapped and compatible forms are caught above).
        AddressClass::Reserved
    } else {
        AddressClass::Public
    }
}

/// IPv6 forms that carry an IPv4 address a packet could end up at.
pub fn is_ipv4_embedding(a: Ipv6Addr) -> bool {
    let s = a.segments();
    let mapped = s[..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff;
    let compatible = s[..6] == [0, 0, 0, 0, 0, 0] && !(s[6] == 0 && s[7] <= 1);
    let translated = s[..4] == [0, 0, 0, 0] && s[4] == 0xffff && s[5] == 0; // ::ffff:0:a.b.c.d (SIIT)
    let nat64 = s[0] == 0x64 && s[1] == 0xff9b && (s[2..6] == [0, 0, 0, 0] || s[2] == 1);
    let six_to_four = s[0] == 0x2002;
    let teredo = s[0] == 0x2001 && s[1] == 0;
    mapped || compatible || translated || nat64 || six_to_four || teredo
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> AddressClass {
        address_class(s.parse().unwrap())
    }

    #[test]
    fn address_class_table() {
        use AddressClass::*;
        let cases: &[(&str, &str, AddressClass)] = &[
            ("public_v4", "93.184.216.34", Public),
            ("documentation_v4_is_public", "192.0.2.10", Public),
            ("public_v6", "2606:2800:220:1::1", Public),
            ("documentation_v6_is_public", "2001:db8::1", Public),
            ("unspecified_v4", "0.0.0.0", Unspecified),
            ("this_network_v4", "0.1.2.3", Unspecified),
            ("unspecified_v6", "::", Unspecified),
            ("loopback_v4", "127.0.0.1", Loopback),
            ("loopback_v4_other", "127.255.0.1", Loopback),
            ("loopback_v6", "::1", Loopback),
            ("aws_metadata_v4", "169.254.169.254", CloudMetadata),
            ("ecs_metadata_v4", "169.254.170.2", CloudMetadata),
            ("aws_metadata_v6", "fd00:ec2::254", CloudMetadata),
            ("link_local_v4", "169.254.1.1", LinkLocal),
            ("link_local_v6", "fe80::1", LinkLocal),
            ("multicast_v4", "224.0.0.251", Multicast),
            ("multicast_v6", "ff02::fb", Multicast),
            ("broadcast", "255.255.255.255", Broadcast),
            ("rfc1918_10", "10.1.2.3", Private),
            ("rfc1918_172", "172.16.0.1", Private),
            ("rfc1918_192", "192.168.1.1", Private),
            ("cgnat", "100.64.0.1", Private),
            ("just_outside_cgnat", "100.128.0.1", Public),
            ("unique_local_v6", "fd12:3456::1", Private),
            ("site_local_v6", "fec0::1", Private),
            ("v4_mapped", "::ffff:169.254.169.254", Ipv4Embedding),
            ("v4_mapped_public", "::ffff:93.184.216.34", Ipv4Embedding),
            ("v4_compatible", "::127.0.0.1", Ipv4Embedding),
            ("siit_translated", "::ffff:0:10.0.0.1", Ipv4Embedding),
            ("nat64_well_known", "64:ff9b::a9fe:a9fe", Ipv4Embedding),
            ("nat64_local_use", "64:ff9b:1::a00:1", Ipv4Embedding),
            ("six_to_four", "2002:a9fe:a9fe::1", Ipv4Embedding),
            (
                "teredo",
                "2001:0:4136:e378:8000:63bf:3fff:fdd2",
                Ipv4Embedding,
            ),
            ("reserved_class_e", "240.0.0.1", Reserved),
            ("benchmarking", "198.18.0.1", Reserved),
            ("ietf_protocol", "192.0.0.8", Reserved),
            ("discard_only_v6", "100::1", Reserved),
        ];
        for (name, addr, expected) in cases {
            assert_eq!(class(addr), *expected, "{name}: {addr}");
        }
    }

    #[test]
    fn refused_cidrs_agree_with_the_classifier() {
        for c in REFUSED_CIDRS {
            let net: IpNet = c.parse().unwrap();
            for addr in [net.network(), net.broadcast()] {
                assert!(
                    !address_class(addr).is_public(),
                    "{c}: {addr} is classified public"
                );
            }
        }
        let public = [
            "93.184.216.34",
            "1.1.1.1",
            "8.8.8.8",
            "192.0.2.1",
            "2606:4700::1111",
            "2001:db8::1",
        ];
        for p in public {
            let a: IpAddr = p.parse().unwrap();
            let covered = REFUSED_CIDRS
                .iter()
                .any(|c| c.parse::<IpNet>().unwrap().contains(&a));
            assert!(!covered, "{p} is public but a refused CIDR covers it");
        }
    }

    #[test]
    fn host_and_sandbox_addresses_are_refused_and_operator_cidrs_open_them() {
        let net = HostNetwork {
            host_addresses: vec!["198.51.100.7".parse().unwrap()],
            sandbox_pools: vec!["10.203.0.0/16".parse().unwrap()],
            allow_cidrs: vec!["10.9.0.0/16".parse().unwrap()],
        };
        let v = |s: &str| classify(s.parse().unwrap(), &net);
        assert_eq!(v("198.51.100.7").class, AddressClass::Host);
        assert!(!v("198.51.100.7").reachable());
        assert_eq!(v("10.203.4.2").class, AddressClass::Sandbox);
        assert!(!v("10.203.4.2").reachable());
        assert!(v("10.9.1.1").reachable(), "operator-allowed private range");
        assert!(!v("10.8.1.1").reachable());
        assert!(v("198.51.100.8").reachable());
    }
}
