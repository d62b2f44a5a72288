//! The guard's request path: one query in, one answer out (or none for garbage): the query
//! read, the sandbox asking admitted, the name decided by `policy::dns`, resolved, its
//! addresses committed to the fence, and only then the answer.

use std::{net::IpAddr, sync::Arc, time::Duration};

use hickory_proto::{
    op::{Query, ResponseCode},
    rr::{DNSClass, Record},
};

use super::{
    rate::Buckets,
    resolve::Resolver,
    sandbox::{Commit, CommitEntry, Directory, SandboxDns},
    settings::{GuardConfig, Transport},
    wire::{self, Answer, address},
};
use crate::{
    audit::{AuditEvent, AuditSink, DnsEvent},
    policy::{
        destination::{self, HostNetwork},
        dns::{self, DnsDecision},
    },
};

/// The DNS guard. Cheap to share (`Arc`); every method takes `&self`.
pub struct Guard {
    pub(super) config: GuardConfig,
    pub(super) directory: Arc<dyn Directory>,
    commit: Arc<dyn Commit>,
    pub(super) audit: Arc<dyn AuditSink>,
    network: HostNetwork,
    resolver: Resolver,
    buckets: Buckets,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Guard {
    pub fn new(
        config: GuardConfig,
        directory: Arc<dyn Directory>,
        commit: Arc<dyn Commit>,
        audit: Arc<dyn AuditSink>,
        network: HostNetwork,
    ) -> Self {
        Self {
            config,
            directory,
            commit,
            audit,
            network,
            resolver: Resolver::default(),
            buckets: Buckets::default(),
        }
    }

    /// Answer one query from `source`. `None`: not even a DNS header; nothing is sent back.
    pub async fn handle(
        &self,
        source: IpAddr,
        query: &[u8],
        transport: Transport,
    ) -> Option<Vec<u8>> {
        let (id, msg) = match wire::read_query(query) {
            Ok(read) => read,
            Err(answer) => return answer,
        };
        let [question] = msg.queries.as_slice() else {
            return wire::error(id, ResponseCode::FormErr);
        };
        let answer = Answer::to(id, &msg, question, transport);
        let name = question.name().to_ascii();
        let qtype = u16::from(question.query_type());
        let event = DnsEvent {
            name: name.clone(),
            qtype: question.query_type().to_string(),
            decision: "refused",
            reason: None,
            answers: vec![],
            removed: vec![],
            upstream_ms: None,
            cached: false,
        };

        // A dual-stack socket reports IPv4 clients as ::ffff:a.b.c.d.
        let Some((sandbox, mut event)) = self.admit(source.to_canonical(), question, event) else {
            return answer.code(ResponseCode::Refused);
        };
        let decision = if sandbox.allow_all {
            dns::decide_allow_all(&name, qtype)
        } else {
            dns::decide(&sandbox.allowed, &name, qtype)
        };
        match decision {
            DnsDecision::Refuse { reason } => {
                event.reason = Some(reason.into());
                self.record(&sandbox, event);
                answer.code(ResponseCode::Refused)
            }
            DnsDecision::Empty { reason } => {
                event.decision = "empty";
                event.reason = Some(reason.into());
                self.record(&sandbox, event);
                answer.code(ResponseCode::NoError)
            }
            DnsDecision::Resolve { ports } => {
                let asked = Asked {
                    sandbox: &sandbox,
                    question,
                    name: &name,
                    ports,
                };
                self.resolve_and_commit(asked, event, answer).await
            }
        }
    }

    /// The sandbox asking from `source`, if it may ask now: a sandbox, class IN, within its
    /// rate. A refusal is recorded (a rate-limited one now and then) and is `None`.
    fn admit(
        &self,
        source: IpAddr,
        question: &Query,
        mut event: DnsEvent,
    ) -> Option<(Arc<SandboxDns>, DnsEvent)> {
        let Some(sandbox) = self.directory.sandbox_for(source) else {
            event.reason = Some(format!("{source} is not a sandbox"));
            self.record(&SandboxDns::unknown(), event);
            return None;
        };
        if question.query_class() != DNSClass::IN {
            event.reason = Some("only class IN is answered".into());
            self.record(&sandbox, event);
            return None;
        }
        let (rate, burst) = (self.config.rate_per_second, self.config.burst);
        if !self.buckets.take_token(sandbox.id, rate, burst) {
            event.decision = "rate-limited";
            event.reason = Some(format!(
                "more than {} queries a second",
                self.config.rate_per_second
            ));
            if self.buckets.should_report_limit(sandbox.id) {
                self.record(&sandbox, event);
            }
            return None;
        }
        Some((sandbox, event))
    }

    /// An allowed name: resolved, its answer's addresses in refused classes removed, the rest
    /// committed to the fence, and only then answered (SERVFAIL when either step fails).
    async fn resolve_and_commit(
        &self,
        asked: Asked<'_>,
        mut event: DnsEvent,
        mut answer: Answer<'_>,
    ) -> Option<Vec<u8>> {
        let sandbox = asked.sandbox;
        let (rcode, records) = match self
            .resolver
            .resolve(&self.config, asked.question, &mut event)
            .await
        {
            Ok(r) => r,
            Err(why) => {
                event.decision = "servfail";
                event.reason = Some(why);
                self.record(sandbox, event);
                return answer.code(ResponseCode::ServFail);
            }
        };
        let (kept, removed) = self.filter(records);
        event.removed = removed;
        let entries = asked.entries(&kept);
        event.answers = entries.iter().map(|e| e.addr).collect();
        if !entries.is_empty()
            && let Err(why) = self.commit.commit(sandbox, &entries)
        {
            event.decision = "servfail";
            event.reason = Some(format!("the fence did not take the addresses: {why}"));
            self.record(sandbox, event);
            return answer.code(ResponseCode::ServFail);
        }
        event.decision = "answered";
        self.record(sandbox, event);
        answer.reply.add_answers(kept);
        answer.code(rcode)
    }

    /// Remove address records in refused destination classes.
    fn filter(&self, records: Vec<Record>) -> (Vec<Record>, Vec<IpAddr>) {
        let mut removed = Vec::new();
        let kept = records
            .into_iter()
            .filter(|r| match address(r) {
                Some(a) if !destination::classify(a, &self.network).reachable() => {
                    removed.push(a);
                    false
                }
                _ => true,
            })
            .collect();
        (kept, removed)
    }

    /// `event` of `sandbox` (its incarnation as the question found it).
    fn record(&self, sandbox: &SandboxDns, event: DnsEvent) {
        // On a serving thread, gathered with the rest of its turn (see `serve_udp_threads`).
        let _ = crate::audit::emit_here(
            &self.audit,
            sandbox.id,
            &sandbox.incarnation,
            AuditEvent::Dns(event),
        );
    }
}

/// An allowed question: who asked it, and the ports its answer's addresses open.
struct Asked<'a> {
    sandbox: &'a SandboxDns,
    question: &'a Query,
    /// The name as asked.
    name: &'a str,
    ports: Vec<u16>,
}

impl Asked<'_> {
    /// What the fence is to open for the address records of `kept`.
    fn entries(&self, kept: &[Record]) -> Vec<CommitEntry> {
        let name = self.name;
        kept.iter()
            .filter_map(|r| {
                address(r).map(|addr| CommitEntry {
                    name: crate::hosts::normalize_name(name)
                        .unwrap_or_else(|_| name.trim_end_matches('.').to_ascii_lowercase()),
                    addr,
                    tcp_ports: self.ports.clone(),
                    ttl: Duration::from_secs(u64::from(r.ttl)),
                })
            })
            .collect()
    }
}
