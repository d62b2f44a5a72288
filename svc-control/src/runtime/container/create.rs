//! Making a sandbox's container: its relay directory, root file system and shared
//! directories, the bundle's `config.json`, then `runc create` (the guest waits there while
//! svcd plugs its network in) and `runc start`.

use std::{
    fs::Permissions,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::ExitStatus,
};

use super::{
    Container, RUNTIME_TIMEOUT, disk, handed, init, oci, relay::relay_dir, rootfs, runc_error,
    shared::detach_shared,
};
use crate::runtime::{
    GUEST_RELAY_SOCKET, GuestHandle, GuestLinks, GuestSpec, HostEnd, RuntimeError, Started,
    start_time,
};

impl Container {
    /// Create the guest of `spec`, plug it into its link (made and fenced meanwhile) and
    /// start it.
    pub(super) async fn start_guest(
        &self,
        spec: &GuestSpec,
        links: &dyn GuestLinks,
    ) -> Result<Started, RuntimeError> {
        let err = |message: String| RuntimeError::Start {
            name: spec.name.clone(),
            message,
        };
        let ids = self.guest_ids(spec.id).map_err(err)?;
        std::fs::create_dir_all(&spec.dir)
            .and_then(|()| std::os::unix::fs::chown(&spec.dir, Some(0), Some(ids.gid)))
            .and_then(|()| std::fs::set_permissions(&spec.dir, Permissions::from_mode(0o710)))
            .map_err(|e| err(format!("{}: {e}", spec.dir.display())))?;
        let t0 = std::time::Instant::now();
        // The host end of the link is made and fenced while runc creates the container.
        let ((guest, runc_create), (ifindex, link)) = tokio::try_join!(
            async {
                let g = self.create(spec, ids).await.map_err(err)?;
                Ok::<_, RuntimeError>((g, t0.elapsed()))
            },
            async {
                let i = links.prepare(HostEnd::Veth).await?;
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
    }

    /// `runc create` the guest of `spec`, its ids from `ids` on (its init waits for `runc
    /// start`); its handle.
    async fn create(&self, spec: &GuestSpec, ids: rootfs::IdRange) -> Result<GuestHandle, String> {
        let files = relay_files(spec)?;
        let init_bind = if spec.rootfs.is_empty() {
            None
        } else {
            Some(handed::init_bind(
                &self.lower,
                &spec.rootfs,
                &spec.dir,
                self.svc_init,
            )?)
        };
        let lower = handed::lower(&self.lower, &spec.rootfs);
        // Mounted in runc's own mount namespace, never the host's (see `Overlay`).
        let (disk, overlay) = disk::root_file_system(&spec.dir, &lower, ids, self.disk_mib).await?;
        let (shared, mut sub_binds, sources) = self.mount_shared(spec, ids)?;
        sub_binds.extend(init_bind);
        let bundle = spec.dir.join("bundle");
        self.write_bundle(spec, ids, &bundle, &files, &shared, &sub_binds)?;
        let pid_file = spec.dir.join("init.pid");
        let runc_log = spec.dir.join("runc.log");
        // The init's channel: the guest's end at fd 3 of the runtime (`--preserve-fds 1`).
        let channel = self.svc_init.then(init::socket_pair).transpose()?;
        let guest_end = channel.as_ref().map(|(_, g)| init::raw(g));
        let mut c = self.create_command(spec, &bundle, &pid_file, &runc_log)?;
        if guest_end.is_some() {
            c.arg("--preserve-fds").arg("1");
        }
        c.arg(&spec.name);
        // SAFETY: the closure only makes system calls (dup2, fcntl, unshare, mount, open) on
        // data prepared before the fork.
        unsafe {
            c.pre_exec(move || {
                if let Some(fd) = guest_end {
                    init::to_channel_fd(fd)?;
                }
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
        let status = status.map_err(|_| "runc create timed out".to_owned())?;
        let guest = self.created(spec, status, &pid_file, &runc_log)?;
        // The guest's init holds its end now: svcd keeps only its own.
        if let Some((ours, _)) = channel {
            self.inits().insert(
                spec.name.clone(),
                std::sync::Arc::new(init::InitChannel::new(ours)),
            );
        }
        Ok(guest)
    }

    /// The bundle's `config.json` for `spec` (its guest's ids from `ids` on): its read-only `files`, its `shared` directories
    /// and the `sub_binds` inside them (see `oci::SandboxBundle`).
    fn write_bundle(
        &self,
        spec: &GuestSpec,
        ids: rootfs::IdRange,
        bundle: &Path,
        files: &[(PathBuf, PathBuf)],
        shared: &[(PathBuf, PathBuf)],
        sub_binds: &[(PathBuf, PathBuf, bool)],
    ) -> Result<(), String> {
        let uid_map = oci::IdMapping {
            container_id: 0,
            host_id: ids.uid,
            size: rootfs::ID_COUNT,
        };
        let config = oci::sandbox(&oci::SandboxBundle {
            hostname: &spec.name,
            uid_map,
            gid_map: oci::IdMapping {
                host_id: ids.gid,
                ..uid_map
            },
            files,
            shared,
            sub_binds,
            init: handed::init(&spec.rootfs, self.svc_init),
            cgroups_path: format!("/{}/{}", self.cgroup_parent, spec.name),
            limits: self.limits,
        });
        let json = serde_json::to_vec_pretty(&config).map_err(|e| e.to_string())?;
        std::fs::write(bundle.join("config.json"), json)
            .map_err(|e| format!("writing {}/config.json: {e}", bundle.display()))
    }

    /// `runc create` for `spec`'s bundle, the init's pid to `pid_file`, runc's messages to
    /// `runc_log` and the init's output to `init.log` (its options only: the caller adds any
    /// more, then the container's name).
    fn create_command(
        &self,
        spec: &GuestSpec,
        bundle: &Path,
        pid_file: &Path,
        runc_log: &Path,
    ) -> Result<tokio::process::Command, String> {
        let log = std::fs::File::create(spec.dir.join("init.log"))
            .map_err(|e| format!("init.log: {e}"))?;
        let mut c = self.runc();
        c.arg("--log")
            .arg(runc_log)
            .arg("create")
            // No session keyring per guest: the kernel counts keys per user and every guest
            // is the same host uid, so the 201st sandbox would fail (kernel.keys.maxkeys is
            // 200). The guest cannot use the inherited one: seccomp refuses every keyring call
            // and /proc/keys is masked.
            .arg("--no-new-keyring")
            .arg("--bundle")
            .arg(bundle)
            .arg("--pid-file")
            .arg(pid_file)
            // The guest's init keeps its standard output and error: its log file, never a pipe
            // of svcd's (a pipe would stay open as long as the guest runs).
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        Ok(c)
    }

    /// The guest `runc create` made (it ended with `status`): its init, recorded in
    /// `init.id`; or what went wrong.
    fn created(
        &self,
        spec: &GuestSpec,
        status: std::io::Result<ExitStatus>,
        pid_file: &Path,
        runc_log: &Path,
    ) -> Result<GuestHandle, String> {
        let status = status.map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                "a path bound into the guest (.git or one in it) became a symbolic link \
                 while the sandbox was made: refused"
                    .to_owned()
            } else {
                format!("running {}: {e}", self.runtime.display())
            }
        })?;
        if !status.success() {
            let said = std::fs::read(runc_log).unwrap_or_default();
            return Err(format!("runc create: {}", runc_error(&said)));
        }
        let pid: u32 = std::fs::read_to_string(pid_file)
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

/// The host files the guest sees read-only: `spec`'s, and the relay socket's directory
/// (root's, so the guest can use the socket svcd binds in it, and svcd can bind it again
/// after a restart, but change nothing there).
fn relay_files(spec: &GuestSpec) -> Result<Vec<(PathBuf, PathBuf)>, String> {
    let relay = relay_dir(&spec.dir);
    std::fs::create_dir_all(&relay)
        .and_then(|()| std::fs::set_permissions(&relay, Permissions::from_mode(0o755)))
        .map_err(|e| format!("{}: {e}", relay.display()))?;
    let mut files = spec.files.clone();
    files.push((
        relay,
        Path::new(GUEST_RELAY_SOCKET)
            .parent()
            .unwrap_or(Path::new("/run/svc"))
            .to_path_buf(),
    ));
    Ok(files)
}
