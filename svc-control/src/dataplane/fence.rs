//! The fence object: one load of svc's eBPF programs, pinned, attached per guest link.

use std::path::{Path, PathBuf};

use aya::{
    Ebpf, EbpfLoader,
    programs::links::{FdLink, PinnedLink},
};
use svc_ebpf_common::{AllowValue, DropEvent, program};

use super::{
    bpffs::ensure_bpffs,
    counters::{Counters, sum_counters},
    diagnostics::LogLevel,
    error::DataplaneError,
    maps::Maps,
    tcx::{
        Direction, attach_tcx, classifier, detach_pinned, link_err, remove_if_present,
        remove_pin_dir, validate_link_name,
    },
};

/// svc's eBPF object, built by `build.rs` from the `svc-ebpf` crate.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/svc-ebpf"));

/// Where bpffs lives on a normal host.
const BPFFS_ROOT: &str = "/sys/fs/bpf";

/// The loaded fence: programs and maps, pinned under `pin_dir`.
pub struct Fence {
    pub(super) ebpf: Ebpf,
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

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("pin_dir", &self.pin_dir)
            .finish_non_exhaustive()
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
            ensure_bpffs(Path::new(BPFFS_ROOT))?;
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
