//! `[metrics]`: Prometheus metrics over HTTP (off unless `listen` is set).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// `[metrics]`: Prometheus metrics over HTTP (off unless `listen` is set).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsFile {
    /// `IP:port` to serve `/metrics` on, e.g. `127.0.0.1:9464`.
    pub listen: Option<String>,
}

impl MetricsFile {
    /// Where `/metrics` is served, if anywhere; an error through `err` if `listen` is no
    /// `IP:port`.
    pub(super) fn validate(self, err: &mut impl FnMut(&str, String)) -> Option<SocketAddr> {
        let l = self.listen?;
        match l.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                err(
                    "metrics.listen",
                    format!("expected IP:port such as 127.0.0.1:9464, got {l:?}"),
                );
                None
            }
        }
    }
}
