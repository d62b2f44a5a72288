//! What the running svcd's backends are and use (`svc doctor --microvm` asks it, rather than
//! reading its own environment).
//!
//! | method and path     | body | answer       |
//! |---------------------|------|--------------|
//! | `GET /v1/backends`  |      | [`Backends`] |

use serde::{Deserialize, Serialize};

/// Every backend this svcd has, and which one makes a sandbox nobody chose a backend for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backends {
    /// The default backend's kind.
    pub default: String,
    pub backends: Vec<BackendInfo>,
}

/// One backend: what it is, whether it can make sandboxes now, and what it uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendInfo {
    /// Its kind (`container`, `microvm`).
    pub kind: String,
    /// Older names it still answers to.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// One line for people.
    pub summary: String,
    /// What separates the guest from the host.
    pub isolates_with: String,
    /// Whether it can fork a running sandbox.
    pub can_fork: bool,
    /// Whether it can make a sandbox now.
    pub available: bool,
    /// Why not, when it cannot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    /// The accelerator its guests run under and why, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accel: Option<String>,
    /// The files it uses (the microvm backend's kernel, rootfs and initrd), each with where
    /// svcd took it from (host paths: root only; empty for other callers).
    #[serde(default)]
    pub uses: Vec<Used>,
}

/// A file a backend uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Used {
    /// What it is (`kernel`, `rootfs`, `initrd`).
    pub name: String,
    /// Its path.
    pub path: String,
    /// Where svcd took it from: an environment variable (`SVC_MICROVM_KERNEL`) or a key of
    /// svcd.toml (`microvm.kernel`).
    pub from: String,
}
