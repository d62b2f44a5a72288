//! Serving on one thread per core: each thread runs a single-threaded tokio runtime with a
//! socket of its own in one `SO_REUSEPORT` group, so the kernel spreads packets and connections
//! across threads and no request wakes another thread. The DNS guard's UDP side and the proxy
//! are served this way.

use std::{
    future::Future,
    net::SocketAddr,
    os::fd::{AsRawFd as _, OwnedFd},
    thread::JoinHandle,
};

use nix::sys::socket::{
    AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, bind, listen, setsockopt, socket,
    sockopt,
};

/// Pending connections a listener queues before the kernel refuses more.
const BACKLOG: i32 = 1024;

/// A non-blocking socket bound to `addr` in its `SO_REUSEPORT` group (an IPv6 address also
/// takes IPv4, as the daemon's other listeners do).
fn bound(addr: SocketAddr, kind: SockType) -> std::io::Result<OwnedFd> {
    let family = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket(
        family,
        kind,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    setsockopt(&fd, sockopt::ReusePort, &true)?;
    if addr.is_ipv6() {
        setsockopt(&fd, sockopt::Ipv6V6Only, &false)?;
    }
    bind(fd.as_raw_fd(), &SockaddrStorage::from(addr))?;
    Ok(fd)
}

/// A UDP socket on `addr`, one of a `SO_REUSEPORT` group.
pub fn udp(addr: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    bound(addr, SockType::Datagram).map(std::net::UdpSocket::from)
}

/// A listening TCP socket on `addr`, one of a `SO_REUSEPORT` group.
pub fn tcp_listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let fd = bound(addr, SockType::Stream)?;
    listen(&fd, Backlog::new(BACKLOG).map_err(std::io::Error::from)?)?;
    Ok(std::net::TcpListener::from(fd))
}

/// Run `serve` to its end on a new thread named `name`, in a single-threaded runtime of its own
/// (tasks it spawns run there too, and end with it).
pub fn spawn<F, Fut>(name: String, serve: F) -> std::io::Result<JoinHandle<()>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    spawn_with(name, || {}, serve)
}

/// [`spawn`], the thread's audit records for `audit` gathered over each turn of its loop and
/// written together when the turn ends (`audit::Batched`; records go through
/// `audit::record_here`): one write for the requests or questions it finished in that turn.
pub fn spawn_with_audit<F, Fut>(
    name: String,
    audit: &std::sync::Arc<dyn crate::audit::AuditSink>,
    serve: F,
) -> std::io::Result<JoinHandle<()>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let batched = crate::audit::Batched::new(audit.clone());
    let flush = batched.clone();
    spawn_with(
        name,
        move || flush.flush(),
        move || {
            batched.enter();
            serve()
        },
    )
}

/// [`spawn`], calling `before_park` whenever the thread has run all its ready work and is about
/// to wait for more (the end of each turn of its event loop): where work gathered over a turn
/// is finished together (audit records written at once).
pub(crate) fn spawn_with<F, Fut>(
    name: String,
    before_park: impl Fn() + Send + Sync + 'static,
    serve: F,
) -> std::io::Result<JoinHandle<()>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()>,
{
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_park(before_park)
        .build()?;
    std::thread::Builder::new()
        .name(name)
        .spawn(move || rt.block_on(serve()))
}

/// Threads for the cores this process may run on (at most `max`).
pub fn threads(max: usize) -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get().min(max).max(1))
}
