//! The API's HTTP pieces: response bodies (JSON, JSON lines, failures), request bodies read
//! with a limit, and the JSON lines its streams carry (events, logs, audit records, an exec's
//! frames).

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt as _, Full, Limited, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use tokio::sync::mpsc;

use super::failure::Failure;

/// Largest API request body.
const MAX_BODY: usize = 1024 * 1024;

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

pub(super) fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let body = serde_json::to_vec(value).unwrap_or_default();
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

pub(super) fn failure(f: &Failure) -> Response<Body> {
    json(
        StatusCode::from_u16(f.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        &f.to_api(),
    )
}

pub(super) async fn read_json<T: serde::de::DeserializeOwned>(
    req: Request<Incoming>,
) -> Result<T, Failure> {
    let body = Limited::new(req.into_body(), MAX_BODY)
        .collect()
        .await
        .map_err(|e| Failure {
            status: 413,
            code: "too-large",
            message: format!("request body: {e} (limit {MAX_BODY} bytes)"),
        })?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|e| Failure::bad(format!("request body: {e}")))
}
