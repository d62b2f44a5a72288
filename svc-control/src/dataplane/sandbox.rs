//! Map sync: a sandbox's record and allow entries, written so that a policy change is atomic
//! per sandbox (generation double-buffering, see `svc-ebpf-common`), plus the global
//! destination-class tries.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use aya::maps::lpm_trie::Key;
use ipnet::IpNet;
use svc_ebpf_common::{
    AllowKey4, AllowKey6, AllowValue, CidrKey4, CidrKey6, SandboxRecord, class, flags, map, mode,
    rule,
};

use super::{DataplaneError, Fence, clock};
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
    fn encode(self, v6: bool) -> u32 {
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

impl Fence {
    /// Install or replace a sandbox's whole policy on its link, atomically: the new entries
    /// are written under the next generation, the record is flipped in one update, then the
    /// previous generation is deleted. Returns the generation now in force.
    pub fn install_sandbox(
        &mut self,
        link: &SandboxLink,
        entries: &[AllowEntry],
        cidrs: &[CidrEntry],
    ) -> Result<u32, DataplaneError> {
        if link.sandbox == 0 {
            return Err(DataplaneError::ReservedSandboxId);
        }
        let previous = self.maps.record(link.ifindex);
        let generation = previous.map_or(1, |r| r.generation.wrapping_add(1).max(1));
        for e in entries {
            self.put_allow(link.sandbox, generation, e)?;
        }
        for c in cidrs {
            self.put_cidr(link.sandbox, generation, c)?;
        }
        let record = record(link, generation);
        self.maps
            .set_record(link.ifindex, record)
            .map_err(|e| write_err(map::LINKS, e))?;
        if let Some(old) = previous {
            self.delete_generation(old.sandbox, Some(old.generation))?;
        }
        Ok(generation)
    }

    /// A new generation of a sandbox's policy that carries the allow entries over as `carry`
    /// says (kept entries keep their expiry and last use), flipped in one update like
    /// [`Fence::install_sandbox`]; the entries left behind are gone with the old generation
    /// (svcd installs no CIDR entries for sandboxes: their allowlists are names, bound by the
    /// DNS guard). The generation now in force.
    pub fn regenerate(
        &mut self,
        ifindex: u32,
        carry: impl Fn(IpAddr) -> Carry,
    ) -> Result<u32, DataplaneError> {
        let old = self
            .maps
            .record(ifindex)
            .ok_or(DataplaneError::NoSandbox(ifindex))?;
        let generation = old.generation.wrapping_add(1).max(1);
        let carried = |addr: IpAddr, v: AllowValue| match carry(addr) {
            Carry::Drop => None,
            Carry::Keep => Some(v),
            Carry::Only(rules) => narrowed(v, &rules, addr.is_ipv6()),
        };
        let mut v4 = Vec::new();
        for (k, v) in self.maps.allow4.iter().flatten() {
            if k.sandbox == old.sandbox
                && k.generation == old.generation
                && let Some(v) = carried(IpAddr::from(k.addr), v)
            {
                v4.push((AllowKey4 { generation, ..k }, v));
            }
        }
        let mut v6 = Vec::new();
        for (k, v) in self.maps.allow6.iter().flatten() {
            if k.sandbox == old.sandbox
                && k.generation == old.generation
                && let Some(v) = carried(IpAddr::from(k.addr), v)
            {
                v6.push((AllowKey6 { generation, ..k }, v));
            }
        }
        for (k, v) in v4 {
            self.maps
                .allow4
                .insert(k, v, 0)
                .map_err(|e| write_err(map::ALLOW4, e))?;
        }
        for (k, v) in v6 {
            self.maps
                .allow6
                .insert(k, v, 0)
                .map_err(|e| write_err(map::ALLOW6, e))?;
        }
        self.maps
            .set_record(ifindex, SandboxRecord { generation, ..old })
            .map_err(|e| write_err(map::LINKS, e))?;
        self.delete_generation(old.sandbox, Some(old.generation))?;
        Ok(generation)
    }

    /// Whether `link`'s record is already in force exactly as `link` describes it (any
    /// generation): re-adoption then keeps the entries the DNS guard wrote before the restart
    /// instead of starting a new, empty generation.
    pub fn record_in_force(&self, link: &SandboxLink) -> bool {
        self.maps
            .record(link.ifindex)
            .is_some_and(|r| record(link, r.generation) == r)
    }

    /// Add one entry to the generation in force (the DNS guard's write). Fails if the link has
    /// no sandbox. An address already in force for another name keeps that name's rules too:
    /// the entry opens both names' ports until the later expiry (the fence sees addresses, not
    /// names). An entry already in force with these rules among its own and at least as much
    /// life left is not written again (a cached answer repeated: no system call at all);
    /// whether it was written.
    pub fn add_allow(&mut self, ifindex: u32, entry: &AllowEntry) -> Result<bool, DataplaneError> {
        let rec = self
            .maps
            .record_seen(ifindex)
            .ok_or(DataplaneError::NoSandbox(ifindex))?;
        self.put_allow(rec.sandbox, rec.generation, entry)
    }

    /// Remove a sandbox: its record first (the link then drops everything), then its entries.
    pub fn remove_sandbox(&mut self, ifindex: u32) -> Result<(), DataplaneError> {
        let Some(rec) = self.maps.record(ifindex) else {
            return Ok(());
        };
        self.maps
            .clear_record(ifindex)
            .map_err(|e| write_err(map::LINKS, e))?;
        self.delete_generation(rec.sandbox, None)
    }

    /// The record of a link, if it has one.
    pub fn sandbox_record(&self, ifindex: u32) -> Option<SandboxRecord> {
        self.maps.record(ifindex)
    }

    /// Allow entries of one sandbox in the generation in force: (address, entry).
    pub fn allow_entries(&self, sandbox: u32) -> Vec<(IpAddr, AllowValue)> {
        let mut out = Vec::new();
        for (k, v) in self.maps.allow4.iter().flatten() {
            if k.sandbox == sandbox {
                out.push((IpAddr::from(k.addr), v));
            }
        }
        for (k, v) in self.maps.allow6.iter().flatten() {
            if k.sandbox == sandbox {
                out.push((IpAddr::from(k.addr), v));
            }
        }
        out
    }

    /// Replace the destination classes: `deny` CIDRs are never reachable, `operator_allow`
    /// CIDRs (longer prefixes win in the trie) reopen part of them. Written over the old
    /// classes, which leave afterwards, so no moment has neither.
    pub fn set_destination_classes(
        &mut self,
        deny: &[IpNet],
        operator_allow: &[IpNet],
    ) -> Result<(), DataplaneError> {
        // The new entries first, then the stale ones out: the tries are never without the
        // classes both old and new refuse (AllowAll sandboxes outlive a restarting svcd).
        let old4: Vec<Key<[u8; 4]>> = self.maps.deny4.keys().flatten().collect();
        let old6: Vec<Key<[u8; 16]>> = self.maps.deny6.keys().flatten().collect();
        self.classes.clear();
        for (nets, verdict) in [(deny, class::DENY), (operator_allow, class::OPERATOR_ALLOW)] {
            self.classes.extend(nets.iter().map(|n| (*n, verdict)));
            for net in nets {
                match net {
                    IpNet::V4(n) => self
                        .maps
                        .deny4
                        .insert(
                            &Key::new(u32::from(n.prefix_len()), n.network().octets()),
                            verdict,
                            0,
                        )
                        .map_err(|e| write_err(map::DENY4, e))?,
                    IpNet::V6(n) => self
                        .maps
                        .deny6
                        .insert(
                            &Key::new(u32::from(n.prefix_len()), n.network().octets()),
                            verdict,
                            0,
                        )
                        .map_err(|e| write_err(map::DENY6, e))?,
                }
            }
        }
        let listed = |prefix: u32, addr: IpAddr| {
            self.classes
                .iter()
                .any(|(n, _)| u32::from(n.prefix_len()) == prefix && n.network() == addr)
        };
        for k in old4 {
            if !listed(k.prefix_len(), IpAddr::from(k.data())) {
                let _ = self.maps.deny4.remove(&k);
            }
        }
        for k in old6 {
            if !listed(k.prefix_len(), IpAddr::from(k.data())) {
                let _ = self.maps.deny6.remove(&k);
            }
        }
        Ok(())
    }

    /// Delete allow entries that are dead now (past their TTL and idle). Returns how many.
    pub fn collect_expired(&mut self) -> Result<usize, DataplaneError> {
        let now = clock::monotonic_ns();
        let dead4: Vec<AllowKey4> = self
            .maps
            .allow4
            .iter()
            .flatten()
            .filter(|(_, v)| !v.alive(now))
            .map(|(k, _)| k)
            .collect();
        let dead6: Vec<AllowKey6> = self
            .maps
            .allow6
            .iter()
            .flatten()
            .filter(|(_, v)| !v.alive(now))
            .map(|(k, _)| k)
            .collect();
        let n = dead4.len() + dead6.len();
        for k in dead4 {
            let _ = self.maps.allow4.remove(&k);
            self.written
                .remove(&(k.sandbox, k.generation, IpAddr::from(k.addr)));
        }
        for k in dead6 {
            let _ = self.maps.allow6.remove(&k);
            self.written
                .remove(&(k.sandbox, k.generation, IpAddr::from(k.addr)));
        }
        // An entry kept alive by traffic past its expiry is written again at its next answer.
        self.written
            .retain(|_, v| v.expiry_ns == 0 || v.expiry_ns > now);
        Ok(n)
    }

    /// Whether the destination classes refuse `addr` (the longest matching prefix decides, as
    /// in the kernel's trie).
    pub fn class_denies(&self, addr: IpAddr) -> bool {
        self.classes
            .iter()
            .filter(|(n, _)| n.contains(&addr))
            .max_by_key(|(n, _)| n.prefix_len())
            .is_some_and(|(_, v)| *v == class::DENY)
    }

    fn put_allow(
        &mut self,
        sandbox: u32,
        generation: u32,
        e: &AllowEntry,
    ) -> Result<bool, DataplaneError> {
        // The Curated fast path skips the class trie on a hit: a denied address must never get
        // into the allow maps.
        if self.class_denies(e.addr) {
            return Err(DataplaneError::DeniedDestination(e.addr.to_string()));
        }
        let v6 = e.addr.is_ipv6();
        let mut value = value(&e.rules, e.host_id, e.ttl, e.idle, v6)?;
        let key = (sandbox, generation, e.addr);
        if self.written.get(&key).is_some_and(|w| covers(w, &value)) {
            return Ok(false);
        }
        // Forgotten first: a failed write leaves no claim behind.
        self.written.remove(&key);
        // Read from the map, not from `written`: an entry kept alive by traffic past its expiry
        // is no longer remembered there, and its rules must not be cut under that traffic.
        if let Some(live) = self
            .read_allow(sandbox, generation, e.addr)
            .filter(|v| v.alive(clock::monotonic_ns()))
        {
            let (merged, left_out) = merge(&live, &value);
            if left_out > 0 {
                tracing::warn!(addr = %e.addr, sandbox, left_out, slots = rule::SLOTS,
                    "an address shared by allowed names needs more port rules than an entry holds: the earlier names' extra rules are dropped");
            }
            value = merged;
        }
        match e.addr {
            IpAddr::V4(a) => self
                .maps
                .allow4
                .insert(
                    AllowKey4 {
                        sandbox,
                        generation,
                        addr: a.octets(),
                    },
                    value,
                    0,
                )
                .map_err(|err| write_err(map::ALLOW4, err)),
            IpAddr::V6(a) => self
                .maps
                .allow6
                .insert(
                    AllowKey6 {
                        sandbox,
                        generation,
                        addr: a.octets(),
                    },
                    value,
                    0,
                )
                .map_err(|err| write_err(map::ALLOW6, err)),
        }?;
        self.written.insert(key, value);
        Ok(true)
    }

    /// The allow entry of `addr` in the maps, if any.
    fn read_allow(&self, sandbox: u32, generation: u32, addr: IpAddr) -> Option<AllowValue> {
        match addr {
            IpAddr::V4(a) => self.maps.allow4.get(
                &AllowKey4 {
                    sandbox,
                    generation,
                    addr: a.octets(),
                },
                0,
            ),
            IpAddr::V6(a) => self.maps.allow6.get(
                &AllowKey6 {
                    sandbox,
                    generation,
                    addr: a.octets(),
                },
                0,
            ),
        }
        .ok()
    }

    fn put_cidr(
        &mut self,
        sandbox: u32,
        generation: u32,
        c: &CidrEntry,
    ) -> Result<(), DataplaneError> {
        let operator_allowed = self
            .classes
            .iter()
            .any(|(a, v)| *v == class::OPERATOR_ALLOW && a.contains(&c.net));
        let overlaps_denied = self
            .classes
            .iter()
            .any(|(n, v)| *v == class::DENY && (n.contains(&c.net) || c.net.contains(n)));
        if overlaps_denied && !operator_allowed {
            return Err(DataplaneError::DeniedDestination(c.net.to_string()));
        }
        let value = value(
            &c.rules,
            c.host_id,
            None,
            Duration::ZERO,
            c.net.addr().is_ipv6(),
        )?;
        let (s, g) = (sandbox.to_be_bytes(), generation.to_be_bytes());
        match c.net {
            IpNet::V4(n) => self
                .maps
                .cidr4
                .insert(
                    &Key::new(
                        64 + u32::from(n.prefix_len()),
                        CidrKey4 {
                            sandbox: s,
                            generation: g,
                            addr: n.network().octets(),
                        },
                    ),
                    value,
                    0,
                )
                .map_err(|err| write_err(map::CIDR4, err)),
            IpNet::V6(n) => self
                .maps
                .cidr6
                .insert(
                    &Key::new(
                        64 + u32::from(n.prefix_len()),
                        CidrKey6 {
                            sandbox: s,
                            generation: g,
                            addr: n.network().octets(),
                        },
                    ),
                    value,
                    0,
                )
                .map_err(|err| write_err(map::CIDR6, err)),
        }
    }

    /// Delete a sandbox's entries of one generation (or of all).
    fn delete_generation(
        &mut self,
        sandbox: u32,
        generation: Option<u32>,
    ) -> Result<(), DataplaneError> {
        let hit = |s: u32, g: u32| s == sandbox && generation.is_none_or(|want| want == g);
        let k4: Vec<AllowKey4> = self
            .maps
            .allow4
            .keys()
            .flatten()
            .filter(|k| hit(k.sandbox, k.generation))
            .collect();
        let k6: Vec<AllowKey6> = self
            .maps
            .allow6
            .keys()
            .flatten()
            .filter(|k| hit(k.sandbox, k.generation))
            .collect();
        let c4: Vec<Key<CidrKey4>> = self
            .maps
            .cidr4
            .keys()
            .flatten()
            .filter(|k| {
                let d = k.data();
                hit(
                    u32::from_be_bytes(d.sandbox),
                    u32::from_be_bytes(d.generation),
                )
            })
            .collect();
        let c6: Vec<Key<CidrKey6>> = self
            .maps
            .cidr6
            .keys()
            .flatten()
            .filter(|k| {
                let d = k.data();
                hit(
                    u32::from_be_bytes(d.sandbox),
                    u32::from_be_bytes(d.generation),
                )
            })
            .collect();
        for k in k4 {
            let _ = self.maps.allow4.remove(&k);
        }
        for k in k6 {
            let _ = self.maps.allow6.remove(&k);
        }
        self.written.retain(|(s, g, _), _| !hit(*s, *g));
        for k in c4 {
            let _ = self.maps.cidr4.remove(&k);
        }
        for k in c6 {
            let _ = self.maps.cidr6.remove(&k);
        }
        Ok(())
    }
}

fn record(link: &SandboxLink, generation: u32) -> SandboxRecord {
    SandboxRecord {
        sandbox: link.sandbox,
        mode: match link.mode {
            EgressMode::Curated => mode::CURATED,
            EgressMode::AllowAll => mode::ALLOW_ALL,
        },
        generation,
        flags: if link.proxy { flags::PROXY } else { 0 },
        guest_v4: link.guest_v4.octets(),
        gateway_v4: link.gateway_v4.octets(),
        guest_v6: link.guest_v6.map_or([0; 16], |a| a.octets()),
        guest_v6_ll: link.guest_v6_link_local.map_or([0; 16], |a| a.octets()),
        gateway_v6: link.gateway_v6.map_or([0; 16], |a| a.octets()),
    }
}

fn value(
    rules: &[PortRule],
    host_id: u32,
    ttl: Option<Duration>,
    idle: Duration,
    v6: bool,
) -> Result<AllowValue, DataplaneError> {
    if rules.len() > rule::SLOTS {
        return Err(DataplaneError::TooManyRules {
            given: rules.len(),
            max: rule::SLOTS,
        });
    }
    let mut slots = [0u32; rule::SLOTS];
    for (slot, r) in slots.iter_mut().zip(rules) {
        *slot = r.encode(v6);
    }
    let expiry_ns = ttl.map_or(0, |t| {
        clock::monotonic_ns()
            .saturating_add(u64::try_from(t.as_nanos()).unwrap_or(u64::MAX))
            .max(1)
    });
    Ok(AllowValue {
        host_id,
        _pad: 0,
        rules: slots,
        expiry_ns,
        idle_ns: u64::try_from(idle.as_nanos()).unwrap_or(u64::MAX),
        last_seen_ns: 0,
    })
}

/// Whether `written`, in the maps, already does what writing `wanted` would: the same host and
/// idle time, every wanted rule among its rules, and an expiry no earlier (or none).
fn covers(written: &AllowValue, wanted: &AllowValue) -> bool {
    written.host_id == wanted.host_id
        && wanted
            .rules
            .iter()
            .all(|r| *r == 0 || written.rules.contains(r))
        && written.idle_ns == wanted.idle_ns
        && (written.expiry_ns == 0
            || (wanted.expiry_ns != 0 && written.expiry_ns >= wanted.expiry_ns))
}

/// `new` written over the live entry `live` of the same address: `new`'s rules, then those of
/// `live`'s it lacks while slots last, and the later expiry (none beats any). How many of
/// `live`'s rules found no slot.
fn merge(live: &AllowValue, new: &AllowValue) -> (AllowValue, usize) {
    let mut out = AllowValue {
        expiry_ns: if live.expiry_ns == 0 || new.expiry_ns == 0 {
            0
        } else {
            live.expiry_ns.max(new.expiry_ns)
        },
        last_seen_ns: live.last_seen_ns,
        ..*new
    };
    let mut used = out.rules.iter().filter(|r| **r != 0).count();
    let mut left_out = 0;
    for r in live.rules.iter().filter(|r| **r != 0) {
        if out.rules[..used].contains(r) {
            continue;
        }
        if used == rule::SLOTS {
            left_out += 1;
            continue;
        }
        out.rules[used] = *r;
        used += 1;
    }
    (out, left_out)
}

/// `v` with only the rules among `keep`, packed to the front; `None` when none is.
fn narrowed(v: AllowValue, keep: &[PortRule], v6: bool) -> Option<AllowValue> {
    let keep: Vec<u32> = keep.iter().map(|r| r.encode(v6)).collect();
    let mut rules = [0u32; rule::SLOTS];
    let kept = v.rules.iter().filter(|r| **r != 0 && keep.contains(r));
    let mut n = 0;
    for (slot, r) in rules.iter_mut().zip(kept) {
        *slot = *r;
        n += 1;
    }
    (n > 0).then_some(AllowValue { rules, ..v })
}

fn write_err(map: &'static str, source: aya::maps::MapError) -> DataplaneError {
    DataplaneError::WriteMap {
        map,
        source: Box::new(source),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ports: &[u16], expiry_ns: u64) -> AllowValue {
        let rules: Vec<PortRule> = ports.iter().map(|p| PortRule::Tcp(*p)).collect();
        AllowValue {
            expiry_ns,
            ..value(&rules, 7, None, Duration::from_secs(1), false).unwrap()
        }
    }

    fn ports(v: &AllowValue) -> Vec<u16> {
        v.rules
            .iter()
            .filter(|r| **r != 0)
            .map(|r| rule::port(*r))
            .collect()
    }

    #[test]
    fn a_write_over_a_live_entry_keeps_its_rules_and_the_later_expiry() {
        // (case, live ports, live expiry, new ports, new expiry, want ports, want expiry, left out)
        type Case = (
            &'static str,
            &'static [u16],
            u64,
            &'static [u16],
            u64,
            &'static [u16],
            u64,
            usize,
        );
        let cases: &[Case] = &[
            (
                "disjoint",
                &[443, 80],
                50,
                &[5432],
                90,
                &[5432, 443, 80],
                90,
                0,
            ),
            (
                "overlapping",
                &[443, 80],
                90,
                &[80, 22],
                50,
                &[80, 22, 443],
                90,
                0,
            ),
            ("same", &[443], 50, &[443], 60, &[443], 60, 0),
            ("live_never_expires", &[443], 0, &[22], 60, &[22, 443], 0, 0),
            ("new_never_expires", &[443], 60, &[22], 0, &[22, 443], 0, 0),
            (
                "more_than_the_slots",
                &[1, 2, 3, 4, 5, 6],
                50,
                &[7, 8, 9],
                60,
                &[7, 8, 9, 1, 2, 3, 4, 5],
                60,
                1,
            ),
        ];
        for (case, live, live_exp, new, new_exp, want, want_exp, left) in cases {
            let mut old = entry(live, *live_exp);
            old.last_seen_ns = 33;
            let (got, left_out) = merge(&old, &entry(new, *new_exp));
            assert_eq!(ports(&got), *want, "{case}");
            assert_eq!(got.expiry_ns, *want_exp, "{case}");
            assert_eq!(left_out, *left, "{case}");
            assert_eq!(got.last_seen_ns, 33, "{case}: the last use is kept");
            assert!(covers(&got, &entry(new, *new_exp)), "{case}");
        }
    }

    #[test]
    fn covers_means_every_wanted_rule_is_there_with_as_much_life() {
        let written = entry(&[443, 80, 5432], 100);
        let cases: &[(&str, &[u16], u64, bool)] = &[
            ("subset", &[443, 80], 100, true),
            ("one_rule", &[5432], 50, true),
            ("all_in_another_order", &[5432, 80, 443], 100, true),
            ("a_rule_missing", &[443, 22], 50, false),
            ("more_life_needed", &[443], 101, false),
            ("no_expiry_wanted", &[443], 0, false),
        ];
        for (case, wanted, exp, want) in cases {
            assert_eq!(covers(&written, &entry(wanted, *exp)), *want, "{case}");
        }
        assert!(
            covers(&entry(&[443], 0), &entry(&[443], 5)),
            "none beats any"
        );
    }

    #[test]
    fn narrowing_keeps_only_the_listed_rules_packed_or_nothing() {
        let v = entry(&[443, 80, 5432], 100);
        let keep = |p: &[u16]| -> Vec<PortRule> { p.iter().map(|p| PortRule::Tcp(*p)).collect() };
        let got = narrowed(v, &keep(&[5432, 22]), false).unwrap();
        assert_eq!(ports(&got), [5432]);
        assert_eq!(got.expiry_ns, 100);
        assert_eq!(
            ports(&narrowed(v, &keep(&[80, 443]), false).unwrap()),
            [443, 80]
        );
        assert_eq!(narrowed(v, &keep(&[22]), false), None);
        assert_eq!(narrowed(v, &[PortRule::Udp(443)], false), None);
    }
}
