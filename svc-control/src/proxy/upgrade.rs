//! A WebSocket handshake the upstream agreed to: the 101 to the guest, then both upgraded
//! connections relayed until they close (or a live change removes the host), audited when it
//! opens and again when it closes.

use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};

use super::{
    body::ProxyBody,
    context::{Exchange, HeldSlot},
    forward::UpstreamResponse,
    record::{self, ms},
    response::{Answer, empty},
    revoke::{Ended, host_revoked, until_ended},
};

/// The guest's and the upstream's upgraded connections, to come.
pub(super) struct Upgrading {
    guest: OnUpgrade,
    upstream: OnUpgrade,
}

/// The upgrade both sides agreed to: the guest asked for one and the upstream answered 101.
pub(super) fn agreed(
    guest: Option<OnUpgrade>,
    response: &mut UpstreamResponse,
) -> Option<Upgrading> {
    match guest {
        Some(guest) if response.status() == http::StatusCode::SWITCHING_PROTOCOLS => {
            Some(Upgrading {
                guest,
                upstream: hyper::upgrade::on(response),
            })
        }
        _ => None,
    }
}

/// Audit the handshake, start the relay (it holds the guest connection's slot until it
/// closes) and answer the guest's handshake.
pub(super) fn open(
    ex: &Exchange<'_>,
    answer: Answer,
    upgrading: Upgrading,
    held: Option<HeldSlot>,
) -> http::Response<ProxyBody> {
    let Answer { parts, record, .. } = answer;
    // The handshake is audited now; the relay writes a second record when it closes.
    let mut opened = record.clone();
    opened.upgrade = Some("websocket");
    opened.duration_ms = ms(ex.started);
    ex.ctx.audit_request(ex.sandbox, opened);
    let (audit, id, started) = (ex.ctx.audit.clone(), ex.sandbox.id, ex.started);
    let of = ex.sandbox.incarnation.clone();
    // A live change that removes the host ends the relayed connection too.
    let revoked = host_revoked(
        ex.ctx.sandboxes.revocations(),
        ex.ctx.sandboxes.clone(),
        (id, of.clone()),
        record.host.clone().unwrap_or_default(),
    );
    // So does the sandbox's teardown.
    let ended = held.as_ref().map(|h| -> Ended { Box::pin(h.0.ended()) });
    tokio::spawn(async move {
        // The relayed connection holds its slot until it closes.
        let _held = held;
        let mut closed = record;
        closed.upgrade = Some("websocket-closed");
        if let (Ok(g), Ok(u)) = tokio::join!(upgrading.guest, upgrading.upstream) {
            tokio::select! {
                counted = relay(TokioIo::new(g), TokioIo::new(u)) => {
                    (closed.bytes_up, closed.bytes_down) = counted;
                }
                () = revoked => {
                    closed.upgrade = Some("websocket-cut");
                }
                () = until_ended(ended) => {
                    closed.upgrade = Some("websocket-cut");
                }
            }
        }
        closed.duration_ms = ms(started);
        let _ = record::write(&audit, (id, &of), closed);
    });
    http::Response::from_parts(parts, empty())
}

/// Copy both ways until both directions end (or either fails); the bytes each way, counted
/// even when a side drops its connection without a clean close.
pub(super) async fn relay<G, U>(guest: G, upstream: U) -> (u64, u64)
where
    G: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    use tokio::io::AsyncWriteExt as _;
    async fn pump(mut from: impl AsyncRead + Unpin, mut to: impl AsyncWrite + Unpin) -> u64 {
        let mut buf = vec![0u8; 16 * 1024];
        let mut total = 0u64;
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if to.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    total += n as u64;
                }
            }
        }
        let _ = to.shutdown().await;
        total
    }
    let (gr, gw) = tokio::io::split(guest);
    let (ur, uw) = tokio::io::split(upstream);
    tokio::join!(pump(gr, uw), pump(ur, gw))
}
