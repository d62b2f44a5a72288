//! Whose a slot or a budget is ([`Guest`]: a sandbox id and which creation of it), and the end
//! of one: [`Ending`], what teardown fires and then waits on until every slot of that guest is
//! given back.
//!
//! Sandbox ids are reused at once after a destroy. Keyed by the id alone, a destroyed
//! sandbox's connections still open would count against the next sandbox given its id (its
//! connection caps, its audit budget); keyed by [`Guest`], a task that outlives its sandbox
//! counts against that sandbox only.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use tokio::sync::watch;

use super::Channel;

/// One creation of a sandbox: its id and its incarnation's key (16 hex digits; empty when the
/// caller cannot tell it, e.g. a record of an earlier svcd version).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Guest {
    pub id: u32,
    pub key: Arc<str>,
}

impl Guest {
    /// Sandbox `id` in its creation `key`.
    pub fn new(id: u32, key: impl Into<Arc<str>>) -> Self {
        Self {
            id,
            key: key.into(),
        }
    }
}

impl std::fmt::Display for Guest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}", self.id)
        } else {
            write!(f, "{} ({})", self.id, self.key)
        }
    }
}

/// What one guest holds: a count per channel, and the signal its slots watch for its end.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) counts: HashMap<Channel, u32>,
    pub(super) end: Arc<watch::Sender<bool>>,
}

impl Held {
    /// Nothing held yet; `ended`: its guest was torn down already (a slot taken now is cut at
    /// once).
    pub(super) fn new(ended: bool) -> Self {
        Self {
            counts: HashMap::new(),
            end: Arc::new(watch::channel(ended).0),
        }
    }
}

/// Guests torn down lately, so that a slot one of their tasks takes after its guest's held
/// counts were dropped is cut at once too (the most recent [`Self::KEEP`]).
#[derive(Debug, Default)]
pub(super) struct Ended {
    order: VecDeque<Guest>,
    set: HashSet<Guest>,
}

impl Ended {
    const KEEP: usize = 1024;

    pub(super) fn insert(&mut self, guest: Guest) {
        if guest.key.is_empty() || !self.set.insert(guest.clone()) {
            return;
        }
        self.order.push_back(guest);
        if self.order.len() > Self::KEEP
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
    }

    pub(super) fn contains(&self, guest: &Guest) -> bool {
        !guest.key.is_empty() && self.set.contains(guest)
    }
}

/// A guest's end, fired: [`Self::drained`] waits until every slot it held is given back.
#[derive(Debug)]
pub struct Ending {
    pub(super) guest: Guest,
    /// `None`: it held nothing when it ended.
    pub(super) end: Option<Arc<watch::Sender<bool>>>,
    pub(super) limits: std::sync::Weak<super::GuestLimits>,
    /// What it held when it ended, by channel key: what teardown cut.
    pub cut: Vec<(&'static str, u32)>,
}

impl Ending {
    /// Wait until every task that held a slot of the guest has let it go, for at most
    /// `within`. `Err`: what it still holds, by channel key, when the time ran out.
    pub async fn drained(self, within: Duration) -> Result<(), Vec<(&'static str, u32)>> {
        let Some(end) = self.end else {
            return Ok(());
        };
        if tokio::time::timeout(within, end.closed()).await.is_ok() {
            return Ok(());
        }
        let Some(limits) = self.limits.upgrade() else {
            return Ok(());
        };
        let left = by_key(limits.holding(&self.guest));
        if left.is_empty() { Ok(()) } else { Err(left) }
    }
}

/// Counts by channel as (key, count), in the keys' order.
pub(super) fn by_key(held: Vec<(Channel, u32)>) -> Vec<(&'static str, u32)> {
    let mut out: Vec<_> = held.into_iter().map(|(c, n)| (c.key(), n)).collect();
    out.sort_unstable();
    out
}

/// Until `end` says its guest was torn down (never, if it is dropped unsaid).
pub(super) async fn until_ended(mut end: watch::Receiver<bool>) {
    if end.wait_for(|ended| *ended).await.is_err() {
        std::future::pending::<()>().await;
    }
}
