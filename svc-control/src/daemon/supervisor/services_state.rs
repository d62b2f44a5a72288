//! Where a workspace's services stand, as svcd last heard from their supervisor (kept in the
//! workspace's run; read and changed by `workspace_services`).

use std::{collections::BTreeMap, time::Instant};

use tokio::sync::watch;

use super::task::TaskGuard;

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct ServiceState {
    /// Up for the settle time (`running`) or healthy (with a check).
    pub(super) up: bool,
}

/// Where the services stand.
#[derive(Debug, Default)]
pub(super) struct ServicesState {
    pub(super) states: BTreeMap<String, ServiceState>,
    /// Waiting to announce ready (a start's hooks are done), since when.
    pub(super) pending: Option<Instant>,
    /// The supervisor's reader: its task, the way to stop it, and whether it ended.
    pub(super) task: Option<(TaskGuard, watch::Sender<bool>, watch::Receiver<bool>)>,
}

impl ServicesState {
    /// Forget the supervisor (its task ends).
    pub(super) fn end(&mut self) {
        self.task = None;
    }

    pub(super) fn alive(&self) -> bool {
        self.task
            .as_ref()
            .is_some_and(|(_, _, done)| !*done.borrow())
    }
}
