//! One audit record: when, which sandbox, and what happened by layer (packet verdicts, DNS
//! questions, HTTP requests, SSH sessions, policy changes, credential refreshes, suppressed
//! counts), written as one JSON line; its JSON Schema is generated from these types.

use std::{
    net::IpAddr,
    sync::Arc,
    time::{Duration, SystemTime},
};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use svc_ebpf_common::{DropEvent, reason};

use super::{
    events::{
        CredentialEvent, DnsEvent, HttpEvent, PacketEvent, PolicyEvent, SshEvent, SuppressedEvent,
    },
    layer::AuditLayer,
};

/// One audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AuditRecord {
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    /// The sandbox id.
    pub sandbox: u32,
    /// The sandbox's name, where the writer knows it (svcd adds it to every record).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_name: Option<String>,
    /// Which creation of the sandbox it is of (16 hex digits, made when the sandbox was
    /// created): ids and names are reused, an incarnation never is. Absent where the writer
    /// could not tell, and in records of versions before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incarnation: Option<String>,
    /// The Kubernetes pod the sandbox was made for (svcd adds it to every record of such a
    /// sandbox): its namespace and name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<crate::api::PodRef>,
    #[serde(flatten)]
    pub event: AuditEvent,
}

/// A sandbox as its records name it: its name, and the key made for it when it was created
/// and never made again. A destroyed sandbox's id (and name) go to the next sandbox made, so a
/// writer takes this from the registry entry it looked up when it first met the sandbox (a
/// proxy connection's accept, a DNS question's arrival, a relay session's start) and never
/// looks it up again: a record written late (a response that arrives after the sandbox was
/// destroyed) stays the old sandbox's. The default is unknown (the sink names such a record by
/// its id, if it can).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Incarnation {
    /// The sandbox's name.
    pub name: Arc<str>,
    /// Its key: 16 hex digits, random (empty: unknown).
    pub key: Arc<str>,
}

impl Incarnation {
    /// Sandbox `name`'s creation `key`.
    pub fn new(name: &str, key: &str) -> Self {
        Self {
            name: name.into(),
            key: key.into(),
        }
    }

    /// A new key (16 hex digits from the system's random source).
    pub fn fresh_key() -> String {
        let mut b = [0u8; 8];
        let _ = getrandom::fill(&mut b);
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// Whether it is known (not the default).
    pub fn is_known(&self) -> bool {
        !self.key.is_empty()
    }
}

/// What happened, by layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
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
    pub fn layer(&self) -> AuditLayer {
        match self {
            Self::Packet(_) => AuditLayer::Packet,
            Self::Dns(_) => AuditLayer::Dns,
            Self::Http(_) => AuditLayer::Http,
            Self::Ssh(_) => AuditLayer::Ssh,
            Self::Policy(_) => AuditLayer::Policy,
            Self::Credential(_) => AuditLayer::Credential,
            Self::Suppressed(_) => AuditLayer::Suppressed,
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

    /// The word its layer gives its outcome in (a packet's `verdict`, a question's, request's
    /// or session's `decision`); `None` for a layer that decides nothing.
    pub fn decision_word(&self) -> Option<&'static str> {
        match self {
            Self::Packet(p) => Some(p.verdict),
            Self::Dns(d) => Some(d.decision),
            Self::Http(h) => Some(h.decision),
            Self::Ssh(s) => Some(s.decision),
            Self::Policy(_) | Self::Credential(_) | Self::Suppressed(_) => None,
        }
    }
}

impl AuditRecord {
    /// The record of `event` in `sandbox`, made now (the name is the sink's to add).
    pub fn now(sandbox: u32, event: AuditEvent) -> Self {
        Self {
            time: rfc3339(SystemTime::now()),
            sandbox,
            sandbox_name: None,
            incarnation: None,
            pod: None,
            event,
        }
    }

    /// The record of `event` in `sandbox`'s incarnation `of`, made now (left to the sink to
    /// name when `of` is unknown).
    pub fn now_of(sandbox: u32, of: &Incarnation, event: AuditEvent) -> Self {
        let mut r = Self::now(sandbox, event);
        if of.is_known() {
            r.sandbox_name = Some(of.name.to_string());
            r.incarnation = Some(of.key.to_string());
        }
        r
    }

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
            incarnation: None,
            pod: None,
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

/// The JSON Schema of one audit line (draft 2020-12), as shipped in `schema/audit.v1.json`
/// (`svcd audit-schema` prints it).
pub fn schema() -> serde_json::Value {
    // What svcd writes: fields it leaves out when empty are optional.
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .for_serialize()
        .into_generator();
    serde_json::to_value(generator.into_root_schema_for::<AuditRecord>()).unwrap_or_default()
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
            incarnation: None,
            pod: None,
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
                reason: None,
            }),
        }
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
    fn every_layer_is_the_tag_of_an_event() {
        for name in AuditLayer::NAMES {
            let err = serde_json::from_value::<AuditEvent>(serde_json::json!({ "layer": name }))
                .expect_err("no fields");
            assert!(
                err.to_string().contains("missing field"),
                "{name}: not an event's tag: {err}"
            );
        }
    }

    #[test]
    fn a_record_reads_back_as_written_with_its_layer_as_the_tag() {
        let mut packet = AuditRecord::from_drop(
            &DropEvent {
                family: 4,
                protocol: 17,
                reason: reason::DROP_UDP_NOT_ALLOWED,
                ..DropEvent::default()
            },
            0,
            SystemTime::now(),
        );
        packet.sandbox_name = Some("dev".into());
        for r in [http_record(2, "/x"), packet] {
            let line = serde_json::to_string(&r).expect("serialises");
            let back: AuditRecord = serde_json::from_str(&line).expect("reads back");
            assert_eq!(back, r, "{line}");
            let v: serde_json::Value = serde_json::from_str(&line).expect("JSON");
            assert_eq!(v["layer"], r.event.layer().as_str());
        }
    }
}
