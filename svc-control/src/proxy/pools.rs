//! Several upstream pools per proxy thread for HTTP/2 guests' requests, and which one a
//! request takes (HTTP/1.1 guests' requests go over kept-alive HTTP/1.1 connections instead).
//!
//! An HTTP/2 upstream carries every request to a host over one connection per pool, and its
//! connection task writes whatever streams are waiting in one go: a burst of guest streams
//! goes upstream as one batch and comes back as one, and client, proxy and upstream take turns
//! instead of overlapping. So a host's requests go to the first pool with fewer than
//! [`SPILL_AT`] of them in flight: traffic one request at a time keeps one upstream
//! connection (one handshake to a distant host), a burst spreads over at most [`POOLS`]
//! HTTP/2 connections (a cap, where a pool per request would open a connection per stream).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

/// Upstream pools per proxy thread (so at most this many HTTP/2 connections per host each).
pub const POOLS: usize = 4;

/// Requests to one host in flight on a pool before the next one spills to the next pool.
pub const SPILL_AT: u32 = 4;

type InFlight = Arc<Mutex<HashMap<String, [u32; POOLS]>>>;

/// [`POOLS`] clients and each one's requests in flight, per upstream authority.
#[derive(Clone)]
pub struct Pools<C> {
    clients: Arc<[C]>,
    in_flight: InFlight,
}

impl<C: Clone> Pools<C> {
    /// The pools, from a maker of one client (called [`POOLS`] times).
    pub fn new(mut make: impl FnMut() -> C) -> Self {
        Self {
            clients: (0..POOLS).map(|_| make()).collect(),
            in_flight: Arc::default(),
        }
    }

    /// Whether no request is in flight on any pool.
    pub fn idle(&self) -> bool {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
    }

    /// The client for one more request to `authority`, counted in flight until the slot drops.
    pub fn take(&self, authority: &str) -> (C, Slot) {
        let mut counts = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // The host's key is allocated once per request (for its slot), and once more only when
        // the host is not counted yet.
        let authority = authority.to_owned();
        let mut now = counts.get(&authority).copied().unwrap_or([0; POOLS]);
        let pool = pick(&now);
        now[pool] += 1;
        match counts.get_mut(&authority) {
            Some(entry) => *entry = now,
            None => {
                counts.insert(authority.clone(), now);
            }
        }
        (
            self.clients[pool].clone(),
            Slot {
                in_flight: self.in_flight.clone(),
                authority,
                pool,
            },
        )
    }
}

/// The first pool with fewer than [`SPILL_AT`] requests in flight; when every pool has that
/// many, the least busy (the first of equals).
pub fn pick(in_flight: &[u32; POOLS]) -> usize {
    in_flight
        .iter()
        .position(|&n| n < SPILL_AT)
        .unwrap_or_else(|| (0..POOLS).min_by_key(|&i| (in_flight[i], i)).unwrap_or(0))
}

/// One request in flight on a pool; dropping it counts it out (and forgets a host with none).
pub struct Slot {
    in_flight: InFlight,
    authority: String,
    pool: usize,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = counts.get_mut(&self.authority) {
            entry[self.pool] = entry[self.pool].saturating_sub(1);
            if entry.iter().all(|&n| n == 0) {
                counts.remove(&self.authority);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_for_the_next_request() {
        let cases: &[(&str, [u32; POOLS], usize)] = &[
            ("nothing in flight: the first pool", [0, 0, 0, 0], 0),
            ("one at a time stays on the first pool", [1, 0, 0, 0], 0),
            ("under the spill mark: still the first", [3, 0, 0, 0], 0),
            ("the first pool full: the second", [4, 0, 0, 0], 1),
            (
                "a drained earlier pool is used again first",
                [2, 4, 4, 0],
                0,
            ),
            ("the first two full: the third", [4, 4, 1, 0], 2),
            ("all full: the least busy", [6, 4, 5, 7], 1),
            ("all full and equal: the first", [5, 5, 5, 5], 0),
        ];
        for (name, in_flight, want) in cases {
            assert_eq!(pick(in_flight), *want, "{name}: {in_flight:?}");
        }
    }

    #[test]
    fn a_burst_spreads_one_at_a_time_does_not_and_every_slot_is_counted_out() {
        let made = std::cell::Cell::new(0);
        let pools = Pools::new(|| {
            made.set(made.get() + 1);
            made.get() - 1
        });
        // One request at a time: always the first pool.
        for _ in 0..10 {
            let (client, _slot) = pools.take("api.example.test:443");
            assert_eq!(client, 0);
        }
        // Sixteen at once: four on each pool.
        let burst: Vec<_> = (0..16)
            .map(|_| pools.take("api.example.test:443"))
            .collect();
        let mut per_pool = [0; POOLS];
        for (client, _) in &burst {
            per_pool[*client] += 1;
        }
        assert_eq!(per_pool, [4, 4, 4, 4]);
        // Another host's count is its own.
        assert_eq!(pools.take("other.example.test:443").0, 0);
        drop(burst);
        assert!(
            pools.in_flight.lock().unwrap().is_empty(),
            "every slot dropped: no host left counted"
        );
    }
}
