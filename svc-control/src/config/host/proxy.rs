//! `[proxy]`: the HTTPS proxy's port and the extra roots it trusts upstream.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{checks, defaults};

/// `[proxy]` as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyFile {
    /// Port the HTTPS proxy listens on (the fence redirects guests' web traffic to it).
    pub port: Option<u16>,
    /// PEM files of CAs trusted for upstream servers besides the public roots (an operator's
    /// private CA; the demo's test CA). Verification is never turned off.
    pub extra_roots: Option<Vec<PathBuf>>,
}

impl ProxyFile {
    /// `port`, checked: not 0, and not the DNS guard's `guard_port`.
    pub(super) fn port(&self, guard_port: u16, err: &mut impl FnMut(&str, String)) -> u16 {
        let proxy_port = self.port.unwrap_or(defaults::PROXY_PORT);
        if proxy_port == 0 {
            err(
                "proxy.port",
                "expected a port from 1 to 65535, got 0".into(),
            );
        }
        if guard_port == proxy_port {
            err(
                "proxy.port",
                format!("the proxy and the DNS guard cannot share port {proxy_port}"),
            );
        }
        proxy_port
    }

    /// `extra_roots`, checked: each an absolute path.
    pub(super) fn extra_roots(self, err: &mut impl FnMut(&str, String)) -> Vec<PathBuf> {
        let roots = self.extra_roots.unwrap_or_default();
        for (i, r) in roots.iter().enumerate() {
            checks::check_absolute(&format!("proxy.extra_roots[{i}]"), r, err);
        }
        roots
    }
}
