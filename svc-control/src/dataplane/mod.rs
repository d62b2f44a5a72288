//! The only code that talks to the kernel: loads svc's eBPF object once, pins its programs and
//! maps under a bpffs directory (`/sys/fs/bpf/svc` by default), attaches the fence to guest
//! links and reads its counters.

mod allow;
mod bpffs;
mod classes;
pub mod clock;
mod counters;
mod diagnostics;
mod entries;
mod error;
mod fence;
pub mod idmap;
mod link;
pub mod loopdev;
mod maps;
mod nft;
mod sandbox;
/// Seccomp filters installed on a helper between fork and exec.
pub mod seccomp;
mod tcx;
mod test_run;

pub use bpffs::ensure_bpffs;
pub use counters::{Counters, ReasonCount, read_pinned_counters};
pub use diagnostics::{LogLevel, TracingLog, tracing_log};
pub use entries::{AllowEntry, Carry, CidrEntry, PortRule, SandboxLink, WEB};
pub use error::DataplaneError;
pub use fence::Fence;
pub use link::{Links, configure_guest, disable_ipv6};
pub use nft::{Nft, NftConfig, set_elements as nft_set_elements};
pub use tcx::{Direction, remove_pin_dir};
pub use test_run::TestRunOutcome;

/// Default pin directory for svcd's programs, maps and links.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/svc";
