//! The TLS-intercepting HTTPS proxy (issue 6): the per-sandbox CA with cached leaves, a bounded
//! ClientHello reader, and the connection/request path (SNI binding, HTTP/1.1 and HTTP/2,
//! per-request policy, credential swap/strip, verified upstream TLS, audit).
//!
//! The path is a pipeline of stages, one file each (see `server`): `accept` → `tls` | `plain`
//! → `exchange` driving `request` → `forward` → `response` | `upgrade`, with `refuse` beside
//! them. Every decision is `policy`'s (`sni`, `binding`, `request`); the stages do the I/O.
//! They share their state through `context`, and never import each other in a circle.

/// Stage: a guest connection's slot, ClientHello and SNI gate.
mod accept;
mod body;
pub mod ca;
pub mod client_hello;
pub mod config;
/// The state the stages take: shared, per connection, per request.
mod context;
pub mod dial;
/// One request through the stages, in order.
mod exchange;
/// Stage: the upstream request (credential swap, dial, pools).
mod forward;
mod git_push;
pub mod guest_trust;
pub mod h1_frames;
pub mod h1_head;
mod h1_pool;
/// The guest's HTTP/1.1 stream as hyper reads it: through the witness, under the head's time.
mod h1_watch;
/// Headers of one hop.
mod headers;
/// The request body past its prefix, scanned for placeholders as it goes upstream.
mod late_leak;
/// Plain HTTP guest connections (the Host binding).
mod plain;
pub mod pools;
/// Writing the proxy's audit records.
mod record;
/// Refusal answers and their audit.
mod refuse;
/// Stage: read the request and ask the policy.
mod request;
pub mod resolve;
/// Stage: the upstream's answer to the guest (scrub, the request's record).
mod response;
/// Live allowlist changes on open connections.
mod revoke;
/// Whom the proxy serves: sandboxes by source address, revocations.
mod sandboxes;
mod scrub;
/// The proxy: its parts, threads and accept loops.
pub mod server;
/// Stage: the TLS path (leaf certificates, the handshake, HTTP/1.1 and HTTP/2).
mod tls;
/// WebSocket relays.
mod upgrade;
pub mod upstream;
/// The upstream pools and connectors.
mod upstreams;

/// The proxy's TLS on both legs: ring, with the TLS 1.3 suite AES-128-GCM/SHA-256 first.
/// The default order leads with AES-256-GCM/SHA-384, whose SHA-384 has no instruction-set
/// support on x86 (SHA-256 has SHA-NI): a handshake's key schedule and transcript hashing then
/// cost several per cent of the proxy's time per new connection. AES-128-GCM is TLS 1.3's
/// mandatory suite; every suite offered stays one rustls considers safe.
pub fn crypto_provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    std::sync::Arc::new(provider)
}

/// The proxy's audit record lives with the others in `audit`.
pub use crate::audit::HttpEvent;
pub use server::{
    Broker, Proxy, ProxyConfig, ProxySandbox, Resolve, Revocation, Sandboxes, SystemResolver,
};
