//! `spotlight`: ports forwarded from the sandbox to the host.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Spotlight {
    #[serde(default)]
    pub defaults: Vec<SpotlightForward>,
}

/// One port forward: `remotePort` inside the sandbox to `localPort` on the host.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SpotlightForward {
    #[schemars(length(min = 1))]
    pub service: String,
    #[schemars(range(min = 1, max = 65535))]
    pub remote_port: u16,
    #[schemars(range(min = 1, max = 65535))]
    pub local_port: u16,
}

impl Spotlight {
    /// Each forward names a service and two ports that are not 0.
    pub(super) fn validate(&self, err: &mut impl FnMut(String, String)) {
        for (i, f) in self.defaults.iter().enumerate() {
            if f.service.trim().is_empty() {
                err(
                    format!("/spotlight/defaults/{i}/service"),
                    "must not be empty".into(),
                );
            }
            for (key, port) in [("remotePort", f.remote_port), ("localPort", f.local_port)] {
                if port == 0 {
                    err(
                        format!("/spotlight/defaults/{i}/{key}"),
                        "expected a port from 1 to 65535, got 0".into(),
                    );
                }
            }
        }
    }
}
