//! The guard's listeners: UDP (batched receivers, one per core or per thread of their own) and
//! TCP (length-prefixed queries, a per-sandbox cap on connections).

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream, UdpSocket},
};

use super::{guard::Guard, settings::Transport};
use crate::limits::Channel;

/// Questions one UDP receiver keeps waiting for the upstream at once.
const MAX_WAITING: usize = 1024;
/// Largest query accepted over UDP.
const MAX_UDP_QUERY: usize = 4096;

impl Guard {
    /// Serve UDP until `shutdown` completes.
    pub async fn serve_udp(self: Arc<Self>, socket: UdpSocket, shutdown: impl Future<Output = ()>) {
        // One receiver per core: each answers what it can where it runs (see `receive_udp`).
        let receivers = crate::per_core::threads(4);
        self.serve_udp_on(socket, receivers, shutdown).await;
    }

    async fn serve_udp_on(
        self: Arc<Self>,
        socket: UdpSocket,
        receivers: usize,
        shutdown: impl Future<Output = ()>,
    ) {
        let socket = Arc::new(socket);
        let receivers: Vec<_> = (0..receivers)
            .map(|_| tokio::spawn(self.clone().receive_udp(socket.clone())))
            .collect();
        shutdown.await;
        for r in receivers {
            r.abort();
        }
    }

    /// Serve UDP on `addr` from `threads` threads of their own, each with its own socket
    /// (`SO_REUSEPORT`: the kernel spreads the sandboxes' questions over them) and its own
    /// single-threaded runtime, so a question is received, answered (or forwarded and answered)
    /// and sent back on one thread, without hand-offs between workers: measured, that takes
    /// ~35 µs off a forwarded question on this kind of machine, and the threads together answer
    /// more cached questions than one. They end when `shutdown` turns true. Binding errors are
    /// returned here, before any thread starts.
    pub fn serve_udp_threads(
        self: &Arc<Self>,
        addr: SocketAddr,
        threads: usize,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
        let sockets = (0..threads.max(1))
            .map(|_| crate::per_core::udp(addr))
            .collect::<std::io::Result<Vec<_>>>()?;
        sockets
            .into_iter()
            .enumerate()
            .map(|(i, socket)| {
                let (guard, mut shutdown) = (self.clone(), shutdown.clone());
                // The thread's audit records (one per question) are written together at the
                // end of each turn of its loop, as the proxy's are: one write for a batch of
                // questions read with one `recvmmsg`, not one each.
                crate::per_core::spawn_with_audit(
                    format!("dns-guard-{i}"),
                    &self.audit,
                    move || async move {
                        let Ok(socket) = UdpSocket::from_std(socket) else {
                            return;
                        };
                        guard
                            .serve_udp_on(socket, 1, async move {
                                let _ = shutdown.wait_for(|s| *s).await;
                            })
                            .await;
                    },
                )
            })
            .collect()
    }

    /// One receiver: reads the questions waiting in batches (`udp_batch`), answers what is
    /// ready at once (the cache, refusals) right here, sending the batch's answers together,
    /// and drives
    /// the questions that wait for the upstream itself, as futures of its own (at most
    /// [`MAX_WAITING`] at a time; more are dropped, as a full socket buffer would): no task is
    /// spawned and no other thread woken for any question (a spawned task cost ~10 µs more
    /// per forwarded question, measured).
    async fn receive_udp(self: Arc<Self>, socket: Arc<UdpSocket>) {
        use std::os::fd::AsFd as _;

        use futures::StreamExt as _;
        let mut inbox = super::udp_batch::Inbox::new(MAX_UDP_QUERY);
        let mut waiting = futures::stream::FuturesUnordered::new();
        loop {
            tokio::select! {
                biased;
                Some((answer, peer)) = waiting.next(), if !waiting.is_empty() => {
                    if let Some(answer) = answer {
                        send_udp(&socket, answer, peer);
                    }
                    continue;
                }
                r = socket.readable() => if r.is_err() {
                    continue;
                },
            }
            // Everything waiting, up to a batch, in one call (`WouldBlock` clears the
            // readiness and the loop waits again).
            let Ok(received) = socket.try_io(tokio::io::Interest::READABLE, || {
                inbox.receive(socket.as_fd())
            }) else {
                continue;
            };
            let mut ready = Vec::new();
            for (query, peer) in received {
                let query = query.to_vec();
                let guard = self.clone();
                let mut answer = Box::pin(async move {
                    (guard.handle(peer.ip(), &query, Transport::Udp).await, peer)
                });
                let first = answer
                    .as_mut()
                    .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()));
                match first {
                    std::task::Poll::Ready((Some(answer), peer)) => ready.push((answer, peer)),
                    std::task::Poll::Ready((None, _)) => {}
                    // `waiting` polls it again with its real waker.
                    std::task::Poll::Pending if waiting.len() < MAX_WAITING => {
                        waiting.push(answer);
                    }
                    std::task::Poll::Pending => {}
                }
            }
            send_batch(&socket, ready);
        }
    }

    /// Serve DNS over TCP until `shutdown` completes. A sandbox holds at most
    /// `limits.dns_tcp_connections` connections at once: the next is accepted and closed at
    /// once, unread (no task, no buffer), and the hit reported.
    pub async fn serve_tcp(
        self: Arc<Self>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) {
        tokio::pin!(shutdown);
        loop {
            let (conn, peer) = tokio::select! {
                () = &mut shutdown => return,
                r = listener.accept() => match r { Ok(x) => x, Err(_) => continue },
            };
            let slot = match self.directory.sandbox_for(peer.ip().to_canonical()) {
                Some(sandbox) => match self
                    .config
                    .limits
                    .acquire(&sandbox.guest(), Channel::DnsTcp)
                {
                    Ok(slot) => Some(slot),
                    Err(_) => {
                        drop(conn);
                        continue;
                    }
                },
                // Not a sandbox: answered REFUSED by `handle`, as over UDP.
                None => None,
            };
            let guard = self.clone();
            // Served until it ends, or its sandbox is torn down (then closed).
            tokio::spawn(async move {
                let ended = slot.as_ref().map(crate::limits::Slot::ended);
                let ended = async move {
                    match ended {
                        Some(ended) => ended.await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = guard.tcp_connection(conn, peer) => {}
                    () = ended => {}
                }
                drop(slot);
            });
        }
    }

    async fn tcp_connection(&self, mut conn: TcpStream, peer: SocketAddr) {
        for _ in 0..100 {
            let mut len = [0u8; 2];
            let read =
                tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut len)).await;
            if !matches!(read, Ok(Ok(_))) {
                return;
            }
            let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
            if !matches!(
                tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut query)).await,
                Ok(Ok(_))
            ) {
                return;
            }
            let Some(answer) = self.handle(peer.ip(), &query, Transport::Tcp).await else {
                return;
            };
            let Ok(alen) = u16::try_from(answer.len()) else {
                return;
            };
            if conn.write_all(&alen.to_be_bytes()).await.is_err()
                || conn.write_all(&answer).await.is_err()
            {
                return;
            }
        }
    }
}

/// Send answers in as few calls as the socket takes now; any it does not take go one by one
/// (from a task if the socket is full).
fn send_batch(socket: &Arc<UdpSocket>, answers: Vec<(Vec<u8>, SocketAddr)>) {
    use std::os::fd::AsFd as _;
    if answers.is_empty() {
        return;
    }
    let sent = socket
        .try_io(tokio::io::Interest::WRITABLE, || {
            super::udp_batch::send(socket.as_fd(), &answers)
        })
        .unwrap_or(0);
    for (answer, peer) in answers.into_iter().skip(sent) {
        send_udp(socket, answer, peer);
    }
}

/// Send a UDP answer now if the socket takes it, else from a task once it can.
fn send_udp(socket: &Arc<UdpSocket>, answer: Vec<u8>, peer: SocketAddr) {
    match socket.try_send_to(&answer, peer) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            let socket = socket.clone();
            tokio::spawn(async move {
                let _ = socket.send_to(&answer, peer).await;
            });
        }
        _ => {}
    }
}
