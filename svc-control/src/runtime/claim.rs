//! What a guest made ahead of its request (a warm pool's, docs/pool.md) is given when a
//! sandbox claims it.

use std::path::PathBuf;

use super::GuestNet;

/// What a pooled guest is given by the sandbox that claims it ([`Backend::claim_guest`]).
#[derive(Debug, Clone)]
pub struct Claim {
    /// The sandbox's name: the guest's host name.
    pub hostname: String,
    /// The guest's address (the pooled one's: it keeps its id and link).
    pub net: GuestNet,
    /// The sandbox's guest files, already written on the host: (host copy, path in the guest).
    pub files: Vec<(PathBuf, PathBuf)>,
}
