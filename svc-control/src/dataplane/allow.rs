//! Allow entries: the DNS guard's writes into the generation in force (merged with what an
//! address already opens, skipped when already in force), their expiry, and the value an
//! entry's port rules encode to.

use std::{net::IpAddr, time::Duration};

use aya::maps::lpm_trie::Key;
use ipnet::IpNet;
use svc_ebpf_common::{AllowKey4, AllowKey6, AllowValue, CidrKey4, CidrKey6, class, map, rule};

use super::{
    clock,
    entries::{AllowEntry, CidrEntry, PortRule},
    error::{DataplaneError, write_err},
    fence::Fence,
};

impl Fence {
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

    pub(super) fn put_allow(
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

    pub(super) fn put_cidr(
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
}

pub(super) fn value(
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
pub(super) fn narrowed(v: AllowValue, keep: &[PortRule], v6: bool) -> Option<AllowValue> {
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
