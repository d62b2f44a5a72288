//! Stage `accept`: a guest connection. Find its sandbox by source address, take one of the
//! sandbox's connection slots, read the ClientHello (bounded, `hello_timeout`), and pass it
//! through the SNI gate (`policy::sni`: no ECH, a server name the sandbox may reach, bound to
//! the address dialled) to the TLS path (`tls`), or hand a plain HTTP request to `plain`.

use std::{net::SocketAddr, sync::Arc};

use tokio::{io::AsyncReadExt as _, net::TcpStream};

use super::{
    client_hello::{self, HelloError, HelloInfo},
    context::{Conn, Ctx, HeldSlot},
    plain,
    revoke::Cut,
    tls,
};
use crate::{
    limits::Channel,
    policy::{
        binding::Dialled,
        sni::{self, Hello},
    },
};

/// Admit one guest connection from `peer`, at once and in the accept loop: one from no
/// sandbox, or over its sandbox's `limits.proxy_connections`, is closed right here (the
/// latter audited), so a flood of connections never has more than the cap's worth of them
/// waiting in tasks. An admitted one is served to its end by the future returned.
pub(super) fn admit(
    ctx: Arc<Ctx>,
    tcp: TcpStream,
    peer: SocketAddr,
) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
    let source = peer.ip().to_canonical();
    let sandbox = ctx.sandboxes.sandbox_for(source)?;
    // Subscribed before anything is decided: a change after this is not missed.
    let mut cut = Cut {
        revocations: ctx.sandboxes.revocations(),
        host_revocations: ctx.sandboxes.revocations(),
        ended: None,
        fd: std::os::fd::AsFd::as_fd(&tcp).try_clone_to_owned().ok(),
    };
    // Counted against this creation of the sandbox only, and ended with it.
    let slot = match ctx.config.limits.acquire(&sandbox.guest(), Channel::Proxy) {
        Ok(slot) => HeldSlot(Arc::new(slot)),
        Err(hit) => {
            ctx.audit_conn(&sandbox, hit.to_string());
            return None;
        }
    };
    cut.ended = Some(Box::pin(slot.0.ended()));
    let conn = Conn {
        ctx,
        sandbox,
        source,
        cut,
        slot,
    };
    Some(connection(conn, tcp))
}

/// Serve one admitted guest connection to its end. Refusals are audited, and the connection
/// closed.
async fn connection(conn: Conn, mut tcp: TcpStream) {
    let mut buf = Vec::with_capacity(2048);
    let hello = tokio::time::timeout(
        conn.ctx.config.hello_timeout,
        read_hello(&mut tcp, &mut buf),
    )
    .await;
    let refuse = |why: String| conn.ctx.audit_conn(&conn.sandbox, why);
    let hello = match hello {
        Ok(Ok(Some(h))) => h,
        Ok(Ok(None)) => return plain::serve(conn, tcp, buf).await,
        Ok(Err(e)) => return refuse(format!("ClientHello refused: {e}")),
        Err(_) => return refuse("no ClientHello in time".into()),
    };
    let (name, dialled_to) = match gate(&conn, &tcp, &hello) {
        Ok(admitted) => admitted,
        Err(refusal) => return refuse(refusal.to_string()),
    };
    tls::serve(conn, tcp, buf, name, dialled_to).await;
}

/// Read until a whole ClientHello is in `buf`: `None` if the connection opens with a plain
/// HTTP request instead (a redirected port 80).
async fn read_hello(
    tcp: &mut TcpStream,
    buf: &mut Vec<u8>,
) -> Result<Option<HelloInfo>, HelloError> {
    loop {
        let mut chunk = [0u8; 4096];
        let n = tcp
            .read(&mut chunk)
            .await
            .map_err(|_| HelloError::Incomplete)?;
        if n == 0 {
            return Err(HelloError::Incomplete);
        }
        buf.extend_from_slice(&chunk[..n]);
        // Not a TLS handshake record: a plain HTTP request (redirected port 80).
        if buf.first().is_some_and(u8::is_ascii_uppercase) {
            return Ok(None);
        }
        match client_hello::parse(buf) {
            Err(HelloError::Incomplete) => {}
            other => return other.map(Some),
        }
    }
}

/// The SNI gate: the name to serve and where the guest dialled, or why not. The name must be
/// one the dialled address was resolved for (SNI/address binding): a connection to one allowed
/// host's address cannot present another allowed name.
fn gate(
    conn: &Conn,
    tcp: &TcpStream,
    hello: &HelloInfo,
) -> Result<(String, Option<SocketAddr>), sni::Refusal> {
    let dialled_to = conn.ctx.sandboxes.original_destination(tcp);
    let facts = Hello {
        server_name: hello.server_name.as_deref(),
        ech: hello.ech,
        port: dialled_to.map(|a| a.port()),
    };
    let name = sni::admit(&conn.sandbox.policy.allowed, facts)?;
    let dialled = Dialled::observe(dialled_to.map(|a| a.ip().to_canonical()), |a| {
        conn.ctx
            .sandboxes
            .dialled_matches(conn.sandbox.id, a, &name)
    });
    sni::bind(&name, dialled)?;
    Ok((name, dialled_to))
}
