//! Typed handles on the fence's maps, and the link records in them (svcd is their only
//! writer, so it remembers what it wrote).

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf, lpm_trie::LpmTrie},
};
use svc_ebpf_common::{
    AllowKey4, AllowKey6, AllowValue, CidrKey4, CidrKey6, Counter, SandboxRecord, capacity, map,
};

use super::error::DataplaneError;

/// Typed handles on the fence's maps.
pub(super) struct Maps {
    pub counters: PerCpuArray<MapData, Counter>,
    pub links: Array<MapData, SandboxRecord>,
    pub sandboxes: HashMap<MapData, u32, SandboxRecord>,
    pub allow4: HashMap<MapData, AllowKey4, AllowValue>,
    pub allow6: HashMap<MapData, AllowKey6, AllowValue>,
    pub cidr4: LpmTrie<MapData, CidrKey4, AllowValue>,
    pub cidr6: LpmTrie<MapData, CidrKey6, AllowValue>,
    pub deny4: LpmTrie<MapData, [u8; 4], u32>,
    pub deny6: LpmTrie<MapData, [u8; 16], u32>,
    pub events: RingBuf<MapData>,
    /// Link records as this process last wrote or read them (it is their only writer): the
    /// DNS guard's write path finds a link's generation without a system call.
    pub records_seen: std::collections::HashMap<u32, SandboxRecord>,
}

impl Maps {
    /// The record of a link, if it has one.
    pub fn record(&self, ifindex: u32) -> Option<SandboxRecord> {
        if ifindex < capacity::LINKS {
            self.links.get(&ifindex, 0).ok().filter(|r| r.sandbox != 0)
        } else {
            self.sandboxes.get(&ifindex, 0).ok()
        }
    }

    /// The record of a link as last written or read here, else read from the map.
    pub fn record_seen(&mut self, ifindex: u32) -> Option<SandboxRecord> {
        if let Some(r) = self.records_seen.get(&ifindex) {
            return Some(*r);
        }
        let r = self.record(ifindex)?;
        self.records_seen.insert(ifindex, r);
        Some(r)
    }

    /// Write a link's record in one map update.
    pub fn set_record(
        &mut self,
        ifindex: u32,
        record: SandboxRecord,
    ) -> Result<(), aya::maps::MapError> {
        self.records_seen.remove(&ifindex);
        if ifindex < capacity::LINKS {
            self.links.set(ifindex, record, 0)
        } else {
            self.sandboxes.insert(ifindex, record, 0)
        }?;
        self.records_seen.insert(ifindex, record);
        Ok(())
    }

    /// Clear a link's record (the link then drops everything).
    pub fn clear_record(&mut self, ifindex: u32) -> Result<(), aya::maps::MapError> {
        self.records_seen.remove(&ifindex);
        if ifindex < capacity::LINKS {
            self.links.set(ifindex, SandboxRecord::default(), 0)
        } else {
            self.sandboxes.remove(&ifindex)
        }
    }

    /// The destination classes already pinned (re-adoption after a restart).
    pub(super) fn read_classes(&self) -> Vec<(ipnet::IpNet, u32)> {
        let mut out = Vec::new();
        for (k, v) in self.deny4.iter().flatten() {
            if let Ok(n) =
                ipnet::Ipv4Net::new(std::net::Ipv4Addr::from(k.data()), k.prefix_len() as u8)
            {
                out.push((n.into(), v));
            }
        }
        for (k, v) in self.deny6.iter().flatten() {
            if let Ok(n) =
                ipnet::Ipv6Net::new(std::net::Ipv6Addr::from(k.data()), k.prefix_len() as u8)
            {
                out.push((n.into(), v));
            }
        }
        out
    }

    pub(super) fn take(ebpf: &mut Ebpf) -> Result<Self, DataplaneError> {
        Ok(Self {
            counters: take(ebpf, map::COUNTERS)?,
            links: take(ebpf, map::LINKS)?,
            sandboxes: take(ebpf, map::SANDBOXES)?,
            allow4: take(ebpf, map::ALLOW4)?,
            allow6: take(ebpf, map::ALLOW6)?,
            cidr4: take(ebpf, map::CIDR4)?,
            cidr6: take(ebpf, map::CIDR6)?,
            deny4: take(ebpf, map::DENY4)?,
            deny6: take(ebpf, map::DENY6)?,
            events: take(ebpf, map::EVENTS)?,
            records_seen: std::collections::HashMap::new(),
        })
    }
}

fn take<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, DataplaneError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or(DataplaneError::MissingMap(name))?;
    T::try_from(map).map_err(|source| DataplaneError::ReadMap {
        map: name,
        source: Box::new(source),
    })
}
