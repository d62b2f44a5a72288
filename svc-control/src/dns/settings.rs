//! The guard's settings ([`GuardConfig`]) and how a query arrived ([`Transport`]).

use std::{sync::Arc, time::Duration};

use super::upstream::Upstream;
use crate::limits::GuestLimits;

/// How the query arrived (UDP answers are size-limited and may be truncated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// Settings of the guard.
#[derive(Debug, Clone)]
pub struct GuardConfig {
    pub upstream: Upstream,
    /// TTLs in answers and fence entries are clamped to this range.
    pub ttl_min: Duration,
    pub ttl_max: Duration,
    /// Queries per second per sandbox (token bucket), and the bucket's size.
    pub rate_per_second: u32,
    pub burst: u32,
    /// Longest CNAME chain followed.
    pub max_cname_hops: usize,
    /// Per-sandbox caps: DNS-over-TCP connections held at once (`[limits]`).
    pub limits: Arc<GuestLimits>,
}

impl GuardConfig {
    /// The documented defaults: TTLs clamped to 30 s – 1 h, 200 queries a second per sandbox
    /// with a burst of 400, CNAME chains of up to 8 hops.
    pub fn with_upstream(upstream: Upstream) -> Self {
        Self {
            upstream,
            ttl_min: Duration::from_secs(30),
            ttl_max: Duration::from_secs(3600),
            rate_per_second: 200,
            burst: 400,
            max_cname_hops: 8,
            limits: Arc::default(),
        }
    }
}
