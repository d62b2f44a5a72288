//! The contract between the kernel side (`svc-ebpf`) and userspace (`svc-control::dataplane`).
//!
//! Everything here is `#[repr(C)]`, `Copy`, padded explicitly, and free of `bool` and Rust enums,
//! so both sides agree on every byte. Byte order is written on every field. Map and program names
//! are shared constants: BPF object names are at most 15 bytes.
//!
//! Atomic policy changes: allow entries are keyed by `(sandbox, generation, address)`, and the
//! sandbox record names the generation in force. A new policy is written under the next
//! generation, the record is flipped in one map update, and the old generation is deleted, so
//! a packet never sees half of a policy.
#![no_std]
// `unsafe` only for the `aya::Pod` marker impls below, each with its invariant.
#![deny(unsafe_code)]

/// Names of the programs in the eBPF object.
pub mod program {
    /// tc classifier on the host end of a guest link, ingress (guest → host).
    pub const TAP_INGRESS: &str = "svc_tap_ingress";
    /// tc classifier on the host end of a guest link, egress (host → guest).
    pub const TAP_EGRESS: &str = "svc_tap_egress";
    /// An empty classifier (returns "ok" at once), never attached by svcd: the benchmark runs
    /// it beside the fence to measure what any tc program costs on the machine.
    pub const CALIBRATE: &str = "svc_calibrate";
}

/// Names of the maps in the eBPF object. Pinned by name under the pin directory.
pub mod map {
    /// `PERCPU_ARRAY<u32 reason, Counter>`: packets and bytes per verdict reason.
    pub const COUNTERS: &str = "SVC_COUNTERS";
    /// `ARRAY<u32 ifindex, SandboxRecord>`: the sandbox behind each fenced link whose ifindex
    /// is below [`capacity::LINKS`](super::capacity::LINKS) (an array lookup the JIT inlines);
    /// a zeroed slot (sandbox 0) means no sandbox.
    pub const LINKS: &str = "SVC_LINKS";
    /// `HASH<u32 ifindex, SandboxRecord>`: the same for larger ifindexes.
    pub const SANDBOXES: &str = "SVC_SANDBOXES";
    /// `LRU_HASH<AllowKey4, AllowValue>`: IPv4 addresses a sandbox may reach (DNS answers,
    /// IP-literal hosts).
    pub const ALLOW4: &str = "SVC_ALLOW4";
    /// `LRU_HASH<AllowKey6, AllowValue>`: the IPv6 twin of [`ALLOW4`].
    pub const ALLOW6: &str = "SVC_ALLOW6";
    /// `LPM_TRIE<CidrKey4, AllowValue>`: IPv4 CIDRs a sandbox may reach.
    pub const CIDR4: &str = "SVC_CIDR4";
    /// `LPM_TRIE<CidrKey6, AllowValue>`: IPv6 CIDRs a sandbox may reach.
    pub const CIDR6: &str = "SVC_CIDR6";
    /// `LPM_TRIE<[u8; 4], u32 class verdict>`: destination classes never reachable (and the
    /// operator's exceptions, as longer prefixes).
    pub const DENY4: &str = "SVC_DENY4";
    /// `LPM_TRIE<[u8; 16], u32 class verdict>`: the IPv6 twin of [`DENY4`].
    pub const DENY6: &str = "SVC_DENY6";
    /// `RINGBUF`: [`DropEvent`]s for the audit log.
    pub const EVENTS: &str = "SVC_EVENTS";
    /// `HASH<u32 sandbox, RateState>`: per-sandbox rate limit of drop events.
    pub const EVENT_RATE: &str = "SVC_EVENT_RATE";
}

/// Map capacities.
pub mod capacity {
    pub const SANDBOXES: u32 = 4096;
    /// Slots of the link array: ifindexes below this use it.
    pub const LINKS: u32 = 65_536;
    pub const ALLOW4: u32 = 131_072;
    pub const ALLOW6: u32 = 65_536;
    pub const CIDR4: u32 = 16_384;
    pub const CIDR6: u32 = 16_384;
    pub const DENY4: u32 = 1024;
    pub const DENY6: u32 = 1024;
    /// Bytes of the event ring buffer (a power of two, a multiple of the page size).
    pub const EVENTS_BYTES: u32 = 256 * 1024;
    /// Drop events per sandbox per second; past that, drops are only counted.
    pub const EVENTS_PER_SECOND: u32 = 64;
}

/// Verdict reasons: the index into [`map::COUNTERS`]. `u32` codes, never a Rust enum, so the
/// kernel and userspace cannot disagree on a discriminant.
pub mod reason {
    pub const PASS_ARP: u32 = 0;
    pub const DROP_MALFORMED: u32 = 1;
    pub const DROP_ETHERTYPE: u32 = 2;
    pub const DROP_IPV4_DEFAULT: u32 = 3;
    pub const DROP_IPV6_DEFAULT: u32 = 4;
    /// The link has no sandbox record: nothing passes (fail closed).
    pub const DROP_NO_SANDBOX: u32 = 5;
    /// Source address is not the sandbox's own.
    pub const DROP_SPOOFED: u32 = 6;
    /// An IPv4 fragment (first or later): no verdict without both ports.
    pub const DROP_FRAGMENT: u32 = 7;
    /// IPv4 options or IPv6 extension headers.
    pub const DROP_IP_OPTIONS: u32 = 8;
    /// A destination class that is never reachable (metadata, loopback, private, host, …).
    pub const DROP_DEST_CLASS: u32 = 9;
    /// The gateway on a port other than DNS: host services are unreachable.
    pub const DROP_GATEWAY: u32 = 10;
    /// TCP to an address/port the sandbox's map does not hold.
    pub const DROP_TCP_NOT_ALLOWED: u32 = 11;
    /// UDP (not DNS) to an address/port the map does not hold, QUIC among it.
    pub const DROP_UDP_NOT_ALLOWED: u32 = 12;
    /// ICMP / ICMPv6 (not neighbour discovery) not allowed by the map.
    pub const DROP_ICMP: u32 = 13;
    /// Another transport protocol.
    pub const DROP_PROTOCOL: u32 = 14;
    /// DNS (UDP or TCP 53, to any address): marked for the guard.
    pub const PASS_DNS: u32 = 15;
    /// TCP 443/80 to an allowed address: marked for the proxy.
    pub const PASS_PROXY: u32 = 16;
    /// Allowed by the map, forwarded as is.
    pub const PASS_ALLOWED: u32 = 17;
    /// AllowAll mode, destination class allowed.
    pub const PASS_ALLOW_ALL: u32 = 18;
    /// IPv6 neighbour / router discovery the link needs.
    pub const PASS_ND: u32 = 19;
    /// Host → guest traffic.
    pub const PASS_EGRESS: u32 = 20;
    /// Host → guest to an address that is not the guest's.
    pub const DROP_EGRESS_NOT_GUEST: u32 = 21;

    /// Number of slots in the counter map. Larger than the codes in use, so new reasons do not
    /// change the map's layout.
    pub const COUNT: u32 = 32;

    /// Stable, human-readable names, indexed by code.
    pub const NAMES: [&str; 22] = [
        "pass_arp",
        "drop_malformed",
        "drop_ethertype",
        "drop_ipv4_default",
        "drop_ipv6_default",
        "drop_no_sandbox",
        "drop_spoofed",
        "drop_fragment",
        "drop_ip_options",
        "drop_dest_class",
        "drop_gateway",
        "drop_tcp_not_allowed",
        "drop_udp_not_allowed",
        "drop_icmp",
        "drop_protocol",
        "pass_dns",
        "pass_proxy",
        "pass_allowed",
        "pass_allow_all",
        "pass_nd",
        "pass_egress",
        "drop_egress_not_guest",
    ];

    /// The name of a reason code, or `None` for a code this build does not know.
    pub fn name(code: u32) -> Option<&'static str> {
        NAMES.get(code as usize).copied()
    }

    /// Whether a reason code is a drop.
    pub const fn is_drop(code: u32) -> bool {
        !matches!(
            code,
            PASS_ARP
                | PASS_DNS
                | PASS_PROXY
                | PASS_ALLOWED
                | PASS_ALLOW_ALL
                | PASS_ND
                | PASS_EGRESS
        )
    }
}

/// Ethertypes and IP protocol numbers the parser recognises, host byte order.
pub mod ethertype {
    pub const IPV4: u16 = 0x0800;
    pub const ARP: u16 = 0x0806;
    pub const IPV6: u16 = 0x86DD;
}

/// IP protocol numbers.
pub mod proto {
    pub const ICMP: u8 = 1;
    pub const TCP: u8 = 6;
    pub const UDP: u8 = 17;
    pub const ICMPV6: u8 = 58;
}

/// `skb->mark` values the fence sets for nftables.
pub mod mark {
    /// DNS for the guard: nftables redirects it to the guard's port.
    pub const DNS: u32 = 0x5c5c_0001;
    /// TCP 443/80 to an allowed address: nftables redirects it to the proxy's port.
    pub const PROXY: u32 = 0x5c5c_0002;
}

/// [`SandboxRecord::mode`] values.
pub mod mode {
    pub const CURATED: u32 = 1;
    pub const ALLOW_ALL: u32 = 2;
}

/// [`SandboxRecord::flags`] bits.
pub mod flags {
    /// Mark TCP 443/80 to allowed addresses for the proxy (Curated with the proxy running).
    pub const PROXY: u32 = 1;
}

/// [`DENY4`](map::DENY4) / [`DENY6`](map::DENY6) values.
pub mod class {
    /// Never reachable.
    pub const DENY: u32 = 1;
    /// The operator allowed this CIDR (`network.allow_cidrs`), although a shorter prefix denies.
    pub const OPERATOR_ALLOW: u32 = 2;
}

/// One allow rule: `(protocol << 16) | port`, host byte order; port 0 = any port of the
/// protocol; 0 = unused slot.
pub mod rule {
    pub const fn new(protocol: u8, port: u16) -> u32 {
        ((protocol as u32) << 16) | port as u32
    }
    pub const fn protocol(rule: u32) -> u8 {
        (rule >> 16) as u8
    }
    pub const fn port(rule: u32) -> u16 {
        rule as u16
    }
    /// Slots per allow entry.
    pub const SLOTS: usize = 8;
}

/// Value of [`map::COUNTERS`]: one per CPU per reason. Native byte order (kernel-written).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counter {
    /// Packets counted under this reason, native byte order.
    pub packets: u64,
    /// Bytes of those packets (skb length), native byte order.
    pub bytes: u64,
}
const _: () = assert!(core::mem::size_of::<Counter>() == 16);

/// Value of [`map::LINKS`] and [`map::SANDBOXES`], keyed by the host-side link's ifindex
/// (native byte order). Sandbox id 0 is reserved: it marks an empty slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SandboxRecord {
    /// Sandbox id, native byte order.
    pub sandbox: u32,
    /// [`mode`] code, native byte order.
    pub mode: u32,
    /// The generation of allow entries in force, native byte order.
    pub generation: u32,
    /// [`flags`] bits, native byte order.
    pub flags: u32,
    /// The guest's IPv4 address, network byte order.
    pub guest_v4: [u8; 4],
    /// The host end's IPv4 address (gateway and resolver), network byte order.
    pub gateway_v4: [u8; 4],
    /// The guest's global IPv6 address, network byte order (all zero: none).
    pub guest_v6: [u8; 16],
    /// The guest's link-local IPv6 address, network byte order.
    pub guest_v6_ll: [u8; 16],
    /// The host end's IPv6 address, network byte order.
    pub gateway_v6: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<SandboxRecord>() == 72);

/// Key of [`map::ALLOW4`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AllowKey4 {
    /// Native byte order.
    pub sandbox: u32,
    /// Native byte order.
    pub generation: u32,
    /// Network byte order.
    pub addr: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<AllowKey4>() == 12);

/// Key of [`map::ALLOW6`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AllowKey6 {
    /// Native byte order.
    pub sandbox: u32,
    /// Native byte order.
    pub generation: u32,
    /// Network byte order.
    pub addr: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<AllowKey6>() == 24);

/// Data of an LPM key of [`map::CIDR4`]: matched bit by bit, so every field is big-endian and
/// the prefix length is 64 + the CIDR's length.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CidrKey4 {
    /// Network byte order.
    pub sandbox: [u8; 4],
    /// Network byte order.
    pub generation: [u8; 4],
    /// Network byte order.
    pub addr: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<CidrKey4>() == 12);

/// Data of an LPM key of [`map::CIDR6`] (prefix length 64 + the CIDR's length).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CidrKey6 {
    /// Network byte order.
    pub sandbox: [u8; 4],
    /// Network byte order.
    pub generation: [u8; 4],
    /// Network byte order.
    pub addr: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<CidrKey6>() == 24);

/// Value of the allow maps.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllowValue {
    /// Which allowed host this address belongs to (for audit), native byte order.
    pub host_id: u32,
    /// Padding, zero.
    pub _pad: u32,
    /// [`rule`]s, native byte order; unused slots are 0.
    pub rules: [u32; rule::SLOTS],
    /// `CLOCK_MONOTONIC` ns after which the entry is dead unless traffic used it within
    /// `idle_ns`; 0 = never expires. Native byte order.
    pub expiry_ns: u64,
    /// Grace after the last packet, ns. Native byte order.
    pub idle_ns: u64,
    /// `CLOCK_MONOTONIC` ns of the last packet the fence allowed with this entry (written by
    /// the kernel). Native byte order.
    pub last_seen_ns: u64,
}
const _: () = assert!(core::mem::size_of::<AllowValue>() == 64);

impl AllowValue {
    /// Whether the entry is alive at `now`.
    pub const fn alive(&self, now: u64) -> bool {
        self.expiry_ns == 0
            || now < self.expiry_ns
            || (self.last_seen_ns != 0 && now < self.last_seen_ns.saturating_add(self.idle_ns))
    }

    /// Whether a rule allows `protocol`/`port`.
    pub fn allows(&self, protocol: u8, port: u16) -> bool {
        let mut i = 0;
        while i < rule::SLOTS {
            let r = self.rules[i];
            if r != 0
                && rule::protocol(r) == protocol
                && (rule::port(r) == 0 || rule::port(r) == port)
            {
                return true;
            }
            i += 1;
        }
        false
    }
}

/// Per-sandbox drop-event rate state ([`map::EVENT_RATE`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateState {
    /// Start of the current one-second window, `CLOCK_MONOTONIC` ns. Native byte order.
    pub window_start_ns: u64,
    /// Events emitted in this window. Native byte order.
    pub emitted: u32,
    /// Events suppressed in this window. Native byte order.
    pub suppressed: u32,
}
const _: () = assert!(core::mem::size_of::<RateState>() == 16);

/// A dropped packet, for the audit log. No payload.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropEvent {
    /// `CLOCK_MONOTONIC` ns. Native byte order.
    pub ts_ns: u64,
    /// Native byte order.
    pub sandbox: u32,
    /// [`reason`] code. Native byte order.
    pub reason: u32,
    /// The link's ifindex. Native byte order.
    pub ifindex: u32,
    /// Drops of this sandbox suppressed by the rate limit since the last event.
    pub suppressed: u32,
    /// 4 or 6 (0 when not IP).
    pub family: u8,
    /// IP protocol number.
    pub protocol: u8,
    /// Padding, zero.
    pub _pad: [u8; 2],
    /// Host byte order.
    pub src_port: u16,
    /// Host byte order.
    pub dst_port: u16,
    /// Network byte order (IPv4 in the first 4 bytes).
    pub src: [u8; 16],
    /// Network byte order (IPv4 in the first 4 bytes).
    pub dst: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<DropEvent>() == 64);

#[cfg(feature = "user")]
mod pod {
    // SAFETY (all impls): each type is `repr(C)`, `Copy`, has explicit padding fields (no
    // implicit padding: the size asserts above hold) and every bit pattern is a valid value.
    #[expect(unsafe_code, reason = "aya::Pod is an unsafe marker trait")]
    mod impls {
        use super::super::*;
        unsafe impl aya::Pod for Counter {}
        unsafe impl aya::Pod for SandboxRecord {}
        unsafe impl aya::Pod for AllowKey4 {}
        unsafe impl aya::Pod for AllowKey6 {}
        unsafe impl aya::Pod for CidrKey4 {}
        unsafe impl aya::Pod for CidrKey6 {}
        unsafe impl aya::Pod for AllowValue {}
        unsafe impl aya::Pod for RateState {}
        unsafe impl aya::Pod for DropEvent {}
    }
}
