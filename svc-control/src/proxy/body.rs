//! The body every proxied request and answer is carried in.

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub(crate) type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// A request body after its prefix, as a stream of frames.
pub(crate) type Rest = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<hyper::body::Frame<Bytes>, BoxError>> + Send>,
>;
