//! The container backend (the embedded default): each sandbox is an OCI container run by runc.
//!
//! - **ids**: a user namespace maps guest ids 0..65535 to the host range of a dedicated system
//!   user (`/etc/subuid`, `/etc/subgid`); guest root is an unprivileged host id.
//! - **files**: its own root file system, an overlay of the shared base image (shifted into
//!   that id range once) and a writable layer of its own; no host path but the read-only files
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
//! Why runc: it is the reference OCI runtime, packaged by Debian, and handles both cgroup
//! layouts (pure v2 and the hybrid v1 + v2 layout; crun 1.8 refuses the hybrid one). It is
//! driven through its command line, so no runtime code runs inside svcd.

pub mod advisory;
mod cgroup;
pub mod disk;
pub mod oci;
pub mod rootfs;
pub mod seccomp;

use std::{
    fs::Permissions,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use tokio::process::Command;

use super::{
    Backend, BoxFuture, ExecHandle, GuestCommand, GuestConn, GuestHandle, GuestLinks, GuestProcess,
    GuestService, GuestSpec, RuntimeError, Started, start_time,
};
use crate::config::host::ContainerConfig;

/// The guest's init: reaps orphans and passes signals on, as PID 1 must.
pub const INIT: [&str; 4] = ["/usr/bin/tini", "--", "/bin/sleep", "infinity"];

/// How long one runtime command may take.
const RUNTIME_TIMEOUT: Duration = Duration::from_secs(30);

/// The container backend.
#[derive(Debug, Clone)]
pub struct Container {
    runtime: PathBuf,
    /// The runtime's state directory (`runc --root`).
    state: PathBuf,
    /// The shifted base image every sandbox's overlay lies on.
    lower: PathBuf,
    ids: rootfs::IdRange,
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
    /// `runc create`s at once: a burst of creates queues here rather than each running the
    /// runtime at a share of the CPU too small to finish within [`RUNTIME_TIMEOUT`].
    starts: std::sync::Arc<tokio::sync::Semaphore>,
}

/// `runc create`s run at once: two per core (a create is mostly CPU: mounts, the seccomp
/// filter, the namespaces), the rest wait their turn before their timeout starts.
fn concurrent_starts() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get() * 2)
}

/// The directory of a sandbox's relay socket (`<dir>/run`, the guest's `/run/svc`, read-only).
fn relay_dir(dir: &Path) -> PathBuf {
    dir.join("run")
}

impl Container {
    /// Check the host and prepare the image (a copy shifted into the id range, made once per
    /// image build): blocking, seconds the first time.
    pub fn new(config: &ContainerConfig, state_dir: &Path) -> Result<Self, RuntimeError> {
        let runtime = find_program(&config.runtime).ok_or_else(|| {
            RuntimeError::Setup(format!(
                "the OCI runtime {} is not installed (apt-get install runc; or set svcd.toml \
                 container.runtime)",
                config.runtime.display()
            ))
        })?;
        // The runtime's own escapes: svcd runs with an older runc, and says so at every start.
        if let Some(warning) = advisory::check(&runtime).warning() {
            tracing::warn!(runtime = %runtime.display(), "{warning}");
        }
        let ids = rootfs::id_range(
            &config.user,
            Path::new("/etc/subuid"),
            Path::new("/etc/subgid"),
            "container.user",
        )?;
        let limits = oci::Limits {
            memory_bytes: config.memory_bytes,
            pids_max: config.pids_max,
            cpu_millis: config.cpu_millis,
        };
        cgroup::check(Path::new("/sys/fs/cgroup"), &limits).map_err(RuntimeError::Setup)?;
        if config.disk_mib > 0 {
            disk::check().map_err(|e| {
                RuntimeError::Setup(format!(
                    "sandbox disks (container.disk_mib = {}): {e}; or set container.disk_mib = 0",
                    config.disk_mib
                ))
            })?;
        }
        let lower = rootfs::shifted_image(&config.image, ids)?;
        if !lower.join(INIT[0].trim_start_matches('/')).exists() {
            return Err(RuntimeError::Setup(format!(
                "the base image {} has no {} (the guest's init): rebuild it with `cargo xtask \
                 images`",
                config.image.display(),
                INIT[0]
            )));
        }
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
        Ok(Self {
            runtime,
            execs,
            state: state_dir.join("runc"),
            lower,
            ids,
            cgroup_parent: config.cgroup_parent.clone(),
            limits,
            disk_mib: config.disk_mib,
            relays: std::sync::Arc::default(),
            starts: std::sync::Arc::new(tokio::sync::Semaphore::new(concurrent_starts())),
        })
    }

    /// The host ids the guests' root maps to.
    pub fn ids(&self) -> rootfs::IdRange {
        self.ids
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

    async fn create(&self, spec: &GuestSpec) -> Result<GuestHandle, String> {
        // The relay socket's directory: root's, so the guest can use the socket svcd binds in
        // it (and svcd can bind it again after a restart) but change nothing there.
        let relay = relay_dir(&spec.dir);
        std::fs::create_dir_all(&relay)
            .and_then(|()| std::fs::set_permissions(&relay, Permissions::from_mode(0o755)))
            .map_err(|e| format!("{}: {e}", relay.display()))?;
        let mut files = spec.files.clone();
        files.push((
            relay,
            Path::new(super::GUEST_RELAY_SOCKET)
                .parent()
                .unwrap_or(Path::new("/run/svc"))
                .to_path_buf(),
        ));
        // Mounted in runc's own mount namespace, never the host's (see `Overlay`).
        let (disk, overlay) =
            disk::root_file_system(&spec.dir, &self.lower, self.ids, self.disk_mib).await?;
        let (shared, sub_binds, sources) = self.mount_shared(spec)?;
        let bundle = spec.dir.join("bundle");
        let uid_map = oci::IdMapping {
            container_id: 0,
            host_id: self.ids.uid,
            size: rootfs::ID_COUNT,
        };
        let config = oci::sandbox(&oci::SandboxBundle {
            hostname: &spec.name,
            uid_map,
            gid_map: oci::IdMapping {
                host_id: self.ids.gid,
                ..uid_map
            },
            files: &files,
            shared: &shared,
            sub_binds: &sub_binds,
            init: INIT.iter().map(|s| (*s).to_owned()).collect(),
            cgroups_path: format!("/{}/{}", self.cgroup_parent, spec.name),
            limits: self.limits,
        });
        let json = serde_json::to_vec_pretty(&config).map_err(|e| e.to_string())?;
        std::fs::write(bundle.join("config.json"), json)
            .map_err(|e| format!("writing {}/config.json: {e}", bundle.display()))?;
        let log = std::fs::File::create(spec.dir.join("init.log"))
            .map_err(|e| format!("init.log: {e}"))?;
        let pid_file = spec.dir.join("init.pid");
        let runc_log = spec.dir.join("runc.log");
        let mut c = self.runc();
        c.arg("--log")
            .arg(&runc_log)
            .arg("create")
            // No session keyring per guest: the kernel counts keys per user and every guest
            // is the same host uid, so the 201st sandbox would fail (kernel.keys.maxkeys is
            // 200). The guest cannot use the inherited one: seccomp refuses every keyring call
            // and /proc/keys is masked.
            .arg("--no-new-keyring")
            .arg("--bundle")
            .arg(&bundle)
            .arg("--pid-file")
            .arg(&pid_file)
            .arg(&spec.name)
            // The guest's init keeps its standard output and error: its log file, never a pipe
            // of svcd's (a pipe would stay open as long as the guest runs).
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        // SAFETY: the closure only makes system calls (unshare, mount, open, dup2) on data
        // prepared before the fork.
        unsafe {
            c.pre_exec(move || {
                overlay.mount_in_private_namespace()?;
                for p in &sources {
                    p.pin()?;
                }
                Ok(())
            });
        }
        let turn = self.starts.acquire().await;
        let status = tokio::time::timeout(RUNTIME_TIMEOUT, c.status()).await;
        drop(turn);
        // The container's namespace holds the disk's mount now (or runc failed): the kernel
        // detaches the device when that goes.
        drop(disk);
        // The container's mount namespace holds its own bind of each shared directory now:
        // the host-side attachment goes (a runc that failed needs it no more either).
        detach_shared(&spec.dir);
        let status = status
            .map_err(|_| "runc create timed out".to_owned())?
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::ELOOP) {
                    "a path bound into the guest (.git or one in it) became a symbolic link \
                     while the sandbox was made: refused"
                        .to_owned()
                } else {
                    format!("running {}: {e}", self.runtime.display())
                }
            })?;
        if !status.success() {
            let said = std::fs::read(&runc_log).unwrap_or_default();
            return Err(format!("runc create: {}", runc_error(&said)));
        }
        let pid: u32 = std::fs::read_to_string(&pid_file)
            .map_err(|e| format!("{}: {e}", pid_file.display()))?
            .trim()
            .parse()
            .map_err(|e| format!("{}: {e}", pid_file.display()))?;
        let start = start_time(pid).ok_or("the guest's init vanished")?;
        std::fs::write(spec.dir.join("init.id"), format!("{pid} {start}\n"))
            .map_err(|e| format!("recording the guest's init: {e}"))?;
        Ok(GuestHandle {
            name: spec.name.clone(),
            pid,
            start,
        })
    }
}

impl Container {
    /// Attach each directory the guest shares with the host (the coding agent's home, SPEC
    /// 5.2) as an idmapped mount under the sandbox's directory, its owner shown as the guest's
    /// root: (attachment, guest path) for the bundle, and the binds inside them (pinned, then
    /// read-only: see `SharedDir`). `detach_shared` takes them off again.
    fn mount_shared(&self, spec: &GuestSpec) -> Result<SharedMounts, String> {
        use std::os::unix::fs::MetadataExt as _;
        detach_shared(&spec.dir);
        let mut out = Vec::new();
        let mut sub_binds = Vec::new();
        let mut pinned = Vec::new();
        // Where each bind inside a shared directory is pinned for the runtime (in its own
        // namespace): made anew for each creation.
        let staging = spec.dir.join("pins");
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;
        for (i, shared) in spec.shared.iter().enumerate() {
            let what = |e: std::io::Error| {
                format!(
                    "sharing {} with the guest at {}: {e}",
                    shared.host.display(),
                    shared.guest.display()
                )
            };
            let meta = std::fs::symlink_metadata(&shared.host).map_err(what)?;
            if !meta.is_dir() {
                return Err(what(std::io::Error::other("not a directory")));
            }
            let target = spec.dir.join("live").join(i.to_string());
            std::fs::create_dir_all(&target).map_err(what)?;
            crate::dataplane::idmap::bind_idmapped(
                &shared.host,
                &target,
                crate::dataplane::idmap::IdShift {
                    owner_uid: meta.uid(),
                    owner_gid: meta.gid(),
                    shown_uid: self.ids.uid,
                    shown_gid: self.ids.gid,
                },
            )
            .map_err(|e| {
                detach_shared(&spec.dir);
                what(e)
            })?;
            for (rel, read_only) in shared
                .pinned
                .iter()
                .map(|p| (p, false))
                .chain(shared.read_only.iter().map(|p| (p, true)))
            {
                // The caller's (and a guest's) tree: checked here with no link followed, then
                // opened the same way in the runtime's own namespace just before it runs
                // (`PinnedSource`), and bound by the runtime through that handle: swapping
                // `.git` for a link while the sandbox is made binds nothing of the host's.
                let fail = |e: std::io::Error| {
                    detach_shared(&spec.dir);
                    format!(
                        "sharing {} with the guest: {}: {e}",
                        shared.host.display(),
                        rel.display()
                    )
                };
                let handle = crate::dataplane::idmap::open_beneath(&target, rel).map_err(fail)?;
                let is_dir = nix::sys::stat::fstat(&handle)
                    .map(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
                    .map_err(|e| fail(e.into()))?;
                let source = staging.join(pinned.len().to_string());
                let made = if is_dir {
                    std::fs::create_dir(&source)
                } else {
                    std::fs::File::create(&source).map(drop)
                };
                made.map_err(fail)?;
                let at = FIRST_PINNED_FD
                    + i32::try_from(pinned.len()).map_err(|_| "too many binds".to_owned())?;
                pinned.push(
                    crate::dataplane::idmap::PinnedSource::new(&target, rel, &source, at)
                        .map_err(fail)?,
                );
                sub_binds.push((source, shared.guest.join(rel), read_only));
            }
            out.push((target, shared.guest.clone()));
        }
        Ok((out, sub_binds, pinned))
    }
}

/// The shared directories' attachments, the binds inside them (see `oci::SandboxBundle`) and
/// the handles those binds are made from (opened in the runtime's namespace before it runs).
type SharedMounts = (
    Vec<(PathBuf, PathBuf)>,
    Vec<(PathBuf, PathBuf, bool)>,
    Vec<crate::dataplane::idmap::PinnedSource>,
);

/// The descriptor each bind source is opened at while it is pinned (the rest follow).
const FIRST_PINNED_FD: i32 = 500;

/// Take every shared directory's host-side attachment off (see `mount_shared`).
fn detach_shared(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir.join("live")) else {
        return;
    };
    for e in entries.flatten() {
        if let Err(err) = crate::dataplane::idmap::detach(&e.path()) {
            tracing::warn!(path = %e.path().display(), error = %err, "detaching a shared directory");
        }
    }
}

/// The guest's init as `create` recorded it: (pid, start time).
fn read_init(dir: &Path) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(dir.join("init.id")).ok()?;
    let (pid, start) = text.trim().split_once(' ')?;
    Some((pid.parse().ok()?, start.parse().ok()?))
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
    if program.components().count() > 1 {
        return program.exists().then(|| program.to_path_buf());
    }
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join(program))
        .find(|p| p.is_file())
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
        Box::pin(async move {
            let err = |message: String| RuntimeError::Start {
                name: spec.name.clone(),
                message,
            };
            std::fs::create_dir_all(&spec.dir)
                .and_then(|()| std::os::unix::fs::chown(&spec.dir, Some(0), Some(self.ids.gid)))
                .and_then(|()| std::fs::set_permissions(&spec.dir, Permissions::from_mode(0o710)))
                .map_err(|e| err(format!("{}: {e}", spec.dir.display())))?;
            let t0 = std::time::Instant::now();
            // The host end of the link is made and fenced while runc creates the container.
            let ((guest, runc_create), (ifindex, link)) = tokio::try_join!(
                async {
                    let g = self.create(spec).await.map_err(err)?;
                    Ok::<_, RuntimeError>((g, t0.elapsed()))
                },
                async {
                    let i = links.prepare(super::HostEnd::Veth).await?;
                    Ok((i, t0.elapsed()))
                }
            )?;
            let t1 = std::time::Instant::now();
            // The container waits in `create`: plug its network in before anything runs.
            let netns = PathBuf::from(format!("/proc/{}/ns/net", guest.pid));
            links.attach(&netns).await?;
            let t2 = std::time::Instant::now();
            self.run(&["start", &spec.name])
                .await
                .map_err(|e| err(format!("runc start: {e}")))?;
            tracing::debug!(
                create_and_link_ms = (t1 - t0).as_secs_f64() * 1000.0,
                runc_create_ms = runc_create.as_secs_f64() * 1000.0,
                link_ms = link.as_secs_f64() * 1000.0,
                attach_ms = (t2 - t1).as_secs_f64() * 1000.0,
                start_ms = t2.elapsed().as_secs_f64() * 1000.0,
                "container started"
            );
            Ok(Started { guest, ifindex })
        })
    }

    fn alive(&self, guest: &GuestHandle) -> bool {
        start_time(guest.pid) == Some(guest.start)
    }

    fn serve_guest<'a>(
        &'a self,
        guest: &'a GuestHandle,
        dir: &'a Path,
        service: GuestService,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            let socket = relay_dir(dir).join(
                Path::new(super::GUEST_RELAY_SOCKET)
                    .file_name()
                    .unwrap_or_default(),
            );
            let err = |e: std::io::Error| {
                RuntimeError::Exec(format!("the relay socket {}: {e}", socket.display()))
            };
            match std::fs::remove_file(&socket) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(err(e)),
                _ => {}
            }
            let listener = tokio::net::UnixListener::bind(&socket).map_err(err)?;
            // Guest root is an unprivileged host id: the socket is open to all, in a directory
            // only the guest (through its mount) and root can reach.
            std::fs::set_permissions(&socket, Permissions::from_mode(0o666)).map_err(err)?;
            let task = tokio::spawn(async move {
                loop {
                    match listener.accept().await {
                        Ok((stream, _)) => {
                            let (r, w) = stream.into_split();
                            service(GuestConn {
                                reader: Box::pin(r),
                                writer: Box::pin(w),
                            });
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "accepting on a sandbox's relay socket");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
            });
            if let Some(old) = self
                .relays()
                .insert(guest.name.clone(), task.abort_handle())
            {
                old.abort();
            }
            Ok(())
        })
    }

    fn stop<'a>(
        &'a self,
        name: &'a str,
        dir: &'a Path,
    ) -> BoxFuture<'a, Result<Vec<String>, RuntimeError>> {
        Box::pin(async move {
            let err = |message: String| RuntimeError::Stop {
                name: name.to_owned(),
                message,
            };
            let mut removed = Vec::new();
            if let Some(relay) = self.relays().remove(name) {
                relay.abort();
                removed.push("git SSH relay socket".to_owned());
            }
            // `runc delete --force` waits a fixed 100 ms after its SIGKILL before it looks
            // again; killing the init (the kernel then kills the whole pid namespace) and
            // watching it go is quicker. `delete --force` stays the fallback for anything odd.
            let init = read_init(dir);
            let mut forced = true;
            if let Some((pid, start)) = init.filter(|(p, s)| start_time(*p) == Some(*s))
                && self.run(&["kill", name, "KILL"]).await.is_ok()
            {
                forced = !super::gone_within(pid, start, Duration::from_secs(2)).await;
            }
            let delete: &[&str] = if forced {
                &["delete", "--force", name]
            } else {
                &["delete", name]
            };
            match self.run(delete).await {
                Ok(()) => removed.push("container (processes, cgroup)".to_owned()),
                Err(e) if e.contains("does not exist") || e.contains("not exist") => {}
                Err(e) if !forced => match self.run(&["delete", "--force", name]).await {
                    Ok(()) => removed.push("container (processes, cgroup)".to_owned()),
                    Err(again) => return Err(err(format!("runc delete: {e}; --force: {again}"))),
                },
                Err(e) => return Err(err(format!("runc delete: {e}"))),
            }
            detach_shared(dir);
            // Only a sandbox made by an earlier svcd has its overlay in the host's namespace.
            if rootfs::Layers::under(dir).unmount().map_err(err)? {
                removed.push("root file system overlay".to_owned());
            }
            if let Some(what) = disk::release(dir).await.map_err(err)? {
                removed.push(what);
            }
            Ok(removed)
        })
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
            let Some(first) = cmd.argv.first() else {
                return Err(RuntimeError::Exec("no command given".into()));
            };
            if first.is_empty() {
                return Err(RuntimeError::Exec("the command name is empty".into()));
            }
            let fail = |m: String| RuntimeError::Exec(m);
            let mut c = self.runc();
            c.arg("exec")
                .arg("--cwd")
                .arg(cmd.cwd.as_deref().unwrap_or("/"));
            for (k, v) in &cmd.env {
                c.arg("--env").arg(format!("{k}={v}"));
            }
            if cmd.tty.is_some() {
                c.arg("--tty");
            }
            // Which guest process the command is, so that ending it kills the command and not
            // only the runtime's exec.
            static EXECS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            let n = EXECS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let process = GuestProcess {
                pid_file: self.execs.join(format!("{}.{n}.pid", guest.name)),
                init: guest.pid,
            };
            c.arg("--pid-file").arg(&process.pid_file);
            c.arg(&guest.name).args(&cmd.argv).env_clear();
            let Some((rows, cols)) = cmd.tty else {
                c.stdin(if cmd.stdin {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
                let child = c
                    .spawn()
                    .map_err(|e| fail(format!("running runc exec: {e}")))?;
                return Ok(ExecHandle::from_child(child, Some(process)));
            };
            // runc makes the command's terminal inside the container and copies between it
            // and its own standard streams: give it a terminal of svcd's (of the caller's size)
            // whose master end carries the caller's bytes.
            let pty = nix::pty::openpty(
                Some(&nix::pty::Winsize {
                    ws_row: rows,
                    ws_col: cols,
                    ws_xpixel: 0,
                    ws_ypixel: 0,
                }),
                None,
            )
            .map_err(|e| fail(format!("opening a terminal: {e}")))?;
            let slave = |fd: &std::os::fd::OwnedFd| {
                fd.try_clone()
                    .map(Stdio::from)
                    .map_err(|e| fail(format!("the terminal: {e}")))
            };
            c.stdin(slave(&pty.slave)?)
                .stdout(slave(&pty.slave)?)
                .stderr(slave(&pty.slave)?);
            let child = c
                .spawn()
                .map_err(|e| fail(format!("running runc exec: {e}")))?;
            // Only runc holds the terminal's slave end now, so the master reads the end of
            // the output when the command and runc are gone.
            drop(c);
            drop(pty.slave);
            ExecHandle::from_tty(child, pty.master, Some(process))
                .map_err(|e| fail(format!("the terminal: {e}")))
        })
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

    fn resume<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.run(&["resume", &guest.name])
                .await
                .map_err(|message| RuntimeError::Lifecycle {
                    operation: "resuming",
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
