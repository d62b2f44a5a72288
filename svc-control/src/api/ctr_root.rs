//! A pod container's root file system attached into its pod's sandbox: `POST
//! /v1/sandboxes/{name}/roots` takes [`AttachRoot`] and answers [`AttachedRoot`]; `DELETE
//! /v1/sandboxes/{name}/roots/{id}` answers [`DetachedRoot`]. An exec names an attached one by
//! its id ([`ExecRequest::root`](super::ExecRequest::root)) to run chrooted into it.

use serde::{Deserialize, Serialize};

/// Attach a container's root file system (checked by `policy::ctr_root`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachRoot {
    /// The container's id (containerd's): its mount point is `/.svc/ctr/<id>` in the guest.
    pub id: String,
    /// Its layers, top first (one: a whole tree): directories of the host, read-only to the
    /// container, under a writable layer of its own.
    pub layers: Vec<String>,
}

/// An attached root file system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttachedRoot {
    pub sandbox: String,
    pub id: String,
    /// Where the guest sees it.
    pub guest_path: String,
    /// The guest's places (`/proc`, `/dev`, resolv.conf, …) not bound inside it, each with
    /// why: a symbolic link in the image where one goes is never followed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
}

/// A detach's answer: whether it was attached (detaching one that is not is no error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DetachedRoot {
    pub sandbox: String,
    pub id: String,
    pub was_attached: bool,
}
