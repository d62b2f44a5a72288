//! Bounds-checked header parsing, shared by both classifiers. Every load goes through
//! [`Frame`]; every failure is a verdict reason, so the entry points fail closed.

use svc_ebpf_common::{ethertype, proto, reason};

/// Length of an Ethernet II header.
pub const ETH_HLEN: usize = 14;
const IPV4_HLEN: usize = 20;
const IPV6_HLEN: usize = 40;

/// A load past the end of the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBounds;

/// A packet the classifier can read. Implemented for `TcContext` in the program, and for byte
/// slices in host tests.
pub trait Frame {
    /// Total length of the frame in bytes.
    fn len(&self) -> usize;
    /// Whether the frame is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn load_u8(&self, offset: usize) -> Result<u8, OutOfBounds>;
    /// Two bytes at `offset`, in wire (big-endian) order.
    fn load_be16(&self, offset: usize) -> Result<u16, OutOfBounds>;
    fn load_4(&self, offset: usize) -> Result<[u8; 4], OutOfBounds>;
    fn load_16(&self, offset: usize) -> Result<[u8; 16], OutOfBounds>;
}

/// What the fence needs of one IP packet. Addresses in network order; IPv4 in the first four
/// bytes.
// Aligned to 8: zeroed as five 8-byte words (see `zeroed_in`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C, align(8))]
pub struct IpPacket {
    pub family: u8,
    pub protocol: u8,
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub src_port: u16,
    pub dst_port: u16,
    /// ICMP / ICMPv6 type (0 otherwise).
    pub icmp_type: u8,
    pub hop_limit: u8,
}

impl IpPacket {
    /// All zero. The classifiers start from this and let the parser fill it in place: a packet
    /// returned by value (or inside an `Option`) makes LLVM copy undefined bytes, which the
    /// verifier refuses to read.
    pub const ZERO: Self = Self {
        family: 0,
        protocol: 0,
        src: [0; 16],
        dst: [0; 16],
        src_port: 0,
        dst_port: 0,
        icmp_type: 0,
        hop_limit: 0,
    };

    /// A zeroed packet in `slot`, written as five 8-byte stores. `let p = IpPacket::ZERO`
    /// compiles to a call of the eBPF build's byte-at-a-time `memset` (40 iterations on every
    /// packet, seen in `bpftool prog dump xlated` and under perf); volatile stores cannot be
    /// merged back into that call.
    #[inline(always)]
    pub fn zeroed_in(slot: &mut core::mem::MaybeUninit<Self>) -> &mut Self {
        // SAFETY: `slot` is writable storage for one `IpPacket`.
        unsafe { zero(slot.as_mut_ptr()) };
        // SAFETY: every byte was just written with zero, a valid value of every field.
        unsafe { slot.assume_init_mut() }
    }

    /// Zero this packet in place (as [`IpPacket::zeroed_in`], without `memset`).
    #[inline(always)]
    pub fn clear(&mut self) {
        // SAFETY: `self` is a valid, exclusive reference.
        unsafe { zero(self) };
    }
}

/// Write zero over the `WORDS` 8-byte words of `*p` with volatile stores.
///
/// # Safety
/// `p` must be valid for writes of one `IpPacket` (which is `WORDS * 8` bytes, aligned to 8:
/// checked at compile time below), so each store stays inside it and is aligned.
#[inline(always)]
unsafe fn zero(p: *mut IpPacket) {
    let words = p.cast::<u64>();
    for i in 0..WORDS {
        // SAFETY: the caller's promise; `i < WORDS`.
        unsafe { core::ptr::write_volatile(words.add(i), 0) };
    }
}

/// [`IpPacket`] in 8-byte words.
const WORDS: usize = core::mem::size_of::<IpPacket>() / 8;
const _: () = assert!(
    core::mem::size_of::<IpPacket>() == WORDS * 8 && core::mem::align_of::<IpPacket>() == 8
);

/// [`parse`] found ARP; the sender protocol address is in the first four bytes of `src`.
pub const KIND_ARP: u8 = 1;
/// [`parse`] found IPv4 or IPv6.
pub const KIND_IP: u8 = 2;

/// Parse a frame into `p`: `Ok` is [`KIND_ARP`] or [`KIND_IP`], `Err` the drop reason.
// Inlined: a BPF-to-BPF call on every packet costs more than the code it saves.
#[inline(always)]
pub fn parse<F: Frame>(frame: &F, p: &mut IpPacket) -> Result<u8, u32> {
    let oob = |_: OutOfBounds| reason::DROP_MALFORMED;
    if frame.len() < ETH_HLEN {
        return Err(reason::DROP_MALFORMED);
    }
    match frame.load_be16(12).map_err(oob)? {
        ethertype::ARP => {
            // htype 1, ptype IPv4, hlen 6, plen 4; sender protocol address at 14 + 14.
            if frame.load_be16(ETH_HLEN).map_err(oob)? != 1
                || frame.load_be16(ETH_HLEN + 2).map_err(oob)? != ethertype::IPV4
                || frame.load_u8(ETH_HLEN + 4).map_err(oob)? != 6
                || frame.load_u8(ETH_HLEN + 5).map_err(oob)? != 4
            {
                return Err(reason::DROP_MALFORMED);
            }
            let sender = frame.load_4(ETH_HLEN + 14).map_err(oob)?;
            p.src[0] = sender[0];
            p.src[1] = sender[1];
            p.src[2] = sender[2];
            p.src[3] = sender[3];
            Ok(KIND_ARP)
        }
        ethertype::IPV4 => parse_v4(frame, p).map(|()| KIND_IP),
        ethertype::IPV6 => parse_v6(frame, p).map(|()| KIND_IP),
        _ => Err(reason::DROP_ETHERTYPE),
    }
}

#[inline(always)]
fn parse_v4<F: Frame>(frame: &F, p: &mut IpPacket) -> Result<(), u32> {
    let oob = |_: OutOfBounds| reason::DROP_MALFORMED;
    let l3 = ETH_HLEN;
    let vihl = frame.load_u8(l3).map_err(oob)?;
    if vihl >> 4 != 4 || (vihl & 0x0f) < 5 {
        return Err(reason::DROP_MALFORMED);
    }
    if (vihl & 0x0f) != 5 {
        return Err(reason::DROP_IP_OPTIONS);
    }
    let total = frame.load_be16(l3 + 2).map_err(oob)? as usize;
    if total < IPV4_HLEN || l3 + total > frame.len() {
        return Err(reason::DROP_MALFORMED);
    }
    let frag = frame.load_be16(l3 + 6).map_err(oob)?;
    if frag & 0x3fff != 0 {
        return Err(reason::DROP_FRAGMENT);
    }
    p.family = 4;
    p.protocol = frame.load_u8(l3 + 9).map_err(oob)?;
    p.hop_limit = frame.load_u8(l3 + 8).map_err(oob)?;
    let s = frame.load_4(l3 + 12).map_err(oob)?;
    let d = frame.load_4(l3 + 16).map_err(oob)?;
    p.src[0] = s[0];
    p.src[1] = s[1];
    p.src[2] = s[2];
    p.src[3] = s[3];
    p.dst[0] = d[0];
    p.dst[1] = d[1];
    p.dst[2] = d[2];
    p.dst[3] = d[3];
    transport(frame, l3 + IPV4_HLEN, p)
}

#[inline(always)]
fn parse_v6<F: Frame>(frame: &F, p: &mut IpPacket) -> Result<(), u32> {
    let oob = |_: OutOfBounds| reason::DROP_MALFORMED;
    let l3 = ETH_HLEN;
    if frame.load_u8(l3).map_err(oob)? >> 4 != 6 {
        return Err(reason::DROP_MALFORMED);
    }
    let payload = frame.load_be16(l3 + 4).map_err(oob)? as usize;
    if l3 + IPV6_HLEN + payload > frame.len() {
        return Err(reason::DROP_MALFORMED);
    }
    let next = frame.load_u8(l3 + 6).map_err(oob)?;
    match next {
        // Fragment header.
        44 => return Err(reason::DROP_FRAGMENT),
        // Hop-by-hop, routing, destination options, AH, ESP, mobility, HIP, shim6, experiments.
        0 | 43 | 60 | 51 | 50 | 135 | 139 | 140 | 253 | 254 => return Err(reason::DROP_IP_OPTIONS),
        _ => {}
    }
    p.family = 6;
    p.protocol = next;
    p.src = frame.load_16(l3 + 8).map_err(oob)?;
    p.dst = frame.load_16(l3 + 24).map_err(oob)?;
    p.hop_limit = frame.load_u8(l3 + 7).map_err(oob)?;
    transport(frame, l3 + IPV6_HLEN, p)
}

#[inline(always)]
fn transport<F: Frame>(frame: &F, l4: usize, p: &mut IpPacket) -> Result<(), u32> {
    let oob = |_: OutOfBounds| reason::DROP_MALFORMED;
    match p.protocol {
        proto::TCP | proto::UDP => {
            p.src_port = frame.load_be16(l4).map_err(oob)?;
            p.dst_port = frame.load_be16(l4 + 2).map_err(oob)?;
        }
        proto::ICMP | proto::ICMPV6 => {
            p.icmp_type = frame.load_u8(l4).map_err(oob)?;
        }
        _ => {}
    }
    Ok(())
}

/// Whether two 16-byte addresses are equal (no `memcmp` in eBPF).
#[inline(always)]
pub fn eq16(a: &[u8; 16], b: &[u8; 16]) -> bool {
    let (a0, a1) = halves(a);
    let (b0, b1) = halves(b);
    ((a0 ^ b0) | (a1 ^ b1)) == 0
}

/// The two native-endian u64 halves of an address (straight-line code, no loop).
#[inline(always)]
fn halves(a: &[u8; 16]) -> (u64, u64) {
    (
        u64::from_ne_bytes([a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]]),
        u64::from_ne_bytes([a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]]),
    )
}

/// Whether the first four bytes of `a` equal `b`.
#[inline(always)]
pub fn eq4(a: &[u8; 16], b: &[u8; 4]) -> bool {
    u32::from_ne_bytes([a[0], a[1], a[2], a[3]]) == u32::from_ne_bytes(*b)
}

/// The first four bytes of an address.
#[inline(always)]
pub fn v4(a: &[u8; 16]) -> [u8; 4] {
    [a[0], a[1], a[2], a[3]]
}
