//! The TLS-intercepting HTTPS proxy (issue 6): the per-sandbox CA with cached leaves, a bounded
//! ClientHello reader, and the connection/request path (SNI binding, HTTP/1.1 and HTTP/2,
//! per-request policy, credential swap/strip, verified upstream TLS, audit).

pub mod ca;
pub mod client_hello;
pub mod guest_trust;
pub mod h1_frames;
pub mod server;
pub mod upstream;

/// The proxy's audit record lives with the others in `audit`.
pub use crate::audit::HttpEvent;
pub use server::{
    Broker, Proxy, ProxyConfig, ProxySandbox, Resolve, Revocation, Sandboxes, SystemResolver,
};
