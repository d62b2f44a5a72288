//! One structured record type for every layer (packet verdicts now; DNS, HTTP, credential use
//! and SSH refs as those layers arrive), written as JSON lines. A record never holds a secret
//! value: no payloads, no header values, no tokens.

use std::{
    fs::{File, OpenOptions},
    io::Write as _,
    net::IpAddr,
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, SystemTime},
};

/// Which records a reader asked for.
pub mod query;

/// Records gathered over one turn of a serving thread's event loop and written together.
mod batched;
pub use batched::{Batched, record_here};

use schemars::JsonSchema;
use serde::Serialize;
use svc_ebpf_common::{DropEvent, reason};

/// One audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct AuditRecord {
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    /// The sandbox id.
    pub sandbox: u32,
    /// The sandbox's name, where the writer knows it (svcd adds it to every record).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_name: Option<String>,
    #[serde(flatten)]
    pub event: AuditEvent,
}

/// What happened, by layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(tag = "layer", rename_all = "kebab-case")]
pub enum AuditEvent {
    /// A packet the fence dropped.
    Packet(PacketEvent),
    /// A DNS question the guard answered.
    Dns(DnsEvent),
    /// An HTTPS request through the proxy (or a refused TLS connection).
    Http(HttpEvent),
    /// A git-over-SSH session through the relay.
    Ssh(SshEvent),
    /// A change of a running sandbox's policy.
    Policy(PolicyEvent),
    /// A refresh of a brokered OAuth secret on the host (sandbox 0: it serves every sandbox
    /// given it).
    Credential(CredentialEvent),
    /// A sandbox's records past its share of the log, counted and not written.
    Suppressed(SuppressedEvent),
}

impl AuditEvent {
    /// Its `layer`, as written.
    pub fn layer(&self) -> &'static str {
        match self {
            Self::Packet(_) => "packet",
            Self::Dns(_) => "dns",
            Self::Http(_) => "http",
            Self::Ssh(_) => "ssh",
            Self::Policy(_) => "policy",
            Self::Credential(_) => "credential",
            Self::Suppressed(_) => "suppressed",
        }
    }

    /// Whether the guest's own traffic makes it (and so it counts against the sandbox's
    /// `[limits] audit_records_per_sec`): not a caller's policy change, a host refresh, or a
    /// count of suppressed records.
    pub fn guest_driven(&self) -> bool {
        matches!(
            self,
            Self::Packet(_) | Self::Dns(_) | Self::Http(_) | Self::Ssh(_)
        )
    }
}

/// A sandbox's records past its `[limits] audit_records_per_sec` (bursts of `audit_burst`)
/// since the last such record: how many of each layer were counted and not written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct SuppressedEvent {
    /// By layer (`dns`, `http`, `packet`, `ssh`): how many records.
    pub records: std::collections::BTreeMap<String, u64>,
    /// The budget they were past: records a second, and at once.
    pub per_sec: u32,
    pub burst: u32,
}

/// One refresh of a brokered credential: which, how it went, until when its token is good.
/// Never a token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct CredentialEvent {
    /// `store:NAME@vN`.
    pub credential: String,
    /// `refreshed` or `failed`.
    pub outcome: &'static str,
    /// The token endpoint's answer or the error, when it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the access token in hand expires (RFC 3339).
    pub expires_at: String,
}

/// A live policy change (`svc sandbox allow`): what changed, the generation it made, who
/// asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct PolicyEvent {
    /// What changed: `allowlist`.
    pub change: &'static str,
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// The sandbox's policy generation after the change.
    pub generation: u32,
    /// The API caller (`uid N`).
    pub by: String,
}

/// One git session through the SSH relay: what was asked, every ref a push updates, what was
/// decided (no pack data, no keys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct SshEvent {
    /// The host as git's remote names it (empty when the request did not parse).
    pub host: String,
    /// `owner/repo`.
    pub repo: String,
    /// `git-upload-pack` or `git-receive-pack`.
    pub command: String,
    /// A push's ref updates (creations and deletions included), each checked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refs: Vec<SshRef>,
    /// The push carried a signed push certificate.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub signed: bool,
    /// `allow` or `deny`.
    pub decision: &'static str,
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct SshRef {
    pub name: String,
    pub old: String,
    pub new: String,
}

/// One proxied request, for the audit log (no header values, no query values, no tokens).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct HttpEvent {
    pub host: Option<String>,
    pub method: String,
    pub path: Option<String>,
    pub status: u16,
    pub decision: &'static str,
    pub rule: String,
    pub credential: &'static str,
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
    pub upgrade: Option<&'static str>,
    /// The address and port the proxy connected to for an allowed request (`192.0.2.10:443`,
    /// `[2001:db8::1]:443`): always the one the guest dialled, never a resolution of the name;
    /// for a `destination-class:*` refusal, the address refused. Absent for other refusals and
    /// for requests sent through the operator's forward proxy (which resolves the name itself).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dialled: Option<String>,
    /// A smart-HTTP push held to AllowedBranches (`--https-push-branches`): every ref it
    /// updates, refused or not.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refs: Vec<SshRef>,
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
        }
    }
}

/// One DNS question and what the guard did with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct DnsEvent {
    pub name: String,
    /// Record type mnemonic (`A`, `AAAA`, …) or number.
    pub qtype: String,
    /// `answered`, `empty`, `refused`, `rate-limited`, `servfail`, `formerr`.
    pub decision: &'static str,
    /// Why, for anything but `answered`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Addresses in the answer (committed to the fence first).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub answers: Vec<IpAddr>,
    /// Addresses removed from the answer (destination classes).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<IpAddr>,
    /// Time spent waiting for the upstream, when asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream_ms: Option<u64>,
    /// Served from the guard's cache.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cached: bool,
}

/// A dropped packet: the reason and the addresses, never the payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct PacketEvent {
    pub verdict: &'static str,
    pub reason: &'static str,
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
    #[serde(skip_serializing_if = "is_zero")]
    pub suppressed: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The JSON Schema of one audit line (draft 2020-12), as shipped in `schema/audit.v1.json`
/// (`svcd audit-schema` prints it).
pub fn schema() -> serde_json::Value {
    // What svcd writes: fields it leaves out when empty are optional.
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator();
    serde_json::to_value(generator.into_root_schema_for::<AuditRecord>()).unwrap_or_default()
}

impl AuditRecord {
    /// The record of a drop event. `mono_now_ns` and `wall_now` are one reading of both clocks,
    /// to place the kernel's monotonic timestamp on the wall clock.
    pub fn from_drop(e: &DropEvent, mono_now_ns: u64, wall_now: SystemTime) -> Self {
        let age = Duration::from_nanos(mono_now_ns.saturating_sub(e.ts_ns));
        let when = wall_now.checked_sub(age).unwrap_or(wall_now);
        let addr = |a: &[u8; 16]| match e.family {
            4 => Some(IpAddr::from([a[0], a[1], a[2], a[3]])),
            6 => Some(IpAddr::from(*a)),
            _ => None,
        };
        let ip = e.family == 4 || e.family == 6;
        let ports = ip && (e.protocol == 6 || e.protocol == 17);
        Self {
            time: rfc3339(when),
            sandbox: e.sandbox,
            sandbox_name: None,
            event: AuditEvent::Packet(PacketEvent {
                verdict: "drop",
                reason: reason::name(e.reason).unwrap_or("unknown"),
                protocol: ip.then(|| protocol_name(e.protocol)),
                src: addr(&e.src),
                dst: addr(&e.dst),
                src_port: ports.then_some(e.src_port),
                dst_port: ports.then_some(e.dst_port),
                link: e.ifindex,
                suppressed: e.suppressed,
            }),
        }
    }
}

fn protocol_name(p: u8) -> String {
    match p {
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        58 => "icmpv6".into(),
        n => n.to_string(),
    }
}

/// RFC 3339 UTC with milliseconds.
pub fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Errors of the audit sink. Losing the sink is an error the caller acts on (the proxy
/// refuses requests), never a silent gap.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("opening audit log {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing audit log {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where records go.
pub trait AuditSink: Send + Sync {
    fn record(&self, r: &AuditRecord) -> Result<(), AuditError>;

    /// A record the caller has no further use for (a batching sink keeps it without a copy).
    fn record_owned(&self, r: AuditRecord) -> Result<(), AuditError> {
        self.record(&r)
    }

    /// Several records, in order, written together where the sink can (one write for a
    /// file). Every record is tried; the first error is returned. A sink may fill in fields
    /// (the sandbox's name) in place.
    fn record_all(&self, records: &mut [AuditRecord]) -> Result<(), AuditError> {
        let mut first = Ok(());
        for r in records.iter() {
            let result = self.record(r);
            if first.is_ok() {
                first = result;
            }
        }
        first
    }

    /// Whether a record written now would land. The proxy asks before it answers a request whose
    /// record is only complete when the response body ends.
    fn ready(&self) -> Result<(), AuditError> {
        Ok(())
    }
}

/// A JSON-lines file, rotated to `<name>.1` when it passes `max_bytes`.
#[derive(Debug)]
pub struct JsonlFile {
    path: PathBuf,
    max_bytes: u64,
    state: Mutex<(File, u64)>,
    /// The last write failed; cleared by the next write that lands.
    failed: std::sync::atomic::AtomicBool,
}

impl JsonlFile {
    pub fn open(path: impl Into<PathBuf>, max_bytes: u64) -> Result<Self, AuditError> {
        let path = path.into();
        let file = open_append(&path)?;
        let len = file.metadata().map_or(0, |m| m.len());
        Ok(Self {
            path,
            max_bytes,
            state: Mutex::new((file, len)),
            failed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn rotate(&self, state: &mut (File, u64)) -> Result<(), AuditError> {
        let rotated = self.path.with_extension(format!(
            "{}.1",
            self.path
                .extension()
                .and_then(|e| e.to_str())
                .unwrap_or("log")
        ));
        std::fs::rename(&self.path, &rotated).map_err(|source| AuditError::Write {
            path: self.path.clone(),
            source,
        })?;
        *state = (open_append(&self.path)?, 0);
        Ok(())
    }
}

impl AuditSink for JsonlFile {
    fn record(&self, r: &AuditRecord) -> Result<(), AuditError> {
        self.write_lines(std::slice::from_ref(r))
    }

    /// One write for all of them.
    fn record_all(&self, records: &mut [AuditRecord]) -> Result<(), AuditError> {
        self.write_lines(records)
    }

    fn ready(&self) -> Result<(), AuditError> {
        if self.failed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(AuditError::Write {
                path: self.path.clone(),
                source: std::io::Error::other("the last audit write failed"),
            });
        }
        Ok(())
    }
}

impl JsonlFile {
    /// Write `records` as lines in one write; the outcome is what `ready` says next.
    fn write_lines(&self, records: &[AuditRecord]) -> Result<(), AuditError> {
        let result = self.append(records);
        self.failed
            .store(result.is_err(), std::sync::atomic::Ordering::Relaxed);
        result
    }

    fn append(&self, records: &[AuditRecord]) -> Result<(), AuditError> {
        let mut lines = Vec::with_capacity(256 * records.len());
        for r in records {
            // Serialising our own record types into memory cannot fail.
            if serde_json::to_writer(&mut lines, r).is_ok() {
                lines.push(b'\n');
            }
        }
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.1 + lines.len() as u64 > self.max_bytes && state.1 > 0 {
            self.rotate(&mut state)?;
        }
        state
            .0
            .write_all(&lines)
            .map_err(|source| AuditError::Write {
                path: self.path.clone(),
                source,
            })?;
        state.1 += lines.len() as u64;
        Ok(())
    }
}

fn open_append(path: &Path) -> Result<File, AuditError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| AuditError::Open {
            path: path.to_owned(),
            source,
        })?;
    }
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| AuditError::Open {
            path: path.to_owned(),
            source,
        })
}

/// Parse one audit line as JSON, refusing an object with the same key twice (which ordinary
/// parsers accept, keeping one value and losing the other). For readers of audit files and the
/// tests that check what svcd writes.
pub fn parse_strict(line: &str) -> Result<serde_json::Value, String> {
    let mut de = serde_json::Deserializer::from_str(line);
    let v = serde::Deserialize::deserialize(&mut de).map(|Strict(v)| v);
    let v = v.map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(v)
}

/// A JSON value whose objects have unique keys.
struct Strict(serde_json::Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> serde::de::Visitor<'de> for StrictVisitor {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(v.into())
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
        let mut v = Vec::new();
        while let Some(Strict(x)) = a.next_element()? {
            v.push(x);
        }
        Ok(v.into())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> Result<Self::Value, A::Error> {
        let mut m = serde_json::Map::new();
        while let Some(k) = a.next_key::<String>()? {
            let Strict(v) = a.next_value()?;
            if m.insert(k.clone(), v).is_some() {
                return Err(serde::de::Error::custom(format!("key {k:?} appears twice")));
            }
        }
        Ok(m.into())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An allowed GET's record for `sandbox` and `path`.
    pub(crate) fn http_record(sandbox: u32, path: &str) -> AuditRecord {
        AuditRecord {
            time: "2026-11-21T00:00:00.000Z".into(),
            sandbox,
            sandbox_name: None,
            event: AuditEvent::Http(HttpEvent {
                host: Some("api.example.test".into()),
                method: "GET".into(),
                path: Some(path.into()),
                status: 200,
                decision: "allow",
                rule: "open-host".into(),
                credential: "none",
                bytes_up: 0,
                bytes_down: 2,
                duration_ms: 1,
                upgrade: None,
                dialled: Some("192.0.2.10:443".into()),
                refs: Vec::new(),
            }),
        }
    }

    #[test]
    fn a_failed_write_makes_the_sink_not_ready() {
        // /dev/full takes the open and fails every write with ENOSPC: a real full disk.
        let sink = JsonlFile::open("/dev/full", 1 << 20).unwrap();
        assert!(sink.ready().is_ok(), "ready until a write fails");
        let r = http_record(1, "/");
        let err = sink.record(&r).unwrap_err();
        assert!(err.to_string().contains("/dev/full"), "{err}");
        assert!(sink.ready().is_err(), "not ready after a failed write");
    }

    #[test]
    fn drop_event_becomes_a_record_without_payload() {
        let mut e = DropEvent {
            ts_ns: 1_000_000_000,
            sandbox: 3,
            reason: reason::DROP_TCP_NOT_ALLOWED,
            ifindex: 9,
            family: 4,
            protocol: 6,
            src_port: 40000,
            dst_port: 443,
            ..DropEvent::default()
        };
        e.src[..4].copy_from_slice(&[10, 213, 0, 2]);
        e.dst[..4].copy_from_slice(&[192, 0, 2, 20]);
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let r = AuditRecord::from_drop(&e, 3_000_000_000, wall);
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["layer"], "packet");
        assert_eq!(json["reason"], "drop_tcp_not_allowed");
        assert_eq!(json["dst"], "192.0.2.20");
        assert_eq!(json["dst_port"], 443);
        assert_eq!(json["protocol"], "tcp");
        assert_eq!(
            json["time"], "2027-01-15T07:59:58.000Z",
            "the kernel timestamp placed on the wall clock"
        );
        assert!(json.get("suppressed").is_none());
    }

    #[test]
    fn jsonl_file_rotates_at_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fence.jsonl");
        let sink = JsonlFile::open(&path, 300).unwrap();
        let e = DropEvent {
            family: 4,
            protocol: 17,
            reason: reason::DROP_UDP_NOT_ALLOWED,
            ..DropEvent::default()
        };
        for _ in 0..10 {
            sink.record(&AuditRecord::from_drop(&e, 0, SystemTime::now()))
                .unwrap();
        }
        assert!(std::fs::metadata(&path).unwrap().len() <= 300);
        assert!(dir.path().join("fence.jsonl.1").exists());
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            serde_json::from_str::<serde_json::Value>(line).unwrap();
        }
    }
}
