//! The body every proxied request and answer is carried in.

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;
