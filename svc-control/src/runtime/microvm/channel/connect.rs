//! Reaching a guest's agent: a unix socket (virtio-serial) or a hybrid vsock socket, then a
//! hello with a nonce of this host's, said again until the agent answers it.

use std::{
    path::Path,
    sync::{Arc, atomic::Ordering},
    time::{Duration, Instant},
};

use svc_guest::proto::{self, Frame, Kind};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::UnixStream,
    sync::mpsc,
};

use super::Channel;

/// How long one hello waits for its answer before it is sent again.
const HELLO_RETRY: Duration = Duration::from_millis(500);

/// How long one hybrid vsock `CONNECT` waits for its `OK` before it is made again.
const VSOCK_ATTEMPT: Duration = Duration::from_secs(2);

impl Channel {
    /// Connect to the agent at `socket` (QEMU's end of the virtio-serial port) and say hello
    /// until it answers, within `limit`.
    pub async fn connect(socket: &Path, limit: Duration) -> Result<Arc<Self>, String> {
        let deadline = Instant::now() + limit;
        let stream = loop {
            match UnixStream::connect(socket).await {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("connecting to {}: {e}", socket.display()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let (r, w) = stream.into_split();
        let (channel, mut hellos) = Self::over(r, w);
        channel
            .greet(&mut hellos, deadline)
            .await
            .map_err(|e| format!("the agent on {}: {e}", socket.display()))?;
        Ok(channel)
    }

    /// Connect to the agent through a hybrid vsock unix socket (Firecracker's, and
    /// vhost-device-vsock's): `CONNECT <port>\n`, `OK <host port>\n`, then the channel.
    pub async fn connect_vsock(
        socket: &Path,
        port: u32,
        limit: Duration,
    ) -> Result<Arc<Self>, String> {
        let deadline = Instant::now() + limit;
        loop {
            // One attempt waits for its OK at most VSOCK_ATTEMPT: a request sent while the
            // guest's vsock driver is still starting can be lost without the socket closing
            // (the device is reset when the driver binds), and then only a new one is answered.
            let wait = VSOCK_ATTEMPT.min(deadline.saturating_duration_since(Instant::now()));
            let attempt = async {
                let mut stream = UnixStream::connect(socket)
                    .await
                    .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
                stream
                    .write_all(format!("CONNECT {port}\n").as_bytes())
                    .await
                    .map_err(|e| e.to_string())?;
                // Byte by byte: nothing after the line may be read into a buffer here.
                let mut line = Vec::new();
                let mut byte = [0u8; 1];
                while line.len() < 64 && !line.ends_with(b"\n") {
                    if stream.read(&mut byte).await.map_err(|e| e.to_string())? == 0 {
                        return Err(
                            "the vsock socket closed before OK (no agent listening yet?)"
                                .to_owned(),
                        );
                    }
                    line.push(byte[0]);
                }
                svc_guest::parse_vsock_ok(&String::from_utf8_lossy(&line))?;
                Ok(stream)
            };
            let attempt = match tokio::time::timeout(wait, attempt).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::info!(
                        socket = %socket.display(),
                        port,
                        "vsock CONNECT unanswered after {} ms; connecting again",
                        wait.as_millis()
                    );
                    Err(format!("no OK within {} ms", wait.as_millis()))
                }
            };
            match attempt {
                Ok(stream) => {
                    let (r, w) = stream.into_split();
                    let (channel, mut hellos) = Self::over(r, w);
                    channel.greet(&mut hellos, deadline).await.map_err(|e| {
                        format!("the agent on {} port {port}: {e}", socket.display())
                    })?;
                    return Ok(channel);
                }
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("vsock {} port {port}: {e}", socket.display()));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Say hello (again every half second) until the agent answers this hello, by `deadline`;
    /// what the agent says it can do on the way ([`Channel::holds_exec`]).
    pub async fn greet(
        &self,
        hellos: &mut mpsc::UnboundedReceiver<String>,
        deadline: Instant,
    ) -> Result<(), String> {
        let nonce = format!("{:016x}", rand_u64());
        let want = format!("{} {nonce}", svc_guest::READY);
        // An agent that says what it can do says it before its `READY` (proto's docs).
        let features = format!("{} {nonce} ", proto::FEATURES);
        loop {
            if self
                .out
                .send(Frame::new(0, Kind::Hello, nonce.clone()))
                .is_err()
            {
                return Err(self.ended_reason());
            }
            let wait = HELLO_RETRY.min(deadline.saturating_duration_since(Instant::now()));
            let answered = tokio::time::timeout(wait, async {
                while let Some(said) = hellos.recv().await {
                    if said == want {
                        return true;
                    }
                    if let Some(list) = said.strip_prefix(&features) {
                        let held = list.split(' ').any(|f| f == proto::HELD_EXEC);
                        self.held_exec.store(held, Ordering::Relaxed);
                    }
                }
                false
            })
            .await;
            match answered {
                Ok(true) => return Ok(()),
                Ok(false) => return Err(self.ended_reason()),
                Err(_) if Instant::now() >= deadline => {
                    return Err("no answer to hello in time".to_owned());
                }
                Err(_) => {}
            }
        }
    }
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b)
}
