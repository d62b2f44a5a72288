//! The microvm backend: each sandbox is a QEMU `-M microvm` guest with a kernel of its own —
//! the boundary for hostile code. A guest root that owns its kernel still sees only virtio
//! devices: its disk (a copy-on-write overlay of the image), its NIC (a tap on the host that
//! carries the fence, exactly like the container backend's veth), and the agent's channel.
//!
//! Creation: overlay the root file system; launch QEMU paused ([`qemu::Monitor::launch`]),
//! which makes the tap; put QEMU in its memory cgroup; address and fence the tap; let the guest
//! run; wait for the agent's hello on the channel; set the guest up (address, host name,
//! entropy) and write its files (resolv.conf, hosts, CA bundle). Exec, files and setup go over
//! the channel ([`channel`], protocol in `svc_guest::proto`).
//!
//! Fork: pause the source, snapshot its memory and devices to a file, copy its disk overlay,
//! and start a clone from them with its own tap, addresses, channel and identity (docs/microvm.md).

pub mod channel;
pub mod qemu;
pub mod qmp;
mod virtiofsd;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use svc_guest::proto::{Exec, Request, Setup};

use self::{
    channel::Channel,
    qemu::{Accel, Images, Launch, Monitor, Qemu, VmDir},
};
use super::{
    Backend, BoxFuture, ExecHandle, GuestCommand, GuestHandle, GuestLinks, GuestSpec, HostEnd,
    RuntimeError, Started, ids, start_time,
};
use crate::config::host::MicrovmConfig;

/// How long a guest may take from launch to its agent's hello (TCG on a busy host is slow).
const BOOT_LIMIT: Duration = Duration::from_secs(120);

/// How long the guest's agent may take to set the guest up once it has answered (its network,
/// host name and files; the live mounts after it have their own limit).
const SETUP_LIMIT: Duration = Duration::from_secs(60);

/// How long an exec waits to reach an agent that was up before (after an svcd restart).
const RECONNECT_LIMIT: Duration = Duration::from_secs(10);

/// The microvm backend.
pub struct Microvm {
    config: MicrovmConfig,
    /// The images, or why they are not usable.
    images: Result<Images, String>,
    monitor: Qemu,
    /// Why this accelerator.
    accel_reason: String,
    /// `<state_dir>/sandboxes`: each VM's files are in its sandbox's directory.
    sandboxes: PathBuf,
    /// The memory cgroup each VM's QEMU goes in, under this parent.
    cgroup_parent: String,
    /// One channel per running guest.
    channels: Mutex<HashMap<String, Arc<Channel>>>,
    /// What each guest's own connections go to (`serve_guest`), kept for its next channel.
    services: Mutex<HashMap<String, super::GuestService>>,
}

impl std::fmt::Debug for Microvm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Microvm")
            .field("accel", &self.monitor.accel)
            .field("images", &self.images)
            .finish_non_exhaustive()
    }
}

impl Microvm {
    /// The backend as svcd's configuration and environment make it. It always exists; when
    /// the images are missing, [`Microvm::unavailable`] says why and creation is refused.
    pub fn new(
        config: &MicrovmConfig,
        state_dir: &Path,
        cgroup_parent: &str,
        env: impl Fn(&str) -> Option<std::ffi::OsString>,
    ) -> Self {
        let (accel, accel_reason) = Accel::choose(&config.accel);
        Self {
            config: config.clone(),
            images: Images::from_env(env),
            monitor: Qemu {
                binary: config.qemu.clone(),
                accel,
            },
            accel_reason,
            sandboxes: state_dir.join("sandboxes"),
            cgroup_parent: cgroup_parent.to_owned(),
            channels: Mutex::default(),
            services: Mutex::default(),
        }
    }

    /// Why a sandbox cannot be made with this backend, if it cannot.
    pub fn unavailable(&self) -> Option<&str> {
        self.images.as_ref().err().map(String::as_str)
    }

    /// The accelerator and why it was chosen.
    pub fn accel(&self) -> (&'static str, &str) {
        (self.monitor.accel.name(), &self.accel_reason)
    }

    fn dir(&self, name: &str) -> VmDir {
        VmDir(self.sandboxes.join(name))
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Channel>>> {
        self.channels
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
        self.channels().insert(name.to_owned(), c.clone());
        Ok(c)
    }

    fn services(&self) -> std::sync::MutexGuard<'_, HashMap<String, super::GuestService>> {
        self.services
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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

    /// Start the VM's vhost-device-vsock: QEMU's vhost-user device on one side, the hybrid
    /// socket svcd connects to on the other.
    async fn serve_vsock(&self, dir: &VmDir) -> Result<(), String> {
        let mut cmd = tokio::process::Command::new(&self.config.vhost_vsock);
        cmd.args(["--guest-cid", "3", "--socket"])
            .arg(dir.vsock_device())
            .arg("--uds-path")
            .arg(dir.vsock());
        spawn_helper(
            cmd,
            "vhost-device-vsock",
            &dir.0.join("vsock.log"),
            &dir.vsock_pidfile(),
            &dir.vsock_device(),
        )
        .await
    }

    /// The memory cgroup of VM `name`: (directory, the file its limit goes in).
    fn cgroup(&self, name: &str) -> (PathBuf, &'static str) {
        let root = Path::new("/sys/fs/cgroup");
        if root.join("cgroup.controllers").exists() {
            (root.join(&self.cgroup_parent).join(name), "memory.max")
        } else {
            (
                root.join("memory").join(&self.cgroup_parent).join(name),
                "memory.limit_in_bytes",
            )
        }
    }

    /// Put QEMU (`pid`) in a cgroup whose memory ceiling is the guest's RAM plus QEMU's own
    /// overhead: the guest's RAM size alone is not a host limit.
    fn limit_memory(&self, name: &str, pid: u32) -> Result<(), String> {
        let (dir, limit_file) = self.cgroup(name);
        let said = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
        if limit_file == "memory.max" {
            // cgroup v2: the memory controller must be on for every level above.
            let root = Path::new("/sys/fs/cgroup");
            let mut at = root.to_path_buf();
            for part in Path::new(&self.cgroup_parent).components() {
                let control = at.join("cgroup.subtree_control");
                std::fs::write(&control, "+memory").map_err(|e| said(&control, e))?;
                at.push(part);
                std::fs::create_dir_all(&at).map_err(|e| said(&at, e))?;
            }
            let control = at.join("cgroup.subtree_control");
            std::fs::write(&control, "+memory").map_err(|e| said(&control, e))?;
        }
        std::fs::create_dir_all(&dir).map_err(|e| said(&dir, e))?;
        let bytes = (self.config.memory_mib + self.config.overhead_mib) << 20;
        let limit = dir.join(limit_file);
        std::fs::write(&limit, bytes.to_string()).map_err(|e| said(&limit, e))?;
        let procs = dir.join("cgroup.procs");
        std::fs::write(&procs, pid.to_string()).map_err(|e| said(&procs, e))
    }

    /// The uid and gid sandbox `id`'s QEMU runs as: its own, the microvm user's range start +
    /// `id`. A QEMU that a guest broke out of shares no id with another sandbox's QEMU, disk
    /// or snapshot, nor with any container guest (their user's range is another).
    fn vm_ids(&self, id: u32) -> Result<(u32, u32), String> {
        let range = ids::id_range(
            &self.config.user,
            Path::new("/etc/subuid"),
            Path::new("/etc/subgid"),
            "microvm.user",
        )
        .map_err(|e| e.to_string())?;
        if id == 0 || id >= ids::ID_COUNT {
            return Err(format!(
                "sandbox id {id} is outside the microvm user {}'s range of {} ids (one per \
                 sandbox): use a smaller ipv4_pool in svcd.toml",
                self.config.user,
                ids::ID_COUNT
            ));
        }
        Ok((range.uid + id, range.gid + id))
    }

    /// Start a virtiofsd for each shared directory (the guest's root is the directory
    /// owner there); their sockets and tags.
    async fn serve_shared(
        &self,
        dir: &VmDir,
        shared: &[super::SharedDir],
    ) -> Result<Vec<(PathBuf, String)>, String> {
        let mut out = Vec::new();
        for (i, d) in shared.iter().enumerate() {
            // virtiofsd resolves the path itself: it must be the directory it names, with no
            // link on the way (a directory swapped for a link is refused, not followed).
            if std::fs::canonicalize(&d.host).ok().as_deref() != Some(d.host.as_path()) {
                return Err(format!(
                    "the live mount's host directory {} has a symbolic link in its path (or is \
                     gone): give the path without links",
                    d.host.display()
                ));
            }
            let meta = std::fs::metadata(&d.host).map_err(|e| {
                format!("the live mount's host directory {}: {e}", d.host.display())
            })?;
            if !meta.is_dir() {
                return Err(format!(
                    "the live mount's host {} is not a directory",
                    d.host.display()
                ));
            }
            let (uid, gid) = (
                std::os::unix::fs::MetadataExt::uid(&meta),
                std::os::unix::fs::MetadataExt::gid(&meta),
            );
            let socket = dir.fs_socket(i);
            // The guest's root writes as the directory's owner and sees the owner's files as
            // its own; no other id, no setid bit, no device node reaches the host.
            let cmd = virtiofsd::command(&self.config.virtiofsd, &socket, &d.host, (uid, gid))?;
            spawn_helper(
                cmd,
                "virtiofsd",
                &dir.0.join(format!("fs{i}.log")),
                &dir.fs_pidfile(i),
                &socket,
            )
            .await?;
            out.push((socket, format!("svcfs{i}")));
        }
        Ok(out)
    }

    /// Launch, fence, boot and set up a guest.
    async fn boot(
        &self,
        spec: &GuestSpec,
        links: &dyn GuestLinks,
        images: &Images,
    ) -> Result<Started, String> {
        let t0 = std::time::Instant::now();
        let dir = VmDir(spec.dir.clone());
        std::fs::create_dir_all(&dir.0).map_err(|e| format!("{}: {e}", dir.0.display()))?;
        for sock in [dir.agent(), dir.qmp()] {
            if sock.as_os_str().len() >= 108 {
                return Err(format!(
                    "{}: too long for a unix socket (108 bytes); use a shorter state_dir",
                    sock.display()
                ));
            }
        }
        match &spec.restore {
            // A clone's disk is its source's as it was at the snapshot.
            Some(snap) => {
                tokio::fs::copy(&snap.disk, dir.disk())
                    .await
                    .map_err(|e| format!("copying the snapshot's disk: {e}"))?;
            }
            None => overlay(&images.rootfs, &dir.disk(), self.config.disk_mib).await?,
        }
        // QEMU reopens its disk as the unprivileged user it runs as (after a restore, and on
        // `cont` after a snapshot): this VM's own ids own its overlay.
        let (uid, gid) = self.vm_ids(spec.id)?;
        std::os::unix::fs::chown(dir.disk(), Some(uid), Some(gid))
            .and_then(|()| {
                std::fs::set_permissions(
                    dir.disk(),
                    std::os::unix::fs::PermissionsExt::from_mode(0o600),
                )
            })
            .map_err(|e| format!("{}: {e}", dir.disk().display()))?;
        // The live mounts: one virtiofsd each, up before QEMU connects to it.
        let shared = self.serve_shared(&dir, &spec.shared).await?;
        let vsock = self.vsock() && spec.restore.is_none();
        if vsock {
            self.serve_vsock(&dir).await?;
        }
        let vsock_device = dir.vsock_device();
        // The tap is made and fenced while QEMU starts; QEMU opens it, and the guest runs
        // only once both are done.
        let launch = Launch {
            dir: &dir,
            images,
            tap: links.link(),
            memory_mib: self.config.memory_mib,
            cpus: self.config.cpus,
            incoming: spec.restore.as_ref().map(|s| s.memory.as_path()),
            run_as: (uid, gid),
            shared: &shared,
            vsock: vsock.then_some(vsock_device.as_path()),
        };
        // QEMU attaches to the tap by name: it exists first.
        links.make_tap().await.map_err(|e| e.to_string())?;
        let (ifindex, pid) = tokio::try_join!(
            async { links.prepare(HostEnd::Tap).await.map_err(|e| e.to_string()) },
            self.monitor.launch(&launch)
        )?;
        let t1 = std::time::Instant::now();
        let start = start_time(pid).ok_or("QEMU exited as it started")?;
        self.limit_memory(&spec.name, pid)
            .map_err(|e| format!("the memory cgroup: {e}"))?;
        self.monitor.resume(&dir).await?;
        let t2 = std::time::Instant::now();
        let channel = match self.connect(&dir, BOOT_LIMIT).await {
            Ok(c) => c,
            Err(e) => {
                // Say what the guest said: the console's last lines.
                let console = self.monitor.console(&dir).await.unwrap_or_default();
                let tail: Vec<&str> = console.lines().rev().take(8).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return Err(format!(
                    "the guest did not come up: {e}; its console ends:\n{}",
                    tail.join("\n")
                ));
            }
        };
        let t3 = std::time::Instant::now();
        // The guest is not trusted to answer: an agent that stops mid-setup fails the create.
        tokio::time::timeout(
            SETUP_LIMIT,
            set_up(&channel, &spec.name, links, &spec.files),
        )
        .await
        .map_err(|_| {
            format!(
                "the guest's agent did not finish setting up within {} s",
                SETUP_LIMIT.as_secs()
            )
        })??;
        if spec.restore.is_none() {
            // A clone's mounts came with its memory.
            for ((_, tag), dir) in shared.iter().zip(&spec.shared) {
                let mount = Request::Mount {
                    tag: tag.clone(),
                    path: dir.guest.display().to_string(),
                };
                tokio::time::timeout(SETUP_LIMIT, channel.call(&mount, b""))
                    .await
                    .map_err(|_| format!("timed out after {} s", SETUP_LIMIT.as_secs()))
                    .flatten()
                    .map_err(|e| format!("the live mount of {}: {e}", dir.host.display()))?;
            }
        }
        if spec.restore.is_none() && self.config.disk_mib > 0 {
            // A clone's file system grew with its source's.
            tokio::time::timeout(SETUP_LIMIT, grow_root(&channel))
                .await
                .map_err(|_| format!("timed out after {} s", SETUP_LIMIT.as_secs()))
                .flatten()
                .map_err(|e| format!("growing the guest's root file system to its disk: {e}"))?;
        }
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        tracing::debug!(
            disk_and_launch_ms = ms(t1 - t0),
            cgroup_fence_cont_ms = ms(t2 - t1),
            to_agent_ms = ms(t3 - t2),
            setup_ms = ms(t3.elapsed()),
            restored = spec.restore.is_some(),
            "microvm started"
        );
        self.channels().insert(spec.name.clone(), channel);
        Ok(Started {
            guest: GuestHandle {
                name: spec.name.clone(),
                pid,
                start,
            },
            ifindex,
        })
    }
}

/// Start a VM's helper daemon (`what`: virtiofsd, vhost-device-vsock) in its own process
/// group, its messages in `log` and its pid in `pidfile`, and wait until it has opened
/// `socket` (QEMU connects to it at launch). It is reaped whenever it ends (with QEMU's
/// connection); destroy kills it by its pid file.
async fn spawn_helper(
    mut cmd: tokio::process::Command,
    what: &str,
    log: &Path,
    pidfile: &Path,
    socket: &Path,
) -> Result<(), String> {
    let out = std::fs::File::create(log).map_err(|e| format!("{what}'s log: {e}"))?;
    let program = std::path::PathBuf::from(cmd.as_std().get_program());
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(out)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("running {}: {e}", program.display()))?;
    if let Some(pid) = child.id() {
        let _ = std::fs::write(pidfile, pid.to_string());
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            let said = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!("{what} exited ({status}): {}", said.trim()));
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("{what} did not open its socket within 10 s"));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    Ok(())
}

/// A qcow2 overlay at `disk` over the raw image `rootfs`: the guest writes only its own copy,
/// and at most `mib` MiB of it (`[container] disk_mib`; the image's own size if that is more,
/// or if `mib` is 0): the disk's virtual size, which bounds what its file can grow to.
async fn overlay(rootfs: &Path, disk: &Path, mib: u64) -> Result<(), String> {
    let image = std::fs::metadata(rootfs)
        .map_err(|e| format!("{}: {e}", rootfs.display()))?
        .len();
    let size = mib.saturating_mul(1 << 20).max(image);
    let out = tokio::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(rootfs)
        .arg(disk)
        .arg(size.to_string())
        .output()
        .await
        .map_err(|e| format!("running qemu-img: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "qemu-img create: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Grow the guest's root file system to its disk (online, with the image's resize2fs): the
/// image is made small, each guest's disk is `disk_mib`.
async fn grow_root(channel: &Arc<Channel>) -> Result<(), String> {
    use tokio::io::AsyncReadExt as _;
    let mut h = channel.exec(Exec {
        argv: [
            "/bin/sh",
            "-c",
            "resize2fs \"$(findmnt -n -o SOURCE /)\" 2>&1",
        ]
        .map(str::to_owned)
        .to_vec(),
        env: Vec::new(),
        cwd: None,
        stdin: false,
        tty: None,
    })?;
    let mut said = Vec::new();
    if let Some(mut out) = h.stdout.take() {
        let _ = out.read_to_end(&mut said).await;
    }
    match h.wait().await.map_err(|e| e.to_string())? {
        0 => Ok(()),
        code => Err(format!(
            "resize2fs exited with {code}: {}",
            String::from_utf8_lossy(&said).trim()
        )),
    }
}

/// The guest's identity, network and files, over its channel.
async fn set_up(
    channel: &Channel,
    name: &str,
    links: &dyn GuestLinks,
    files: &[(PathBuf, PathBuf)],
) -> Result<(), String> {
    let net = links.guest_net();
    let mut entropy = [0u8; 64];
    getrandom::fill(&mut entropy).map_err(|e| e.to_string())?;
    let setup = Request::Setup(Setup {
        hostname: name.to_owned(),
        address: format!("{}/{}", net.address, net.prefix),
        gateway: net.gateway.to_string(),
        entropy: entropy.iter().map(|b| format!("{b:02x}")).collect(),
        clock_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    });
    let mut contents = Vec::new();
    for (host, guest) in files {
        let content = tokio::fs::read(host)
            .await
            .map_err(|e| format!("{}: {e}", host.display()))?;
        contents.push((guest, content));
    }
    // All at once: the channel carries them side by side, each answered on its own stream.
    let writes = contents.iter().map(|(guest, content)| async move {
        let t = std::time::Instant::now();
        let r = channel
            .call(
                &Request::WriteFile {
                    path: guest.display().to_string(),
                    mode: 0o644,
                },
                content,
            )
            .await
            .map_err(|e| format!("writing {} in the guest: {e}", guest.display()));
        tracing::debug!(file = %guest.display(), bytes = content.len(), ms = t.elapsed().as_secs_f64() * 1000.0, "written");
        r
    });
    let (set_up, written) = tokio::join!(
        async {
            let t = std::time::Instant::now();
            let r = channel.call(&setup, b"").await;
            tracing::debug!(ms = t.elapsed().as_secs_f64() * 1000.0, "setup call");
            r
        },
        futures::future::join_all(writes)
    );
    set_up.map_err(|e| format!("setting the guest up: {e}"))?;
    written.into_iter().collect::<Result<Vec<()>, String>>()?;
    Ok(())
}

/// The effective uid and gid of process `pid` (`/proc/PID/status`).
fn process_ids(pid: u32) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let effective = |key: &str| -> Option<u32> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(2)?.parse().ok()
    };
    Some((effective("Uid:")?, effective("Gid:")?))
}

/// QEMU's pid from its pidfile, if that process is still this VM's QEMU (its command line
/// names the VM's directory).
fn qemu_pid(dir: &VmDir) -> Option<(u32, u64)> {
    let pid: u32 = std::fs::read_to_string(dir.pidfile())
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    // Every QEMU of ours names its QMP socket, whichever channel it has.
    let mine = dir.qmp().display().to_string();
    String::from_utf8_lossy(&cmdline)
        .contains(&mine)
        .then_some(())?;
    Some((pid, start_time(pid)?))
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
            let images = self.images.as_ref().map_err(|e| RuntimeError::Start {
                name: spec.name.clone(),
                message: e.clone(),
            })?;
            self.boot(spec, links, images)
                .await
                .map_err(|message| RuntimeError::Start {
                    name: spec.name.clone(),
                    message,
                })
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
        Box::pin(async move {
            let dir = VmDir(dir.to_path_buf());
            let mut removed = Vec::new();
            self.channels().remove(name);
            self.services().remove(name);
            if let Some((pid, start)) = qemu_pid(&dir) {
                // Asked first (QEMU then removes its tap and sockets itself), killed if slow.
                let asked = self.monitor.quit(&dir).await.is_ok()
                    && super::gone_within(pid, start, Duration::from_secs(2)).await;
                if !asked {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX)),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    if !super::gone_within(pid, start, Duration::from_secs(5)).await {
                        return Err(RuntimeError::Stop {
                            name: name.to_owned(),
                            message: format!("QEMU (pid {pid}) did not die"),
                        });
                    }
                }
                removed.push(format!("QEMU (pid {pid})"));
            }
            let helpers = (0..)
                .map(|i| dir.fs_pidfile(i))
                .take_while(|p| p.exists())
                .chain(std::iter::once(dir.vsock_pidfile()).filter(|p| p.exists()))
                .collect::<Vec<_>>();
            for pidfile in helpers {
                let Ok(pid) = std::fs::read_to_string(&pidfile) else {
                    continue;
                };
                if let Ok(pid) = pid.trim().parse::<i32>()
                    && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                        String::from_utf8_lossy(&c).contains(&dir.0.display().to_string())
                    })
                {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                    removed.push(format!(
                        "{} (pid {pid})",
                        if pidfile == dir.vsock_pidfile() {
                            "vhost-device-vsock"
                        } else {
                            "virtiofsd"
                        }
                    ));
                }
            }
            let (cgroup, _) = self.cgroup(name);
            if cgroup.exists() {
                // Empty once QEMU is gone; the kernel may take a moment to say so.
                for _ in 0..100 {
                    if std::fs::remove_dir(&cgroup).is_ok() {
                        removed.push(format!("memory cgroup {}", cgroup.display()));
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            Ok(removed)
        })
    }

    fn serve_guest<'a>(
        &'a self,
        guest: &'a GuestHandle,
        _dir: &'a Path,
        service: super::GuestService,
    ) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.services().insert(guest.name.clone(), service.clone());
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
        Box::pin(async move {
            if !self.alive(guest) {
                return Err(RuntimeError::NotRunning);
            }
            let channel = self.channel(&guest.name, RECONNECT_LIMIT).await?;
            channel
                .exec(Exec {
                    argv: cmd.argv.clone(),
                    env: cmd.env.clone(),
                    cwd: cmd.cwd.clone(),
                    stdin: cmd.stdin,
                    tty: cmd.tty,
                })
                .map_err(RuntimeError::Exec)
        })
    }

    fn snapshot<'a>(
        &'a self,
        guest: &'a GuestHandle,
        into: &'a Path,
    ) -> BoxFuture<'a, Result<super::Snapshot, RuntimeError>> {
        Box::pin(async move {
            let err = |message: String| RuntimeError::Lifecycle {
                operation: "snapshotting",
                name: guest.name.clone(),
                message,
            };
            let dir = self.dir(&guest.name);
            if self.vsock() {
                return Err(RuntimeError::Unsupported {
                    backend: "microvm",
                    operation: "fork",
                    hint: " whose agent channel is vsock (QEMU cannot migrate a vhost-user vsock \
                           device): set microvm.channel = \"virtio-serial\" for sandboxes that fork",
                });
            }
            // QEMU writes the memory file as the unprivileged ids it runs as (this VM's own;
            // its clones' QEMUs open the file before they drop to theirs).
            let (uid, gid) = qemu_pid(&dir)
                .and_then(|(pid, _)| process_ids(pid))
                .ok_or_else(|| err("its QEMU is not running".to_owned()))?;
            std::fs::create_dir_all(into)
                .and_then(|()| std::os::unix::fs::chown(into, Some(uid), Some(gid)))
                .and_then(|()| {
                    std::fs::set_permissions(
                        into,
                        std::os::unix::fs::PermissionsExt::from_mode(0o700),
                    )
                })
                .map_err(|e| err(format!("{}: {e}", into.display())))?;
            self.monitor.pause(&dir).await.map_err(err)?;
            let snap = super::Snapshot {
                dir: into.to_path_buf(),
                memory: into.join("memory"),
                disk: into.join("disk.qcow2"),
            };
            self.monitor
                .snapshot(&dir, &snap.memory)
                .await
                .map_err(err)?;
            // Paused and flushed: the overlay is the disk as the memory knows it.
            tokio::fs::copy(dir.disk(), &snap.disk)
                .await
                .map_err(|e| err(format!("copying the disk: {e}")))?;
            Ok(snap)
        })
    }

    fn pause<'a>(&'a self, guest: &'a GuestHandle) -> BoxFuture<'a, Result<(), RuntimeError>> {
        Box::pin(async move {
            self.monitor
                .pause(&self.dir(&guest.name))
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
            self.monitor
                .resume(&self.dir(&guest.name))
                .await
                .map_err(|message| RuntimeError::Lifecycle {
                    operation: "resuming",
                    name: guest.name.clone(),
                    message,
                })
        })
    }
}
