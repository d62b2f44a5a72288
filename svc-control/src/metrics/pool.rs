//! The warm pools' series: sandboxes ready per backend, creations served from a pool, and
//! creations that were not, by reason (docs/pool.md).

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BackendLabels {
    backend: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MissLabels {
    backend: String,
    reason: String,
}

/// The pools' series (registered with the rest by [`super::Metrics::new`]).
#[derive(Debug, Clone, Default)]
pub(super) struct PoolSeries {
    size: Family<BackendLabels, Gauge>,
    hits: Family<BackendLabels, Counter>,
    misses: Family<MissLabels, Counter>,
}

impl PoolSeries {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "pool_size",
            "Sandboxes made ahead and ready in the warm pool, by backend",
            self.size.clone(),
        );
        registry.register(
            "pool_hits",
            "svc sandbox create served from the warm pool, by backend",
            self.hits.clone(),
        );
        registry.register(
            "pool_misses",
            "svc sandbox create made cold while a pool is on, by backend and reason",
            self.misses.clone(),
        );
    }
}

impl super::Metrics {
    /// The pool of `backend` holds `ready` sandboxes now.
    pub fn pool_size(&self, backend: &str, ready: usize) {
        let l = BackendLabels {
            backend: backend.to_owned(),
        };
        self.pool
            .size
            .get_or_create(&l)
            .set(i64::try_from(ready).unwrap_or(i64::MAX));
    }

    /// A creation took a sandbox of `backend`'s pool.
    pub fn pool_hit(&self, backend: &str) {
        let l = BackendLabels {
            backend: backend.to_owned(),
        };
        self.pool.hits.get_or_create(&l).inc();
    }

    /// A creation was made cold while the pool of `backend` was on, for `reason`.
    pub fn pool_miss(&self, backend: &str, reason: &str) {
        let l = MissLabels {
            backend: backend.to_owned(),
            reason: reason.to_owned(),
        };
        self.pool.misses.get_or_create(&l).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::super::Metrics;

    #[test]
    fn pool_series_are_served() {
        let m = Metrics::new();
        m.pool_size("container", 2);
        m.pool_hit("container");
        m.pool_miss("container", "mounts");
        m.pool_miss("container", "mounts");
        let text = m.encode(&[], &[]);
        assert!(
            text.contains(r#"svc_pool_size{backend="container"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"svc_pool_hits_total{backend="container"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"svc_pool_misses_total{backend="container",reason="mounts"} 2"#),
            "{text}"
        );
    }
}
