//! Setting a booted guest up over its agent's channel: its identity, network and files, its
//! live mounts, and its root file system grown to its disk. The guest is not trusted to
//! answer: each step has a time limit, and a step that fails fails the create.

use std::{path::PathBuf, sync::Arc, time::Duration};

use svc_guest::proto::{Exec, Request, Setup};

use super::channel::Channel;
use crate::runtime::{Claim, GuestLinks, GuestNet, GuestSpec, SharedDir};

/// How long the guest's agent may take to set the guest up once it has answered (its network,
/// host name and files; the live mounts after it have their own limit).
pub(super) const SETUP_LIMIT: Duration = Duration::from_secs(60);

/// Everything the guest of `spec` needs once its agent answered: (a fresh guest only: a
/// clone's came with its memory and disk) its root file system grown to its disk when
/// `disk_mib` is set; identity, network and files; (a fresh guest only) its live mounts on
/// the `shared` devices; then the grown file system's writes flushed.
///
/// The first block allocation after a grown file system's journal commit costs the guest
/// ~150 ms of emulated CPU under TCG, once (docs/PERFORMANCE.md, "The microvm claim
/// regression"). The growth is committed (`sync`), the files written after it and flushed
/// (`sync`) here, at the boot: not at the first writes after it, which for a pooled guest are
/// its claim's (on the trees share's machine; a VM without it still pays part later).
pub(super) async fn set_up_guest(
    channel: &Arc<Channel>,
    spec: &GuestSpec,
    links: &dyn GuestLinks,
    shared: &[(PathBuf, String)],
    disk_mib: u64,
) -> Result<(), String> {
    // A clone's file system grew with its source's.
    let grow = spec.restore.is_none() && disk_mib > 0;
    if grow {
        in_guest(channel, GROW_ROOT)
            .await
            .map_err(|e| format!("growing the guest's root file system to its disk: {e}"))?;
    }
    set_up_within(channel, &spec.name, &links.guest_net(), &spec.files).await?;
    if spec.restore.is_none() {
        // A clone's mounts came with its memory.
        mount_shared(channel, shared, &spec.shared).await?;
    }
    if grow {
        // Last: nothing the guest was given waits to be written when it is handed over.
        in_guest(channel, "sync 2>&1")
            .await
            .map_err(|e| format!("flushing the guest's writes on its grown file system: {e}"))?;
    }
    Ok(())
}

/// Grow the guest's root file system to its disk (online, with the image's resize2fs: the
/// image is made small, each guest's disk is `disk_mib`), and commit the growth.
const GROW_ROOT: &str = "resize2fs \"$(findmnt -n -o SOURCE /)\" 2>&1 && sync 2>&1";

/// A pooled guest given to the sandbox that claims it: the same identity, network and files a
/// fresh guest of that sandbox is set up with (its address is the pooled one's, kept), a fresh
/// seed for its entropy pool and the clock.
pub(super) async fn claim(channel: &Channel, claim: &Claim) -> Result<(), String> {
    set_up_within(channel, &claim.hostname, &claim.net, &claim.files).await
}

/// [`set_up`], within [`SETUP_LIMIT`].
async fn set_up_within(
    channel: &Channel,
    name: &str,
    net: &GuestNet,
    files: &[(PathBuf, PathBuf)],
) -> Result<(), String> {
    tokio::time::timeout(SETUP_LIMIT, set_up(channel, name, net, files))
        .await
        .map_err(|_| {
            format!(
                "the guest's agent did not finish setting up within {} s",
                SETUP_LIMIT.as_secs()
            )
        })?
}

/// Mount each virtio-fs device (`devices`: socket, tag) at its shared directory's guest path.
async fn mount_shared(
    channel: &Channel,
    devices: &[(PathBuf, String)],
    shared: &[SharedDir],
) -> Result<(), String> {
    for ((_, tag), dir) in devices.iter().zip(shared) {
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
    Ok(())
}

/// `sh -c script` in the guest, within [`SETUP_LIMIT`]; what it said when it failed.
async fn in_guest(channel: &Arc<Channel>, script: &str) -> Result<(), String> {
    tokio::time::timeout(SETUP_LIMIT, run_sh(channel, script))
        .await
        .map_err(|_| format!("timed out after {} s", SETUP_LIMIT.as_secs()))
        .flatten()
}

async fn run_sh(channel: &Arc<Channel>, script: &str) -> Result<(), String> {
    use tokio::io::AsyncReadExt as _;
    let mut h = channel.exec(Exec {
        argv: ["/bin/sh", "-c", script].map(str::to_owned).to_vec(),
        env: Vec::new(),
        cwd: None,
        stdin: false,
        tty: None,
        ..Exec::default()
    })?;
    let mut said = Vec::new();
    if let Some(mut out) = h.stdout.take() {
        let _ = out.read_to_end(&mut said).await;
    }
    match h.wait().await.map_err(|e| e.to_string())? {
        0 => Ok(()),
        code => Err(format!(
            "`{script}` exited with {code}: {}",
            String::from_utf8_lossy(&said).trim()
        )),
    }
}

/// The guest's identity, network and files, over its channel.
async fn set_up(
    channel: &Channel,
    name: &str,
    net: &GuestNet,
    files: &[(PathBuf, PathBuf)],
) -> Result<(), String> {
    let setup = setup_request(name, net)?;
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

/// The guest's host name, address, gateway, clock and a fresh seed for its entropy pool.
fn setup_request(name: &str, net: &GuestNet) -> Result<Request, String> {
    let mut entropy = [0u8; 64];
    getrandom::fill(&mut entropy).map_err(|e| e.to_string())?;
    Ok(Request::Setup(Setup {
        hostname: name.to_owned(),
        address: format!("{}/{}", net.address, net.prefix),
        gateway: net.gateway.to_string(),
        entropy: entropy.iter().map(|b| format!("{b:02x}")).collect(),
        clock_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    }))
}
