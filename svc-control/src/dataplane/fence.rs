//! The fence object: one load of svc's eBPF programs, pinned, attached per guest link.

use std::{
    io,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf, lpm_trie::LpmTrie},
    programs::{
        LinkOrder, SchedClassifier, TcAttachType, TestRun as _, TestRunOptions,
        links::{FdLink, PinnedLink},
        tc::TcAttachOptions,
    },
};
use serde::Serialize;
use svc_ebpf_common::{
    AllowKey4, AllowKey6, AllowValue, CidrKey4, CidrKey6, Counter, DropEvent, SandboxRecord,
    capacity, map, program, reason,
};

use super::DataplaneError;

/// svc's eBPF object, built by `build.rs` from the `svc-ebpf` crate.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/svc-ebpf"));

/// Where bpffs lives on a normal host.
const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// The loaded fence: programs and maps, pinned under `pin_dir`.
pub struct Fence {
    ebpf: Ebpf,
    pin_dir: PathBuf,
    pub(super) maps: Maps,
    /// A copy of the destination-class tries (prefix, verdict), to refuse allow entries in a
    /// denied class before they reach the kernel.
    pub(super) classes: Vec<(ipnet::IpNet, u32)>,
    /// Every allow entry this process wrote and that is still in the maps, as written:
    /// (sandbox, generation, address) → value. svcd is the maps' only writer (the programs
    /// only read them), so an answer whose entry is already here, with the same rules and at
    /// least the life it needs, is in the fence without a new write (`Fence::add_allow`).
    pub(super) written: std::collections::HashMap<(u32, u32, std::net::IpAddr), AllowValue>,
    /// Links of the empty calibration program while a benchmark has it attached
    /// ([`Fence::attach_calibration`]); never pinned, never used by svcd.
    calibration: Vec<aya::programs::tc::SchedClassifierLinkId>,
}

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

/// Which direction of a guest link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Guest → host (tc ingress on the host end).
    Ingress,
    /// Host → guest (tc egress on the host end).
    Egress,
}

impl Direction {
    const fn program(self) -> &'static str {
        match self {
            Self::Ingress => program::TAP_INGRESS,
            Self::Egress => program::TAP_EGRESS,
        }
    }
    const fn suffix(self) -> &'static str {
        match self {
            Self::Ingress => "ingress",
            Self::Egress => "egress",
        }
    }
    const fn attach_type(self) -> TcAttachType {
        match self {
            Self::Ingress => TcAttachType::Ingress,
            Self::Egress => TcAttachType::Egress,
        }
    }
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("pin_dir", &self.pin_dir)
            .finish_non_exhaustive()
    }
}

/// Result of running the ingress classifier once on a crafted frame (`BPF_PROG_TEST_RUN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TestRunOutcome {
    /// The tc action the program returned (`TC_ACT_OK` = 0, `TC_ACT_SHOT` = 2).
    pub action: u32,
}

impl TestRunOutcome {
    /// `TC_ACT_SHOT`: the frame was dropped.
    pub const fn dropped(self) -> bool {
        self.action == 2
    }
    /// `TC_ACT_OK`: the frame passed.
    pub const fn passed(self) -> bool {
        self.action == 0
    }
}

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

impl Fence {
    /// Load the object once, pin its maps and the ingress program under `pin_dir`.
    ///
    /// Maps already pinned there (by an earlier svcd) are reused, so counters and allow entries
    /// survive a restart.
    pub fn load(pin_dir: impl Into<PathBuf>) -> Result<Self, DataplaneError> {
        Self::load_with_log(pin_dir, LogLevel::Warn)
    }

    /// [`Fence::load`] with the programs' diagnostics (aya-log) at `level` and above: map
    /// errors and packets that should not happen. Read them with [`Fence::take_logger`].
    pub fn load_with_log(
        pin_dir: impl Into<PathBuf>,
        level: LogLevel,
    ) -> Result<Self, DataplaneError> {
        let pin_dir = pin_dir.into();
        if pin_dir.starts_with(BPFFS_ROOT) {
            super::ensure_bpffs(Path::new(BPFFS_ROOT))?;
        }
        for dir in [pin_dir.clone(), pin_dir.join("links")] {
            std::fs::create_dir_all(&dir)
                .map_err(|source| DataplaneError::PinDir { path: dir, source })?;
        }
        let level = level as u8;
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(&pin_dir)
            .override_global("AYA_LOG_LEVEL", &level, true)
            .load(OBJECT)
            .map_err(|source| DataplaneError::Load {
                pin_dir: pin_dir.clone(),
                source: Box::new(source),
            })?;
        for name in [
            program::TAP_INGRESS,
            program::TAP_EGRESS,
            program::CALIBRATE,
        ] {
            let prog = classifier(&mut ebpf, name)?;
            prog.load().map_err(|source| DataplaneError::Program {
                operation: "loading",
                program: name,
                source: Box::new(source),
            })?;
            let prog_pin = pin_dir.join(format!("prog_{name}"));
            remove_if_present(&prog_pin)?;
            prog.pin(&prog_pin).map_err(|source| DataplaneError::Pin {
                what: "program",
                path: prog_pin,
                source: Box::new(source),
            })?;
        }
        let maps = Maps::take(&mut ebpf)?;
        let classes = maps.read_classes();
        Ok(Self {
            ebpf,
            pin_dir,
            maps,
            classes,
            written: std::collections::HashMap::new(),
            calibration: Vec::new(),
        })
    }

    /// The reader of the programs' diagnostics (their aya-log ring buffer), handing each
    /// record to `logger`; `None` after the first call. Drive it with `flush` when its fd is
    /// readable (svcd: [`tracing_log`], into its own log).
    pub fn take_logger<L: log::Log>(&mut self, logger: L) -> Option<aya_log::EbpfLogger<L>> {
        aya_log::EbpfLogger::init_with_logger(&mut self.ebpf, logger).ok()
    }

    /// The directory the fence is pinned under.
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Path of the pinned TCX link of one direction of `link` (bpffs refuses names with a dot).
    pub fn link_pin(&self, link: &str, direction: Direction) -> PathBuf {
        self.pin_dir
            .join("links")
            .join(format!("{link}_{}", direction.suffix()))
    }

    /// Attach the fence to both directions of the host end of a guest link (TCX, kernel 6.6
    /// or later).
    ///
    /// The links are pinned, so the fence stays on the link when this process exits: a crashed
    /// supervisor leaves the fence closed, not open. Attaching again replaces the programs
    /// atomically (re-adoption after a restart).
    pub fn attach(&mut self, link: &str) -> Result<(), DataplaneError> {
        validate_link_name(link)?;
        for direction in [Direction::Ingress, Direction::Egress] {
            self.attach_one(link, direction)?;
        }
        Ok(())
    }

    fn attach_one(&mut self, link: &str, direction: Direction) -> Result<(), DataplaneError> {
        let link_pin = self.link_pin(link, direction);
        let prog = classifier(&mut self.ebpf, direction.program())?;
        let attach_err = |source| DataplaneError::Attach {
            link: link.to_owned(),
            source: Box::new(source),
        };
        let link_id = match PinnedLink::from_pin(&link_pin) {
            Ok(existing) => {
                // Re-adopt: swap our program into the existing link without a gap.
                let existing = FdLink::from(existing)
                    .try_into()
                    .map_err(|source| link_err(link, source))?;
                prog.attach_to_link(existing).map_err(attach_err)?
            }
            Err(_) => attach_tcx(prog, link, direction)?,
        };
        let owned = prog.take_link(link_id).map_err(attach_err)?;
        let fd_link: FdLink = owned.try_into().map_err(|source| link_err(link, source))?;
        remove_if_present(&link_pin)?;
        fd_link
            .pin(&link_pin)
            .map_err(|source| DataplaneError::Pin {
                what: "link",
                path: link_pin,
                source: Box::new(source),
            })?;
        Ok(())
    }

    /// Detach the fence from both directions of `link`.
    pub fn detach(&mut self, link: &str) -> Result<(), DataplaneError> {
        validate_link_name(link)?;
        let mut first_err = None;
        for direction in [Direction::Ingress, Direction::Egress] {
            if let Err(e) = detach_pinned(link, &self.link_pin(link, direction)) {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Attach the empty calibration program (shipped in the same object, never attached by
    /// svcd) to both directions of `link`, as the fence would be: what any tc program costs a
    /// link, for benchmarks to set the fence against. Not pinned: undone by
    /// [`Self::detach_calibration`] or when this process exits.
    pub fn attach_calibration(&mut self, link: &str) -> Result<(), DataplaneError> {
        validate_link_name(link)?;
        let prog = classifier(&mut self.ebpf, program::CALIBRATE)?;
        for direction in [Direction::Ingress, Direction::Egress] {
            self.calibration.push(attach_tcx(prog, link, direction)?);
        }
        Ok(())
    }

    /// Detach every calibration link [`Self::attach_calibration`] made.
    pub fn detach_calibration(&mut self) -> Result<(), DataplaneError> {
        let prog = classifier(&mut self.ebpf, program::CALIBRATE)?;
        for id in std::mem::take(&mut self.calibration) {
            prog.detach(id).map_err(|source| DataplaneError::Program {
                operation: "detaching",
                program: program::CALIBRATE,
                source: Box::new(source),
            })?;
        }
        Ok(())
    }

    /// Read the verdict counters.
    pub fn counters(&self) -> Result<Counters, DataplaneError> {
        sum_counters(&self.maps.counters)
    }

    /// Every drop event waiting in the ring buffer (non-blocking).
    pub fn drain_events(&mut self) -> Vec<DropEvent> {
        let mut out = Vec::new();
        while let Some(item) = self.maps.events.next() {
            if item.len() >= std::mem::size_of::<DropEvent>() {
                // SAFETY: the kernel wrote a whole `DropEvent` (checked length); `read_unaligned`
                // copes with the ring buffer's 8-byte alignment.
                out.push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<DropEvent>()) });
            }
        }
        out
    }

    /// Run the ingress classifier once on `frame` with `BPF_PROG_TEST_RUN`. Counters move as
    /// they would for a real packet.
    pub fn test_run(&mut self, frame: &[u8]) -> Result<TestRunOutcome, DataplaneError> {
        self.test_run_dir(Direction::Ingress, frame)
    }

    /// Run one direction's classifier `repeat` times on `frame`; the kernel's average time per
    /// run (the program alone, no stack around it). For benchmarks.
    pub fn test_run_timed(
        &mut self,
        direction: Direction,
        frame: &[u8],
        repeat: u32,
    ) -> Result<std::time::Duration, DataplaneError> {
        self.test_run_program_timed(direction.program(), frame, repeat)
    }

    /// [`Self::test_run_timed`] of the empty calibration program: the floor any tc program
    /// pays on this machine.
    pub fn test_run_calibration(
        &mut self,
        frame: &[u8],
        repeat: u32,
    ) -> Result<std::time::Duration, DataplaneError> {
        self.test_run_program_timed(program::CALIBRATE, frame, repeat)
    }

    fn test_run_program_timed(
        &mut self,
        name: &'static str,
        frame: &[u8],
        repeat: u32,
    ) -> Result<std::time::Duration, DataplaneError> {
        let prog = classifier(&mut self.ebpf, name)?;
        let mut out = vec![0u8; frame.len().max(64) + 256];
        let result = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                repeat,
                ..TestRunOptions::new()
            })
            .map_err(|source| DataplaneError::Program {
                operation: "test-running",
                program: name,
                source: Box::new(source),
            })?;
        Ok(result.duration)
    }

    /// Run one direction's classifier once on `frame`. The kernel runs test frames on the
    /// loopback device, so the sandbox record they see is the one for ifindex 1.
    pub fn test_run_dir(
        &mut self,
        direction: Direction,
        frame: &[u8],
    ) -> Result<TestRunOutcome, DataplaneError> {
        let name = direction.program();
        let prog = classifier(&mut self.ebpf, name)?;
        let mut out = vec![0u8; frame.len().max(64) + 256];
        let result = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                data_out: Some(&mut out),
                ..TestRunOptions::new()
            })
            .map_err(|source| DataplaneError::Program {
                operation: "test-running",
                program: name,
                source: Box::new(source),
            })?;
        // The mark the program set is not returned by the kernel; callers read counters.
        Ok(TestRunOutcome {
            action: result.return_value,
        })
    }

    /// Remove everything pinned under the pin directory: links (detaching them), the program,
    /// the maps, then the directory. Keeps going past errors and returns all of them.
    pub fn remove_pins(self) -> Result<(), Vec<DataplaneError>> {
        let Self {
            ebpf,
            pin_dir,
            maps,
            ..
        } = self;
        drop(maps);
        drop(ebpf);
        remove_pin_dir(&pin_dir)
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

/// Remove a pin directory made by [`Fence::load`], whoever loaded it.
pub fn remove_pin_dir(pin_dir: &Path) -> Result<(), Vec<DataplaneError>> {
    let mut errors = Vec::new();
    let links = pin_dir.join("links");
    if let Ok(entries) = std::fs::read_dir(&links) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Err(e) = detach_pinned(&name, &entry.path()) {
                errors.push(e);
            }
        }
    }
    for dir in [links.as_path(), pin_dir] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                let path = entry.path();
                if !path.is_dir()
                    && let Err(source) = std::fs::remove_file(&path)
                {
                    errors.push(DataplaneError::Unpin { path, source });
                }
            }
        }
        if let Err(source) = std::fs::remove_dir(dir)
            && source.kind() != io::ErrorKind::NotFound
        {
            errors.push(DataplaneError::Unpin {
                path: dir.to_owned(),
                source,
            });
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
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
    fn read_classes(&self) -> Vec<(ipnet::IpNet, u32)> {
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

    fn take(ebpf: &mut Ebpf) -> Result<Self, DataplaneError> {
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

fn detach_pinned(link: &str, path: &Path) -> Result<(), DataplaneError> {
    let pinned = PinnedLink::from_pin(path).map_err(|_| DataplaneError::NotAttached {
        link: link.to_owned(),
        path: path.to_owned(),
    })?;
    // Unpinning drops the last reference once the fd closes: the kernel detaches the program.
    let fd_link = pinned.unpin().map_err(|source| DataplaneError::Detach {
        link: link.to_owned(),
        source,
    })?;
    drop(fd_link);
    Ok(())
}

fn sum_counters<T: std::borrow::Borrow<MapData>>(
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

fn classifier<'a>(
    ebpf: &'a mut Ebpf,
    name: &'static str,
) -> Result<&'a mut SchedClassifier, DataplaneError> {
    let prog = ebpf
        .program_mut(name)
        .ok_or(DataplaneError::MissingProgram(name))?;
    prog.try_into().map_err(|source| DataplaneError::Program {
        operation: "typing",
        program: name,
        source: Box::new(source),
    })
}

/// Attach `prog` to one direction of `link` with TCX, after whatever is there.
fn attach_tcx(
    prog: &mut SchedClassifier,
    link: &str,
    direction: Direction,
) -> Result<aya::programs::tc::SchedClassifierLinkId, DataplaneError> {
    prog.attach_with_options(
        link,
        direction.attach_type(),
        TcAttachOptions::TcxOrder(LinkOrder::default()),
    )
    .map_err(|source| DataplaneError::Attach {
        link: link.to_owned(),
        source: Box::new(source),
    })
}

fn link_err(link: &str, source: aya::programs::links::LinkError) -> DataplaneError {
    DataplaneError::Link {
        link: link.to_owned(),
        source: Box::new(source),
    }
}

fn remove_if_present(path: &Path) -> Result<(), DataplaneError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(DataplaneError::Unpin {
            path: path.to_owned(),
            source,
        }),
    }
}

fn validate_link_name(link: &str) -> Result<(), DataplaneError> {
    let ok = !link.is_empty()
        && link.len() < 16
        && !link.contains(['/', '\0'])
        && link != "."
        && link != ".."
        && !link.chars().any(char::is_whitespace);
    if ok {
        Ok(())
    } else {
        Err(DataplaneError::BadLinkName(link.to_owned()))
    }
}

/// The least severe of the programs' diagnostics that are written (aya-log's levels; the
/// programs skip the others without writing anything).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
#[repr(u8)]
pub enum LogLevel {
    Off = 0,
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

/// The programs' diagnostics into svcd's tracing log (target `svc::fence`).
#[derive(Debug, Clone, Copy, Default)]
pub struct TracingLog;

impl log::Log for TracingLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let message = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: "svc::fence", "{message}"),
            log::Level::Warn => tracing::warn!(target: "svc::fence", "{message}"),
            log::Level::Info => tracing::info!(target: "svc::fence", "{message}"),
            log::Level::Debug => tracing::debug!(target: "svc::fence", "{message}"),
            log::Level::Trace => tracing::trace!(target: "svc::fence", "{message}"),
        }
    }

    fn flush(&self) {}
}

/// Forward `logger`'s records as they come, until the task is dropped.
pub async fn tracing_log(logger: aya_log::EbpfLogger<TracingLog>) {
    // SAFETY: the logger owns its ring buffer's map fd, which stays open and the same for as
    // long as the logger lives, and the AsyncFd owns the logger.
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
    };
    let mut fd = match registered {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(error = %e, "the fence's diagnostics cannot be read");
            return;
        }
    };
    loop {
        match fd.readable_mut().await {
            Ok(mut ready) => {
                ready.get_inner_mut().flush();
                ready.clear_ready();
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the fence's diagnostics");
                return;
            }
        }
    }
}
