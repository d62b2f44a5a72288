//! Plain HTTP (the fence redirects TCP 80 to allowed addresses here too): HTTP/1.1 only, each
//! request's `Host` bound to the address the guest dialled as the TLS path binds the server
//! name (`policy::binding`), then the same per-request stages with the `http` scheme (which
//! refuses any placeholder as a leak) and a plain HTTP upstream.

use std::{
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Instant,
};

use http::{Method, Request, Response, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;

use super::{
    body::ProxyBody,
    context::{Conn, Ctx, Exchange},
    exchange::exchange,
    h1_frames::{Tracker, Verdict},
    h1_watch::Watched,
    request::Carried,
    revoke::whose,
    sandboxes::ProxySandbox,
    tls::{Rewind, hands_over, hyper_buffer},
};
use crate::{
    hosts::Authority,
    policy::{
        binding::{self, Dialled, Mismatch},
        credentials::Scheme,
    },
};

/// Serve a plain-HTTP guest connection whose first bytes (`head`) were read already.
pub(super) async fn serve(conn: Conn, tcp: TcpStream, head: Vec<u8>) {
    let Conn {
        ctx,
        sandbox,
        source,
        cut,
        slot,
    } = conn;
    let found = sandbox.clone();
    let dialled_to = ctx.sandboxes.original_destination(&tcp);
    // The host of the request this connection serves now (Host varies per request).
    let serving: Arc<Mutex<Option<String>>> = Arc::default();
    let serving_now = serving.clone();
    let (tracker, witness) = Tracker::new(ctx.config.max_head);
    let stream = Watched::new(
        Rewind::new(head, tcp),
        Some(tracker),
        ctx.config.header_timeout,
    );
    let served = ctx.clone();
    let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(slot.clone());
        let sandbox = served.current(source, &sandbox);
        let ctx = served.clone();
        let framing = witness.next();
        if let Ok(mut s) = serving_now.lock() {
            *s = host_header(&req)
                .and_then(|h| Authority::parse(h, 80).ok())
                .map(|a| a.host_str());
        }
        let witness = witness.clone();
        async move {
            let upgrade = matches!(framing, Some(Verdict::Framed { upgrade: true, .. }));
            let connect = req.method() == Method::CONNECT;
            let answer = request(&ctx, &sandbox, dialled_to, req, framing).await;
            if upgrade {
                witness.answered(hands_over(connect, &answer));
            }
            Ok::<_, Infallible>(answer)
        }
    });
    let serve = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(ctx.config.header_timeout)
        .max_buf_size(hyper_buffer(ctx.config.max_head))
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    let serving_at_cut = serving.clone();
    let dialled = dialled_to.map(|a| a.ip().to_canonical());
    let serve = async {
        let _ = serve.await;
    };
    let was_cut = cut
        .serve(
            serve,
            ctx.sandboxes.clone(),
            whose(&found),
            dialled,
            move || serving.lock().ok()?.clone(),
        )
        .await;
    if let Some(why) = was_cut {
        let host = serving_at_cut.lock().ok().and_then(|s| s.clone());
        ctx.audit_cut(&found, "HTTP", host, why);
    }
}

/// One plain HTTP request: its Host must be a name the DNS guard answered the dialled
/// address with, as a TLS server name must.
async fn request(
    ctx: &Ctx,
    sandbox: &ProxySandbox,
    dialled_to: Option<SocketAddr>,
    req: Request<Incoming>,
    framing: Option<Verdict>,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let dialled = dialled_to.map(|a| a.ip().to_canonical());
    // A refused head's stand-in has no Host to bind: its refusal is `request`'s.
    let stand_in = matches!(framing, Some(Verdict::Refused { .. }));
    if let Err(mismatch) = bound(ctx, sandbox, host_header(&req), dialled)
        && !stand_in
    {
        let ex = Exchange {
            ctx,
            sandbox,
            method: req.method().clone(),
            started,
        };
        // Recorded with its path, as the policy would read it.
        let path = crate::policy::target::canonicalize(&req.uri().to_string())
            .ok()
            .map(|t| t.path());
        return *ex.refuse(
            Some(mismatch.name.clone()),
            path,
            Mismatch::STATUS,
            Mismatch::RULE,
            &mismatch.host_reason(),
        );
    }
    let carried = Carried {
        scheme: Scheme::Http,
        sni: None,
        framing: framing.as_ref(),
        dialled_port: dialled_to.map(|a| a.port()),
    };
    exchange(ctx, sandbox, carried, dialled_to, req).await
}

/// The request's `Host`, if it is readable text.
fn host_header(req: &Request<Incoming>) -> Option<&str> {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
}

/// The binding of a request's `Host` to the dialled address (a missing or bad Host, or a name
/// off the list, is the policy's to refuse in `exchange`). The guard is asked only about a
/// name the binding applies to.
fn bound(
    ctx: &Ctx,
    sandbox: &ProxySandbox,
    host: Option<&str>,
    dialled: Option<IpAddr>,
) -> Result<(), Mismatch> {
    let Some(name) = binding::host_to_bind(&sandbox.policy.allowed, host) else {
        return Ok(());
    };
    let dialled = Dialled::observe(dialled, |a| {
        ctx.sandboxes.dialled_matches(sandbox.id, a, &name)
    });
    binding::plain_host(&name, dialled)
}
