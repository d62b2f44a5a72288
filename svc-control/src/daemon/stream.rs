//! The API's response bodies, and the JSON lines its streams carry (events, logs, audit
//! records, an exec's frames).

use std::convert::Infallible;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use tokio::sync::mpsc;

/// Every API response's body.
pub(super) type Body = BoxBody<Bytes, Infallible>;

/// A body of what `rx` yields, until its senders are gone. Dropped when the caller goes (the
/// senders see their channel closed).
pub(super) fn stream_body(rx: mpsc::Receiver<Bytes>) -> Body {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    StreamBody::new(stream).boxed()
}

/// A 200 whose body is the JSON lines `rx` yields.
pub(super) fn ndjson(rx: mpsc::Receiver<Bytes>) -> Response<Body> {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/x-ndjson")
        .body(stream_body(rx))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

/// `v` as one JSON line.
pub(super) fn line<T: serde::Serialize>(v: &T) -> Bytes {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    Bytes::from(b)
}
