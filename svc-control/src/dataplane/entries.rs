//! What the fence is told about a sandbox: its link ([`SandboxLink`]), the addresses and
//! CIDRs it may reach with their port rules, and what a new generation carries over.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use ipnet::IpNet;
use svc_ebpf_common::rule;

use crate::policy::mode::EgressMode;

/// What the fence needs to know about one sandbox link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxLink {
    /// ifindex of the host end of the guest link.
    pub ifindex: u32,
    pub sandbox: u32,
    pub mode: EgressMode,
    /// Mark TCP 443/80 for the proxy (Curated with the proxy running).
    pub proxy: bool,
    pub guest_v4: Ipv4Addr,
    pub gateway_v4: Ipv4Addr,
    pub guest_v6: Option<Ipv6Addr>,
    pub guest_v6_link_local: Option<Ipv6Addr>,
    pub gateway_v6: Option<Ipv6Addr>,
}

/// One transport rule of an allow entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortRule {
    Tcp(u16),
    Udp(u16),
    /// ICMP echo and the rest of ICMP / ICMPv6 (never neighbour discovery, which is separate).
    Icmp,
    /// Any TCP port.
    AnyTcp,
}

impl PortRule {
    pub(super) fn encode(self, v6: bool) -> u32 {
        use svc_ebpf_common::proto;
        match self {
            Self::Tcp(p) => rule::new(proto::TCP, p),
            Self::Udp(p) => rule::new(proto::UDP, p),
            Self::AnyTcp => rule::new(proto::TCP, 0),
            Self::Icmp => rule::new(if v6 { proto::ICMPV6 } else { proto::ICMP }, 0),
        }
    }
}

/// The web ports an allowed host name opens.
pub const WEB: [PortRule; 2] = [PortRule::Tcp(443), PortRule::Tcp(80)];

/// An address a sandbox may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowEntry {
    pub addr: IpAddr,
    pub rules: Vec<PortRule>,
    /// Which allowed host it belongs to, for audit.
    pub host_id: u32,
    /// `None`: never expires (IP-literal hosts). `Some`: the DNS TTL (clamped by the guard).
    pub ttl: Option<Duration>,
    /// How long traffic keeps an expired entry alive.
    pub idle: Duration,
}

/// A CIDR a sandbox may reach (static).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CidrEntry {
    pub net: IpNet,
    pub rules: Vec<PortRule>,
    pub host_id: u32,
}

/// What [`Fence::regenerate`] does with one allow entry of the generation in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Carry {
    /// Left behind: gone with the old generation.
    Drop,
    /// Copied as it is (rules, expiry and last use).
    Keep,
    /// Copied with only those of its rules that are among these; left behind when none is.
    Only(Vec<PortRule>),
}
