//! Sandbox backends behind one trait. `netns` (namespaces on the host) is the embedded default
//! for development, tests and trusted builds; it is not a boundary for hostile code: the
//! guest shares the host kernel and runs as root in its namespaces. The microvm backend is the
//! boundary.
//!
//! A backend starts and stops the guest and runs commands in it. It knows nothing of the fence:
//! svcd plugs the guest's network in through [`GuestHandle::netns`].

mod netns;

use std::{future::Future, path::PathBuf, pin::Pin};

pub use netns::{Netns, sandbox_init};

/// What a backend needs to start a guest.
#[derive(Debug, Clone)]
pub struct GuestSpec {
    pub name: String,
    /// The sandbox's directory on the host (svcd's state dir); the backend keeps its log here.
    pub dir: PathBuf,
    /// Files bind-mounted over the guest's own: (host file, guest path).
    pub files: Vec<(PathBuf, PathBuf)>,
}

/// A running guest, as svcd stores it to find it again after a restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestHandle {
    /// Host pid of the guest's init.
    pub pid: u32,
    /// Its start time (clock ticks since boot, `/proc/PID/stat` field 22), so a reused pid is
    /// never mistaken for the guest.
    pub start: u64,
}

impl GuestHandle {
    /// The guest's network namespace.
    pub fn netns(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.pid))
    }
}

/// A command to run in a guest.
#[derive(Debug, Clone, Default)]
pub struct GuestCommand {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<String>,
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
    #[error("stopping guest pid {pid}: {message}")]
    Stop { pid: u32, message: String },
    #[error("the guest is not running")]
    NotRunning,
    #[error("{0}")]
    Exec(String),
}

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A sandbox backend.
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    fn start<'a>(&'a self, spec: &'a GuestSpec)
    -> BoxFuture<'a, Result<GuestHandle, RuntimeError>>;
    /// Whether the guest still runs (and is the one started).
    fn alive(&self, guest: GuestHandle) -> bool;
    /// Stop the guest and everything in it.
    fn stop(&self, guest: GuestHandle) -> BoxFuture<'_, Result<(), RuntimeError>>;
    /// A process running `cmd` inside the guest, stdout and stderr piped, stdin null.
    fn command(
        &self,
        guest: GuestHandle,
        cmd: &GuestCommand,
    ) -> Result<tokio::process::Command, RuntimeError>;
    fn pause(&self, _guest: GuestHandle) -> Result<(), RuntimeError> {
        Err(self.unsupported("pause"))
    }
    fn resume(&self, _guest: GuestHandle) -> Result<(), RuntimeError> {
        Err(self.unsupported("resume"))
    }
    fn fork(&self, _guest: GuestHandle) -> Result<(), RuntimeError> {
        Err(self.unsupported("fork"))
    }
    fn unsupported(&self, operation: &'static str) -> RuntimeError;
}
