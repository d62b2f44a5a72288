//! The microvm backend: each sandbox is a QEMU `-M microvm` guest with a kernel of its own —
//! the boundary for hostile code. A guest root that owns its kernel still sees only virtio
//! devices: its disk (a copy-on-write overlay of the image), its NIC (a tap on the host that
//! carries the fence, exactly like the container backend's veth), and the agent's channel.
//!
//! Creation: overlay the root file system; launch the monitor paused ([`Monitor::launch`], QEMU's in
//! [`qemu`]),
//! which makes the tap; put QEMU in its memory cgroup; address and fence the tap; let the guest
//! run; wait for the agent's hello on the channel; set the guest up (address, host name,
//! entropy) and write its files (resolv.conf, hosts, CA bundle). Exec, files and setup go over
//! the channel ([`channel`], protocol in `svc_guest::proto`).
//!
//! Fork: pause the source, snapshot its memory and devices to a file, copy its disk overlay,
//! and start a clone from them with its own tap, addresses, channel and identity (docs/microvm.md).

mod boot;
pub mod channel;
mod ctr_root;
mod daemons;
#[cfg(test)]
mod fake;
mod host;
pub mod images;
mod lifecycle;
pub mod monitor;
pub mod qemu;
pub mod qmp;
mod setup;
mod trees;
mod virtiofsd;
pub mod vm_dir;

pub use lifecycle::STATUS_LIMIT;
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use self::{
    channel::{Channel, NoAck, START},
    images::Images,
    monitor::{Accel, Monitor},
    qemu::Qemu,
    vm_dir::VmDir,
};
use super::{
    Backend, BoxFuture, Claim, ExecHandle, GuestCommand, GuestHandle, GuestLinks, GuestService,
    GuestSpec, RuntimeError, Snapshot, Started, start_time,
};
use crate::config::host::MicrovmConfig;

/// How long an exec waits to reach an agent that was up before (after an svcd restart).
const RECONNECT_LIMIT: Duration = Duration::from_secs(10);

/// The microvm backend.
pub struct Microvm {
    config: MicrovmConfig,
    /// The images, or why they are not usable.
    images: Result<Images, String>,
    /// What runs each VM (QEMU).
    monitor: Arc<dyn Monitor>,
    /// Why the monitor's accelerator.
    accel_reason: String,
    /// `<state_dir>/sandboxes`: each VM's files are in its sandbox's directory.
    sandboxes: PathBuf,
    /// The memory cgroup each VM's QEMU goes in, under this parent.
    cgroup_parent: String,
    /// One channel per running guest.
    channels: Mutex<HashMap<String, Arc<Channel>>>,
    /// What each guest's own connections go to (`serve_guest`), kept for its next channel.
    services: Mutex<HashMap<String, GuestService>>,
    /// The run state each adopted VM's QEMU told (or why it told none), kept for the
    /// adoption's `serve_guest`, so that a hung monitor is waited for once, not twice.
    adopted: Mutex<HashMap<String, Result<bool, String>>>,
    /// One pod container's root file system attached or detached at a time in each guest
    /// (per guest: a guest whose agent stalls its own attach or detach holds no other's).
    roots: crate::runtime::pod_root::RootLocks,
}

impl std::fmt::Debug for Microvm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Microvm")
            .field("monitor", &self.monitor.name())
            .field("accel", &self.monitor.accel())
            .field("images", &self.images)
            .finish_non_exhaustive()
    }
}

impl Microvm {
    /// The backend as svcd's configuration and environment make it (the environment's
    /// `SVC_MICROVM_*` images win over `[microvm]`'s). It always exists; when
    /// the images are missing, [`Microvm::unavailable`] says why and creation is refused.
    pub fn new(
        config: &MicrovmConfig,
        state_dir: &Path,
        cgroup_parent: &str,
        env: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Self {
        let (accel, accel_reason) = Accel::choose(&config.accel);
        let qemu = Qemu {
            binary: config.qemu.clone(),
            accel,
        };
        Self::over(
            Arc::new(qemu),
            accel_reason,
            config,
            state_dir.join("sandboxes"),
            cgroup_parent,
            Images::resolve(&config.images, env),
        )
    }

    /// The backend with `monitor` running its VMs (`accel_reason`: why its accelerator), each
    /// VM's files under `sandboxes`, its guests booted from `images` (or refused, saying why).
    fn over(
        monitor: Arc<dyn Monitor>,
        accel_reason: String,
        config: &MicrovmConfig,
        sandboxes: PathBuf,
        cgroup_parent: &str,
        images: Result<Images, String>,
    ) -> Self {
        Self {
            config: config.clone(),
            images,
            monitor,
            accel_reason,
            sandboxes,
            cgroup_parent: cgroup_parent.to_owned(),
            channels: Mutex::default(),
            services: Mutex::default(),
            adopted: Mutex::default(),
            roots: crate::runtime::pod_root::RootLocks::default(),
        }
    }

    /// Why a sandbox cannot be made with this backend, if it cannot.
    pub fn unavailable(&self) -> Option<&str> {
        self.images.as_ref().err().map(String::as_str)
    }

    /// The images its guests boot from, when they are usable.
    pub fn images(&self) -> Option<&Images> {
        self.images.as_ref().ok()
    }

    /// The accelerator and why it was chosen.
    pub fn accel(&self) -> (&'static str, &str) {
        (self.monitor.accel().name(), &self.accel_reason)
    }

    fn dir(&self, name: &str) -> VmDir {
        VmDir(self.sandboxes.join(name))
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Channel>>> {
        self.channels
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn services(&self) -> std::sync::MutexGuard<'_, HashMap<String, GuestService>> {
        self.services
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn adopted(&self) -> std::sync::MutexGuard<'_, HashMap<String, Result<bool, String>>> {
        self.adopted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The guest's channel: the open one, or a new connection (after an svcd restart, or when
    /// the last one broke).
    async fn channel(&self, name: &str, limit: Duration) -> Result<Arc<Channel>, RuntimeError> {
        if let Some(c) = self.channels().get(name).filter(|c| c.is_open()) {
            return Ok(c.clone());
        }
        let c = self
            .connect(&self.dir(name), limit)
            .await
            .map_err(|e| RuntimeError::Exec(format!("reaching the guest's agent: {e}")))?;
        if let Some(service) = self.services().get(name) {
            c.serve_guest(service.clone());
        }
        if !c.holds_exec() {
            tracing::warn!(
                guest = %name,
                "the guest's agent predates held starts: a command it takes too late is refused                  but may still run once the agent reads it; recreate the sandbox (or refill the                  pool) with the current image"
            );
        }
        self.channels().insert(name.to_owned(), c.clone());
        Ok(c)
    }

    /// Run `cmd` in `guest` (chrooted into `root` when given) as its user: the agent sets
    /// the ids `policy::exec_user` checked. The agent must take the command within [`START`]
    /// (read its request: the command then runs as long as it runs); one that does not — its
    /// VM paused behind svcd's back, its agent stopped — fails the command naming the VM's run
    /// state, the command is cancelled (it never runs, even once the guest goes on: the agent
    /// holds it until told to start, [`Channel::start`]), and the channel is given up (what ran
    /// over it ends; the next command connects again).
    async fn exec_as(
        &self,
        guest: &GuestHandle,
        cmd: &GuestCommand,
        root: Option<&str>,
    ) -> Result<ExecHandle, RuntimeError> {
        if !self.alive(guest) {
            return Err(RuntimeError::NotRunning);
        }
        let channel = match self.channel(&guest.name, RECONNECT_LIMIT).await {
            Ok(c) => c,
            Err(e) => {
                let state = self.unanswered(guest).await;
                return Err(RuntimeError::Exec(format!("{e}; {state}")));
            }
        };
        match channel.start(trees::request(cmd, root), START).await {
            Ok(handle) => Ok(handle),
            Err(NoAck::Ended(e)) => Err(RuntimeError::Exec(format!(
                "the channel to the guest's agent: {e}"
            ))),
            Err(NoAck::Late) => {
                let why = format!(
                    "the guest's agent took no command within {} s: {}; the channel to it was \
                     given up (its next command connects again)",
                    START.as_secs(),
                    self.unanswered(guest).await
                );
                tracing::warn!(guest = %guest.name, "{why}");
                self.give_up(&guest.name, &channel, &why);
                Err(RuntimeError::Exec(why))
            }
        }
    }

    /// Stop using `channel` to `name`'s agent: what runs over it ends with `why`, its
    /// connection closes (the agent ends what this host started once it reads again), and the
    /// next command connects anew.
    fn give_up(&self, name: &str, channel: &Arc<Channel>, why: &str) {
        let mut channels = self.channels();
        if channels.get(name).is_some_and(|c| Arc::ptr_eq(c, channel)) {
            channels.remove(name);
        }
        drop(channels);
        channel.abandon(format!(
            "the channel to the guest's agent was given up: {why}"
        ));
    }

    /// Whether guests talk to their agent over vsock (`microvm.channel = "vsock"`).
    fn vsock(&self) -> bool {
        self.config.channel == "vsock"
    }

    /// Connect to the agent of the VM in `dir` over this backend's transport.
    async fn connect(&self, dir: &VmDir, limit: Duration) -> Result<Arc<Channel>, String> {
        if self.vsock() {
            Channel::connect_vsock(&dir.vsock(), svc_guest::VSOCK_PORT, limit).await
        } else {
            Channel::connect(&dir.agent(), limit).await
        }
    }
}

impl Backend for Microvm {
    fn name(&self) -> &'static str {
        "microvm"
    }

    fn start<'a>(
        &'a self,
        spec: &'a GuestSpec,
        links: &'a dyn GuestLinks,
    ) -> BoxFuture<'a, Result<Started, RuntimeError>> {
        Box::pin(async move {
            let failed = |message: String| RuntimeError::Start {
                name: spec.name.clone(),
                message,
            };
            if let Some(dir) = spec.rootfs.first() {
                return Err(failed(format!(
                    "--rootfs {}: the microvm backend boots its own disk image",
                    dir.display()
                )));
            }
            let images = self.images.as_ref().map_err(|e| failed(e.clone()))?;
            self.boot(spec, links, images).await.map_err(failed)
        })
    }

    fn alive(&self, guest: &GuestHandle) -> bool {
        start_time(guest.pid) == Some(guest.start) && !super::is_zombie(guest.pid)
    }

    fn stop<'a>(
        &'a self,
        name: &'a str,
        dir: &'a Path,
    ) -> BoxFuture<'a, Result<Vec<String>, RuntimeError>> {
        Box::pin(self.stop_vm(name, dir))
    }

    fn serve_guest<'a>(
        &'a self,
        guest: &'a GuestHandle,
        _dir: &'a Path,
        service: GuestService,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.services().insert(guest.name.clone(), service.clone());
            // With no channel yet (adopted), a paused VM's agent cannot answer: its channel is
            // made at its resume. Nor is one waited for when QEMU does not say its state (a
            // held or hung monitor): the guest's next command connects, and serves it.
            let open = self
                .channels()
                .get(&guest.name)
                .is_some_and(|c| c.is_open());
            if !open {
                let told = self.adopted().remove(&guest.name);
                let state = match told {
                    Some(state) => state,
                    None => self.paused_vm(guest).await.map_err(|e| e.to_string()),
                };
                match state {
                    Ok(false) => {}
                    Ok(true) => return Ok(()),
                    Err(e) => {
                        tracing::warn!(guest = %guest.name, error = %e, "no channel to the guest's agent until its next command");
                        return Ok(());
                    }
                }
            }
            let channel = self.channel(&guest.name, RECONNECT_LIMIT).await?;
            channel.serve_guest(service);
            Ok(())
        })
    }

    fn exec<'a>(
        &'a self,
        guest: &'a GuestHandle,
        cmd: &'a GuestCommand,
    ) -> BoxFuture<'a, Result<ExecHandle, RuntimeError>> {
        Box::pin(self.exec_as(guest, cmd, cmd.root.as_deref()))
    }

    fn snapshot<'a>(
        &'a self,
        guest: &'a GuestHandle,
        into: &'a Path,
    ) -> BoxFuture<'a, Result<Snapshot, RuntimeError>> {
        Box::pin(self.snapshot_vm(guest, into))
    }

    fn pause<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(self.pause_vm(guest))
    }

    fn resume<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(self.resume_vm(guest))
    }

    /// QEMU's run state (`query-status`), asked when svcd adopts the VM; the answer is
    /// kept for the adoption's `serve_guest`.
    fn paused<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<bool, RuntimeError>> {
        Box::pin(async move {
            let state = self.paused_vm(guest).await;
            let told = state.as_ref().copied().map_err(ToString::to_string);
            self.adopted().insert(guest.name.clone(), told);
            state
        })
    }

    /// A pod container's root file system: an overlay of its layers on the host, put into
    /// the VM as a tree (`ctr_root`).
    fn attach_root<'a>(
        &'a self,
        guest: &'a GuestHandle,
        _id: u32,
        dir: &'a Path,
        ctr: &'a str,
        layers: &'a [PathBuf],
    ) -> BoxFuture<'a, Result<crate::runtime::pod_root::RootIn, RuntimeError>> {
        Box::pin(self.attach_root_in(guest, dir, ctr, layers))
    }

    fn detach_root<'a>(
        &'a self,
        guest: &'a GuestHandle,
        dir: &'a Path,
        ctr: &'a str,
    ) -> BoxFuture<'a, Result<bool, RuntimeError>> {
        Box::pin(self.detach_root_in(guest, dir, ctr))
    }

    fn root_attached(&self, dir: &Path, ctr: &str) -> Option<String> {
        ctr_root::attached(dir, ctr).then(|| super::pod_root::guest_path(ctr))
    }

    /// The guest's files live on its own disk: the claimer's are written over the pooled
    /// ones through the agent, with its host name and a fresh entropy seed.
    fn claim_guest<'a>(
        &'a self,
        guest: &'a GuestHandle,
        claim: &'a Claim,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            if !self.alive(guest) {
                return Err(RuntimeError::NotRunning);
            }
            let channel = self.channel(&guest.name, RECONNECT_LIMIT).await?;
            setup::claim(&channel, claim)
                .await
                .map_err(|message| RuntimeError::Lifecycle {
                    operation: "claiming",
                    name: guest.name.clone(),
                    message,
                })
        })
    }
}
