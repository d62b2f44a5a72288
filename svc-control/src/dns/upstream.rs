//! Asking the upstream resolvers: UDP first, TCP when the answer is truncated, each resolver in
//! turn until one answers within the timeout.

use std::{net::SocketAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpStream, UdpSocket},
    time::timeout,
};

/// The upstream resolvers.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub servers: Vec<SocketAddr>,
    pub timeout: Duration,
}

impl Upstream {
    /// The host configuration's upstreams, or, when it lists none, the nameservers of its
    /// resolv.conf (read now). Two seconds per attempt.
    pub fn from_host(host: &crate::config::host::HostConfig) -> Result<Self, String> {
        let servers = if host.dns_upstreams.is_empty() {
            let text = std::fs::read_to_string(&host.resolv_conf)
                .map_err(|e| format!("reading {}: {e}", host.resolv_conf.display()))?;
            crate::config::host::resolv_conf_nameservers(&text)
        } else {
            host.dns_upstreams.clone()
        };
        if servers.is_empty() {
            return Err(format!(
                "no DNS upstreams: dns.upstreams is empty and {} names no nameserver",
                host.resolv_conf.display()
            ));
        }
        Ok(Self {
            servers,
            timeout: Duration::from_secs(2),
        })
    }

    /// Send `query` (wire format) and return the first answer (wire format), each over a
    /// socket of its own.
    pub async fn ask(&self, query: &[u8], id: u16) -> Result<Vec<u8>, String> {
        self.ask_with(None, query, id).await
    }

    /// [`Upstream::ask`] over a socket from `pool` when it has one (see [`Sockets`]).
    pub async fn ask_pooled(
        &self,
        pool: &Sockets,
        query: &[u8],
        id: u16,
    ) -> Result<Vec<u8>, String> {
        self.ask_with(Some(pool), query, id).await
    }

    async fn ask_with(
        &self,
        pool: Option<&Sockets>,
        query: &[u8],
        id: u16,
    ) -> Result<Vec<u8>, String> {
        let mut last = String::from("no upstream resolvers configured");
        for server in &self.servers {
            match self.ask_udp(pool, *server, query, id).await {
                Ok(answer) if truncated(&answer) => match self.ask_tcp(*server, query).await {
                    Ok(a) => return Ok(a),
                    Err(e) => last = format!("{server} (tcp): {e}"),
                },
                Ok(answer) => return Ok(answer),
                Err(e) => last = format!("{server}: {e}"),
            }
        }
        Err(last)
    }

    async fn ask_udp(
        &self,
        pool: Option<&Sockets>,
        server: SocketAddr,
        query: &[u8],
        id: u16,
    ) -> Result<Vec<u8>, String> {
        let mut sock = match pool.and_then(|p| p.take(server)) {
            Some(s) => s,
            None => Pooled::open(server).await.map_err(|e| e.to_string())?,
        };
        sock.socket.send(query).await.map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 4096];
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            // A timeout or an error drops the socket: only one that got its answer goes back.
            let n = timeout(
                deadline.saturating_duration_since(tokio::time::Instant::now()),
                sock.socket.recv(&mut buf),
            )
            .await
            .map_err(|_| "timed out".to_owned())?
            .map_err(|e| e.to_string())?;
            // Ignore anything that is not the answer to this query (spoofing, stale packets).
            if n >= 12 && u16::from_be_bytes([buf[0], buf[1]]) == id {
                buf.truncate(n);
                if let Some(pool) = pool {
                    sock.uses += 1;
                    pool.put(server, sock);
                }
                return Ok(buf);
            }
        }
    }

    async fn ask_tcp(&self, server: SocketAddr, query: &[u8]) -> Result<Vec<u8>, String> {
        let work = async {
            let mut s = TcpStream::connect(server)
                .await
                .map_err(|e| e.to_string())?;
            let len = u16::try_from(query.len()).map_err(|_| "query too large".to_owned())?;
            s.write_all(&len.to_be_bytes())
                .await
                .map_err(|e| e.to_string())?;
            s.write_all(query).await.map_err(|e| e.to_string())?;
            let mut lenb = [0u8; 2];
            s.read_exact(&mut lenb).await.map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; usize::from(u16::from_be_bytes(lenb))];
            s.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
            Ok(buf)
        };
        timeout(self.timeout, work)
            .await
            .map_err(|_| "timed out".to_owned())?
    }
}

/// Connected UDP sockets to the upstreams, kept between questions: opening, connecting and
/// registering a socket for every question is most of what a forwarded question costs
/// (measured: ~50 µs of ~120). Each is used by one question at a time, taken back only after
/// it got its answer (a timed-out one is dropped, so a late answer never meets the next
/// question; each question's id and question section are checked anyway), and retired after
/// [`Sockets::MAX_USES`] questions or [`Sockets::MAX_AGE`], so its source port (the other
/// secret an off-path spoofer must guess, besides the id) keeps changing.
#[derive(Debug, Default)]
pub struct Sockets {
    idle: std::sync::Mutex<std::collections::HashMap<SocketAddr, Vec<Pooled>>>,
}

#[derive(Debug)]
struct Pooled {
    socket: UdpSocket,
    opened: std::time::Instant,
    uses: u32,
}

impl Pooled {
    async fn open(server: SocketAddr) -> std::io::Result<Self> {
        let bind: SocketAddr = if server.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            ([0u16; 8], 0).into()
        };
        let socket = UdpSocket::bind(bind).await?;
        socket.connect(server).await?;
        Ok(Self {
            socket,
            opened: std::time::Instant::now(),
            uses: 0,
        })
    }
}

impl Sockets {
    /// Questions one socket carries before it is closed.
    pub const MAX_USES: u32 = 64;
    /// How long one socket is kept.
    pub const MAX_AGE: Duration = Duration::from_secs(5);
    /// Idle sockets kept per upstream.
    const MAX_IDLE: usize = 32;

    fn take(&self, server: SocketAddr) -> Option<Pooled> {
        let mut idle = self.idle.lock().ok()?;
        let list = idle.get_mut(&server)?;
        while let Some(s) = list.pop() {
            if s.opened.elapsed() >= Self::MAX_AGE {
                continue;
            }
            // Anything waiting on it is stale (an answer that came twice): read it away.
            let mut scratch = [0u8; 512];
            while s.socket.try_recv(&mut scratch).is_ok() {}
            return Some(s);
        }
        None
    }

    fn put(&self, server: SocketAddr, s: Pooled) {
        if s.uses >= Self::MAX_USES || s.opened.elapsed() >= Self::MAX_AGE {
            return;
        }
        if let Ok(mut idle) = self.idle.lock() {
            let list = idle.entry(server).or_default();
            if list.len() < Self::MAX_IDLE {
                list.push(s);
            }
        }
    }
}

/// The TC bit of a wire-format message.
fn truncated(msg: &[u8]) -> bool {
    msg.len() >= 3 && msg[2] & 0x02 != 0
}
