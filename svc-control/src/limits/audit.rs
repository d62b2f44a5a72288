//! A sandbox's share of the audit log: records a second, on average, with bursts
//! (`[limits] audit_records_per_sec`, `audit_burst`). One guest asking many DNS questions or
//! making many requests would otherwise fill the log and rotate every other sandbox's records
//! out of it. Past its budget a sandbox's records are counted by layer, not written; svcd
//! writes one `suppressed` record per sandbox with the counts every few seconds.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Mutex, PoisonError},
    time::Instant,
};

use super::Guest;

/// A token bucket per sandbox (per [`Guest`]: a later sandbox given the same id has a bucket of
/// its own), and what each has had suppressed since last asked.
#[derive(Debug)]
pub struct Budget {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<Guest, Bucket>>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    /// Records suppressed by layer since [`Budget::take_suppressed`] last drained them.
    suppressed: BTreeMap<&'static str, u64>,
}

/// What [`Budget::admit`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Write it.
    Write,
    /// Count it; `first`: the first suppressed since the sandbox was last within its budget.
    Suppress { first: bool },
}

impl Budget {
    pub fn new(per_sec: u32, burst: u32) -> Self {
        Self {
            rate: f64::from(per_sec),
            burst: f64::from(burst.max(1)),
            buckets: Mutex::default(),
        }
    }

    /// One record of `layer` for `sandbox` at `now`.
    pub fn admit(&self, sandbox: &Guest, layer: &'static str, now: Instant) -> Admit {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let b = buckets.entry(sandbox.clone()).or_insert_with(|| Bucket {
            tokens: self.burst,
            at: now,
            suppressed: BTreeMap::new(),
        });
        let elapsed = now.saturating_duration_since(b.at).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.rate).min(self.burst);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Admit::Write;
        }
        let first = b.suppressed.is_empty();
        *b.suppressed.entry(layer).or_insert(0) += 1;
        Admit::Suppress { first }
    }

    /// Each sandbox's suppressed counts since the last call (drained), and forget sandboxes
    /// whose buckets are full again (they cost nothing to make anew).
    pub fn take_suppressed(&self, now: Instant) -> Vec<(Guest, BTreeMap<&'static str, u64>)> {
        let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::new();
        let (rate, burst) = (self.rate, self.burst);
        buckets.retain(|sandbox, b| {
            if !b.suppressed.is_empty() {
                out.push((sandbox.clone(), std::mem::take(&mut b.suppressed)));
            }
            let refilled = b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * rate;
            refilled < burst
        });
        out.sort_by(|(a, _), (b, _)| a.cmp(b));
        out
    }
}

/// Two budgets' suppressed counts as one list: by sandbox, each layer's counts added.
pub fn merge_suppressed(
    a: Vec<(Guest, BTreeMap<&'static str, u64>)>,
    b: Vec<(Guest, BTreeMap<&'static str, u64>)>,
) -> Vec<(Guest, BTreeMap<&'static str, u64>)> {
    let mut merged = BTreeMap::<Guest, BTreeMap<&'static str, u64>>::new();
    for (sandbox, counts) in a.into_iter().chain(b) {
        let into = merged.entry(sandbox).or_default();
        for (layer, n) in counts {
            *into.entry(layer).or_insert(0) += n;
        }
    }
    merged.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Sandbox `id` in a creation of its own.
    fn g(id: u32) -> Guest {
        Guest::new(id, format!("{id:016x}"))
    }

    #[test]
    fn a_burst_then_the_rate_then_counts_by_layer() {
        let b = Budget::new(10, 5);
        let t0 = Instant::now();
        let burst: Vec<_> = (0..5).map(|_| b.admit(&g(1), "dns", t0)).collect();
        assert!(burst.iter().all(|a| *a == Admit::Write), "{burst:?}");
        assert_eq!(b.admit(&g(1), "dns", t0), Admit::Suppress { first: true });
        assert_eq!(b.admit(&g(1), "http", t0), Admit::Suppress { first: false });
        // Another sandbox has its own bucket.
        assert_eq!(b.admit(&g(2), "dns", t0), Admit::Write);
        // A tenth of a second later: one more record's worth.
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(b.admit(&g(1), "dns", t1), Admit::Write);
        assert_eq!(b.admit(&g(1), "dns", t1), Admit::Suppress { first: false });
        let taken = b.take_suppressed(t1);
        assert_eq!(
            taken,
            [(g(1), BTreeMap::from([("dns", 2), ("http", 1)]))],
            "drained, by layer"
        );
        assert_eq!(b.take_suppressed(t1), []);
        assert_eq!(b.admit(&g(1), "dns", t1), Admit::Suppress { first: true });
    }

    #[test]
    fn two_budgets_counts_merge_by_sandbox_and_layer() {
        let a = vec![
            (g(1), BTreeMap::from([("http", 2)])),
            (g(3), BTreeMap::from([("dns", 1)])),
        ];
        let b = vec![(g(1), BTreeMap::from([("http", 1), ("dns", 4)]))];
        assert_eq!(
            merge_suppressed(a, b),
            [
                (g(1), BTreeMap::from([("dns", 4), ("http", 3)])),
                (g(3), BTreeMap::from([("dns", 1)]))
            ]
        );
    }

    #[test]
    fn full_buckets_are_forgotten_and_the_burst_is_the_cap() {
        let b = Budget::new(10, 5);
        let t0 = Instant::now();
        b.admit(&g(1), "dns", t0);
        b.admit(&g(2), "dns", t0);
        // An hour idle refills to the burst, not beyond.
        let later = t0 + Duration::from_secs(3600);
        let _ = b.take_suppressed(later);
        assert!(b.buckets.lock().unwrap().is_empty());
        let writes = (0..10)
            .filter(|_| b.admit(&g(1), "dns", later) == Admit::Write)
            .count();
        assert_eq!(writes, 5);
    }

    #[test]
    fn a_later_sandbox_given_the_same_id_has_a_bucket_of_its_own() {
        let b = Budget::new(10, 2);
        let t0 = Instant::now();
        let (earlier, later) = (
            Guest::new(4, "a1a1a1a1a1a1a1a1"),
            Guest::new(4, "b2b2b2b2b2b2b2b2"),
        );
        for _ in 0..2 {
            assert_eq!(b.admit(&earlier, "http", t0), Admit::Write);
        }
        assert_eq!(
            b.admit(&earlier, "http", t0),
            Admit::Suppress { first: true }
        );
        // The earlier one spent its burst; the later one, same id, has its whole burst.
        assert_eq!(b.admit(&later, "http", t0), Admit::Write);
        assert_eq!(b.admit(&later, "http", t0), Admit::Write);
        assert_eq!(b.admit(&later, "http", t0), Admit::Suppress { first: true });
        // And the counts are told apart.
        assert_eq!(
            b.admit(&earlier, "dns", t0),
            Admit::Suppress { first: false }
        );
        assert_eq!(
            b.take_suppressed(t0),
            [
                (earlier, BTreeMap::from([("dns", 1), ("http", 1)])),
                (later, BTreeMap::from([("http", 1)]))
            ]
        );
    }
}
