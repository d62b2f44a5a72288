//! One structured record type for every layer (packet verdicts, DNS questions, HTTP requests,
//! SSH sessions, policy changes, credential refreshes), written as JSON lines. A record never
//! holds a secret value: no payloads, no header values, no tokens.
//!
//! The rooms: `layer` names the layers, `events` holds each layer's record and `record` the
//! line around it (with the schema); `sink` is where records go, `jsonl` the file on disk and
//! `batched` a serving thread's batch in front of it; [`query`] and `strict` are for readers.

/// Which records a reader asked for.
pub mod query;

/// Records gathered over one turn of a serving thread's event loop and written together.
mod batched;
/// What each layer's record says.
mod events;
/// The audit log file, rotated at its cap.
mod jsonl;
/// The layers, as one enum.
mod layer;
/// One record: time, sandbox, event; and its JSON Schema.
mod record;
/// The sink trait and its error.
mod sink;
/// Strict parsing of an audit line (no key twice).
mod strict;
/// The fixed words of a record, read back.
mod words;

pub use batched::{Batched, emit_here, record_here};
pub use events::{
    CredentialEvent, DnsEvent, HttpEvent, PacketEvent, PolicyEvent, SshEvent, SshRef,
    SuppressedEvent,
};
pub use jsonl::{JsonlFile, rotated};
pub use layer::AuditLayer;
pub use record::{AuditEvent, AuditRecord, Incarnation, rfc3339, schema};
pub use sink::{AuditError, AuditSink};
pub use strict::parse_strict;
