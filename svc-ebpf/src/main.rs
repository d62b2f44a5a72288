//! The tc fence attached to the host end of every guest link.
//!
//! Built for `bpfel-unknown-none` by `svc-control/build.rs`. On the host the crate is only
//! checked (clippy), never run, so it is an ordinary `std` binary there.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    helpers::bpf_ktime_get_coarse_ns,
    macros::{btf_map, classifier},
    programs::TcContext,
};
use aya_log_ebpf::{debug, error, warn};
use svc_ebpf::{
    btf::{Array, HashMap, LpmKey, LpmTrie, LruHashMap, PerCpuArray, RingBuf},
    parse::{self, Frame, IpPacket, KIND_ARP, OutOfBounds, eq4, eq16, v4},
};
use svc_ebpf_common::{
    AllowKey4, AllowKey6, AllowValue, CidrKey4, CidrKey6, Counter, DropEvent, RateState,
    SandboxRecord, capacity, class, flags, mark, mode, proto, reason,
};

// BTF-defined and pinned by name (see `svc_ebpf::btf`): `bpftool map dump` names the fields.
#[btf_map(name = "SVC_COUNTERS")]
static SVC_COUNTERS: PerCpuArray<Counter, { reason::COUNT as usize }> = PerCpuArray::new();
#[btf_map(name = "SVC_LINKS")]
static SVC_LINKS: Array<SandboxRecord, { capacity::LINKS as usize }> = Array::new();
#[btf_map(name = "SVC_SANDBOXES")]
static SVC_SANDBOXES: HashMap<u32, SandboxRecord, { capacity::SANDBOXES as usize }> =
    HashMap::new();
#[btf_map(name = "SVC_ALLOW4")]
static SVC_ALLOW4: LruHashMap<AllowKey4, AllowValue, { capacity::ALLOW4 as usize }> =
    LruHashMap::new();
#[btf_map(name = "SVC_ALLOW6")]
static SVC_ALLOW6: LruHashMap<AllowKey6, AllowValue, { capacity::ALLOW6 as usize }> =
    LruHashMap::new();
#[btf_map(name = "SVC_CIDR4")]
static SVC_CIDR4: LpmTrie<CidrKey4, AllowValue, { capacity::CIDR4 as usize }> = LpmTrie::new();
#[btf_map(name = "SVC_CIDR6")]
static SVC_CIDR6: LpmTrie<CidrKey6, AllowValue, { capacity::CIDR6 as usize }> = LpmTrie::new();
#[btf_map(name = "SVC_DENY4")]
static SVC_DENY4: LpmTrie<[u8; 4], u32, { capacity::DENY4 as usize }> = LpmTrie::new();
#[btf_map(name = "SVC_DENY6")]
static SVC_DENY6: LpmTrie<[u8; 16], u32, { capacity::DENY6 as usize }> = LpmTrie::new();
#[btf_map(name = "SVC_EVENTS")]
static SVC_EVENTS: RingBuf<DropEvent, { capacity::EVENTS_BYTES as usize }> = RingBuf::new();
#[btf_map(name = "SVC_EVENT_RATE")]
static SVC_EVENT_RATE: HashMap<u32, RateState, { capacity::SANDBOXES as usize }> = HashMap::new();

const DNS_PORT: u16 = 53;
const ONE_SECOND_NS: u64 = 1_000_000_000;

/// Guest → host. Thin: classify, count, report drops, turn the reason into a tc verdict.
#[classifier]
pub fn svc_tap_ingress(ctx: TcContext) -> i32 {
    let mut slot = core::mem::MaybeUninit::uninit();
    let packet = IpPacket::zeroed_in(&mut slot);
    let (code, sandbox) = ingress(&ctx, packet);
    finish(&ctx, code, sandbox, packet)
}

/// Host → guest: only the guest's own addresses (and the link's neighbour discovery).
#[classifier]
pub fn svc_tap_egress(ctx: TcContext) -> i32 {
    let mut slot = core::mem::MaybeUninit::uninit();
    let packet = IpPacket::zeroed_in(&mut slot);
    let (code, sandbox) = egress(&ctx, packet);
    finish(&ctx, code, sandbox, packet)
}

/// Calibration only (see `svc_ebpf_common::program::CALIBRATE`).
#[classifier]
pub fn svc_calibrate(_ctx: TcContext) -> i32 {
    TC_ACT_OK
}

// Inlined into each classifier (perf showed it as a call on every packet).
#[inline(always)]
fn finish(ctx: &TcContext, code: u32, sandbox: u32, packet: &IpPacket) -> i32 {
    count(code, ctx.len());
    if reason::is_drop(code) {
        report(ctx, code, sandbox, packet);
        TC_ACT_SHOT
    } else {
        TC_ACT_OK
    }
}

fn ingress(ctx: &TcContext, packet: &mut IpPacket) -> (u32, u32) {
    let Some(rec) = record(ctx) else {
        return (reason::DROP_NO_SANDBOX, 0);
    };
    let frame = TcFrame(ctx);
    match parse::parse(&frame, packet) {
        Err(code) => (code, rec.sandbox),
        Ok(KIND_ARP) => {
            let code = if eq4(&packet.src, &rec.guest_v4) {
                reason::PASS_ARP
            } else {
                reason::DROP_SPOOFED
            };
            // Not an IP packet: no addresses in the event.
            packet.clear();
            (code, rec.sandbox)
        }
        Ok(_) if packet.family == 4 => (ingress_v4(ctx, rec, packet), rec.sandbox),
        Ok(_) => (ingress_v6(ctx, rec, packet), rec.sandbox),
    }
}

fn ingress_v4(ctx: &TcContext, rec: &SandboxRecord, p: &IpPacket) -> u32 {
    if !eq4(&p.src, &rec.guest_v4) {
        return reason::DROP_SPOOFED;
    }
    if let Some(code) = dns_or_gateway(ctx, p, eq4(&p.dst, &rec.gateway_v4)) {
        return code;
    }
    let dst = v4(&p.dst);
    if rec.mode == mode::ALLOW_ALL {
        return if denied_class4(&dst) {
            reason::DROP_DEST_CLASS
        } else {
            reason::PASS_ALLOW_ALL
        };
    }
    // Curated: userspace never writes a class-denied address into the allow maps (the same
    // lists fill SVC_DENY4), so only a miss needs the trie, to name the reason.
    let now = now_ns();
    let key = AllowKey4 {
        sandbox: rec.sandbox,
        generation: rec.generation,
        addr: dst,
    };
    if let Some(entry) = SVC_ALLOW4.get_ptr_mut(&key) {
        // SAFETY: the pointer comes from a successful lookup; the kernel keeps the value alive
        // for the program run. A racing update of last_seen_ns from another CPU is benign.
        let entry = unsafe { &mut *entry };
        if entry.alive(now) {
            return allowed(ctx, rec, p, entry, now);
        }
    }
    let cidr = LpmKey {
        prefix_len: 64 + 32,
        data: CidrKey4 {
            sandbox: rec.sandbox.to_be_bytes(),
            generation: rec.generation.to_be_bytes(),
            addr: dst,
        },
    };
    // SAFETY: trie values are written once per key (replaced, never changed in place).
    if let Some(entry) = unsafe { SVC_CIDR4.get(&cidr) } {
        let mut copy = *entry;
        return allowed(ctx, rec, p, &mut copy, 0);
    }
    if denied_class4(&dst) {
        return reason::DROP_DEST_CLASS;
    }
    not_allowed(p.protocol)
}

fn ingress_v6(ctx: &TcContext, rec: &SandboxRecord, p: &IpPacket) -> u32 {
    // Neighbour and router discovery the link needs: ICMPv6 133–137 with hop limit 255.
    if p.protocol == proto::ICMPV6 && (133..=137).contains(&p.icmp_type) {
        let src_ok =
            eq16(&p.src, &rec.guest_v6_ll) || eq16(&p.src, &rec.guest_v6) || is_unspecified(&p.src);
        return if p.hop_limit == 255 && src_ok {
            reason::PASS_ND
        } else {
            reason::DROP_SPOOFED
        };
    }
    let has_global = !is_unspecified(&rec.guest_v6);
    if !(has_global && eq16(&p.src, &rec.guest_v6)) {
        return reason::DROP_SPOOFED;
    }
    if let Some(code) = dns_or_gateway(ctx, p, eq16(&p.dst, &rec.gateway_v6)) {
        return code;
    }
    if rec.mode == mode::ALLOW_ALL {
        return if denied_class6(&p.dst) {
            reason::DROP_DEST_CLASS
        } else {
            reason::PASS_ALLOW_ALL
        };
    }
    let now = now_ns();
    let key = AllowKey6 {
        sandbox: rec.sandbox,
        generation: rec.generation,
        addr: p.dst,
    };
    if let Some(entry) = SVC_ALLOW6.get_ptr_mut(&key) {
        // SAFETY: as in ingress_v4.
        let entry = unsafe { &mut *entry };
        if entry.alive(now) {
            return allowed(ctx, rec, p, entry, now);
        }
    }
    let cidr = LpmKey {
        prefix_len: 64 + 128,
        data: CidrKey6 {
            sandbox: rec.sandbox.to_be_bytes(),
            generation: rec.generation.to_be_bytes(),
            addr: p.dst,
        },
    };
    // SAFETY: as in ingress_v4.
    if let Some(entry) = unsafe { SVC_CIDR6.get(&cidr) } {
        let mut copy = *entry;
        return allowed(ctx, rec, p, &mut copy, 0);
    }
    if denied_class6(&p.dst) {
        return reason::DROP_DEST_CLASS;
    }
    not_allowed(p.protocol)
}

/// DNS (UDP or TCP 53, to any address) goes to the guard; the gateway takes nothing else.
fn dns_or_gateway(ctx: &TcContext, p: &IpPacket, to_gateway: bool) -> Option<u32> {
    if (p.protocol == proto::UDP || p.protocol == proto::TCP) && p.dst_port == DNS_PORT {
        ctx.set_mark(mark::DNS);
        return Some(reason::PASS_DNS);
    }
    if to_gateway {
        return Some(reason::DROP_GATEWAY);
    }
    None
}

/// An allow entry matched the address: check the protocol and port, mark web traffic for the
/// proxy, note the traffic. Inlined: the fast path of every allowed packet.
#[inline(always)]
fn allowed(
    ctx: &TcContext,
    rec: &SandboxRecord,
    p: &IpPacket,
    entry: &mut AllowValue,
    now: u64,
) -> u32 {
    let port = if p.protocol == proto::ICMP || p.protocol == proto::ICMPV6 {
        0
    } else {
        p.dst_port
    };
    if !entry.allows(p.protocol, port) {
        return not_allowed(p.protocol);
    }
    // Note the traffic at most four times per idle grace: a write per packet would bounce the
    // cache line between CPUs.
    if now != 0 && now.saturating_sub(entry.last_seen_ns) > entry.idle_ns >> 2 {
        entry.last_seen_ns = now;
    }
    if p.protocol == proto::TCP
        && (p.dst_port == 443 || p.dst_port == 80)
        && rec.flags & flags::PROXY != 0
    {
        ctx.set_mark(mark::PROXY);
        return reason::PASS_PROXY;
    }
    reason::PASS_ALLOWED
}

fn not_allowed(protocol: u8) -> u32 {
    match protocol {
        proto::TCP => reason::DROP_TCP_NOT_ALLOWED,
        proto::UDP => reason::DROP_UDP_NOT_ALLOWED,
        proto::ICMP | proto::ICMPV6 => reason::DROP_ICMP,
        _ => reason::DROP_PROTOCOL,
    }
}

fn egress(ctx: &TcContext, packet: &mut IpPacket) -> (u32, u32) {
    let Some(rec) = record(ctx) else {
        return (reason::DROP_NO_SANDBOX, 0);
    };
    let frame = TcFrame(ctx);
    let to_guest = match parse::parse(&frame, packet) {
        Err(code) => return (code, rec.sandbox),
        Ok(KIND_ARP) => {
            packet.clear();
            return (reason::PASS_ARP, rec.sandbox);
        }
        Ok(_) if packet.family == 4 => eq4(&packet.dst, &rec.guest_v4),
        Ok(_) if packet.protocol == proto::ICMPV6 && (133..=137).contains(&packet.icmp_type) => {
            return (reason::PASS_ND, rec.sandbox);
        }
        Ok(_) => eq16(&packet.dst, &rec.guest_v6) || eq16(&packet.dst, &rec.guest_v6_ll),
    };
    let code = if to_guest {
        reason::PASS_EGRESS
    } else {
        reason::DROP_EGRESS_NOT_GUEST
    };
    (code, rec.sandbox)
}

/// The record of the packet's link, read in place (no 72-byte copy per packet). Userspace
/// replaces a record with one map update; a reader racing it sees the old or the new one.
fn record(ctx: &TcContext) -> Option<&'static SandboxRecord> {
    // SAFETY: `skb` is the context pointer the kernel passed in; `ifindex` is a plain field
    // the verifier lets tc programs read.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    if ifindex < capacity::LINKS {
        // An array lookup the JIT inlines; an empty slot (sandbox 0) is no record.
        // SAFETY: array slots are preallocated and stay valid for the program run.
        return unsafe { SVC_LINKS.get(&ifindex) }.filter(|r| r.sandbox != 0);
    }
    // SAFETY: map values stay valid for the whole program run (RCU); the reference is not kept
    // beyond it.
    unsafe { SVC_SANDBOXES.get(&ifindex) }
}

fn denied_class4(addr: &[u8; 4]) -> bool {
    let key = LpmKey {
        prefix_len: 32,
        data: *addr,
    };
    // SAFETY: as in ingress_v4.
    unsafe { SVC_DENY4.get(&key) }.is_some_and(|v| *v == class::DENY)
}

fn denied_class6(addr: &[u8; 16]) -> bool {
    let key = LpmKey {
        prefix_len: 128,
        data: *addr,
    };
    // SAFETY: as in ingress_v4.
    unsafe { SVC_DENY6.get(&key) }.is_some_and(|v| *v == class::DENY)
}

fn is_unspecified(a: &[u8; 16]) -> bool {
    eq16(a, &[0u8; 16])
}

/// `CLOCK_MONOTONIC_COARSE` (same base as `CLOCK_MONOTONIC`, jiffy resolution, far cheaper).
fn now_ns() -> u64 {
    // SAFETY: bpf_ktime_get_coarse_ns has no preconditions.
    unsafe { bpf_ktime_get_coarse_ns() }
}

fn count(code: u32, len: u32) {
    if let Some(counter) = SVC_COUNTERS.get_ptr_mut(&code) {
        // SAFETY: the pointer comes from a successful map lookup of this CPU's slot, which the
        // kernel keeps valid for the whole program run; per-CPU slots are never shared, so no
        // other writer races this one.
        unsafe {
            (*counter).packets += 1;
            (*counter).bytes += u64::from(len);
        }
    }
}

/// Emit a drop event unless this sandbox is past its rate for the current second.
fn report(ctx: &TcContext, code: u32, sandbox: u32, p: &IpPacket) {
    let now = now_ns();
    let mut suppressed = 0;
    match SVC_EVENT_RATE.get_ptr_mut(&sandbox) {
        Some(state) => {
            // SAFETY: pointer from a successful lookup, valid for the program run; races between
            // CPUs only blur the rate a little.
            let state = unsafe { &mut *state };
            if now.saturating_sub(state.window_start_ns) >= ONE_SECOND_NS {
                suppressed = state.suppressed;
                state.window_start_ns = now;
                state.emitted = 0;
                state.suppressed = 0;
            }
            if state.emitted >= capacity::EVENTS_PER_SECOND {
                state.suppressed += 1;
                return;
            }
            state.emitted += 1;
        }
        None => {
            if let Err(rc) = SVC_EVENT_RATE.insert(
                &sandbox,
                &RateState {
                    window_start_ns: now,
                    emitted: 1,
                    suppressed: 0,
                },
                0,
            ) {
                error!(
                    ctx,
                    "SVC_EVENT_RATE insert for sandbox {} failed: {}", sandbox, rc
                );
            }
        }
    }
    // SAFETY: as in `record`.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    let event = DropEvent {
        ts_ns: now,
        sandbox,
        reason: code,
        ifindex,
        suppressed,
        family: p.family,
        protocol: p.protocol,
        _pad: [0; 2],
        src_port: p.src_port,
        dst_port: p.dst_port,
        src: p.src,
        dst: p.dst,
    };
    if SVC_EVENTS.output(&event, 0).is_err() {
        warn!(
            ctx,
            "drop event ring buffer full: sandbox {} reason {} on ifindex {} not audited",
            sandbox,
            code,
            ifindex
        );
    }
    // Diagnostics of what should not happen, at the audit's own rate (64 a second per
    // sandbox): the audit names the drop, the log says what the fence saw.
    if code == reason::DROP_NO_SANDBOX {
        warn!(
            ctx,
            "packet on ifindex {} that has no sandbox record (a fenced link svcd does not know)",
            ifindex
        );
    } else if code == reason::DROP_MALFORMED {
        debug!(
            ctx,
            "malformed packet from sandbox {} on ifindex {}: {} bytes",
            sandbox,
            ifindex,
            ctx.len()
        );
    }
}

struct TcFrame<'a>(&'a TcContext);

impl TcFrame<'_> {
    /// Read `T` at `offset` straight from the linear packet data when it is there (the common
    /// case: headers are linear), else through `bpf_skb_load_bytes`, which also reaches paged
    /// data. Either way bounds-checked.
    #[inline(always)]
    fn read<T: Copy>(&self, offset: usize) -> Result<T, OutOfBounds> {
        let start = self.0.data();
        let end = self.0.data_end();
        if start + offset + core::mem::size_of::<T>() <= end {
            // SAFETY: [start + offset, start + offset + size_of::<T>()) lies inside the packet's
            // linear data (checked just above, and again by the verifier); `read_unaligned`
            // copes with any alignment.
            return Ok(unsafe { core::ptr::read_unaligned((start + offset) as *const T) });
        }
        self.0.load::<T>(offset).map_err(|_| OutOfBounds)
    }
}

impl Frame for TcFrame<'_> {
    fn len(&self) -> usize {
        self.0.len() as usize
    }
    fn load_u8(&self, offset: usize) -> Result<u8, OutOfBounds> {
        self.read::<u8>(offset)
    }
    fn load_be16(&self, offset: usize) -> Result<u16, OutOfBounds> {
        self.read::<u16>(offset).map(u16::from_be)
    }
    fn load_4(&self, offset: usize) -> Result<[u8; 4], OutOfBounds> {
        self.read::<[u8; 4]>(offset)
    }
    fn load_16(&self, offset: usize) -> Result<[u8; 16], OutOfBounds> {
        self.read::<[u8; 16]>(offset)
    }
}

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // No panic path survives into the object (the verifier would reject the loop); this only
    // satisfies `no_std`.
    #[expect(
        clippy::empty_loop,
        reason = "no_std panic handler that is never reached"
    )]
    loop {}
}

/// Host builds only exist for linting.
#[cfg(not(target_arch = "bpf"))]
fn main() {}
