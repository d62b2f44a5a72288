//! Destination address classes (both egress modes): addresses a sandbox never reaches unless
//! the operator explicitly allows a CIDR in the host configuration (`network.allow_cidrs`).
//!
//! Refused classes: unspecified, loopback, link-local (cloud metadata included), multicast,
//! broadcast, private networks (RFC 1918, unique-local, shared CGNAT space), the IPv6 forms
//! that carry an IPv4 address (mapped, compatible, NAT64 `64:ff9b::/96` and `64:ff9b:1::/48`,
//! 6to4 `2002::/16`, Teredo `2001::/32`), reserved space, the host's own addresses and every
//! sandbox's subnet. An embedded IPv4 address is never looked through: the whole IPv6 form is
//! refused, so a guest cannot reach an IPv4 address the fence would not let it reach directly.
//!
//! The same classes bound every address svc itself dials on a guest's behalf (the proxy's
//! upstream connections, the git relay's SSH connections, direct dials past the operator's
//! forward proxy): [`classify_dial`] adds svcd's own ports and reads an IPv4 address carried in
//! an IPv6 form as that IPv4 address, so `::ffff:127.0.0.1` is refused as loopback.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

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
    /// One of svcd's own listening ports on an address of this host (its loopback, its own
    /// addresses, a sandbox gateway): only ever a dial's class.
    Svcd,
}

impl AddressClass {
    pub const fn is_public(self) -> bool {
        matches!(self, Self::Public)
    }

    /// Whether an operator CIDR (`network.allow_cidrs`) can open this class: never the host's
    /// own addresses, the sandboxes' or svcd's ports (the fence lists those after the
    /// operator's exceptions, so they win there too).
    pub const fn operator_may_open(self) -> bool {
        !matches!(self, Self::Public | Self::Host | Self::Sandbox | Self::Svcd)
    }

    /// The class's name, as the audit and the refusals write it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Public => "public",
            Self::Unspecified => "unspecified",
            Self::Loopback => "loopback",
            Self::CloudMetadata => "cloud-metadata",
            Self::LinkLocal => "link-local",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::Private => "private",
            Self::Ipv4Embedding => "ipv4-embedding",
            Self::Reserved => "reserved",
            Self::Host => "host",
            Self::Sandbox => "sandbox",
            Self::Svcd => "svcd",
        }
    }
}

/// What the host looks like to the classifier: its own addresses and the sandbox pools, plus
/// the operator's explicit exceptions, and the ports svcd listens on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostNetwork {
    pub host_addresses: Vec<IpAddr>,
    pub sandbox_pools: Vec<IpNet>,
    pub allow_cidrs: Vec<IpNet>,
    /// svcd's own TCP ports (the DNS guard, the proxy, metrics): a dial to one of them on an
    /// address of this host is refused as [`AddressClass::Svcd`].
    pub svcd_ports: Vec<u16>,
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
        allowed_by_operator: class.operator_may_open()
            && net.allow_cidrs.iter().any(|c| c.contains(&addr)),
    }
}

/// Classify an address svc is about to dial for a guest (the proxy's upstream, the relay's SSH
/// server, a direct dial past the forward proxy). An IPv4 address carried in an IPv6 form
/// (mapped, compatible, SIIT, NAT64) that is itself refused is refused as its own class — a
/// socket would reach it — and svcd's own ports on any address of this host are
/// [`AddressClass::Svcd`].
pub fn classify_dial(dial: SocketAddr, net: &HostNetwork) -> DestinationVerdict {
    let addr = dial.ip();
    let carried = match addr {
        IpAddr::V6(v6) => embedded_v4(v6).map(|v4| classify(IpAddr::V4(v4), net)),
        IpAddr::V4(_) => None,
    };
    let mut verdict = match carried {
        Some(v4) if !v4.reachable() => v4,
        _ => classify(addr, net),
    };
    let own_class = |c: AddressClass| {
        matches!(
            c,
            AddressClass::Host
                | AddressClass::Loopback
                | AddressClass::Unspecified
                | AddressClass::Sandbox
        )
    };
    let own = own_class(verdict.class) || carried.is_some_and(|v| own_class(v.class));
    if own && net.svcd_ports.contains(&dial.port()) {
        verdict = DestinationVerdict {
            class: AddressClass::Svcd,
            allowed_by_operator: false,
        };
    }
    verdict
}

/// The IPv4 address an IPv6 form carries where a socket to it reaches that IPv4 address:
/// mapped `::ffff:a.b.c.d`, compatible `::a.b.c.d`, SIIT `::ffff:0:a.b.c.d`, NAT64
/// `64:ff9b::a.b.c.d`.
fn embedded_v4(a: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = a.segments();
    let o = a.octets();
    let v4 = Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    let mapped = s[..5] == [0, 0, 0, 0, 0] && s[5] == 0xffff;
    let compatible = s[..6] == [0, 0, 0, 0, 0, 0] && !(s[6] == 0 && s[7] <= 1);
    let siit = s[..4] == [0, 0, 0, 0] && s[4] == 0xffff && s[5] == 0;
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    (mapped || compatible || siit || nat64).then_some(v4)
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
            svcd_ports: vec![],
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

    /// Every address svc dials for a guest: the classes above, read through the IPv6 forms
    /// that carry an IPv4 address, the host's own addresses, the sandbox pool and svcd's ports.
    #[test]
    fn dial_table() {
        use AddressClass::*;
        let net = HostNetwork {
            host_addresses: vec![
                "198.51.100.7".parse().unwrap(),
                "2001:db8:7::1".parse().unwrap(),
            ],
            sandbox_pools: vec![
                "10.203.0.0/16".parse().unwrap(),
                "fd20:5c::/48".parse().unwrap(),
            ],
            allow_cidrs: vec![
                "10.9.0.0/16".parse().unwrap(),
                "127.0.0.0/8".parse().unwrap(),
                "198.51.100.0/24".parse().unwrap(),
                "10.203.9.0/24".parse().unwrap(),
            ],
            svcd_ports: vec![15353, 15380, 9464],
        };
        // (name, dial, class, reachable)
        let cases: &[(&str, &str, AddressClass, bool)] = &[
            ("public_https", "93.184.216.34:443", Public, true),
            (
                "public_on_an_svcd_port_number",
                "93.184.216.34:9464",
                Public,
                true,
            ),
            ("public_v6", "[2606:2800:220:1::1]:443", Public, true),
            ("metadata", "169.254.169.254:80", CloudMetadata, false),
            ("metadata_v6", "[fd00:ec2::254]:80", CloudMetadata, false),
            (
                "metadata_mapped",
                "[::ffff:169.254.169.254]:80",
                CloudMetadata,
                false,
            ),
            (
                "metadata_compatible",
                "[::169.254.169.254]:80",
                CloudMetadata,
                false,
            ),
            (
                "metadata_nat64",
                "[64:ff9b::a9fe:a9fe]:80",
                CloudMetadata,
                false,
            ),
            (
                "metadata_siit",
                "[::ffff:0:a9fe:a9fe]:80",
                CloudMetadata,
                false,
            ),
            ("link_local", "169.254.3.3:80", LinkLocal, false),
            (
                "loopback_opened_by_operator",
                "127.0.0.1:8080",
                Loopback,
                true,
            ),
            // The operator opened 127/8, not its IPv6 forms: the mapped form stays refused.
            (
                "loopback_mapped_not_opened_by_the_v4_cidr",
                "[::ffff:127.0.0.1]:8080",
                Ipv4Embedding,
                false,
            ),
            ("loopback_v6", "[::1]:80", Loopback, false),
            ("svcd_port_on_loopback", "127.0.0.1:9464", Svcd, false),
            (
                "svcd_port_on_mapped_loopback",
                "[::ffff:127.0.0.1]:15380",
                Svcd,
                false,
            ),
            ("svcd_port_on_loopback_v6", "[::1]:15353", Svcd, false),
            ("svcd_port_on_unspecified", "0.0.0.0:15380", Svcd, false),
            ("host_address", "198.51.100.7:80", Host, false),
            ("host_address_v6", "[2001:db8:7::1]:443", Host, false),
            (
                "host_address_mapped",
                "[::ffff:198.51.100.7]:80",
                Host,
                false,
            ),
            (
                "host_address_on_svcd_port",
                "198.51.100.7:15380",
                Svcd,
                false,
            ),
            (
                "documentation_neighbour_of_the_host_is_public",
                "198.51.100.8:80",
                Public,
                true,
            ),
            ("another_sandbox", "10.203.4.2:80", Sandbox, false),
            (
                "another_sandbox_under_an_operator_cidr",
                "10.203.9.2:80",
                Sandbox,
                false,
            ),
            (
                "another_sandbox_mapped",
                "[::ffff:10.203.4.2]:80",
                Sandbox,
                false,
            ),
            ("another_sandbox_v6", "[fd20:5c::2]:80", Sandbox, false),
            ("sandbox_gateway_svcd_port", "10.203.4.1:15353", Svcd, false),
            ("private_opened_by_operator", "10.9.1.1:443", Private, true),
            ("private_not_opened", "10.8.1.1:443", Private, false),
            (
                "mapped_public_is_still_an_embedding",
                "[::ffff:93.184.216.34]:443",
                Ipv4Embedding,
                false,
            ),
            (
                "six_to_four",
                "[2002:a9fe:a9fe::1]:80",
                Ipv4Embedding,
                false,
            ),
        ];
        for (name, dial, class, reachable) in cases {
            let v = classify_dial(dial.parse().unwrap(), &net);
            assert_eq!(v.class, *class, "{name}: {dial}");
            assert_eq!(v.reachable(), *reachable, "{name}: {dial}");
        }
    }
}
