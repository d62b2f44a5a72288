//! The fence's verdict counters: per reason, summed over CPUs, read from the loaded fence or
//! from the pinned map of one loaded by another process.

use std::path::Path;

use aya::maps::{MapData, PerCpuArray};
use serde::Serialize;
use svc_ebpf_common::{Counter, map, reason};

use super::error::DataplaneError;

/// The counters of one verdict reason, summed over CPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReasonCount {
    pub code: u32,
    pub reason: &'static str,
    pub drop: bool,
    pub packets: u64,
    pub bytes: u64,
}

/// All verdict counters of the fence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Counters {
    pub reasons: Vec<ReasonCount>,
}

impl Counters {
    /// Packets counted under `code`.
    pub fn packets(&self, code: u32) -> u64 {
        self.reasons
            .iter()
            .find(|r| r.code == code)
            .map_or(0, |r| r.packets)
    }

    /// Packets dropped for any reason.
    pub fn dropped(&self) -> u64 {
        self.reasons
            .iter()
            .filter(|r| r.drop)
            .map(|r| r.packets)
            .sum()
    }
}

/// Read the counters from the pinned map of a fence loaded by another process (svcd, the demo).
pub fn read_pinned_counters(pin_dir: &Path) -> Result<Counters, DataplaneError> {
    let path = pin_dir.join(map::COUNTERS);
    let data = MapData::from_pin(&path).map_err(|source| DataplaneError::OpenMap {
        path: path.clone(),
        source: Box::new(source),
    })?;
    let map = aya::maps::Map::PerCpuArray(data);
    let array: PerCpuArray<MapData, Counter> =
        PerCpuArray::try_from(map).map_err(|source| DataplaneError::OpenMap {
            path,
            source: Box::new(source),
        })?;
    sum_counters(&array)
}

pub(super) fn sum_counters<T: std::borrow::Borrow<MapData>>(
    array: &PerCpuArray<T, Counter>,
) -> Result<Counters, DataplaneError> {
    let mut reasons = Vec::with_capacity(reason::NAMES.len());
    for (code, name) in (0u32..).zip(reason::NAMES) {
        let per_cpu = array
            .get(&code, 0)
            .map_err(|source| DataplaneError::ReadMap {
                map: map::COUNTERS,
                source: Box::new(source),
            })?;
        let (packets, bytes) = per_cpu
            .iter()
            .fold((0u64, 0u64), |(p, b), c| (p + c.packets, b + c.bytes));
        reasons.push(ReasonCount {
            code,
            reason: name,
            drop: reason::is_drop(code),
            packets,
            bytes,
        });
    }
    Ok(Counters { reasons })
}
