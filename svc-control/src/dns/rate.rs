//! Each sandbox's query rate: a token bucket per sandbox, and which of its refusals are worth
//! an audit record.

use std::{collections::HashMap, sync::Mutex, time::Instant};

struct Bucket {
    tokens: f64,
    last: Instant,
    limited_since_report: u64,
}

/// The sandboxes' token buckets.
#[derive(Default)]
pub(super) struct Buckets(Mutex<HashMap<u32, Bucket>>);

impl Buckets {
    /// Take one token of `sandbox`'s bucket (refilled at `rate_per_second`, holding at most
    /// `burst`); `false` when it is empty.
    pub fn take_token(&self, sandbox: u32, rate_per_second: u32, burst: u32) -> bool {
        let Ok(mut buckets) = self.0.lock() else {
            return false;
        };
        let now = Instant::now();
        let b = buckets.entry(sandbox).or_insert(Bucket {
            tokens: f64::from(burst),
            last: now,
            limited_since_report: 0,
        });
        let refill = now.duration_since(b.last).as_secs_f64() * f64::from(rate_per_second);
        b.tokens = (b.tokens + refill).min(f64::from(burst));
        b.last = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            b.limited_since_report += 1;
            false
        }
    }

    /// Report the first refusal of a burst and then one in a hundred, so a flood cannot flood
    /// the audit log either.
    pub fn should_report_limit(&self, sandbox: u32) -> bool {
        self.0
            .lock()
            .ok()
            .and_then(|b| b.get(&sandbox).map(|b| b.limited_since_report % 100 == 1))
            .unwrap_or(true)
    }
}
