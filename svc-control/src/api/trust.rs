//! The approval of a project's perimeter (`svc workspace trust`), per API caller.
//!
//! | method and path           | body               | answer          |
//! |---------------------------|--------------------|-----------------|
//! | `POST /v1/trust/check`    | [`TrustRequest`]   | [`TrustCheck`]  |
//! | `POST /v1/trust`          | [`TrustRequest`]   | [`TrustCheck`] (approved) |

use serde::{Deserialize, Serialize};

use crate::policy::trust::Perimeter;

/// A project directory and the perimeter its files describe now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustRequest {
    /// The project directory on the host (absolute, without symbolic links).
    pub root: String,
    pub perimeter: Perimeter,
}

/// The part of a creation request that came from a project's files (`svc workspace up`,
/// `svc sandbox create --workspace`): svcd enforces it only if the caller approved it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectPerimeter {
    pub root: String,
    pub perimeter: Perimeter,
    /// Approve this perimeter now (`--trust`: the caller has reviewed it).
    #[serde(default)]
    pub trust: bool,
}

/// Whether the caller approved a project's current perimeter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrustCheck {
    pub root: String,
    /// The caller whose approval this is.
    pub uid: u32,
    /// `approved`, `unapproved` or `changed`.
    pub decision: String,
    /// The digest of the current perimeter (`sha256:…`).
    pub digest: String,
    /// The current perimeter's canonical text.
    pub content: String,
    /// For `changed`: the line diff from the approved text (`-`) to the current one (`+`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diff: Option<String>,
    /// When the caller's approval for this directory was recorded (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_at: Option<String>,
}
