//! Small servers and clients that live in a namespace: std sockets opened on a thread that
//! entered the namespace. Every loop is bounded and stops when its handle is dropped.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::NetNs;

/// A TCP server that accepts, writes `greeting`, and counts connections.
pub struct TcpServer {
    pub accepted: Arc<AtomicUsize>,
    /// Peer addresses of the accepted connections.
    pub peers: Arc<std::sync::Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl TcpServer {
    pub fn start(ns: &NetNs, bind: SocketAddr, greeting: &'static [u8]) -> Self {
        let accepted = Arc::new(AtomicUsize::new(0));
        let peers = Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s, p) = (accepted.clone(), stop.clone(), peers.clone());
        let path = format!("/run/netns/{}", ns.name);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let file = std::fs::File::open(&path).expect("open netns");
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let listener = TcpListener::bind(bind).unwrap_or_else(|e| panic!("bind {bind}: {e}"));
            listener.set_nonblocking(true).expect("nonblocking");
            let _ = ready_tx.send(());
            let deadline = Instant::now() + Duration::from_secs(120);
            while !s.load(Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((mut conn, peer)) => {
                        a.fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut v) = p.lock() {
                            v.push(peer);
                        }
                        let _ = conn.write_all(greeting);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        let _ = ready_rx.recv_timeout(Duration::from_secs(5));
        Self {
            accepted,
            peers,
            stop,
            thread: Some(thread),
        }
    }

    pub fn count(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for TcpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A UDP server that echoes every datagram back.
pub struct UdpEcho {
    stop: Arc<AtomicBool>,
    pub received: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl UdpEcho {
    pub fn start(ns: &NetNs, bind: SocketAddr) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(AtomicUsize::new(0));
        let (s, r) = (stop.clone(), received.clone());
        let path = format!("/run/netns/{}", ns.name);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let file = std::fs::File::open(&path).expect("open netns");
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let sock = UdpSocket::bind(bind).unwrap_or_else(|e| panic!("bind {bind}: {e}"));
            sock.set_read_timeout(Some(Duration::from_millis(20)))
                .expect("timeout");
            let _ = ready_tx.send(());
            let mut buf = [0u8; 2048];
            let deadline = Instant::now() + Duration::from_secs(120);
            while !s.load(Ordering::Relaxed) && Instant::now() < deadline {
                if let Ok((n, peer)) = sock.recv_from(&mut buf) {
                    r.fetch_add(1, Ordering::Relaxed);
                    let _ = sock.send_to(&buf[..n], peer);
                }
            }
        });
        let _ = ready_rx.recv_timeout(Duration::from_secs(5));
        Self {
            stop,
            received,
            thread: Some(thread),
        }
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// From inside `ns`: connect over TCP and read the greeting. `Ok(greeting)` or why not.
pub fn tcp_fetch(ns: &NetNs, to: SocketAddr) -> Result<Vec<u8>, String> {
    tcp_fetch_within(ns, to, Duration::from_millis(700))
}

/// [`tcp_fetch`] with a chosen connect timeout.
pub fn tcp_fetch_within(ns: &NetNs, to: SocketAddr, timeout: Duration) -> Result<Vec<u8>, String> {
    ns.run(move || {
        let mut conn = TcpStream::connect_timeout(&to, timeout).map_err(|e| e.to_string())?;
        conn.set_read_timeout(Some(Duration::from_millis(700)))
            .map_err(|e| e.to_string())?;
        let mut buf = Vec::new();
        let _ = conn.read_to_end(&mut buf);
        Ok(buf)
    })
}

/// From inside `ns`: send one UDP datagram and wait for the echo.
pub fn udp_roundtrip(ns: &NetNs, to: SocketAddr) -> bool {
    ns.run(move || {
        let bind: SocketAddr = if to.is_ipv4() {
            "0.0.0.0:0".parse().expect("addr")
        } else {
            "[::]:0".parse().expect("addr")
        };
        let Ok(sock) = UdpSocket::bind(bind) else {
            return false;
        };
        let _ = sock.set_read_timeout(Some(Duration::from_millis(500)));
        if sock.send_to(b"ping", to).is_err() {
            return false;
        }
        let mut buf = [0u8; 16];
        matches!(sock.recv_from(&mut buf), Ok((4, _)))
    })
}

/// From inside `ns`: whether `ping -c 1` gets a reply.
pub fn pings(ns: &NetNs, to: &str) -> bool {
    ns.exec("ping", &["-c", "1", "-W", "1", to])
        .status
        .success()
}
