//! Per-guest budgets: how many of each channel one sandbox holds open in svcd at once (DNS
//! over TCP, proxy connections, exec and Spotlight streams, relay sessions), from svcd.toml's
//! `[limits]`.
//!
//! A channel asks [`GuestLimits::acquire`] for a [`Slot`] before it takes anything else for a
//! guest (a task, a buffer, an upstream descriptor) and holds it for as long as it serves; the
//! slot is given back when dropped. At the cap the caller refuses on that channel only, and
//! the hit is told to a [`Report`] (svcd: the metric `svc_guest_limit_hits_total` and a log line
//! at most once per `log_interval` per sandbox and limit).
//!
//! A sandbox's audit records are held to a rate instead ([`GuestLimits::admit_audit`],
//! [`audit::Budget`]).
//!
//! Everything is kept per [`Guest`] (a sandbox id and its incarnation), never per id alone: ids
//! are reused at once after a destroy. Teardown ends a guest ([`GuestLimits::end`]): each task
//! holding one of its slots sees [`Slot::ended`] and lets go, and teardown waits for that
//! ([`Ending::drained`], bounded) before the id is freed.

pub mod audit;
mod guest;

pub use guest::{Ending, Guest};

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use crate::config::limits::LimitsConfig;

/// A channel a guest can open, and so a key of `[limits]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Channel {
    DnsTcp,
    Proxy,
    ProxyRequests,
    Exec,
    Spotlight,
    GitSsh,
    /// Audit records a second (a rate, not a count held: see [`audit::Budget`]).
    AuditRecords,
    /// Service events a second from the guest's service supervisor (a built-in rate).
    ServiceEvents,
}

impl Channel {
    /// Its key in `[limits]` (and its `limit` label in `svc_guest_limit_hits_total`).
    pub fn key(self) -> &'static str {
        match self {
            Self::DnsTcp => "dns_tcp_connections",
            Self::Proxy => "proxy_connections",
            Self::ProxyRequests => "proxy_requests",
            Self::Exec => "exec_streams",
            Self::Spotlight => "spotlight_streams",
            Self::GitSsh => "git_ssh_sessions",
            Self::AuditRecords => "audit_records_per_sec",
            Self::ServiceEvents => "service_events",
        }
    }

    /// What one of it is, for people.
    fn what(self) -> &'static str {
        match self {
            Self::DnsTcp => "DNS-over-TCP connections",
            Self::Proxy => "proxy connections",
            Self::ProxyRequests => "requests being read by the proxy",
            Self::Exec => "exec streams",
            Self::Spotlight => "Spotlight streams",
            Self::GitSsh => "git SSH sessions",
            Self::AuditRecords => "audit records a second",
            Self::ServiceEvents => "service events a second",
        }
    }
}

/// Where hits go: svcd counts them and logs them (see `daemon::wiring`).
pub trait Report: Send + Sync {
    /// `sandbox` reached `limit` (held `max` of it). `log`: the first hit of this sandbox at
    /// this limit in `log_interval`, to be logged; the others are only counted.
    fn limit_hit(&self, sandbox: &Guest, limit: Channel, max: u32, log: bool);
}

/// No one to tell (unit tests, tools).
#[derive(Debug, Default)]
pub struct Unreported;

impl Report for Unreported {
    fn limit_hit(&self, _: &Guest, _: Channel, _: u32, _: bool) {}
}

/// A refusal: the sandbox already holds `max` of `channel`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("this sandbox already holds {max} {what} (limits.{key}): refused", what = .channel.what(), key = .channel.key())]
pub struct LimitHit {
    pub channel: Channel,
    pub max: u32,
}

/// The caps and what each sandbox holds. Share it with `Arc`.
pub struct GuestLimits {
    config: LimitsConfig,
    report: Arc<dyn Report>,
    held: Mutex<HashMap<Guest, guest::Held>>,
    /// Guests torn down lately (a slot taken for one is cut at once).
    ended: Mutex<guest::Ended>,
    /// When each (sandbox, limit) was last logged.
    logged: Mutex<HashMap<(Guest, Channel), Instant>>,
    /// Records of what was refused or only seen (every guest-driven record but an allowed one).
    audit: audit::Budget,
    /// Records of allowed requests, questions and sessions: a budget of their own, so a flood
    /// of refusals never leaves an allowed (perhaps credential-bearing) request unrecorded.
    audit_allowed: audit::Budget,
    service_events: audit::Budget,
}

/// Service events (`workspace.service_*`) one sandbox's supervisor may raise a second, and at
/// once: its reports come from inside the guest, which can forge them, and events are kept
/// for the whole host (the last 10,000).
pub const SERVICE_EVENTS_PER_SEC: u32 = 10;
pub const SERVICE_EVENTS_BURST: u32 = 200;

impl std::fmt::Debug for GuestLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestLimits")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Default for GuestLimits {
    /// The documented defaults, told to no one.
    fn default() -> Self {
        Self::new(LimitsConfig::default(), Arc::new(Unreported))
    }
}

impl GuestLimits {
    pub fn new(config: LimitsConfig, report: Arc<dyn Report>) -> Self {
        Self {
            audit: audit::Budget::new(config.audit_records_per_sec, config.audit_burst),
            audit_allowed: audit::Budget::new(config.audit_records_per_sec, config.audit_burst),
            service_events: audit::Budget::new(SERVICE_EVENTS_PER_SEC, SERVICE_EVENTS_BURST),
            config,
            report,
            held: Mutex::default(),
            ended: Mutex::default(),
            logged: Mutex::default(),
        }
    }

    /// Whether `sandbox`'s next audit record of `layer` is written (within its
    /// `audit_records_per_sec`) or only counted; each one counted is a hit, reported (logged
    /// when it is the first since the sandbox was last within its budget and in the interval).
    /// Records of allowed traffic (`allowed`) spend a budget of their own, the same size: a
    /// flood of refusals never starves them, and the log takes at most twice the rate.
    pub fn admit_audit(&self, sandbox: &Guest, layer: &'static str, allowed: bool) -> bool {
        let now = Instant::now();
        let budget = if allowed {
            &self.audit_allowed
        } else {
            &self.audit
        };
        match budget.admit(sandbox, layer, now) {
            audit::Admit::Write => true,
            audit::Admit::Suppress { first } => {
                let log = first && self.first_in_interval(sandbox, Channel::AuditRecords, now);
                let max = self.config.audit_records_per_sec;
                self.report
                    .limit_hit(sandbox, Channel::AuditRecords, max, log);
                false
            }
        }
    }

    /// Whether `sandbox`'s supervisor may raise one more service event now; one that may not is
    /// a hit (reported; logged as the first past the rate in the interval).
    pub fn admit_service_event(&self, sandbox: &Guest) -> bool {
        let now = Instant::now();
        match self.service_events.admit(sandbox, "service", now) {
            audit::Admit::Write => true,
            audit::Admit::Suppress { first } => {
                let log = first && self.first_in_interval(sandbox, Channel::ServiceEvents, now);
                self.report
                    .limit_hit(sandbox, Channel::ServiceEvents, SERVICE_EVENTS_PER_SEC, log);
                false
            }
        }
    }

    /// Forget what the service-event rate has counted (svcd's 5 s tick): the next sandbox past
    /// it is logged again, and buckets full again are dropped.
    pub fn tick(&self) {
        let _ = self.service_events.take_suppressed(Instant::now());
    }

    /// Each sandbox's audit records counted and not written since the last call, by layer.
    pub fn take_suppressed_audit(
        &self,
    ) -> Vec<(Guest, std::collections::BTreeMap<&'static str, u64>)> {
        let now = Instant::now();
        audit::merge_suppressed(
            self.audit.take_suppressed(now),
            self.audit_allowed.take_suppressed(now),
        )
    }

    /// The audit budget: (records a second, burst).
    pub fn audit_budget(&self) -> (u32, u32) {
        (self.config.audit_records_per_sec, self.config.audit_burst)
    }

    /// The cap of `channel`.
    pub fn max(&self, channel: Channel) -> u32 {
        match channel {
            Channel::DnsTcp => self.config.dns_tcp_connections,
            Channel::Proxy => self.config.proxy_connections,
            Channel::ProxyRequests => self.config.proxy_requests,
            Channel::Exec => self.config.exec_streams,
            Channel::Spotlight => self.config.spotlight_streams,
            Channel::GitSsh => self.config.git_ssh_sessions,
            Channel::AuditRecords => self.config.audit_records_per_sec,
            Channel::ServiceEvents => SERVICE_EVENTS_PER_SEC,
        }
    }

    /// One more `channel` for `sandbox`, held until the slot drops; at the cap, a refusal
    /// (reported). A slot of a guest already ended is given, and [`Slot::ended`] at once.
    pub fn acquire(self: &Arc<Self>, sandbox: &Guest, channel: Channel) -> Result<Slot, LimitHit> {
        let max = self.max(channel);
        {
            let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            let h = held.entry(sandbox.clone()).or_insert_with(|| {
                let ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
                guest::Held::new(ended.contains(sandbox))
            });
            let n = h.counts.entry(channel).or_insert(0);
            if *n < max {
                *n += 1;
                return Ok(Slot {
                    limits: self.clone(),
                    sandbox: sandbox.clone(),
                    channel,
                    end: h.end.subscribe(),
                });
            }
        }
        let log = self.first_in_interval(sandbox, channel, Instant::now());
        self.report.limit_hit(sandbox, channel, max, log);
        Err(LimitHit { channel, max })
    }

    /// How many of `channel` `sandbox` holds now.
    pub fn held(&self, sandbox: &Guest, channel: Channel) -> u32 {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(sandbox)
            .and_then(|h| h.counts.get(&channel).copied())
            .unwrap_or(0)
    }

    /// What `sandbox` holds now, by channel (none held: empty).
    fn holding(&self, sandbox: &Guest) -> Vec<(Channel, u32)> {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(sandbox)
            .map(|h| h.counts.iter().map(|(c, n)| (*c, *n)).collect())
            .unwrap_or_default()
    }

    /// `sandbox` was torn down: each task holding one of its slots is told
    /// ([`Slot::ended`]), and so is any that takes one later. Wait on the answer
    /// ([`Ending::drained`]) for them to let go.
    pub fn end(self: &Arc<Self>, sandbox: &Guest) -> Ending {
        self.ended
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(sandbox.clone());
        let (end, cut) = {
            let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
            let h = held.get(sandbox);
            let cut = h.map(|h| h.counts.iter().map(|(c, n)| (*c, *n)).collect());
            (h.map(|h| h.end.clone()), cut.unwrap_or_default())
        };
        if let Some(end) = &end {
            end.send_replace(true);
        }
        Ending {
            guest: sandbox.clone(),
            end,
            limits: Arc::downgrade(self),
            cut: guest::by_key(cut),
        }
    }

    /// Whether a hit at `now` is the first of its (sandbox, limit) in the log interval.
    fn first_in_interval(&self, sandbox: &Guest, channel: Channel, now: Instant) -> bool {
        let mut logged = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
        let interval = self.config.log_interval;
        // Old entries go, so the map holds only sandboxes that hit a limit lately.
        if logged.len() > 1024 {
            logged.retain(|_, at| now.saturating_duration_since(*at) < interval);
        }
        let key = (sandbox.clone(), channel);
        match logged.get(&key) {
            Some(at) if now.saturating_duration_since(*at) < interval => false,
            _ => {
                logged.insert(key, now);
                true
            }
        }
    }

    fn release(&self, sandbox: &Guest, channel: Channel) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = held.get_mut(sandbox) {
            if let Some(n) = h.counts.get_mut(&channel) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    h.counts.remove(&channel);
                }
            }
            if h.counts.is_empty() {
                held.remove(sandbox);
            }
        }
    }
}

/// One channel held by one sandbox, until dropped.
pub struct Slot {
    limits: Arc<GuestLimits>,
    sandbox: Guest,
    channel: Channel,
    /// Whether its guest was torn down.
    end: tokio::sync::watch::Receiver<bool>,
}

impl Slot {
    /// Until its sandbox is torn down ([`GuestLimits::end`]): what serves under it stops then
    /// (and lets the slot go).
    pub fn ended(&self) -> impl std::future::Future<Output = ()> + Send + use<> {
        guest::until_ended(self.end.clone())
    }
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("sandbox", &self.sandbox)
            .field("channel", &self.channel)
            .finish()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.limits.release(&self.sandbox, self.channel);
    }
}

#[cfg(test)]
mod tests;
