//! The TLS-intercepting HTTPS proxy (issue 6). Built so far: the per-sandbox CA with cached
//! leaf certificates, and a bounded ClientHello reader (SNI, ECH). The listener, the HTTP/1.1
//! and HTTP/2 paths, the upstream side and the audit records follow.

pub mod ca;
pub mod client_hello;
