//! The dataplane's errors, each naming the operation and what it acted on.

use std::path::PathBuf;

/// Errors of the dataplane. Each names the operation and what it acted on.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    #[error("mounting bpffs at {path}")]
    MountBpffs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("creating pin directory {path}")]
    PinDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("loading svc's eBPF object (maps pinned under {pin_dir})")]
    Load {
        pin_dir: PathBuf,
        #[source]
        source: Box<aya::EbpfError>,
    },
    #[error("eBPF object has no program {0:?}")]
    MissingProgram(&'static str),
    #[error("eBPF object has no map {0:?}")]
    MissingMap(&'static str),
    #[error("{operation} program {program}")]
    Program {
        operation: &'static str,
        program: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("pinning {what} at {path}")]
    Pin {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: Box<aya::pin::PinError>,
    },
    #[error("attaching the fence to link {link}")]
    Attach {
        link: String,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("converting the TCX link of {link}")]
    Link {
        link: String,
        #[source]
        source: Box<aya::programs::links::LinkError>,
    },
    #[error("link {link} has no fence attached by svc (no pinned link at {path})")]
    NotAttached { link: String, path: PathBuf },
    #[error("detaching the fence from link {link}")]
    Detach {
        link: String,
        #[source]
        source: std::io::Error,
    },
    #[error("opening pinned map {path}")]
    OpenMap {
        path: PathBuf,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("reading map {map}")]
    ReadMap {
        map: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("writing map {map}")]
    WriteMap {
        map: &'static str,
        #[source]
        source: Box<aya::maps::MapError>,
    },
    #[error("sandbox id 0 is reserved (it marks an empty link slot)")]
    ReservedSandboxId,
    #[error("link with ifindex {0} has no sandbox record")]
    NoSandbox(u32),
    #[error("{0} is in a destination class that is never reachable; it cannot be allowed")]
    DeniedDestination(String),
    #[error("an allow entry takes at most {max} port rules, {given} given")]
    TooManyRules { given: usize, max: usize },
    #[error("{operation}: {message}")]
    Netlink { operation: String, message: String },
    #[error("nftables table {table}: {message}")]
    Nft { table: String, message: String },
    #[error("link name {0:?} is not a valid interface name (1 to 15 bytes, no '/', no NUL)")]
    BadLinkName(String),
    #[error("removing pinned object {path}")]
    Unpin {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Writing map `map` failed.
pub(super) fn write_err(map: &'static str, source: aya::maps::MapError) -> DataplaneError {
    DataplaneError::WriteMap {
        map,
        source: Box::new(source),
    }
}
