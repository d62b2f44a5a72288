//! Crafted Ethernet frames for `BPF_PROG_TEST_RUN`. Checksums are left zero: tc programs do
//! not check them.

use std::net::{Ipv4Addr, Ipv6Addr};

pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const ICMP: u8 = 1;
pub const ICMPV6: u8 = 58;
pub const SYN: u8 = 0x02;
pub const ACK: u8 = 0x10;

/// Ethernet header with the given ethertype.
pub fn eth(ethertype: u16) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

/// An ARP request from `sender` asking for `target`.
pub fn arp(sender: Ipv4Addr, target: Ipv4Addr) -> Vec<u8> {
    let mut f = eth(0x0806);
    f.extend_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x01]);
    f.extend_from_slice(&sender.octets());
    f.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    f.extend_from_slice(&target.octets());
    f
}

/// A TCP header with ports and flags.
pub fn tcp(sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    let mut h = Vec::with_capacity(20);
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    h
}

/// A UDP header plus `payload`.
pub fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::new();
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(
        &u16::try_from(8 + payload.len())
            .unwrap_or(u16::MAX)
            .to_be_bytes(),
    );
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(payload);
    h
}

/// An ICMP (or ICMPv6) message of `kind` with an 8-byte body.
pub fn icmp(kind: u8) -> Vec<u8> {
    vec![kind, 0, 0, 0, 0, 1, 0, 1]
}

/// Options for [`ipv4_with`].
#[derive(Debug, Clone, Copy, Default)]
pub struct V4Opts {
    /// Extra 32-bit words of IP options.
    pub option_words: u8,
    /// The flags-and-fragment-offset field.
    pub frag: u16,
}

/// An IPv4 packet carrying `l4`.
pub fn ipv4(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, l4: &[u8]) -> Vec<u8> {
    ipv4_with(src, dst, protocol, l4, V4Opts::default())
}

pub fn ipv4_with(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, l4: &[u8], o: V4Opts) -> Vec<u8> {
    let hlen = 20 + 4 * usize::from(o.option_words);
    let total = u16::try_from(hlen + l4.len()).unwrap_or(u16::MAX);
    let mut f = eth(0x0800);
    f.push(0x40 | (5 + o.option_words));
    f.push(0);
    f.extend_from_slice(&total.to_be_bytes());
    f.extend_from_slice(&[0, 1]);
    f.extend_from_slice(&o.frag.to_be_bytes());
    f.extend_from_slice(&[64, protocol, 0, 0]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend(std::iter::repeat_n(1u8, 4 * usize::from(o.option_words)));
    f.extend_from_slice(l4);
    f
}

/// An IPv6 packet: `next` header and `payload` (which may start with extension headers).
pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, hop_limit: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = eth(0x86DD);
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(
        &u16::try_from(payload.len())
            .unwrap_or(u16::MAX)
            .to_be_bytes(),
    );
    f.push(next);
    f.push(hop_limit);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(payload);
    f
}

/// An 802.1Q VLAN-tagged frame carrying `inner` (an Ethernet frame whose header is replaced).
pub fn vlan_tagged(inner: &[u8]) -> Vec<u8> {
    let mut f = eth(0x8100);
    f.extend_from_slice(&[0, 42]);
    f.extend_from_slice(&inner[12..]);
    f
}
