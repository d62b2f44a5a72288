//! One request through the stages, in order: `request` (read it, ask the policy) → `forward`
//! (rebuild it, swap the credential, send it upstream) → `response` (scrub the answer, count it
//! into the record) or, for an agreed WebSocket handshake, `upgrade` (relay). Each stage answers
//! its own refusals; this driver only hands on what one stage gives the next.

use std::{net::SocketAddr, time::Instant};

use http::{Request, Response};
use hyper::body::Incoming;

use super::{
    body::ProxyBody,
    context::{Ctx, Exchange, HeldSlot},
    forward::{self, Route},
    record::Unanswered,
    refuse::Refused,
    request::{self, Carried},
    response,
    sandboxes::ProxySandbox,
    upgrade,
};

/// Answer one guest request for `sandbox`, carried as `carried` on a connection the guest
/// dialled to `dialled_to`.
pub(super) async fn exchange(
    ctx: &Ctx,
    sandbox: &ProxySandbox,
    carried: Carried<'_>,
    dialled_to: Option<SocketAddr>,
    mut req: Request<Incoming>,
) -> Response<ProxyBody> {
    let ex = Exchange {
        ctx,
        sandbox,
        method: req.method().clone(),
        started: Instant::now(),
    };
    // Its connection's slot: a WebSocket relay takes it along; nothing else does.
    let held = req.extensions_mut().remove::<HeldSlot>();
    match stages(&ex, carried, dialled_to, req, held).await {
        Ok(answer) => answer,
        Err(refused) => *refused,
    }
}

/// The stages in order; `Err` is a refusal a stage answered.
async fn stages(
    ex: &Exchange<'_>,
    carried: Carried<'_>,
    dialled_to: Option<SocketAddr>,
    req: Request<Incoming>,
    held: Option<HeldSlot>,
) -> Result<Response<ProxyBody>, Refused> {
    let allowed = request::admit(ex, carried, req).await?;
    let dialled = dialled_to.map(|a| a.to_string());
    let unanswered = Unanswered::arm(ex, &allowed.decision, dialled);
    // Held until the answer's head is back (`limits.proxy_requests`).
    let _reading = allowed.reading;
    let route = Route {
        scheme: carried.scheme,
        dialled_to,
        decision: &allowed.decision,
        websocket: allowed.guest_upgrade.is_some(),
    };
    let sent = forward::forward(ex, allowed.outgoing, route).await;
    unanswered.disarm();
    let mut sent = sent?;
    let upgrading = upgrade::agreed(allowed.guest_upgrade, &mut sent.response);
    let answer = response::head(ex, sent, allowed.decision, upgrading.is_some())?;
    Ok(match upgrading {
        Some(upgrading) => upgrade::open(ex, answer, upgrading, held),
        None => response::stream(ex, answer),
    })
}
