//! The answer records for an allowed question: from the cache, else from the upstream
//! (following CNAMEs), with TTLs clamped.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use hickory_proto::{
    op::{Message, MessageType, Query, ResponseCode},
    rr::{Name, RData, Record, RecordType},
};

use super::{
    settings::GuardConfig,
    upstream::Sockets,
    wire::{address, chain_tail},
};
use crate::audit::DnsEvent;

struct Cached {
    records: Vec<Record>,
    stored: Instant,
    lifetime: Duration,
    rcode: ResponseCode,
}

/// The guard's resolver: its cache and its pooled upstream sockets.
#[derive(Default)]
pub(super) struct Resolver {
    cache: Mutex<HashMap<(String, u16), Cached>>,
    sockets: Sockets,
}

impl Resolver {
    /// The answer records for an allowed question: cache, else upstream (following CNAMEs),
    /// with TTLs clamped.
    pub async fn resolve(
        &self,
        config: &GuardConfig,
        question: &Query,
        event: &mut DnsEvent,
    ) -> Result<(ResponseCode, Vec<Record>), String> {
        let key = (
            question.name().to_lowercase().to_ascii(),
            u16::from(question.query_type()),
        );
        if let Some((rcode, records)) = self.cached(config, &key) {
            event.cached = true;
            return Ok((rcode, records));
        }
        let started = Instant::now();
        let (rcode, mut records) = self.follow(config, question).await?;
        event.upstream_ms = Some(u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX));
        let (min, max) = (config.ttl_min.as_secs(), config.ttl_max.as_secs());
        for r in &mut records {
            r.ttl = u32::try_from(u64::from(r.ttl).clamp(min, max)).unwrap_or(u32::MAX);
        }
        let lifetime = records
            .iter()
            .map(|r| r.ttl)
            .min()
            .map_or(config.ttl_min, |t| Duration::from_secs(u64::from(t)));
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() > 100_000 {
                cache.retain(|_, c| c.stored.elapsed() < c.lifetime);
            }
            cache.insert(
                key,
                Cached {
                    records: records.clone(),
                    stored: Instant::now(),
                    lifetime,
                    rcode,
                },
            );
        }
        Ok((rcode, records))
    }

    /// Ask the upstream, following the chain while it ends in a CNAME with no address for its
    /// target (at most `max_cname_hops` more questions).
    async fn follow(
        &self,
        config: &GuardConfig,
        question: &Query,
    ) -> Result<(ResponseCode, Vec<Record>), String> {
        let mut records: Vec<Record> = Vec::new();
        let mut target = question.name().clone();
        let mut rcode = ResponseCode::NoError;
        for _ in 0..=config.max_cname_hops {
            let (code, answers) = self.ask(config, &target, question.query_type()).await?;
            rcode = code;
            let before = records.len();
            records.extend(
                answers
                    .into_iter()
                    .filter(|r| matches!(r.data, RData::A(_) | RData::AAAA(_) | RData::CNAME(_))),
            );
            // Follow the chain only if it ends in a CNAME with no address for its target.
            let tail = chain_tail(&records[before..], &target);
            let has_final = records[before..]
                .iter()
                .any(|r| r.name == tail && address(r).is_some());
            if tail == target
                || has_final
                || rcode != ResponseCode::NoError
                || question.query_type() == RecordType::CNAME
            {
                break;
            }
            target = tail;
        }
        Ok((rcode, records))
    }

    async fn ask(
        &self,
        config: &GuardConfig,
        name: &Name,
        rtype: RecordType,
    ) -> Result<(ResponseCode, Vec<Record>), String> {
        let mut q = Message::query();
        q.metadata.recursion_desired = true;
        q.add_query(Query::query(name.clone(), rtype));
        let bytes = q
            .to_vec()
            .map_err(|e| format!("encoding the upstream query: {e}"))?;
        let answer = config
            .upstream
            .ask_pooled(&self.sockets, &bytes, q.metadata.id)
            .await
            .map_err(|e| format!("upstream: {e}"))?;
        let answer = Message::from_vec(&answer)
            .map_err(|e| format!("upstream answer does not parse: {e}"))?;
        if answer.metadata.message_type != MessageType::Response
            || answer.queries.first() != q.queries.first()
        {
            return Err("upstream answered another question".into());
        }
        Ok((answer.metadata.response_code, answer.answers))
    }

    fn cached(
        &self,
        config: &GuardConfig,
        key: &(String, u16),
    ) -> Option<(ResponseCode, Vec<Record>)> {
        let cache = self.cache.lock().ok()?;
        let c = cache.get(key)?;
        let age = c.stored.elapsed();
        if age >= c.lifetime {
            return None;
        }
        // Whole seconds rounded up: an answer never promises more life than its fence entry
        // was given (which lets `Fence::add_allow` skip rewriting an entry that covers it).
        let elapsed =
            u32::try_from(age.as_secs() + u64::from(age.subsec_nanos() > 0)).unwrap_or(u32::MAX);
        let floor = u32::try_from(config.ttl_min.as_secs()).unwrap_or(30);
        let records = c
            .records
            .iter()
            .map(|r| {
                let mut r = r.clone();
                r.ttl = r.ttl.saturating_sub(elapsed).max(floor.min(r.ttl));
                r
            })
            .collect();
        Some((c.rcode, records))
    }
}
