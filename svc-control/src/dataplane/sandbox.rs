//! Map sync: a sandbox's record and allow entries, written so that a policy change is atomic
//! per sandbox (generation double-buffering, see `svc-ebpf-common`).

use std::net::IpAddr;

use aya::maps::lpm_trie::Key;
use svc_ebpf_common::{
    AllowKey4, AllowKey6, AllowValue, CidrKey4, CidrKey6, SandboxRecord, flags, map, mode,
};

use super::{
    allow::narrowed,
    entries::{AllowEntry, Carry, CidrEntry, SandboxLink},
    error::{DataplaneError, write_err},
    fence::Fence,
};
use crate::policy::mode::EgressMode;

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
        if previous.is_none_or(|r| r.sandbox != link.sandbox) {
            // A sandbox's first policy on this link: no entry of an earlier sandbox with the
            // same id may carry over (one whose link went away without `remove_sandbox`, e.g.
            // its guest stopped while svcd was down), or the new sandbox would inherit its
            // allowed addresses at generation 1.
            self.delete_generation(link.sandbox, None)?;
        }
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

    /// Delete a sandbox's entries of one generation (or of all).
    fn delete_generation(
        &mut self,
        sandbox: u32,
        generation: Option<u32>,
    ) -> Result<(), DataplaneError> {
        let hit = |s: u32, g: u32| s == sandbox && generation.is_none_or(|want| want == g);
        let be = |s: [u8; 4], g: [u8; 4]| (u32::from_be_bytes(s), u32::from_be_bytes(g));
        let k4 = doomed(self.maps.allow4.keys(), |k| (k.sandbox, k.generation), hit);
        let k6 = doomed(self.maps.allow6.keys(), |k| (k.sandbox, k.generation), hit);
        let c4 = doomed(
            self.maps.cidr4.keys(),
            |k: &Key<CidrKey4>| be(k.data().sandbox, k.data().generation),
            hit,
        );
        let c6 = doomed(
            self.maps.cidr6.keys(),
            |k: &Key<CidrKey6>| be(k.data().sandbox, k.data().generation),
            hit,
        );
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

/// The keys `keys` yields whose `(sandbox, generation)`, as `owner` reads it, `hit` takes.
fn doomed<K, E>(
    keys: impl Iterator<Item = Result<K, E>>,
    owner: impl Fn(&K) -> (u32, u32),
    hit: impl Fn(u32, u32) -> bool,
) -> Vec<K> {
    keys.flatten()
        .filter(|k| {
            let (s, g) = owner(k);
            hit(s, g)
        })
        .collect()
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
