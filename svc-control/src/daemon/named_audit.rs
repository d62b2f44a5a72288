//! The audit log as svcd writes it: each record named (sandbox name and incarnation) where its
//! writer could not, and each sandbox held to its share (`[limits] audit_records_per_sec`).

use std::{sync::Arc, time::SystemTime};

use super::wiring::{Registered, Registry};
use crate::audit::{AuditError, AuditEvent, AuditRecord, AuditSink};

/// The audit log, with each record's sandbox name filled in from the registry, and each
/// sandbox held to its share of it (`[limits] audit_records_per_sec`).
pub struct NamedAudit {
    pub inner: Arc<dyn AuditSink>,
    pub registry: Arc<Registry>,
    /// Every record made is counted here too, written or suppressed.
    pub metrics: Arc<crate::metrics::Metrics>,
    pub limits: Arc<crate::limits::GuestLimits>,
}

impl NamedAudit {
    fn write(&self, r: &AuditRecord) -> Result<(), AuditError> {
        if !self.admitted(r) {
            return Ok(());
        }
        let result = self.inner.record(r);
        self.count(std::slice::from_ref(r), &result);
        result
    }

    /// Whether `r` is within its sandbox's share of the log (allowed requests and sessions
    /// have a share of their own, refusals and the rest another); one that is not is counted in the metrics as it happened (not
    /// written).
    fn admitted(&self, r: &AuditRecord) -> bool {
        use crate::audit::AuditEvent::{Http, Ssh};
        let allowed =
            matches!(r.event, Http(_) | Ssh(_)) && r.event.decision_word() == Some("allow");
        // Its own creation's share: not a later sandbox's given the same id.
        let whose =
            || crate::limits::Guest::new(r.sandbox, r.incarnation.as_deref().unwrap_or_default());
        if r.sandbox == 0
            || !r.event.guest_driven()
            || self
                .limits
                .admit_audit(&whose(), r.event.layer().as_str(), allowed)
        {
            return true;
        }
        self.metrics.record(r);
        false
    }

    /// Each record written counted, or each one lost.
    fn count(&self, records: &[AuditRecord], result: &Result<(), AuditError>) {
        for r in records {
            match result {
                Ok(()) => self.metrics.record(r),
                Err(_) => self.metrics.audit_failed(),
            }
        }
    }

    /// One `suppressed` record per sandbox that went past its share since the last call, of the
    /// creation of it whose records they were.
    pub fn write_suppressed(&self) {
        self.limits.tick();
        let (per_sec, burst) = self.limits.audit_budget();
        for (sandbox, counts) in self.limits.take_suppressed_audit() {
            let event = crate::audit::AuditEvent::Suppressed(crate::audit::SuppressedEvent {
                records: counts
                    .into_iter()
                    .map(|(layer, n)| (layer.to_owned(), n))
                    .collect(),
                per_sec,
                burst,
            });
            let mut r = AuditRecord::now(sandbox.id, event);
            if sandbox.key.is_empty() {
                self.name(&mut r);
            } else {
                r.incarnation = Some(sandbox.key.to_string());
                r.sandbox_name = (self.registry.by_id(sandbox.id))
                    .filter(|s| s.incarnation.key == sandbox.key)
                    .map(|s| s.name.clone());
            }
            self.add_pod(&mut r);
            let result = self.inner.record(&r);
            self.count(std::slice::from_ref(&r), &result);
        }
    }
}

impl NamedAudit {
    /// The Kubernetes pod of the sandbox `r` is of: that of the sandbox registered under its id
    /// now, when `r` names that sandbox's incarnation (a record of an earlier sandbox with the
    /// id, or one whose incarnation is unknown, gets none). A record that has one keeps it.
    fn pod_of(&self, r: &AuditRecord) -> Option<crate::api::PodRef> {
        if r.pod.is_some() {
            return None;
        }
        let of = r.incarnation.as_deref()?;
        let s = self.registry.by_id(r.sandbox)?;
        (!of.is_empty() && *s.incarnation.key == *of)
            .then(|| s.pod.clone())
            .flatten()
    }

    /// `r` with its sandbox's pod, where [`Self::pod_of`] finds one.
    fn add_pod(&self, r: &mut AuditRecord) {
        if let Some(pod) = self.pod_of(r) {
            r.pod = Some(pod);
        }
    }

    /// The sandbox's name and incarnation, where the writer could not tell them (a packet the
    /// fence dropped names only an id; a count of suppressed records): those of the sandbox
    /// registered under its id now, unless that sandbox is newer than the record (made before
    /// it was created, or on another link): a record of an earlier sandbox with that id stays
    /// unnamed (root reads it by id).
    fn name(&self, r: &mut AuditRecord) {
        if r.incarnation.is_some() || r.sandbox_name.is_some() {
            return;
        }
        let Some(s) = self.registry.by_id(r.sandbox) else {
            return;
        };
        if written_for(r, &s) {
            r.sandbox_name = Some(s.name.clone());
            r.incarnation = Some(s.incarnation.key.to_string()).filter(|k| !k.is_empty());
        }
    }
}

/// Whether `r`, which names only an id, can be `s`'s: stamped at or after `s` was created
/// (at the records' grain, milliseconds), and for a dropped packet, seen on `s`'s link.
fn written_for(r: &AuditRecord, s: &Registered) -> bool {
    let created_ms = s
        .created
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let at_ms = humantime::parse_rfc3339_weak(r.time.trim_end_matches('Z'))
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map(|d| d.as_millis());
    let on_its_link = match &r.event {
        AuditEvent::Packet(p) => p.link == 0 || s.ifindex == 0 || p.link == s.ifindex,
        _ => true,
    };
    at_ms.is_some_and(|at| at >= created_ms) && on_its_link
}

impl AuditSink for NamedAudit {
    fn record(&self, r: &AuditRecord) -> Result<(), AuditError> {
        if (r.incarnation.is_some() || r.sandbox_name.is_some()) && self.pod_of(r).is_none() {
            return self.write(r);
        }
        let mut named = r.clone();
        self.name(&mut named);
        self.add_pod(&mut named);
        self.write(&named)
    }

    fn record_owned(&self, mut r: AuditRecord) -> Result<(), AuditError> {
        self.name(&mut r);
        self.add_pod(&mut r);
        self.write(&r)
    }

    fn record_all(&self, records: &mut [AuditRecord]) -> Result<(), AuditError> {
        for r in records.iter_mut() {
            self.name(r);
            self.add_pod(r);
        }
        // Each record asked once: within its sandbox's share, or counted and dropped.
        let admitted: Vec<bool> = records.iter().map(|r| self.admitted(r)).collect();
        if admitted.iter().all(|a| *a) {
            let result = self.inner.record_all(records);
            self.count(records, &result);
            return result;
        }
        let mut kept: Vec<AuditRecord> = records
            .iter()
            .zip(&admitted)
            .filter(|(_, a)| **a)
            .map(|(r, _)| r.clone())
            .collect();
        if kept.is_empty() {
            return Ok(());
        }
        let result = self.inner.record_all(&mut kept);
        self.count(&kept, &result);
        result
    }

    fn ready(&self) -> Result<(), AuditError> {
        self.inner.ready()
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;
    use crate::{
        audit::{Incarnation, PacketEvent},
        dns::SandboxDns,
        hosts::Allowlist,
    };

    /// Keeps what it is given.
    #[derive(Default)]
    struct Kept(std::sync::Mutex<Vec<AuditRecord>>);

    impl AuditSink for Kept {
        fn record(&self, r: &AuditRecord) -> Result<(), AuditError> {
            self.0.lock().expect("not poisoned").push(r.clone());
            Ok(())
        }
    }

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).expect("time")
    }

    /// Sandbox 3 "dev" of incarnation `b2…`, created at 10:00:00, on link 9.
    fn registry() -> Arc<Registry> {
        let registry = Arc::new(Registry::default());
        registry.insert(Registered {
            id: 3,
            name: "dev".into(),
            incarnation: Incarnation::new("dev", "b2b2b2b2b2b2b2b2"),
            created: at("2026-01-01T10:00:00Z"),
            pod: Some(crate::api::PodRef::new("team-a", "agent-7").expect("pod")),
            ifindex: 9,
            guest: IpAddr::from([10, 213, 0, 2]),
            dns: Arc::new(SandboxDns::curated(3, Allowlist(Vec::new()))),
            proxy: None,
            bearers: std::collections::HashMap::new(),
        });
        registry
    }

    fn named(registry: Arc<Registry>, kept: Arc<Kept>) -> NamedAudit {
        NamedAudit {
            inner: kept,
            registry,
            metrics: Arc::new(crate::metrics::Metrics::default()),
            limits: Arc::new(crate::limits::GuestLimits::new(
                crate::config::limits::LimitsConfig::default(),
                Arc::new(crate::limits::Unreported),
            )),
        }
    }

    fn packet(time: &str, link: u32) -> AuditRecord {
        AuditRecord {
            time: time.into(),
            ..AuditRecord::now(
                3,
                AuditEvent::Packet(PacketEvent {
                    verdict: "drop",
                    reason: "drop_tcp_not_allowed",
                    protocol: None,
                    src: None,
                    dst: None,
                    src_port: None,
                    dst_port: None,
                    link,
                    suppressed: 0,
                }),
            )
        }
    }

    /// A named case: a record as written, and the (name, incarnation) it is stored with.
    type Case = (
        &'static str,
        AuditRecord,
        Option<(&'static str, &'static str)>,
    );

    /// Named cases: a record as written, and the (name, incarnation) it is stored with.
    #[test]
    fn a_record_is_named_for_its_own_incarnation_only() {
        let late_of_a = AuditRecord::now_of(
            3,
            &Incarnation::new("dev", "a1a1a1a1a1a1a1a1"),
            AuditEvent::Packet(match packet("", 9).event {
                AuditEvent::Packet(p) => p,
                _ => unreachable!("a packet"),
            }),
        );
        let cases: [Case; 5] = [
            (
                "written_late_by_a_writer_that_knew_the_earlier_sandbox",
                late_of_a,
                Some(("dev", "a1a1a1a1a1a1a1a1")),
            ),
            (
                "a_drop_after_the_creation_on_its_link",
                packet("2026-01-01T10:00:01.000Z", 9),
                Some(("dev", "b2b2b2b2b2b2b2b2")),
            ),
            (
                "a_drop_before_the_creation_an_earlier_sandboxs",
                packet("2026-01-01T09:59:59.999Z", 9),
                None,
            ),
            (
                "a_drop_on_another_link_an_earlier_sandboxs",
                packet("2026-01-01T10:00:01.000Z", 7),
                None,
            ),
            (
                "a_time_that_does_not_read_is_nobodys",
                packet("soon", 9),
                None,
            ),
        ];
        for (name, record, want) in cases {
            let kept = Arc::new(Kept::default());
            let sink = named(registry(), kept.clone());
            sink.record_owned(record).expect(name);
            let got = kept.0.lock().expect("not poisoned").remove(0);
            assert_eq!(
                got.sandbox_name.as_deref().zip(got.incarnation.as_deref()),
                want,
                "{name}"
            );
            let pod = got.pod.as_ref().map(ToString::to_string);
            let want_pod = want
                .filter(|(_, key)| *key == "b2b2b2b2b2b2b2b2")
                .map(|_| "team-a/agent-7".to_owned());
            assert_eq!(pod, want_pod, "{name}: the pod only of its own incarnation");
            if want.is_none() {
                assert_eq!(
                    (got.sandbox_name, got.incarnation),
                    (None, None),
                    "{name}: left unnamed, not half named"
                );
            }
        }
    }

    #[test]
    fn a_record_made_now_of_a_registered_sandbox_is_named_through_every_path() {
        let kept = Arc::new(Kept::default());
        let sink = named(registry(), kept.clone());
        let now = || {
            AuditRecord::now(
                3,
                AuditEvent::Http(crate::audit::HttpEvent::decided(
                    "GET".into(),
                    "deny",
                    "x".into(),
                )),
            )
        };
        sink.record(&now()).expect("record");
        sink.record_owned(now()).expect("record_owned");
        sink.record_all(&mut [now(), now()]).expect("record_all");
        let kept = kept.0.lock().expect("not poisoned");
        assert_eq!(kept.len(), 4);
        for r in kept.iter() {
            assert_eq!(r.incarnation.as_deref(), Some("b2b2b2b2b2b2b2b2"));
            assert_eq!(r.sandbox_name.as_deref(), Some("dev"));
            assert_eq!(
                r.pod.as_ref().map(ToString::to_string).as_deref(),
                Some("team-a/agent-7"),
                "the pod of its sandbox, on every path"
            );
        }
    }
}
