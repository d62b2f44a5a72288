//! The TLS-intercepting HTTPS proxy (issue 6): the per-sandbox CA with cached leaves, a bounded
//! ClientHello reader, and the connection/request path (SNI binding, HTTP/1.1 and HTTP/2,
//! per-request policy, credential swap/strip, verified upstream TLS, audit).

mod body;
pub mod ca;
pub mod client_hello;
pub mod config;
pub mod dial;
mod git_push;
pub mod guest_trust;
pub mod h1_frames;
mod h1_pool;
pub mod pools;
pub mod resolve;
mod scrub;
pub mod server;
pub mod upstream;

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
