//! svcd's Prometheus metrics (OpenMetrics text, `prometheus-client`), served on
//! `metrics.listen` when svcd.toml sets it (off by default).
//!
//! Most of them are read off the audit records as they are written (every DNS question, every
//! proxied request, every audited drop passes the audit sink), so the DNS guard and the proxy
//! need no hook of their own; the fence's packet and byte totals come from its pinned per-CPU
//! counters at scrape time; sandboxes by state and create/destroy durations come from the
//! supervisor. Labels are bounded: sandbox names (removed when a sandbox is destroyed), decisions,
//! rules, statuses and reason codes — never a host name or a path.

use std::{
    collections::{HashMap, HashSet},
    sync::Mutex,
    time::Duration,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::audit::{AuditEvent, AuditRecord};

mod pool;

/// The Kubernetes pod of a sandbox, as two labels (`pod_namespace`, `pod_name`) on its
/// series; none on a sandbox made for no pod. A sandbox is one pod, so they add no series.
#[derive(Debug, Clone, Default, Hash, PartialEq, Eq)]
struct PodLabels(Option<crate::api::PodRef>);

impl EncodeLabelSet for PodLabels {
    fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::LabelSetEncoder,
    ) -> Result<(), std::fmt::Error> {
        match &self.0 {
            None => Ok(()),
            Some(p) => [
                ("pod_namespace", p.namespace.as_str()),
                ("pod_name", p.name.as_str()),
            ]
            .encode(encoder),
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    sandbox: String,
    reason: String,
    #[prometheus(flatten)]
    pod: PodLabels,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DnsLabels {
    sandbox: String,
    decision: String,
    #[prometheus(flatten)]
    pod: PodLabels,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    sandbox: String,
    decision: String,
    rule: String,
    status: String,
    #[prometheus(flatten)]
    pod: PodLabels,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SshLabels {
    sandbox: String,
    command: String,
    decision: String,
    #[prometheus(flatten)]
    pod: PodLabels,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CredentialLabels {
    credential: String,
    outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LimitLabels {
    sandbox: String,
    limit: String,
    #[prometheus(flatten)]
    pod: PodLabels,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

/// Every metric svcd serves.
pub struct Metrics {
    registry: Registry,
    fence_packets: Family<ReasonLabels, Counter>,
    fence_bytes: Family<ReasonLabels, Counter>,
    drops_audited: Family<DropLabels, Counter>,
    dns_questions: Family<DnsLabels, Counter>,
    dns_upstream: Histogram,
    http_requests: Family<HttpLabels, Counter>,
    http_duration: Histogram,
    ssh_sessions: Family<SshLabels, Counter>,
    audit_failures: Counter,
    credential_refreshes: Family<CredentialLabels, Counter>,
    guest_limit_hits: Family<LimitLabels, Counter>,
    sandboxes: Family<StateLabels, Gauge>,
    create_seconds: Histogram,
    destroy_seconds: Histogram,
    /// The warm pools' size, hits and misses.
    pool: pool::PoolSeries,
    /// The kernel's totals already counted, per reason code: (packets, bytes).
    fence_seen: Mutex<HashMap<u32, (u64, u64)>>,
    /// Label sets that name each sandbox, so its series go when it does.
    by_sandbox: Mutex<HashMap<String, HashSet<SandboxSeries>>>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq)]
enum SandboxSeries {
    Drop(DropLabels),
    Dns(DnsLabels),
    Http(HttpLabels),
    Ssh(SshLabels),
    Limit(LimitLabels),
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Latency buckets in seconds: 0.5 ms … ~16 s.
fn latency() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.0005, 2.0, 16,
    ))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("svc");
        let m = Self {
            fence_packets: Family::default(),
            fence_bytes: Family::default(),
            drops_audited: Family::default(),
            dns_questions: Family::default(),
            dns_upstream: latency(),
            http_requests: Family::default(),
            http_duration: latency(),
            ssh_sessions: Family::default(),
            audit_failures: Counter::default(),
            credential_refreshes: Family::default(),
            guest_limit_hits: Family::default(),
            sandboxes: Family::default(),
            create_seconds: latency(),
            destroy_seconds: latency(),
            pool: pool::PoolSeries::default(),
            fence_seen: Mutex::default(),
            by_sandbox: Mutex::default(),
            registry: Registry::default(),
        };
        registry.register(
            "fence_packets",
            "Packets the fence decided, by verdict reason (all sandboxes; pinned per-CPU counters)",
            m.fence_packets.clone(),
        );
        registry.register(
            "fence_bytes",
            "Bytes the fence decided, by verdict reason (all sandboxes)",
            m.fence_bytes.clone(),
        );
        registry.register(
            "fence_drops_audited",
            "Dropped packets written to the audit log, by sandbox and reason (rate-limited to 64 a second per sandbox)",
            m.drops_audited.clone(),
        );
        registry.register(
            "dns_questions",
            "DNS questions the guard answered, by sandbox and decision",
            m.dns_questions.clone(),
        );
        registry.register(
            "dns_upstream_seconds",
            "Time the DNS guard waited for its upstream",
            m.dns_upstream.clone(),
        );
        registry.register(
            "proxy_requests",
            "Requests through the proxy, by sandbox, decision, rule and status",
            m.http_requests.clone(),
        );
        registry.register(
            "proxy_request_seconds",
            "Allowed proxied requests, from the request head to the end of the response",
            m.http_duration.clone(),
        );
        registry.register(
            "git_ssh_sessions",
            "git sessions through the SSH relay, by sandbox, command and decision",
            m.ssh_sessions.clone(),
        );
        registry.register(
            "audit_write_failures",
            "Audit records that could not be written",
            m.audit_failures.clone(),
        );
        registry.register(
            "credential_refreshes",
            "Token refreshes svcd attempted on the host, by credential and outcome",
            m.credential_refreshes.clone(),
        );
        registry.register(
            "guest_limit_hits",
            "Channels a sandbox was refused at its [limits] cap, by sandbox and limit",
            m.guest_limit_hits.clone(),
        );
        registry.register("sandboxes", "Sandboxes by state", m.sandboxes.clone());
        registry.register(
            "sandbox_create_seconds",
            "svc sandbox create, from the request to the answer",
            m.create_seconds.clone(),
        );
        registry.register(
            "sandbox_destroy_seconds",
            "svc sandbox destroy, from the request to the answer",
            m.destroy_seconds.clone(),
        );
        m.pool.register(&mut registry);
        Self { registry, ..m }
    }

    /// Count one audit record (called by the audit sink for each record written).
    pub fn record(&self, r: &AuditRecord) {
        let sandbox = r
            .sandbox_name
            .clone()
            .unwrap_or_else(|| r.sandbox.to_string());
        let pod = PodLabels(r.pod.clone());
        let series = match &r.event {
            AuditEvent::Packet(p) => {
                let l = DropLabels {
                    sandbox: sandbox.clone(),
                    reason: p.reason.to_owned(),
                    pod: pod.clone(),
                };
                self.drops_audited
                    .get_or_create(&l)
                    .inc_by(1 + u64::from(p.suppressed));
                SandboxSeries::Drop(l)
            }
            AuditEvent::Dns(d) => {
                if let Some(ms) = d.upstream_ms {
                    self.dns_upstream.observe(ms as f64 / 1000.0);
                }
                let l = DnsLabels {
                    sandbox: sandbox.clone(),
                    decision: d.decision.to_owned(),
                    pod: pod.clone(),
                };
                self.dns_questions.get_or_create(&l).inc();
                SandboxSeries::Dns(l)
            }
            AuditEvent::Http(h) => {
                if h.decision == "allow" && h.upgrade.is_none() {
                    self.http_duration.observe(h.duration_ms as f64 / 1000.0);
                }
                // Connection refusals carry their reason as text: one bounded label for them.
                let rule = if h.method == "TLS" {
                    "connection-refused".to_owned()
                } else {
                    h.rule.clone()
                };
                let l = HttpLabels {
                    sandbox: sandbox.clone(),
                    decision: h.decision.to_owned(),
                    rule,
                    status: h.status.to_string(),
                    pod: pod.clone(),
                };
                self.http_requests.get_or_create(&l).inc();
                SandboxSeries::Http(l)
            }
            AuditEvent::Ssh(s) => {
                let l = SshLabels {
                    sandbox: sandbox.clone(),
                    command: s.command.clone(),
                    decision: s.decision.to_owned(),
                    pod: pod.clone(),
                };
                self.ssh_sessions.get_or_create(&l).inc();
                SandboxSeries::Ssh(l)
            }
            // Changes are counted by the events, not as a series.
            // Suppressed records were counted when they happened.
            AuditEvent::Policy(_) | AuditEvent::Credential(_) | AuditEvent::Suppressed(_) => {
                return;
            }
        };
        self.by_sandbox
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(sandbox)
            .or_default()
            .insert(series);
    }

    /// A refresh of `credential` ended with `outcome` (`refreshed`, `failed`, …).
    pub fn credential_refresh(&self, credential: &str, outcome: &str) {
        self.credential_refreshes
            .get_or_create(&CredentialLabels {
                credential: credential.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// `sandbox` (of `pod`, if any) was refused a channel at its cap `limit` (a `[limits]` key).
    pub fn limit_hit(&self, sandbox: &str, pod: Option<crate::api::PodRef>, limit: &str) {
        let l = LimitLabels {
            sandbox: sandbox.to_owned(),
            limit: limit.to_owned(),
            pod: PodLabels(pod),
        };
        self.guest_limit_hits.get_or_create(&l).inc();
        self.by_sandbox
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(sandbox.to_owned())
            .or_default()
            .insert(SandboxSeries::Limit(l));
    }

    /// An audit record could not be written.
    pub fn audit_failed(&self) {
        self.audit_failures.inc();
    }

    /// A sandbox is gone: its series go too.
    pub fn forget(&self, sandbox: &str) {
        let gone = self
            .by_sandbox
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(sandbox)
            .unwrap_or_default();
        for s in gone {
            match s {
                SandboxSeries::Drop(l) => drop(self.drops_audited.remove(&l)),
                SandboxSeries::Dns(l) => drop(self.dns_questions.remove(&l)),
                SandboxSeries::Http(l) => drop(self.http_requests.remove(&l)),
                SandboxSeries::Ssh(l) => drop(self.ssh_sessions.remove(&l)),
                SandboxSeries::Limit(l) => drop(self.guest_limit_hits.remove(&l)),
            }
        }
    }

    pub fn created(&self, took: Duration) {
        self.create_seconds.observe(took.as_secs_f64());
    }

    pub fn destroyed(&self, took: Duration) {
        self.destroy_seconds.observe(took.as_secs_f64());
    }

    /// The text to serve, after the values read at scrape time: the fence's totals as
    /// (reason name, code, packets, bytes), and the sandboxes' states.
    pub fn encode(&self, fence: &[(&str, u32, u64, u64)], states: &[String]) -> String {
        {
            let mut seen = self
                .fence_seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            for (name, code, packets, bytes) in fence {
                let last = seen.entry(*code).or_insert((0, 0));
                let l = ReasonLabels {
                    reason: (*name).to_owned(),
                };
                // Kernel totals only grow while the maps live; a reload starts them over.
                let (dp, db) = if *packets >= last.0 && *bytes >= last.1 {
                    (packets - last.0, bytes - last.1)
                } else {
                    (*packets, *bytes)
                };
                self.fence_packets.get_or_create(&l).inc_by(dp);
                self.fence_bytes.get_or_create(&l).inc_by(db);
                *last = (*packets, *bytes);
            }
        }
        self.sandboxes.clear();
        for state in states {
            self.sandboxes
                .get_or_create(&StateLabels {
                    state: state.clone(),
                })
                .inc();
        }
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{DnsEvent, HttpEvent};

    fn dns(sandbox: &str, decision: &'static str) -> AuditRecord {
        AuditRecord {
            time: "t".into(),
            sandbox: 1,
            sandbox_name: Some(sandbox.into()),
            incarnation: None,
            pod: None,
            event: AuditEvent::Dns(DnsEvent {
                name: "a.test.".into(),
                qtype: "A".into(),
                decision,
                reason: None,
                answers: Vec::new(),
                removed: Vec::new(),
                upstream_ms: Some(3),
                cached: false,
            }),
        }
    }

    #[test]
    fn audit_records_become_counters_and_a_destroyed_sandboxs_series_go() {
        let m = Metrics::new();
        m.record(&dns("dev", "refused"));
        m.record(&dns("dev", "refused"));
        m.record(&dns("ci", "answered"));
        let text = m.encode(&[("drop_tcp_not_allowed", 12, 5, 300)], &["running".into()]);
        assert!(
            text.contains(r#"svc_dns_questions_total{sandbox="dev",decision="refused"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"svc_fence_packets_total{reason="drop_tcp_not_allowed"} 5"#));
        assert!(text.contains(r#"svc_sandboxes{state="running"} 1"#));
        assert!(text.contains("svc_dns_upstream_seconds_count 3"));
        // The kernel's totals are read as totals: only the growth is added.
        let text = m.encode(&[("drop_tcp_not_allowed", 12, 7, 420)], &[]);
        assert!(text.contains(r#"svc_fence_packets_total{reason="drop_tcp_not_allowed"} 7"#));
        m.forget("dev");
        let text = m.encode(&[], &[]);
        assert!(!text.contains(r#"sandbox="dev""#), "{text}");
        assert!(text.contains(r#"sandbox="ci""#));
    }

    #[test]
    fn limit_hits_are_counted_by_sandbox_and_limit_and_go_with_the_sandbox() {
        let m = Metrics::new();
        m.limit_hit("dev", None, "dns_tcp_connections");
        m.limit_hit("dev", None, "dns_tcp_connections");
        m.limit_hit("ci", None, "exec_streams");
        let text = m.encode(&[], &[]);
        assert!(
            text.contains(
                r#"svc_guest_limit_hits_total{sandbox="dev",limit="dns_tcp_connections"} 2"#
            ),
            "{text}"
        );
        m.forget("dev");
        let text = m.encode(&[], &[]);
        assert!(!text.contains(r#"sandbox="dev""#), "{text}");
        assert!(text.contains(r#"limit="exec_streams""#), "{text}");
    }

    #[test]
    fn a_pods_sandbox_has_its_namespace_and_name_as_labels() {
        let m = Metrics::new();
        let pod = crate::api::PodRef::new("team-a", "agent-7").expect("pod");
        let mut r = dns("ctr-x", "refused");
        r.pod = Some(pod.clone());
        m.record(&r);
        m.record(&dns("dev", "refused"));
        m.limit_hit("ctr-x", Some(pod), "exec_streams");
        let text = m.encode(&[], &[]);
        for want in [
            r#"svc_dns_questions_total{sandbox="ctr-x",decision="refused",pod_namespace="team-a",pod_name="agent-7"} 1"#,
            r#"svc_dns_questions_total{sandbox="dev",decision="refused"} 1"#,
            r#"svc_guest_limit_hits_total{sandbox="ctr-x",limit="exec_streams",pod_namespace="team-a",pod_name="agent-7"} 1"#,
        ] {
            assert!(text.contains(want), "{want} in {text}");
        }
        m.forget("ctr-x");
        let text = m.encode(&[], &[]);
        assert!(!text.contains("team-a"), "{text}");
    }

    #[test]
    fn a_refused_connections_free_text_reason_is_one_label() {
        let m = Metrics::new();
        m.record(&AuditRecord {
            time: "t".into(),
            sandbox: 1,
            sandbox_name: Some("dev".into()),
            incarnation: None,
            pod: None,
            event: AuditEvent::Http(HttpEvent::decided(
                "TLS".into(),
                "deny",
                "server name evil.test is not allowed for this sandbox".into(),
            )),
        });
        let text = m.encode(&[], &[]);
        assert!(text.contains(r#"rule="connection-refused""#), "{text}");
        assert!(
            !text.contains("evil.test"),
            "a host name became a label: {text}"
        );
    }
}
