//! Requests that change a running sandbox: its allowlist (`allow`) and a fork into clones.

use serde::{Deserialize, Serialize};

use crate::names::SandboxName;

/// `POST /v1/sandboxes/{name}/allow`: change a running Curated sandbox's allowlist.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AllowChange {
    /// Hosts to add (as `--allow-host` takes them).
    #[serde(default)]
    pub add: Vec<String>,
    /// Hosts to remove (ones added with `--allow-host` or an earlier change).
    #[serde(default)]
    pub remove: Vec<String>,
}

/// `POST /v1/sandboxes/{name}/fork`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkRequest {
    /// The names of the clones to start from one snapshot (checked as the body is read).
    pub clones: Vec<SandboxName>,
}

impl ForkRequest {
    /// A fork into `clones`, each name checked (the first bad one's reason if one is bad).
    pub fn new(clones: impl IntoIterator<Item = String>) -> Result<Self, String> {
        let clones = clones.into_iter().map(SandboxName::new);
        Ok(Self {
            clones: clones.collect::<Result<_, _>>()?,
        })
    }
}
