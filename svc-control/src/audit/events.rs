//! What each layer's record says (the part of an audit line after its time and sandbox): one
//! type per layer, written by svcd and read back by `svc audit`. None holds a secret value: no
//! payloads, no header values, no tokens.

use std::net::IpAddr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::words::{Word, optional_word, word};

/// A sandbox's records past its `[limits] audit_records_per_sec` (bursts of `audit_burst`)
/// since the last such record: how many of each layer were counted and not written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SuppressedEvent {
    /// By layer (`dns`, `http`, `packet`, `ssh`): how many records.
    pub records: std::collections::BTreeMap<String, u64>,
    /// The budget they were past: records a second, and at once.
    pub per_sec: u32,
    pub burst: u32,
}

/// One refresh of a brokered credential: which, how it went, until when its token is good.
/// Never a token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CredentialEvent {
    /// `store:NAME@vN`.
    pub credential: String,
    /// `refreshed` or `failed`.
    #[serde(deserialize_with = "word")]
    pub outcome: Word,
    /// The token endpoint's answer or the error, when it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the access token in hand expires (RFC 3339).
    pub expires_at: String,
}

/// A live policy change (`svc sandbox allow`): what changed, the generation it made, who
/// asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PolicyEvent {
    /// What changed: `allowlist`.
    #[serde(deserialize_with = "word")]
    pub change: Word,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// The sandbox's policy generation after the change.
    pub generation: u32,
    /// The API caller (`uid N`).
    pub by: String,
}

/// One git session through the SSH relay: what was asked, every ref a push updates, what was
/// decided (no pack data, no keys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SshEvent {
    /// The host as git's remote names it (empty when the request did not parse).
    pub host: String,
    /// `owner/repo`.
    pub repo: String,
    /// `git-upload-pack` or `git-receive-pack`.
    pub command: String,
    /// A push's ref updates (creations and deletions included), each checked.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refs: Vec<SshRef>,
    /// The push carried a signed push certificate.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub signed: bool,
    /// `allow` or `deny`.
    #[serde(deserialize_with = "word")]
    pub decision: Word,
    /// For a refusal: the line git's stderr got.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Bytes from git to the server.
    pub bytes_up: u64,
    /// Bytes from the server to git.
    pub bytes_down: u64,
    pub duration_ms: u64,
    /// The exit status git saw.
    pub exit: i32,
}

/// One ref update of a push: the ids before and after (all zeros: created or deleted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SshRef {
    pub name: String,
    pub old: String,
    pub new: String,
}

/// One proxied request, for the audit log (no header values, no query values, no tokens).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HttpEvent {
    pub host: Option<String>,
    pub method: String,
    pub path: Option<String>,
    pub status: u16,
    #[serde(deserialize_with = "word")]
    pub decision: Word,
    pub rule: String,
    #[serde(deserialize_with = "word")]
    pub credential: Word,
    /// Body bytes forwarded from the guest to the upstream.
    pub bytes_up: u64,
    /// Body bytes forwarded from the upstream to the guest (for a refusal: the refusal body).
    pub bytes_down: u64,
    /// From the request head to the end of the response body (or the guest hanging up).
    pub duration_ms: u64,
    /// A protocol upgrade: `websocket` for the handshake, `websocket-closed` for the record
    /// written when the relayed connection ends (its bytes each way and its whole duration),
    /// `websocket-cut` when a live allowlist change removed its host.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(default, deserialize_with = "optional_word")]
    pub upgrade: Option<Word>,
    /// The address and port the proxy connected to for an allowed request (`192.0.2.10:443`,
    /// `[2001:db8::1]:443`): always the one the guest dialled, never a resolution of the name;
    /// for a `destination-class:*` refusal, the address refused. Absent for other refusals and
    /// for requests sent through the operator's forward proxy (which resolves the name itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dialled: Option<String>,
    /// A smart-HTTP push held to AllowedBranches (`--https-push-branches`): every ref it
    /// updates, refused or not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refs: Vec<SshRef>,
    /// Why a request head the proxy could not read was refused (`request-malformed` with 400,
    /// 408, 414 or 431), in the words of the refusal's body; or, for an allowed request with
    /// status 0, why it has no answer (its guest went away before the upstream answered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl HttpEvent {
    /// A request decided `decision` by `rule` that moved nothing: no host, path or status yet,
    /// no credential, no bytes, nothing dialled. Callers set what differs
    /// (`HttpEvent { status, ..HttpEvent::decided(…) }`).
    pub fn decided(method: String, decision: &'static str, rule: String) -> Self {
        Self {
            host: None,
            method,
            path: None,
            status: 0,
            decision,
            rule,
            credential: "none",
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            upgrade: None,
            dialled: None,
            refs: Vec::new(),
            reason: None,
        }
    }
}

/// One DNS question and what the guard did with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DnsEvent {
    pub name: String,
    /// Record type mnemonic (`A`, `AAAA`, …) or number.
    pub qtype: String,
    /// `answered`, `empty`, `refused`, `rate-limited`, `servfail`, `formerr`.
    #[serde(deserialize_with = "word")]
    pub decision: Word,
    /// Why, for anything but `answered`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Addresses in the answer (committed to the fence first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub answers: Vec<IpAddr>,
    /// Addresses removed from the answer (destination classes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<IpAddr>,
    /// Time spent waiting for the upstream, when asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_ms: Option<u64>,
    /// Served from the guard's cache.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cached: bool,
}

/// A dropped packet: the reason and the addresses, never the payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PacketEvent {
    #[serde(deserialize_with = "word")]
    pub verdict: Word,
    #[serde(deserialize_with = "word")]
    pub reason: Word,
    /// `tcp`, `udp`, `icmp`, `icmpv6`, a number for anything else; absent when not IP.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub src: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dst: Option<IpAddr>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub src_port: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dst_port: Option<u16>,
    /// The host-side link's ifindex.
    pub link: u32,
    /// Drops of this sandbox not reported individually since the previous record (rate limit).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub suppressed: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}
