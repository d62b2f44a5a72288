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

    /// Send `query` (wire format) and return the first answer (wire format).
    pub async fn ask(&self, query: &[u8], id: u16) -> Result<Vec<u8>, String> {
        let mut last = String::from("no upstream resolvers configured");
        for server in &self.servers {
            match self.ask_udp(*server, query, id).await {
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

    async fn ask_udp(&self, server: SocketAddr, query: &[u8], id: u16) -> Result<Vec<u8>, String> {
        let bind: SocketAddr = if server.is_ipv4() {
            ([0, 0, 0, 0], 0).into()
        } else {
            ([0u16; 8], 0).into()
        };
        let sock = UdpSocket::bind(bind).await.map_err(|e| e.to_string())?;
        sock.connect(server).await.map_err(|e| e.to_string())?;
        sock.send(query).await.map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 4096];
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let n = timeout(
                deadline.saturating_duration_since(tokio::time::Instant::now()),
                sock.recv(&mut buf),
            )
            .await
            .map_err(|_| "timed out".to_owned())?
            .map_err(|e| e.to_string())?;
            // Ignore anything that is not the answer to this query (spoofing, stale packets).
            if n >= 12 && u16::from_be_bytes([buf[0], buf[1]]) == id {
                buf.truncate(n);
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

/// The TC bit of a wire-format message.
fn truncated(msg: &[u8]) -> bool {
    msg.len() >= 3 && msg[2] & 0x02 != 0
}
