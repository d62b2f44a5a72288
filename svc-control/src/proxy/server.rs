//! The proxy: its parts, and the threads and accept loops that serve it.
//!
//! A guest connection goes through the stages in order (one file each): `accept` (slots,
//! ClientHello, the SNI gate of `policy::sni`) → `tls` (the sandbox CA's leaf, the handshake)
//! or `plain` (the Host binding of `policy::binding`) → per request, `exchange` drives
//! `request` (ask `policy::request::decide`) → `forward` (to `https://<checked name>` over a
//! connection to the address and port the guest dialled, never a fresh resolution of the name,
//! see `dial`; certificate verified against the name with real roots; the credential swapped or
//! stripped) → `response` (scrub, one audit record per request, with the address dialled) or
//! `upgrade` (WebSocket relay). Refusals are answered by `refuse`.

use std::{future::Future, io, net::SocketAddr, sync::Arc, time::Duration};

use tokio::net::{TcpListener, TcpStream};

use super::{accept, context::Ctx, upstreams::Upstreams};
use crate::audit::AuditSink;

pub use super::{
    config::ProxyConfig,
    resolve::{DnsService, HostClient, Resolve, SystemResolver, Upstream, host_client},
    sandboxes::{ProxySandbox, Revocation, Sandboxes},
};
/// The credential broker: the real bearer behind a placeholder.
pub use crate::creds::{Bearer, Broker};

/// The proxy. Share it with `Arc`.
#[derive(Clone)]
pub struct Proxy {
    ctx: Arc<Ctx>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").finish_non_exhaustive()
    }
}

/// While the proxy serves, a timer due within this long stays in the runtime's timer wheel.
/// tokio wakes its I/O driver (an eventfd write, then an extra epoll turn) whenever a timer is
/// registered earlier than every timer already there (tokio-rs/tokio#5207): with an otherwise
/// empty wheel that is every per-request timeout, three system calls per request. With this
/// earlier deadline always present, a request's timeouts (all longer) wake nothing; the cost is
/// one timer firing per second.
const HEARTBEAT: Duration = Duration::from_secs(1);

impl Proxy {
    pub fn new(
        config: ProxyConfig,
        sandboxes: Arc<dyn Sandboxes>,
        broker: Arc<dyn Broker>,
        resolver: Arc<dyn Resolve>,
        audit: Arc<dyn AuditSink>,
    ) -> Self {
        let upstream = Upstreams::new(&config, resolver.clone());
        Self {
            ctx: Arc::new(Ctx {
                config,
                sandboxes,
                broker,
                audit,
                upstream,
                resolver,
            }),
        }
    }

    /// The same proxy (sandboxes, audit, connection counts) with upstream pools of its own, for
    /// a thread of its own: a pooled connection is driven by the runtime that opened it, so
    /// threads sharing one pool would wake each other for every request.
    fn with_own_pools(&self) -> Self {
        let ctx = &self.ctx;
        Self {
            ctx: Arc::new(Ctx {
                upstream: Upstreams::new(&ctx.config, ctx.resolver.clone()),
                ..Ctx::clone(ctx)
            }),
        }
    }

    /// Serve on `addr` from `threads` threads of their own (`per_core`): each accepts from its
    /// own listener in one `SO_REUSEPORT` group and runs its connections, from ClientHello to
    /// upstream and back, on its own single-threaded runtime with its own upstream pools — no
    /// request hands over between threads. Sandboxes, policy, audit and the per-sandbox
    /// connection cap are shared. The threads end when `shutdown` turns true (their open
    /// connections with them). Binding errors are returned here, before any thread starts.
    pub fn serve_threads(
        self: &Arc<Self>,
        addr: SocketAddr,
        threads: usize,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> io::Result<Vec<std::thread::JoinHandle<()>>> {
        let listeners = (0..threads.max(1))
            .map(|_| crate::per_core::tcp_listener(addr))
            .collect::<io::Result<Vec<_>>>()?;
        listeners
            .into_iter()
            .enumerate()
            .map(|(i, listener)| {
                let proxy = Arc::new(self.with_own_pools());
                let mut shutdown = shutdown.clone();
                // Each thread's audit records are written together at the end of each turn of
                // its loop (one write for the requests it finished then, not one each).
                crate::per_core::spawn_with_audit(
                    format!("proxy-{i}"),
                    &self.ctx.audit,
                    move || async move {
                        let Ok(listener) = TcpListener::from_std(listener) else {
                            return;
                        };
                        proxy
                            .serve(listener, async move {
                                let _ = shutdown.wait_for(|s| *s).await;
                            })
                            .await;
                    },
                )
            })
            .collect()
    }

    /// Accept connections until `shutdown` completes.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let heartbeat = tokio::time::sleep(HEARTBEAT);
        tokio::pin!(heartbeat);
        loop {
            let (conn, peer) = tokio::select! {
                () = &mut shutdown => return,
                () = &mut heartbeat => {
                    heartbeat.as_mut().reset(tokio::time::Instant::now() + HEARTBEAT);
                    continue;
                }
                r = listener.accept() => match r {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of descriptors or memory: say so, and let the host breathe rather
                        // than spin on a listener that stays readable.
                        eprintln!("svc proxy: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            self.spawn_connection(conn, peer);
        }
    }

    /// Serve one accepted connection on a task of its own, once admitted (a refused one is
    /// closed here).
    fn spawn_connection(&self, conn: TcpStream, peer: SocketAddr) {
        // Requests and answers are small writes: no Nagle delay on either leg.
        let _ = conn.set_nodelay(true);
        if let Some(serve) = accept::admit(self.ctx.clone(), conn, peer) {
            tokio::spawn(serve);
        }
    }
}
