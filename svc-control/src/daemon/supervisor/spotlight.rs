//! Spotlight: a workspace's port forwards, host `127.0.0.1:localPort` to the sandbox's own
//! `localhost:remotePort` (`spotlight.defaults`, or every published port of the compose file
//! when there is no workspace.json).
//!
//! The host ports are bound when the sandbox is made (a port in use refuses the creation,
//! naming who holds it) and start forwarding at the workspace's first `workspace.ready`. Each
//! connection is carried through the guest's exec (`svc-supervise --connect PORT` inside the
//! sandbox), never through the fence: the sandbox's egress perimeter is unchanged.

use std::{net::TcpListener, sync::Arc};

use tokio::io::AsyncWriteExt as _;
use tracing::{debug, info, warn};

use super::{Failure, Supervisor, task::TaskGuard, workspace::WorkspaceRun};
use crate::{api, config::workspace::SpotlightForward, policy::ownership::Principal};

/// Bind every forward's host port (127.0.0.1) for `who`, or say which is refused (a privileged
/// port of a member's workspace) or taken (and by whom, when `who` may know).
pub(super) fn bind_all(
    forwards: &[SpotlightForward],
    who: &Principal,
) -> Result<Vec<TcpListener>, Failure> {
    let start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024);
    let mut out = Vec::new();
    for f in forwards {
        crate::policy::ownership::spotlight_port(who, f.local_port, start)
            .map_err(Failure::forbidden)?;
        let l = TcpListener::bind(("127.0.0.1", f.local_port)).map_err(|e| {
            let holder = port_holder(f.local_port)
                .filter(|(_, uid)| crate::policy::ownership::sees_port_holder(who, *uid))
                .map_or_else(String::new, |(h, _)| format!(" by {h}"));
            Failure::bad(format!(
                "spotlight: local port {} (for {}:{}) is in use{holder} ({e}); free it or change \
                 its localPort in spotlight.defaults",
                f.local_port, f.service, f.remote_port
            ))
        })?;
        l.set_nonblocking(true)
            .map_err(|e| Failure::internal(format!("port {}: {e}", f.local_port)))?;
        out.push(l);
    }
    Ok(out)
}

/// Who listens on TCP `port` in svcd's network namespace: `pid N (comm)` and its uid, from
/// /proc.
pub(super) fn port_holder(port: u16) -> Option<(String, u32)> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let listening = *state == "0A";
            let this_port = local
                .rsplit_once(':')
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if listening && this_port == Some(port) {
                inodes.push(format!("socket:[{inode}]"));
            }
        }
    }
    if inodes.is_empty() {
        return None;
    }
    for proc in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = proc
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(proc.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(target) = std::fs::read_link(fd.path()) else {
                continue;
            };
            if inodes.iter().any(|i| target.as_os_str() == i.as_str()) {
                let comm = std::fs::read_to_string(proc.path().join("comm")).unwrap_or_default();
                let uid = std::os::unix::fs::MetadataExt::uid(&proc.metadata().ok()?);
                return Some((format!("pid {pid} ({})", comm.trim()), uid));
            }
        }
    }
    // A listener whose process cannot be found: named to no one.
    None
}

impl Supervisor {
    /// Start forwarding `listeners` (bound at creation, one per forward of `run`) once the
    /// workspace is first ready.
    pub(super) fn start_forwards(
        self: &Arc<Self>,
        name: &str,
        run: &Arc<WorkspaceRun>,
        listeners: Vec<TcpListener>,
    ) {
        let mut tasks = Vec::new();
        for (f, l) in run.spec.forwards.iter().cloned().zip(listeners) {
            // The task holds no reference to the workspace: dropping it (with the sandbox)
            // ends the task, and the port is free again.
            let (sup, name) = (self.clone(), name.to_owned());
            let mut ready = run.ready_seen.subscribe();
            let task = tokio::spawn(async move {
                if ready.wait_for(|r| *r).await.is_err() {
                    return;
                }
                let Ok(listener) = tokio::net::TcpListener::from_std(l) else {
                    return;
                };
                info!(sandbox = %name, service = %f.service, local = f.local_port, remote = f.remote_port, "forward opened");
                sup.event(
                    "workspace.forward_opened",
                    Some(&name),
                    serde_json::json!({
                        "service": f.service,
                        "local_port": f.local_port,
                        "remote_port": f.remote_port,
                        "address": format!("127.0.0.1:{}", f.local_port),
                    }),
                );
                loop {
                    let Ok((conn, peer)) = listener.accept().await else {
                        continue;
                    };
                    let (sup, name) = (sup.clone(), name.clone());
                    tokio::spawn(async move {
                        if let Err(e) = sup.forward_one(&name, f.remote_port, conn).await {
                            debug!(sandbox = %name, %peer, remote = f.remote_port, error = %e, "forwarded connection ended");
                        }
                    });
                }
            });
            tasks.push(TaskGuard(task.abort_handle()));
        }
        *run.forwards
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = tasks;
    }

    /// Carry one connection to the sandbox's `localhost:remote` through its exec.
    async fn forward_one(
        &self,
        name: &str,
        remote: u16,
        conn: tokio::net::TcpStream,
    ) -> Result<(), String> {
        let req = api::ExecRequest {
            user: None,
            root: None,
            hardening: None,
            argv: vec![
                svc_guest::services::BINARY.into(),
                "--connect".into(),
                remote.to_string(),
            ],
            env: Vec::new(),
            cwd: None,
            stdin: true,
            tty: None,
        };
        let mut handle = self
            .exec_as(name, &req, true, crate::limits::Channel::Spotlight)
            .await
            .map_err(|f| f.message)?;
        let (mut from_client, mut to_client) = conn.into_split();
        let mut to_guest = handle.stdin.take().ok_or("no stdin")?;
        let mut from_guest = handle.stdout.take().ok_or("no stdout")?;
        let up = async {
            let _ = tokio::io::copy(&mut from_client, &mut to_guest).await;
            let _ = to_guest.shutdown().await;
        };
        let lingered = carry_answer(&mut from_guest, &mut to_client, up).await;
        let _ = to_client.shutdown().await;
        if lingered {
            debug!(sandbox = %name, remote, "the guest said nothing for {LINGER:?} after the client closed; the forward ends");
        }
        // The guest's relay ends with its connection; if its server holds that open, the
        // relay is told to end (the runtime's exec passes the signal on), then killed.
        if tokio::time::timeout(std::time::Duration::from_secs(1), handle.wait())
            .await
            .is_err()
        {
            handle.signal(nix::sys::signal::Signal::SIGTERM);
        }
        match tokio::time::timeout(std::time::Duration::from_secs(5), handle.wait()).await {
            Ok(Ok(0 | 143)) => Ok(()),
            Ok(Ok(code)) => Err(format!("the guest's relay exited with {code}")),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => {
                handle.kill().await;
                warn!(sandbox = %name, remote, "a forwarded connection's relay did not end; killed");
                Ok(())
            }
        }
    }
}

/// How long a forward waits, once its host client has closed its side, for more of the
/// guest's answer: the stream ends after this much silence (its slot comes back).
pub(super) const LINGER: std::time::Duration = std::time::Duration::from_secs(10);

/// Copy the guest's answer to the client while `up` carries the client's bytes to the guest.
/// Ends when the guest's side ends, the client cannot be written, or — once `up` is done (the
/// client closed its side) — the guest is silent for [`LINGER`]; `true` in that last case.
///
/// A client that closed only its sending side still gets the rest of the answer; one that
/// went away entirely cannot be told from it without writing to it, so silence decides.
async fn carry_answer(
    from_guest: &mut (impl tokio::io::AsyncRead + Unpin),
    to_client: &mut (impl tokio::io::AsyncWrite + Unpin),
    up: impl std::future::Future<Output = ()>,
) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut up = std::pin::pin!(up);
    let mut client_done = false;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = if client_done {
            match tokio::time::timeout(LINGER, from_guest.read(&mut buf)).await {
                Ok(r) => r,
                Err(_) => return true,
            }
        } else {
            tokio::select! {
                r = from_guest.read(&mut buf) => r,
                () = &mut up => {
                    client_done = true;
                    continue;
                }
            }
        };
        match n {
            Ok(0) | Err(_) => return false,
            Ok(n) => {
                if to_client.write_all(&buf[..n]).await.is_err() {
                    return false;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::carry_answer;

    /// A client that closed its sending side still gets the answer the guest writes after.
    #[tokio::test]
    async fn the_answer_after_the_client_closed_its_side_is_carried() {
        let (mut guest, mut from_guest) = tokio::io::duplex(64);
        let (mut to_client, mut client) = tokio::io::duplex(64);
        let writer = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            guest.write_all(b"late answer").await.expect("write");
        });
        let lingered = carry_answer(&mut from_guest, &mut to_client, async {}).await;
        writer.await.expect("writer");
        drop(to_client);
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.expect("read");
        assert_eq!((lingered, got.as_slice()), (false, &b"late answer"[..]));
    }

    /// A client that cannot be written ends the forward.
    #[tokio::test]
    async fn a_client_gone_ends_the_forward() {
        let (mut guest, mut from_guest) = tokio::io::duplex(64);
        let (mut to_client, client) = tokio::io::duplex(64);
        drop(client);
        guest.write_all(b"hello").await.expect("write");
        let up = std::future::pending::<()>();
        assert!(!carry_answer(&mut from_guest, &mut to_client, up).await);
    }
}
