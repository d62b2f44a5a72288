//! Sandbox backends behind one trait. Each backend owns how its guest starts, how the guest is
//! plugged into its host link (through [`GuestLinks`], which svcd implements over `dataplane`),
//! how commands run in it ([`ExecHandle`]) and how it stops.
//!
//! `container` is the embedded default: an OCI runtime (runc) runs each sandbox unprivileged —
//! a user namespace whose root is an unprivileged host id, its own root file system, reduced
//! capabilities, a seccomp filter, cgroup limits. The guest shares the host's kernel; the
//! microvm backend (a guest kernel of its own) is the stronger boundary.

/// A sandbox's CPU, memory and process figures, read from its cgroups.
pub mod cgroup_stats;
mod claim;
pub mod container;
/// A command run by a host process (the OCI runtime's `exec`) and its guest process.
mod host_process;
pub mod ids;
pub mod microvm;
/// The calls through which a mode reaches a file: the share rules' seccomp form.
mod not_started;
/// Where a pod container's root file system goes in its guest and what of the guest it gets.
pub mod pod_root;
/// A guest's host process: its start time, whether it died, waiting for it to go.
mod process;
/// The backends an svcd has, by kind (`Arc<dyn Backend>` each, with what it is and whether
/// it can make sandboxes now).
pub mod registry;
pub(crate) mod share_calls;

pub(crate) use process::gone_within;
pub use process::{is_zombie, start_time};

use std::{future::Future, path::PathBuf, pin::Pin, sync::Arc};

pub use claim::Claim;
pub use container::Container;
pub use host_process::GuestProcess;
use host_process::HostProcess;
pub use microvm::Microvm;
pub use registry::{Backends, Description, KINDS, Kind, choices};

/// What a backend needs to start a guest.
#[derive(Debug, Clone)]
pub struct GuestSpec {
    /// The sandbox's name (also the guest's hostname and the runtime's container id).
    pub name: String,
    /// The sandbox's id (unique among live sandboxes; the microvm backend's QEMU uid is its
    /// user's range start + this).
    pub id: u32,
    /// The sandbox's directory on the host (under svcd's state dir); the backend keeps its
    /// bundle and logs here, and removes it with the sandbox.
    pub dir: PathBuf,
    /// Host files the guest sees read-only: (host file, guest path).
    pub files: Vec<(PathBuf, PathBuf)>,
    /// Start from this snapshot of another guest (a fork's clone) instead of booting.
    pub restore: Option<Snapshot>,
    /// Host directories the guest sees read-write, live (the coding agent's home).
    pub shared: Vec<SharedDir>,
    /// The root file system handed to it (`--rootfs`, checked by svcd): a tree, or an image's
    /// layers top first; none: the base image. Read-only under the guest's own writable
    /// layer, as the base image is.
    pub rootfs: Vec<PathBuf>,
}

/// A host directory shared into a guest read-write.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SharedDir {
    pub host: PathBuf,
    pub guest: PathBuf,
    /// Paths under it (relative) the guest sees as mount points of their own, so it cannot
    /// rename them away (a project's `.git`: `policy::gitdir`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned: Vec<PathBuf>,
    /// Paths under it (relative) the guest sees read-only (a project's `.git/config` and
    /// `.git/hooks`), bound after `pinned`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only: Vec<PathBuf>,
}

impl SharedDir {
    /// Shared whole, read-write.
    pub fn plain(host: PathBuf, guest: PathBuf) -> Self {
        Self {
            host,
            guest,
            pinned: Vec::new(),
            read_only: Vec::new(),
        }
    }
}

/// A paused guest saved for forking: its memory and device state, and its disk as it was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The directory holding both (removed once the clones run).
    pub dir: PathBuf,
    pub memory: PathBuf,
    pub disk: PathBuf,
}

/// A running guest, as svcd stores it to find it again after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestHandle {
    /// The sandbox's name (the runtime's container id).
    pub name: String,
    /// Host pid of the guest's init.
    pub pid: u32,
    /// Its start time (clock ticks since boot, `/proc/PID/stat` field 22), so a reused pid is
    /// never mistaken for the guest.
    pub start: u64,
}

/// What the host end of a sandbox's link is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostEnd {
    /// A veth pair svcd makes; its other end goes into the guest's network namespace.
    Veth,
    /// A tap (named [`GuestLinks::link`]) the VM monitor opens; the guest's NIC is its other
    /// side.
    Tap,
}

/// The guest's side of its link, as the guest configures it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestNet {
    pub address: std::net::Ipv4Addr,
    pub prefix: u8,
    /// The host end's address: the guest's gateway and only resolver.
    pub gateway: std::net::Ipv4Addr,
}

/// What the backend asks of svcd while it starts a guest: the sandbox's host link (the one
/// the fence sits on), in two steps so that the first can run while the guest is being made.
pub trait GuestLinks: Send + Sync {
    /// The host end's name.
    fn link(&self) -> &str;
    /// The guest's address on the link.
    fn guest_net(&self) -> GuestNet;
    /// Make the sandbox's tap (down, unaddressed, not yet fenced: nothing can use it before
    /// [`GuestLinks::prepare`]), for a VM monitor to open by name.
    fn make_tap(&self) -> BoxFuture<'_, Result<(), RuntimeError>>;
    /// Make the host end of the sandbox's link (a veth pair; a tap is made by
    /// [`GuestLinks::make_tap`] first), address it and fence it; its ifindex. Nothing of the
    /// guest runs yet.
    fn prepare(&self, end: HostEnd) -> BoxFuture<'_, Result<u32, RuntimeError>>;
    /// Move the guest end of the link into the network namespace at `netns` and configure it
    /// (address, route via the host end), after [`GuestLinks::prepare`].
    fn attach<'a>(&'a self, netns: &'a std::path::Path) -> BoxFuture<'a, Result<(), RuntimeError>>;
}

/// A started guest and its host link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Started {
    pub guest: GuestHandle,
    pub ifindex: u32,
}

/// A connection the guest opened to one of svcd's services for its sandbox (the git SSH
/// relay): `svc_guest::proto` frames both ways, as untrusted as anything from the guest.
pub struct GuestConn {
    pub reader: Pin<Box<dyn tokio::io::AsyncRead + Send>>,
    pub writer: Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
}

impl std::fmt::Debug for GuestConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestConn").finish_non_exhaustive()
    }
}

/// What svcd does with each connection a guest opens (it must not block: it spawns).
pub type GuestService = Arc<dyn Fn(GuestConn) + Send + Sync>;

/// Where the git SSH relay is reached inside every guest.
pub const GUEST_RELAY_SOCKET: &str = svc_guest::agent::relay::SOCKET;

/// A command to run in a guest.
#[derive(Debug, Clone, Default)]
pub struct GuestCommand {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
    /// Give the command a standard input (else it reads end of file at once).
    pub stdin: bool,
    /// Run it on a terminal of (rows, columns); stdout then carries everything it writes.
    pub tty: Option<(u16, u16)>,
    /// Run it as this guest user (checked to be within the guest's ids); none: the guest's root.
    pub user: Option<crate::api::ExecUser>,
    /// Run it chrooted into this guest directory: a pod container's root file system
    /// attached with [`Backend::attach_root`] (`/.svc/ctr/<id>`, checked by svcd to be
    /// attached); `cwd` is then a path inside it. None: the guest's own root.
    pub root: Option<String>,
    /// The capability sets it keeps and its `no_new_privs` (granted by `policy::exec_caps`).
    pub hardening: svc_guest::caps::Hardening,
}

/// How a running command is controlled: each backend's own (a host process for the
/// container backend, a stream on the agent's channel for the microvm backend).
pub trait ExecControl: Send {
    /// Resize the command's terminal (nothing without one).
    fn resize(&self, rows: u16, cols: u16) -> Result<(), RuntimeError>;
    /// Send `signal` to the command.
    fn signal(&self, signal: nix::sys::signal::Signal);
    /// Wait for the command; its exit code (128 + signal when a signal ended it).
    fn wait(&mut self) -> BoxFuture<'_, Result<i32, RuntimeError>>;
    /// End the command now.
    fn kill(&mut self) -> BoxFuture<'_, ()>;
}

/// A command running in a guest: its streams and how it ends.
pub struct ExecHandle {
    pub stdin: Option<Pin<Box<dyn tokio::io::AsyncWrite + Send>>>,
    pub stdout: Option<Pin<Box<dyn tokio::io::AsyncRead + Send>>>,
    pub stderr: Option<Pin<Box<dyn tokio::io::AsyncRead + Send>>>,
    control: Box<dyn ExecControl>,
}

impl std::fmt::Debug for ExecHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecHandle").finish_non_exhaustive()
    }
}

impl ExecHandle {
    /// A handle over a host process that runs the command in the guest (the runtime's `exec`);
    /// `guest`: where the runtime says which guest process the command is, to kill it with.
    fn from_child(mut child: tokio::process::Child, guest: Option<GuestProcess>) -> Self {
        Self {
            stdin: child
                .stdin
                .take()
                .map(|s| Box::pin(s) as Pin<Box<dyn tokio::io::AsyncWrite + Send>>),
            stdout: child
                .stdout
                .take()
                .map(|s| Box::pin(s) as Pin<Box<dyn tokio::io::AsyncRead + Send>>),
            stderr: child
                .stderr
                .take()
                .map(|s| Box::pin(s) as Pin<Box<dyn tokio::io::AsyncRead + Send>>),
            control: Box::new(HostProcess {
                child,
                tty: None,
                guest,
            }),
        }
    }

    /// A handle over a host process whose command runs on the terminal `master`: its input
    /// and output are the terminal's.
    fn from_tty(
        child: tokio::process::Child,
        master: std::os::fd::OwnedFd,
        guest: Option<GuestProcess>,
    ) -> std::io::Result<Self> {
        let reader = tokio::fs::File::from_std(std::fs::File::from(master.try_clone()?));
        let writer = tokio::fs::File::from_std(std::fs::File::from(master.try_clone()?));
        Ok(Self {
            stdin: Some(Box::pin(writer)),
            stdout: Some(Box::pin(reader)),
            stderr: None,
            control: Box::new(HostProcess {
                child,
                tty: Some(master),
                guest,
            }),
        })
    }

    /// The same command, keeping `held` (a per-guest slot, say) until the handle drops.
    pub fn holding(self, held: impl Send + 'static) -> Self {
        Self {
            control: Box::new(Holding {
                inner: self.control,
                _held: held,
            }),
            ..self
        }
    }

    /// Resize the command's terminal (nothing without one).
    pub fn resize(&self, rows: u16, cols: u16) -> Result<(), RuntimeError> {
        self.control.resize(rows, cols)
    }

    /// Wait for the command; its exit code (128 + signal when a signal ended it).
    pub async fn wait(&mut self) -> Result<i32, RuntimeError> {
        self.control.wait().await
    }

    /// Send `signal` to the command.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        self.control.signal(signal);
    }

    /// End the command now.
    pub async fn kill(&mut self) {
        self.control.kill().await;
    }
}

/// A command's control that keeps something alive with it ([`ExecHandle::holding`]).
struct Holding<T> {
    inner: Box<dyn ExecControl>,
    _held: T,
}

impl<T: Send> ExecControl for Holding<T> {
    fn resize(&self, rows: u16, cols: u16) -> Result<(), RuntimeError> {
        self.inner.resize(rows, cols)
    }
    fn signal(&self, signal: nix::sys::signal::Signal) {
        self.inner.signal(signal);
    }
    fn wait(&mut self) -> BoxFuture<'_, Result<i32, RuntimeError>> {
        self.inner.wait()
    }
    fn kill(&mut self) -> BoxFuture<'_, ()> {
        self.inner.kill()
    }
}

/// Errors of a backend.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("starting the guest of {name}: {message}")]
    Start { name: String, message: String },
    #[error("the {backend} backend cannot {operation} a sandbox{hint}")]
    Unsupported {
        backend: &'static str,
        operation: &'static str,
        hint: &'static str,
    },
    #[error("stopping the guest of {name}: {message}")]
    Stop { name: String, message: String },
    #[error("the guest is not running")]
    NotRunning,
    #[error("{0}")]
    Exec(String),
    #[error("{operation} the guest of {name}: {message}")]
    Lifecycle {
        operation: &'static str,
        name: String,
        message: String,
    },
    #[error("the container backend cannot start: {0}")]
    Setup(String),
    /// A pod container's root attached to a sandbox that has one of that id (the caller's
    /// conflict, not svcd's failure).
    #[error(
        "attaching a root file system to the guest of {name}: container {ctr}: it is attached already"
    )]
    RootAttached { name: String, ctr: String },
}

/// What a backend without pod containers' root file systems answers.
pub fn roots_unsupported(backend: &'static str) -> RuntimeError {
    RuntimeError::Unsupported {
        backend,
        operation: "attach a container's root file system to",
        hint: ": not supported on this backend yet (the container backend has it)",
    }
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A sandbox backend.
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    /// Whether it can make sandboxes now: `Err` says why not (for creation and doctor).
    fn availability(&self) -> Result<(), String> {
        Ok(())
    }
    /// What it is: kind, one line, what it isolates with, what it can do. (The registry's
    /// adapters, `registry::Described`, say it for the built-in backends.)
    fn describe(&self) -> Description {
        Description::bare(self.name())
    }
    /// The accelerator its guests run under and why (`kvm (…)`), if it has one.
    fn accel(&self) -> Option<String> {
        None
    }
    /// What else it uses that an operator may ask after, as (name, value): the microvm
    /// backend's image paths.
    fn details(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// Start the guest and plug it into its link through `links`.
    fn start<'a>(
        &'a self,
        spec: &'a GuestSpec,
        links: &'a dyn GuestLinks,
    ) -> BoxFuture<'a, Result<Started, RuntimeError>>;
    /// Whether the guest still runs (and is the one started).
    fn alive(&self, guest: &GuestHandle) -> bool;
    /// Stop the guest of sandbox `name` and remove what the backend made for it under `dir`.
    /// Safe to call for a guest that never started or is already gone.
    fn stop<'a>(
        &'a self,
        name: &'a str,
        dir: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<Vec<String>, RuntimeError>>;
    /// Hand every connection the guest opens to svcd's services (the git SSH relay,
    /// [`GUEST_RELAY_SOCKET`] inside) to `service`, from now until the guest stops; called
    /// again after an svcd restart. The container backend binds a socket in the sandbox's
    /// directory, which the guest sees at that path; the microvm backend takes the streams the
    /// guest's agent opens on its channel.
    fn serve_guest<'a>(
        &'a self,
        guest: &'a GuestHandle,
        dir: &'a std::path::Path,
        service: GuestService,
    ) -> BoxFuture<'a, Result<(), RuntimeError>>;
    /// Run `cmd` inside the guest.
    fn exec<'a>(
        &'a self,
        guest: &'a GuestHandle,
        cmd: &'a GuestCommand,
    ) -> BoxFuture<'a, Result<ExecHandle, RuntimeError>>;
    fn pause<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<(), RuntimeError>>;
    fn resume<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<(), RuntimeError>>;
    /// Whether the guest is paused now (read when svcd adopts it); a backend that cannot tell
    /// says it is not.
    fn paused<'a>(&'a self, _guest: &'a GuestHandle) -> BoxFuture<'a, Result<bool, RuntimeError>> {
        Box::pin(async { Ok(false) })
    }
    /// Give a running guest made ahead of its request (a warm pool's) to the sandbox that
    /// claims it: its host name, and its guest files where the backend does not bind the
    /// host's copies. Backends that cannot are not pooled.
    fn claim_guest<'a>(
        &'a self,
        _guest: &'a GuestHandle,
        _claim: &'a Claim,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        let name = self.name();
        Box::pin(async move {
            Err(RuntimeError::Unsupported {
                backend: name,
                operation: "pool",
                hint: "",
            })
        })
    }
    /// Share `dirs` (in order) into a running guest made ahead of its request (a warm pool's)
    /// that sandbox `id`, in `dir`, claims: as a guest made with them has them. Backends that
    /// cannot ([`Description::share_into_running`]) pool no request with shared directories.
    fn share_into<'a>(
        &'a self,
        _guest: &'a GuestHandle,
        _id: u32,
        _dir: &'a std::path::Path,
        _dirs: &'a [SharedDir],
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        let name = self.name();
        Box::pin(async move {
            Err(RuntimeError::Unsupported {
                backend: name,
                operation: "share a directory into a running",
                hint: " (its shared directories are made when its guest starts)",
            })
        })
    }
    /// Attach `layers` (directories, top first: an image's root file system as containerd
    /// unpacked it) into the running `guest` of sandbox `id` (directory `dir`) as pod
    /// container `ctr`'s root file system, read-only under a writable layer of its own, mapped
    /// to the sandbox's ids; its guest path, where [`GuestCommand::root`] names it, and the
    /// guest's places not bound inside it (each with why).
    fn attach_root<'a>(
        &'a self,
        _guest: &'a GuestHandle,
        _id: u32,
        _dir: &'a std::path::Path,
        _ctr: &'a str,
        _layers: &'a [PathBuf],
    ) -> BoxFuture<'a, Result<crate::runtime::pod_root::RootIn, RuntimeError>> {
        Box::pin(async move { Err(roots_unsupported(self.name())) })
    }
    /// Detach pod container `ctr`'s root file system from `guest` (directory `dir`) and remove
    /// its writable layer; whether it was attached.
    fn detach_root<'a>(
        &'a self,
        _guest: &'a GuestHandle,
        _dir: &'a std::path::Path,
        _ctr: &'a str,
    ) -> BoxFuture<'a, Result<bool, RuntimeError>> {
        Box::pin(async move { Err(roots_unsupported(self.name())) })
    }
    /// The guest path of pod container `ctr`'s root file system if it is attached to the
    /// sandbox in `dir`.
    fn root_attached(&self, _dir: &std::path::Path, _ctr: &str) -> Option<String> {
        None
    }
    /// Pause the guest (it stays paused) and save it under `into` for clones to start from.
    fn snapshot<'a>(
        &'a self,
        _guest: &'a GuestHandle,
        _into: &'a std::path::Path,
    ) -> BoxFuture<'a, Result<Snapshot, RuntimeError>> {
        let name = self.name();
        Box::pin(async move {
            Err(RuntimeError::Unsupported {
                backend: name,
                operation: "fork",
                hint: " (a container's memory cannot be snapshotted: use --backend microvm)",
            })
        })
    }
}
