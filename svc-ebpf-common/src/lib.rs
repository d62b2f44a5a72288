//! The contract between the kernel side (`svc-ebpf`) and userspace (`svc-control::dataplane`).
//!
//! Everything here is `#[repr(C)]`, `Copy`, padded explicitly, and free of `bool` and Rust enums,
//! so both sides agree on every byte. Byte order is written on every field. Map and program names
//! are shared constants: BPF object names are at most 15 bytes.
#![no_std]
// `unsafe` only for the `aya::Pod` marker impls below, each with its invariant.
#![deny(unsafe_code)]

/// Names of the programs in the eBPF object.
pub mod program {
    /// tc classifier on the host end of a guest link, ingress direction (guest → host).
    pub const TAP_INGRESS: &str = "svc_tap_ingress";
}

/// Names of the maps in the eBPF object. Pinned by name under the pin directory.
pub mod map {
    /// `PERCPU_ARRAY<u32 reason, Counter>`: packets and bytes per verdict reason.
    pub const COUNTERS: &str = "SVC_COUNTERS";
}

/// Verdict reasons: the index into [`map::COUNTERS`]. `u32` codes, never a Rust enum, so the
/// kernel and userspace cannot disagree on a discriminant.
pub mod reason {
    /// ARP, passed so the link can resolve its neighbour.
    pub const PASS_ARP: u32 = 0;
    /// Frame shorter than its headers claim, or otherwise unparseable: dropped (fail closed).
    pub const DROP_MALFORMED: u32 = 1;
    /// An ethertype the fence does not speak (VLAN tags, PPPoE, raw frames): dropped.
    pub const DROP_ETHERTYPE: u32 = 2;
    /// IPv4 with no rule that allows it: dropped (default deny).
    pub const DROP_IPV4_DEFAULT: u32 = 3;
    /// IPv6 with no rule that allows it: dropped (default deny).
    pub const DROP_IPV6_DEFAULT: u32 = 4;

    /// Number of slots in the counter map. Larger than the codes in use, so new reasons do not
    /// change the map's layout.
    pub const COUNT: u32 = 32;

    /// Stable, human-readable names, indexed by code, for logs, audit records and `bpftool`
    /// readers.
    pub const NAMES: [&str; 5] = [
        "pass_arp",
        "drop_malformed",
        "drop_ethertype",
        "drop_ipv4_default",
        "drop_ipv6_default",
    ];

    /// The name of a reason code, or `None` for a code this build does not know.
    pub fn name(code: u32) -> Option<&'static str> {
        NAMES.get(code as usize).copied()
    }

    /// Whether a reason code is a drop (every code but the passes).
    pub const fn is_drop(code: u32) -> bool {
        code != PASS_ARP
    }
}

/// Ethertypes the parser recognises, host byte order.
pub mod ethertype {
    pub const IPV4: u16 = 0x0800;
    pub const ARP: u16 = 0x0806;
    pub const IPV6: u16 = 0x86DD;
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

#[cfg(feature = "user")]
#[expect(unsafe_code, reason = "aya::Pod is an unsafe marker trait")]
// SAFETY: `Counter` is `repr(C)`, `Copy`, has no padding and every bit pattern is valid.
unsafe impl aya::Pod for Counter {}
