//! The container backend (the embedded default): each sandbox is an OCI container run by an
//! OCI runtime (crun or runc).
//!
//! - **ids**: a user namespace maps guest ids 0..65535 to the host range of a dedicated system
//!   user (`/etc/subuid`, `/etc/subgid`); guest root is an unprivileged host id.
//! - **files**: its own root file system, an overlay of the shared base image (shifted into
//!   that id range once) — or a root file system handed to it (`--rootfs`, attached idmapped
//!   and read-only, see `handed`) — and a writable layer of its own; no host path but the read-only files
//!   svcd declares (resolv.conf, the CA bundle) and, read-only at `/run/svc`, the directory of
//!   its git SSH relay socket, and read-write the coding agent's home when svcd.toml sets one
//!   (an idmapped bind: its owner's files appear as the guest root's); private /tmp, /dev, /dev/shm; an empty
//!   read-only /sys; /proc with the runtimes' usual masked and read-only paths.
//! - **privileges**: `no_new_privs`, the short capability list of [`oci::CAPABILITIES`], the
//!   seccomp filter of [`seccomp`].
//! - **resources**: a cgroup per sandbox with memory, pids and CPU limits.
//! - **network**: a network namespace of its own, owned by the guest's user namespace, into
//!   which svcd moves the guest end of the sandbox's link between the runtime's `create` and
//!   `start` (the order CNI plugins use). The guest has no CAP_NET_ADMIN there, so it cannot
//!   change its address, routes or link.
//!
//! The runtime ([`binary`]): crun 1.21 or later by default (svc's build; it starts a sandbox in
//! about half runc's time), else runc; both are driven through the same command lines, so no
//! runtime code runs inside svcd. On a hybrid cgroup layout crun needs the v2 side free of
//! controllers ([`cgroup::hybrid_for_crun`]).

pub mod advisory;
mod attach;
pub mod binary;
mod cgroup;
mod create;
/// A pod container's processes, ended with its removal.
mod ctr_procs;
/// A pod container's root file system attached into its pod's running guest.
pub mod ctr_root;
pub mod disk;
mod exec;
mod handed;
mod init;
pub mod oci;
mod pooled;
mod reinit;
mod relay;
pub mod rootfs;
pub mod seccomp;
mod shared;
mod stop;

use std::{
    fs::Permissions,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::process::Command;

use super::ids;
use super::{
    Backend, BoxFuture, ExecHandle, GuestCommand, GuestHandle, GuestLinks, GuestService, GuestSpec,
    RuntimeError, Started, start_time,
};
use crate::config::host::{ContainerConfig, IdRanges};

/// The guest's init: reaps orphans and passes signals on, as PID 1 must, and runs svcd's
/// commands over the channel svcd hands it (see `init`).
pub const INIT: [&str; 1] = ["/usr/local/bin/svc-init"];

/// The init of a base image built before `svc-init` (commands then run with `runc exec`).
pub const OLD_INIT: [&str; 4] = ["/usr/bin/tini", "--", "/bin/sleep", "infinity"];

/// How long one runtime command may take.
const RUNTIME_TIMEOUT: Duration = Duration::from_secs(30);

/// The container backend.
#[derive(Debug, Clone)]
pub struct Container {
    runtime: PathBuf,
    /// The runtime's state directory (`runc --root`).
    state: PathBuf,
    /// The base image every sandbox's overlay lies on.
    lower: rootfs::Lower,
    /// The guests' ids: the one range all map to, or the start of the range sliced per
    /// sandbox (`slices`).
    ids: rootfs::IdRange,
    /// `container.id_ranges = "per-sandbox"`: the range cut into a slice per sandbox.
    slices: Option<ids::SliceRange>,
    cgroup_parent: String,
    limits: oci::Limits,
    /// Each sandbox's disk in MiB (0: its writable layer is a directory of the state's).
    disk_mib: u64,
    /// Each sandbox's relay socket listener (`serve_guest`), ended at `stop`.
    relays: std::sync::Arc<
        std::sync::Mutex<std::collections::HashMap<String, tokio::task::AbortHandle>>,
    >,
    /// Where each exec's `--pid-file` goes (svcd's only).
    execs: PathBuf,
    /// The base image has `svc-init` ([`INIT`]): guests get a channel to it.
    svc_init: bool,
    /// Each guest's channel to its init (none for a guest an earlier svcd made: its
    /// commands run with `runc exec`), dropped at stop.
    inits: std::sync::Arc<
        std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<init::InitChannel>>>,
    >,
    /// Each adopted guest's one attempt at a new channel to its init (`reinit`), and whether
    /// it took; dropped at stop.
    reattached: std::sync::Arc<
        std::sync::Mutex<
            std::collections::HashMap<String, std::sync::Arc<tokio::sync::OnceCell<bool>>>,
        >,
    >,
    /// `runc create`s at once: a burst of creates queues here rather than each running the
    /// runtime at a share of the CPU too small to finish within [`RUNTIME_TIMEOUT`].
    starts: std::sync::Arc<tokio::sync::Semaphore>,
    /// Attaching and detaching pod containers' root file systems, one at a time in each
    /// sandbox.
    roots: std::sync::Arc<super::pod_root::RootLocks>,
}

/// `runc create`s run at once: two per core (a create is mostly CPU: mounts, the seccomp
/// filter, the namespaces), the rest wait their turn before their timeout starts.
fn concurrent_starts() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get() * 2)
}

impl Container {
    /// Check the host and prepare the image (a copy shifted into the id range, made once per
    /// image build): blocking, seconds the first time.
    pub fn new(config: &ContainerConfig, state_dir: &Path) -> Result<Self, RuntimeError> {
        let chosen = binary::choose(config.runtime.as_deref()).map_err(RuntimeError::Setup)?;
        for note in &chosen.passed_over {
            tracing::warn!("OCI runtime passed over: {note}");
        }
        tracing::info!(runtime = %chosen.describe(), "the container backend's OCI runtime");
        let runtime = chosen.path.clone();
        // The runtime's own escapes: svcd runs with an older runtime, and says so at every start.
        if let Some(warning) = advisory::check(&runtime).warning() {
            tracing::warn!(runtime = %runtime.display(), "{warning}");
        }
        let kind = chosen.identity.as_ref().map(|id| id.kind);
        let (subuid, subgid) = (Path::new("/etc/subuid"), Path::new("/etc/subgid"));
        let slices = match config.id_ranges {
            IdRanges::Shared => None,
            IdRanges::PerSandbox => Some(ids::slice_range(
                &config.user,
                subuid,
                subgid,
                "container.user",
            )?),
        };
        let ids = match &slices {
            Some(s) => s.start,
            None => rootfs::id_range(&config.user, subuid, subgid, "container.user")?,
        };
        let limits = oci::Limits {
            memory_bytes: config.memory_bytes,
            pids_max: config.pids_max,
            cpu_millis: config.cpu_millis,
        };
        cgroup::check(Path::new("/sys/fs/cgroup"), &limits).map_err(RuntimeError::Setup)?;
        if kind == Some(advisory::Kind::Crun) {
            cgroup::hybrid_for_crun(Path::new("/sys/fs/cgroup")).map_err(RuntimeError::Setup)?;
        }
        if config.disk_mib > 0 {
            disk::check().map_err(|e| {
                RuntimeError::Setup(format!(
                    "sandbox disks (container.disk_mib = {}): {e}; or set container.disk_mib = 0",
                    config.disk_mib
                ))
            })?;
        }
        let (lower, svc_init) = base_image(config, slices.is_none().then_some(ids))?;
        let execs = state_dirs(state_dir)?;
        Ok(Self {
            runtime,
            execs,
            svc_init,
            inits: std::sync::Arc::default(),
            reattached: std::sync::Arc::default(),
            state: state_dir.join("runc"),
            lower,
            ids,
            slices,
            cgroup_parent: config.cgroup_parent.clone(),
            limits,
            disk_mib: config.disk_mib,
            relays: std::sync::Arc::default(),
            starts: std::sync::Arc::new(tokio::sync::Semaphore::new(concurrent_starts())),
            roots: std::sync::Arc::default(),
        })
    }

    /// The host ids the guests' root maps to: with a range per sandbox, the start of the
    /// range they are cut from.
    pub fn ids(&self) -> rootfs::IdRange {
        self.ids
    }

    /// The range sliced per sandbox (`container.id_ranges = "per-sandbox"`), or none.
    pub fn slices(&self) -> Option<&ids::SliceRange> {
        self.slices.as_ref()
    }

    /// The first host ids of sandbox `id`'s guest: the shared range, or its own slice (an
    /// error naming the range when it holds no slice for `id`).
    pub(super) fn guest_ids(&self, id: u32) -> Result<rootfs::IdRange, String> {
        match &self.slices {
            None => Ok(self.ids),
            Some(s) => s.slice(id),
        }
    }

    fn runc(&self) -> Command {
        let mut c = Command::new(&self.runtime);
        c.arg("--root").arg(&self.state);
        c.stdin(Stdio::null()).kill_on_drop(true);
        c
    }

    /// Run a runtime command to its end; its stderr on failure.
    async fn run(&self, args: &[&str]) -> Result<(), String> {
        let mut c = self.runc();
        c.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
        let out = tokio::time::timeout(RUNTIME_TIMEOUT, c.output())
            .await
            .map_err(|_| format!("runc {} timed out", args.join(" ")))?
            .map_err(|e| format!("running {}: {e}", self.runtime.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(runc_error(&out.stderr))
        }
    }

    fn relays(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, tokio::task::AbortHandle>>
    {
        self.relays
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The guest's channel to its init: the one made at create, or for a guest an earlier
    /// svcd made, one made through its init's hand-over socket (tried once per guest, and not
    /// while the guest is frozen: its init's server could not answer, so the attempt waits for
    /// the guest's resume).
    async fn init_of(&self, guest: &GuestHandle) -> Option<std::sync::Arc<init::InitChannel>> {
        if let Some(init) = self.inits().get(&guest.name).cloned() {
            return Some(init);
        }
        if !self.svc_init || self.frozen(guest.pid).unwrap_or(false) {
            return None;
        }
        let once = self
            .reattached()
            .entry(guest.name.clone())
            .or_default()
            .clone();
        let took = *once
            .get_or_init(|| async {
                match reinit::reattach(guest).await {
                    Ok(init) => {
                        tracing::info!(guest = %guest.name, "a new channel to the adopted guest's init");
                        self.inits()
                            .insert(guest.name.clone(), std::sync::Arc::new(init));
                        true
                    }
                    Err(e) if self.frozen(guest.pid).unwrap_or(false) => {
                        // Paused meanwhile: not spent; tried again once it is resumed.
                        tracing::info!(guest = %guest.name, reason = %e, "no channel to the adopted guest's init while it is paused");
                        self.reattached().remove(&guest.name);
                        false
                    }
                    Err(e) => {
                        tracing::info!(guest = %guest.name, reason = %e, "no channel to the adopted guest's init: its commands run with the runtime's exec");
                        false
                    }
                }
            })
            .await;
        if took {
            self.inits().get(&guest.name).cloned()
        } else {
            None
        }
    }

    /// Whether the processes of the guest whose init is `pid` are frozen (`pause`).
    fn frozen(&self, pid: u32) -> Result<bool, String> {
        crate::runtime::cgroup_stats::Host::default().frozen(pid)
    }

    fn reattached(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        std::collections::HashMap<String, std::sync::Arc<tokio::sync::OnceCell<bool>>>,
    > {
        self.reattached
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn inits(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        std::collections::HashMap<String, std::sync::Arc<init::InitChannel>>,
    > {
        self.inits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The base image, checked to hold the guest's init: shifted into the guests' one id range
/// `shared` (made once per image build), or without one, the image's own tree (each sandbox
/// mounts it idmapped to its slice); and whether its init is `svc-init` ([`INIT`]) rather than
/// an older image's tini ([`OLD_INIT`]).
fn base_image(
    config: &ContainerConfig,
    shared: Option<rootfs::IdRange>,
) -> Result<(rootfs::Lower, bool), RuntimeError> {
    let lower = match shared {
        Some(ids) => rootfs::Lower::Shifted(rootfs::shifted_image(&config.image, ids)?),
        None => rootfs::Lower::Idmapped(rootfs::image_root(&config.image)?.0),
    };
    let has = |init: &str| lower.path().join(init.trim_start_matches('/')).exists();
    if has(INIT[0]) {
        return Ok((lower, true));
    }
    if !has(OLD_INIT[0]) {
        return Err(RuntimeError::Setup(format!(
            "the base image {} has no {} (the guest's init): rebuild it with `svcd images \
             build`",
            config.image.display(),
            INIT[0]
        )));
    }
    tracing::warn!(
        image = %config.image.display(),
        "the base image has no {} (built by an older svc): each command runs with `runc \
         exec`, tens of milliseconds slower; rebuild it with `svcd images build`",
        INIT[0]
    );
    Ok((lower, false))
}

/// Open svcd's state directory to the guests' ids and make the directory of the execs' pid
/// files (emptied: any there are a previous svcd's); that directory.
fn state_dirs(state_dir: &Path) -> Result<PathBuf, RuntimeError> {
    // The runtime sets up a guest's root file system as the guest's ids: they must be able
    // to pass through (not list) svcd's state directory to the sandboxes' bundles. Each
    // sandbox's own directory is open to its guest's root group only (see `start`).
    for dir in [state_dir.to_path_buf(), state_dir.join("sandboxes")] {
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::set_permissions(&dir, Permissions::from_mode(0o711)))
            .map_err(|e| RuntimeError::Setup(format!("{}: {e}", dir.display())))?;
    }
    // Each exec's pid file lives while its exec does: any here now are a previous svcd's.
    let execs = state_dir.join("exec");
    let _ = std::fs::remove_dir_all(&execs);
    std::fs::create_dir_all(&execs)
        .and_then(|()| std::fs::set_permissions(&execs, Permissions::from_mode(0o700)))
        .map_err(|e| RuntimeError::Setup(format!("{}: {e}", execs.display())))?;
    Ok(execs)
}

/// The last error line runc printed (it logs `time=… level=error msg="…"`).
fn runc_error(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    line.split_once("msg=")
        .map_or(line, |(_, m)| m)
        .trim()
        .trim_matches('"')
        .replace("\\\"", "\"")
}

/// `program` as given if it is a path, else the first match on PATH.
fn find_program(program: &Path) -> Option<PathBuf> {
    binary::on_path(program)
}

impl Backend for Container {
    fn name(&self) -> &'static str {
        "container"
    }

    fn start<'a>(
        &'a self,
        spec: &'a GuestSpec,
        links: &'a dyn GuestLinks,
    ) -> BoxFuture<'a, Result<Started, RuntimeError>> {
        Box::pin(self.start_guest(spec, links))
    }

    fn alive(&self, guest: &GuestHandle) -> bool {
        // A guest whose init was killed while no svcd ran stays a zombie until its new parent
        // reaps it: that is a dead guest (as the microvm backend counts it).
        start_time(guest.pid) == Some(guest.start) && !super::is_zombie(guest.pid)
    }

    fn serve_guest<'a>(
        &'a self,
        guest: &'a GuestHandle,
        dir: &'a Path,
        service: GuestService,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move { self.serve_relay(guest, dir, service) })
    }

    fn stop<'a>(
        &'a self,
        name: &'a str,
        dir: &'a Path,
    ) -> BoxFuture<'a, Result<Vec<String>, RuntimeError>> {
        Box::pin(self.stop_guest(name, dir))
    }

    fn exec<'a>(
        &'a self,
        guest: &'a GuestHandle,
        cmd: &'a GuestCommand,
    ) -> BoxFuture<'a, Result<ExecHandle, RuntimeError>> {
        Box::pin(async move {
            if !self.alive(guest) {
                return Err(RuntimeError::NotRunning);
            }
            self.exec_in(guest, cmd).await
        })
    }

    /// The guest's files are the host's copies, bound into it and rewritten in place by the
    /// claim: only the host name is set here.
    fn claim_guest<'a>(
        &'a self,
        guest: &'a GuestHandle,
        claim: &'a crate::runtime::Claim,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(pooled::set_hostname(guest.clone(), claim.hostname.clone()))
    }

    fn share_into<'a>(
        &'a self,
        guest: &'a GuestHandle,
        id: u32,
        dir: &'a Path,
        dirs: &'a [super::SharedDir],
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(self.share_into_guest(guest, id, dir, dirs))
    }

    fn attach_root<'a>(
        &'a self,
        guest: &'a GuestHandle,
        id: u32,
        dir: &'a Path,
        ctr: &'a str,
        layers: &'a [PathBuf],
    ) -> BoxFuture<'a, Result<crate::runtime::pod_root::RootIn, RuntimeError>> {
        Box::pin(self.attach_root_in(guest, id, dir, ctr, layers))
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

    fn pause<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.run(&["pause", &guest.name])
                .await
                .map_err(|message| RuntimeError::Lifecycle {
                    operation: "pausing",
                    name: guest.name.clone(),
                    message,
                })
        })
    }

    /// An adopted guest's channel to its init is made now if it was left for its resume (a
    /// frozen init's server cannot answer the hand-over: `init_of`).
    fn resume<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.run(&["resume", &guest.name])
                .await
                .map_err(|message| RuntimeError::Lifecycle {
                    operation: "resuming",
                    name: guest.name.clone(),
                    message,
                })?;
            if self.svc_init && !self.inits().contains_key(&guest.name) {
                let (this, guest) = (self.clone(), guest.clone());
                tokio::spawn(async move { this.init_of(&guest).await });
            }
            Ok(())
        })
    }

    /// Frozen by the runtime's freezer (an earlier svcd's `pause`).
    fn paused<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<bool, RuntimeError>> {
        Box::pin(async move {
            self.frozen(guest.pid)
                .map_err(|message| RuntimeError::Lifecycle {
                    operation: "reading the freezer state of",
                    name: guest.name.clone(),
                    message,
                })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runc_errors_are_reduced_to_their_message() {
        let stderr = b"time=\"2026-11-22T20:56:52Z\" level=error msg=\"container \\\"x\\\" does not exist\"\n";
        assert_eq!(runc_error(stderr), "container \"x\" does not exist");
        assert_eq!(runc_error(b"plain failure\n"), "plain failure");
    }
}
