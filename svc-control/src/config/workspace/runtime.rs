//! `runtime`: which sandbox backends the workspace needs, in order of preference.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `runtime`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Runtime {
    /// Backends, in order of preference; empty: the daemon selects automatically.
    #[serde(default)]
    pub required: Vec<Backend>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<Selection>,
}

/// Registered sandbox backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// A microVM guest (QEMU `-M microvm`): the isolation boundary for hostile code.
    Microvm,
    /// An unprivileged OCI container (user namespace, own root file system, seccomp, cgroup
    /// limits): the embedded default; shares the host's kernel.
    Container,
    /// The former name of `container`, still accepted.
    Netns,
}

impl Backend {
    pub const ALL: [Self; 3] = [Self::Microvm, Self::Container, Self::Netns];
    /// The backend a name stands for (`netns` is `container`).
    pub const fn canonical(self) -> Self {
        match self {
            Self::Netns => Self::Container,
            other => other,
        }
    }
    pub const fn name(self) -> &'static str {
        match self {
            Self::Microvm => "microvm",
            Self::Container | Self::Netns => "container",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Selection {
    /// The first available backend listed in `required`.
    PreferFirst,
}

impl Runtime {
    /// No backend listed twice (`netns` and `container` are one).
    pub(super) fn validate(&self, err: &mut impl FnMut(String, String)) {
        for (i, b) in self.required.iter().enumerate() {
            if self.required[..i]
                .iter()
                .any(|o| o.canonical() == b.canonical())
            {
                err(
                    format!("/runtime/required/{i}"),
                    format!("backend {:?} is listed twice", b.name()),
                );
            }
        }
    }
}
