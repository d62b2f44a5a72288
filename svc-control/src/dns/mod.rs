//! The DNS guard: answers only names the sandbox may reach, resolves them upstream on the
//! host, commits the answer's addresses to the fence, and only then releases the answer.
//!
//! The guard does not know the fence: it asks a [`Commit`] (svcd plugs in the dataplane) and a
//! [`Directory`] (who is asking, by source address). Rules come from `policy::dns` and
//! `policy::destination`.

mod guard;
mod rate;
mod resolve;
mod sandbox;
mod serve;
mod settings;
mod udp_batch;
mod upstream;
mod wire;

pub use guard::Guard;
pub use sandbox::{Commit, CommitEntry, Destinations, Directory, SandboxDns};
pub use settings::{GuardConfig, Transport};
pub use upstream::{Sockets, Upstream};
