//! A VM's helper daemons, started before its monitor connects to them: one virtiofsd per
//! shared directory, and vhost-device-vsock when the agent's channel is vsock. Each runs in
//! its own process group with its pid in the VM's directory, where stop finds it.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use super::{Microvm, virtiofsd, vm_dir::VmDir};
use crate::runtime::SharedDir;

impl Microvm {
    /// Start the VM's vhost-device-vsock: QEMU's vhost-user device on one side, the hybrid
    /// socket svcd connects to on the other.
    pub(super) async fn serve_vsock(&self, dir: &VmDir) -> Result<(), String> {
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

    /// Start a virtiofsd for each shared directory (the guest's root is the directory
    /// owner there); their sockets and tags.
    pub(super) async fn serve_shared(
        &self,
        dir: &VmDir,
        shared: &[SharedDir],
    ) -> Result<Vec<(PathBuf, String)>, String> {
        let mut out = Vec::new();
        for (i, d) in shared.iter().enumerate() {
            let owner = shared_owner(&d.host)?;
            let socket = dir.fs_socket(i);
            // The guest's root writes as the directory's owner and sees the owner's files as
            // its own; no other id, no setid bit, no device node reaches the host.
            let cmd = virtiofsd::command(&self.config.virtiofsd, &socket, &d.host, owner)?;
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
}

/// The owner (uid, gid) of a live mount's host directory, once it is checked to be the
/// directory it names.
fn shared_owner(host: &Path) -> Result<(u32, u32), String> {
    // virtiofsd resolves the path itself: it must be the directory it names, with no
    // link on the way (a directory swapped for a link is refused, not followed).
    if std::fs::canonicalize(host).ok().as_deref() != Some(host) {
        return Err(format!(
            "the live mount's host directory {} has a symbolic link in its path (or is \
             gone): give the path without links",
            host.display()
        ));
    }
    let meta = std::fs::metadata(host)
        .map_err(|e| format!("the live mount's host directory {}: {e}", host.display()))?;
    if !meta.is_dir() {
        return Err(format!(
            "the live mount's host {} is not a directory",
            host.display()
        ));
    }
    Ok((
        std::os::unix::fs::MetadataExt::uid(&meta),
        std::os::unix::fs::MetadataExt::gid(&meta),
    ))
}

/// Start a VM's helper daemon (`what`: virtiofsd, vhost-device-vsock) in its own process
/// group, its messages in `log` and its pid in `pidfile`, and wait until it has opened
/// `socket` (QEMU connects to it at launch). It is reaped whenever it ends (with QEMU's
/// connection); destroy kills it by its pid file.
pub(super) async fn spawn_helper(
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
