//! Who calls the API: the peer's uid and groups as `policy::ownership` sees them, and the
//! connections each non-root caller may hold open.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use http::Request;
use hyper::body::Incoming;

use super::failure::Failure;
use crate::policy::ownership::Principal;

/// Who called the API (the peer's uid), for the audit of changes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Caller(pub u32);

/// The caller's groups (primary and supplementary), for secrets shared with a group.
#[derive(Debug, Clone, Default)]
pub(super) struct CallerGroups(pub Vec<u32>);

/// The caller as `policy::ownership` sees it; a call without peer credentials is nobody's.
pub(super) fn principal(req: &Request<Incoming>) -> Result<Principal, Failure> {
    let uid = req
        .extensions()
        .get::<Caller>()
        .map(|c| c.0)
        .ok_or_else(|| Failure::forbidden("cannot tell who called (no peer credentials)"))?;
    let groups = req
        .extensions()
        .get::<CallerGroups>()
        .map(|g| g.0.clone())
        .unwrap_or_default();
    Ok(Principal { uid, groups })
}

/// API connections one non-root caller may hold open at once (each is a descriptor and a task
/// of svcd's: a member holding thousands idle would starve every sandbox's guard and proxy).
pub(super) const API_CONNECTIONS_PER_CALLER: u32 = 64;

/// One of a caller's API connections, given back when dropped.
pub(super) struct CallerSlot {
    callers: Arc<Mutex<HashMap<u32, u32>>>,
    uid: u32,
}

/// The API connections each non-root caller holds open now.
#[derive(Default)]
pub(super) struct Callers(Arc<Mutex<HashMap<u32, u32>>>);

impl Callers {
    /// One more connection for `uid` (root: always), or `None` at its cap.
    pub(super) fn hold(&self, uid: u32) -> Option<Option<CallerSlot>> {
        if uid == 0 {
            return Some(None);
        }
        let mut held = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let n = held.entry(uid).or_insert(0);
        if *n >= API_CONNECTIONS_PER_CALLER {
            return None;
        }
        *n += 1;
        Some(Some(CallerSlot {
            callers: self.0.clone(),
            uid,
        }))
    }
}

impl Drop for CallerSlot {
    fn drop(&mut self) {
        let mut held = self.callers.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = held.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                held.remove(&self.uid);
            }
        }
    }
}
