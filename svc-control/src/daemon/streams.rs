//! The API's streams: events, a workspace's log and the audit log, as JSON lines, followed
//! live on request until the caller goes.

use bytes::Bytes;
use http::Response;
use tokio::sync::mpsc;

use super::{
    http::{Body, line, ndjson},
    supervisor::{Failure, Supervisor},
};
use crate::policy::ownership::Principal;

/// `GET /v1/events`: a non-root caller reads only its own sandboxes' and secrets' events (and
/// svcd's own).
pub(super) fn events_stream(
    sup: &Supervisor,
    who: &Principal,
    query: &str,
) -> Result<Response<Body>, Failure> {
    let mut follow = false;
    let mut after: i64 = 0;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("follow", v) => follow = matches!(v, "" | "1" | "true"),
            ("after", v) => {
                after = v
                    .parse()
                    .map_err(|_| Failure::bad(format!("after={v:?}: expected a number")))?;
            }
            (k, _) => return Err(Failure::bad(format!("unknown query parameter {k:?}"))),
        }
    }
    // Subscribe before reading the backlog, so nothing falls between the two.
    let mut live = sup.subscribe();
    let who = who.clone();
    let backlog = sup.events_after(after, 10_000)?;
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(async move {
        let mut last = after;
        for e in backlog {
            last = e.seq;
            if !Supervisor::sees_event(&who, &e) {
                continue;
            }
            if tx.send(line(&e)).await.is_err() {
                return;
            }
        }
        if !follow {
            return;
        }
        loop {
            tokio::select! {
                got = live.recv() => match got {
                    Ok(e) if e.seq > last => {
                        last = e.seq;
                        if !Supervisor::sees_event(&who, &e) {
                            continue;
                        }
                        if tx.send(line(&e)).await.is_err() {
                            return;
                        }
                    }
                    Ok(_) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(_) => return,
                },
                () = tx.closed() => return,
            }
        }
    });
    Ok(ndjson(rx))
}

/// How much of a workspace log file is read and sent at once.
const LOG_PIECE: usize = 16 << 10;

/// `GET /v1/sandboxes/{name}/workspace/log[?follow=1]`: the workspace's log records as JSON
/// lines; with `follow`, new ones as they are written, until the sandbox is destroyed.
pub(super) fn workspace_log_stream(
    sup: &Supervisor,
    name: &str,
    query: &str,
) -> Result<Response<Body>, Failure> {
    let mut follow = false;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=').unwrap_or((pair, "")) {
            ("follow", v) => follow = matches!(v, "" | "1" | "true"),
            (k, _) => return Err(Failure::bad(format!("unknown query parameter {k:?}"))),
        }
    }
    let (past, live) = sup.workspace_log_follow(name, follow)?;
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(async move {
        // The files as they were, in pieces (never the whole log in memory).
        for (file, len) in past {
            let mut file = tokio::io::AsyncReadExt::take(tokio::fs::File::from_std(file), len);
            loop {
                let mut buf = bytes::BytesMut::with_capacity(LOG_PIECE);
                match tokio::io::AsyncReadExt::read_buf(&mut file, &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(buf.freeze()).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
        let Some(mut live) = live else { return };
        loop {
            tokio::select! {
                got = live.recv() => match got {
                    Ok(l) => {
                        if tx.send(l).await.is_err() {
                            return;
                        }
                    }
                    // A follower too slow for the hooks' output misses lines (the log keeps
                    // them all); it is told so.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                        let note = serde_json::json!({"kind": "lagged", "missed": n});
                        if tx.send(line(&note)).await.is_err() {
                            return;
                        }
                    }
                    Err(_) => return,
                },
                () = tx.closed() => return,
            }
        }
    });
    Ok(ndjson(rx))
}

/// `GET /v1/audit?sandbox=&layer=&verdict=&since=&follow=1`: the audit log's records that match,
/// rotated file first, as JSON lines exactly as written; with `follow`, new ones as they come
/// (across a rotation). A non-root caller reads only the records of its own sandboxes (as they
/// are when the read starts, and, when following, those it makes meanwhile), by incarnation:
/// never those of an earlier sandbox of that name or id.
pub(super) fn audit_stream(
    sup: &std::sync::Arc<Supervisor>,
    who: &Principal,
    query: &str,
) -> Result<Response<Body>, Failure> {
    let pairs: Vec<(String, String)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (
                k.to_owned(),
                percent_encoding::percent_decode_str(v)
                    .decode_utf8_lossy()
                    .into_owned(),
            )
        })
        .collect();
    let follow = pairs
        .iter()
        .any(|(k, v)| k == "follow" && matches!(v.as_str(), "" | "1" | "true"));
    let mut filter = crate::audit::query::Filter::parse(&pairs, std::time::SystemTime::now())
        .map_err(Failure::bad)?;
    filter.only = sup.visible_sandboxes(who);
    let path = sup.audit_path();
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    let (sup, who) = (sup.clone(), who.clone());
    let mine: super::audit_read::Mine = Box::new(move || sup.visible_sandboxes(&who));
    tokio::task::spawn_blocking(move || {
        super::audit_read::stream(&path, &filter, follow, &tx, &mine);
    });
    Ok(ndjson(rx))
}
