//! The request body past its prefix, examined as it goes upstream
//! (`policy::body_scan`): a placeholder in it or in its trailers ends the stream with an error,
//! so the upstream request is aborted (its connection reset, never completed), and the leak is
//! kept in a [`Seen`] for the forwarding stage to answer and audit.

use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt as _;

use super::{body::BoxError, request::Rest};
use crate::policy::{
    body_scan::{BodyScanner, LateLeak},
    credentials::PlaceholderTable,
};

/// Where the scan of one request's body tells what it found.
#[derive(Debug, Clone, Default)]
pub(super) struct Seen(Arc<Mutex<Option<LateLeak>>>);

impl Seen {
    /// The leak found, if any.
    pub(super) fn leak(&self) -> Option<LateLeak> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn found(&self, leak: LateLeak) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(leak);
    }
}

/// `rest`, examined for `table`'s placeholders as it streams (carrying on from `prefix`).
pub(super) fn scanned(rest: Rest, table: &PlaceholderTable, prefix: &[u8], seen: &Seen) -> Rest {
    let mut scanner = BodyScanner::after_prefix(table.clone(), prefix);
    if scanner.is_idle() {
        return rest;
    }
    let seen = seen.clone();
    let mut stopped = false;
    Box::pin(rest.scan((), move |(), item| {
        futures::future::ready(examine(&mut scanner, &seen, &mut stopped, item))
    }))
}

/// One frame of the body: passed on, or (a placeholder in it) the error that ends the stream;
/// `None` past that error.
fn examine(
    scanner: &mut BodyScanner,
    seen: &Seen,
    stopped: &mut bool,
    item: Result<hyper::body::Frame<bytes::Bytes>, BoxError>,
) -> Option<Result<hyper::body::Frame<bytes::Bytes>, BoxError>> {
    if *stopped {
        return None;
    }
    let frame = match item {
        Ok(frame) => frame,
        Err(e) => return Some(Err(e)),
    };
    let verdict = match (frame.data_ref(), frame.trailers_ref()) {
        (Some(data), _) => scanner.data(data),
        (None, Some(trailers)) => {
            scanner.trailers(trailers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())))
        }
        (None, None) => Ok(()),
    };
    match verdict {
        Ok(()) => Some(Ok(frame)),
        Err(leak) => {
            *stopped = true;
            seen.found(leak.clone());
            Some(Err(Box::new(leak) as BoxError))
        }
    }
}
