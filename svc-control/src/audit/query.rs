//! Which audit records a reader asked for (`svc audit --sandbox … --layer … --verdict …
//! --since … --until … -n N`), decided on the records as written (JSON), so rotated files and records of
//! older versions are read the same way.

use std::time::{Duration, SystemTime};

use super::layer::AuditLayer;

/// A reader's filter. Every field that is set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// The sandbox's name (or its id, as digits).
    pub sandbox: Option<String>,
    /// `packet`, `dns`, `http`, `ssh`, `policy`, … (every [`AuditLayer`]).
    pub layer: Option<AuditLayer>,
    /// `allow` or `deny`.
    pub verdict: Option<Verdict>,
    /// Records at or after this time.
    pub since: Option<SystemTime>,
    /// Records at or before this time.
    pub until: Option<SystemTime>,
    /// Only the last this many of the matching records written so far (those written later
    /// still follow).
    pub tail: Option<usize>,
    /// Only records of these sandboxes (by name), each made at or after the time it was
    /// created (so a same-named sandbox of someone else before it stays hidden): a non-root
    /// reader's own sandboxes (`policy::ownership`). `None`: every record.
    pub only: Option<Vec<(String, SystemTime)>>,
}

/// Allowed or refused, across layers' own words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny,
}

impl Verdict {
    /// The verdict a layer's own word for its outcome means: a packet's `pass`, a question
    /// `answered` (or answered `empty`) and an `allow` are allowed; anything else is refused.
    pub fn of_word(word: &str) -> Self {
        match word {
            "allow" | "answered" | "empty" | "pass" => Self::Allow,
            _ => Self::Deny,
        }
    }
}

/// A record's `time`.
fn record_time(record: &serde_json::Value) -> Option<SystemTime> {
    record["time"]
        .as_str()
        .and_then(|t| humantime::parse_rfc3339_weak(t.trim_end_matches('Z')).ok())
}

impl Filter {
    /// Build a filter from query values (`sandbox`, `layer`, `verdict`, `since` and `until`
    /// as `10m`, `2h`, … ago or an RFC 3339 time, `tail` as a number), naming what is wrong.
    pub fn parse(pairs: &[(String, String)], now: SystemTime) -> Result<Self, String> {
        let mut f = Self::default();
        for (k, v) in pairs {
            match k.as_str() {
                "sandbox" => f.sandbox = Some(v.clone()),
                "layer" => f.layer = Some(parse_layer(v)?),
                "verdict" => {
                    f.verdict = Some(match v.as_str() {
                        "allow" => Verdict::Allow,
                        "deny" => Verdict::Deny,
                        _ => return Err(format!("verdict {v:?}: expected allow or deny")),
                    });
                }
                "since" => f.since = Some(parse_time("since", v, now)?),
                "until" => f.until = Some(parse_time("until", v, now)?),
                "tail" => {
                    f.tail = Some(v.parse().map_err(|_| {
                        format!("tail {v:?}: expected a number of records, such as 20")
                    })?);
                }
                "follow" => {}
                other => return Err(format!("unknown query parameter {other:?}")),
            }
        }
        Ok(f)
    }

    /// Whether `record` (one audit line, parsed) is wanted.
    pub fn matches(&self, record: &serde_json::Value) -> bool {
        if let Some(only) = &self.only {
            let name = record["sandbox_name"].as_str();
            let at = record_time(record);
            let mine = only.iter().any(|(n, created)| {
                // Records carry milliseconds (`record::rfc3339`); compare at that grain, so a
                // record of an earlier sandbox of the same name in the same second is not
                // this one's.
                let created = created
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map(|d| SystemTime::UNIX_EPOCH + Duration::from_millis(d.as_millis() as u64))
                    .unwrap_or(*created);
                name == Some(n.as_str()) && at.is_some_and(|at| at >= created)
            });
            if !mine {
                return false;
            }
        }
        if let Some(s) = &self.sandbox {
            let by_name = record["sandbox_name"].as_str() == Some(s.as_str());
            let by_id = record["sandbox"]
                .as_u64()
                .is_some_and(|id| id.to_string() == *s);
            if !(by_name || by_id) {
                return false;
            }
        }
        if let Some(l) = self.layer
            && record["layer"].as_str() != Some(l.as_str())
        {
            return false;
        }
        if let Some(v) = self.verdict
            && verdict(record) != Some(v)
        {
            return false;
        }
        if self.since.is_some() || self.until.is_some() {
            let Some(at) = record_time(record) else {
                return false;
            };
            if self.since.is_some_and(|since| at < since)
                || self.until.is_some_and(|until| at > until)
            {
                return false;
            }
        }
        true
    }
}

/// A record's verdict in the layers' own words: a dropped packet is a deny; a DNS question
/// answered (or answered empty) is an allow, anything else a deny; an HTTP decision as given.
pub fn verdict(record: &serde_json::Value) -> Option<Verdict> {
    let word = match record["layer"].as_str()? {
        "packet" => record["verdict"].as_str()?,
        _ => record["decision"].as_str()?,
    };
    Some(Verdict::of_word(word))
}

/// A layer's name, or what is wrong with it.
fn parse_layer(v: &str) -> Result<AuditLayer, String> {
    AuditLayer::from_name(v).ok_or_else(|| {
        format!(
            "layer {v:?}: expected one of {}",
            AuditLayer::NAMES.join(", ")
        )
    })
}

/// `10s`, `10m`, `2h`, `3d` ago, or an RFC 3339 time (`key`: the parameter, for errors).
fn parse_time(key: &str, v: &str, now: SystemTime) -> Result<SystemTime, String> {
    if let Ok(t) = humantime::parse_rfc3339_weak(v.trim_end_matches('Z')) {
        return Ok(t);
    }
    let ago: Duration = humantime::parse_duration(v).map_err(|_| {
        format!("{key} {v:?}: expected a duration such as 10m or 2h, or an RFC 3339 time")
    })?;
    now.checked_sub(ago)
        .ok_or_else(|| format!("{key} {v:?}: too far back"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
    }

    /// A named case: the query and whether each of the three records matches.
    type Case = (
        &'static str,
        &'static [(&'static str, &'static str)],
        [bool; 3],
    );

    fn now() -> SystemTime {
        humantime::parse_rfc3339("2026-11-22T12:00:00Z").expect("time")
    }

    #[test]
    fn filters_match_by_sandbox_layer_verdict_and_time() {
        let dns_refused = serde_json::json!({"time":"2026-11-22T11:55:00.000Z","sandbox":3,
            "sandbox_name":"dev","layer":"dns","name":"x.test.","decision":"refused"});
        let http_allow = serde_json::json!({"time":"2026-11-22T11:00:00.000Z","sandbox":4,
            "sandbox_name":"ci","layer":"http","decision":"allow"});
        let drop = serde_json::json!({"time":"2026-11-22T11:59:00.000Z","sandbox":3,
            "sandbox_name":"dev","layer":"packet","verdict":"drop"});
        let cases: [Case; 10] = [
            ("everything", &[], [true, true, true]),
            ("by_name", &[("sandbox", "dev")], [true, false, true]),
            ("by_id", &[("sandbox", "4")], [false, true, false]),
            ("layer_dns", &[("layer", "dns")], [true, false, false]),
            ("denials", &[("verdict", "deny")], [true, false, true]),
            ("allowed", &[("verdict", "allow")], [false, true, false]),
            ("last_ten_minutes", &[("since", "10m")], [true, false, true]),
            (
                "until_ten_minutes_ago",
                &[("until", "10m")],
                [false, true, false],
            ),
            (
                "a window",
                &[
                    ("since", "2026-11-22T11:50:00Z"),
                    ("until", "2026-11-22T11:58:00Z"),
                ],
                [true, false, false],
            ),
            (
                "tail_filters_nothing_alone",
                &[("tail", "1")],
                [true, true, true],
            ),
        ];
        for (name, q, want) in cases {
            let f = Filter::parse(&pairs(q), now()).expect(name);
            let got = [&dns_refused, &http_allow, &drop].map(|r| f.matches(r));
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn bad_filters_are_named() {
        for (q, fragment) in [
            (
                &[("layer", "smtp")][..],
                "expected one of packet, dns, http, ssh",
            ),
            (&[("verdict", "maybe")][..], "expected allow or deny"),
            (&[("since", "yesterday-ish")][..], "expected a duration"),
            (
                &[("until", "later")][..],
                "until \"later\": expected a duration such as 10m or 2h, or an RFC 3339 time",
            ),
            (
                &[("tail", "-3")][..],
                "tail \"-3\": expected a number of records, such as 20",
            ),
            (&[("colour", "red")][..], "unknown query parameter"),
        ] {
            let err = Filter::parse(&pairs(q), now()).expect_err("refused");
            assert!(err.contains(fragment), "{err}");
        }
        let at = Filter::parse(&pairs(&[("since", "2026-11-22T11:00:00Z")]), now())
            .expect("an RFC 3339 time");
        assert!(at.since.is_some());
    }

    #[test]
    fn a_readers_own_sandboxes_only_since_each_was_created() {
        let created = humantime::parse_rfc3339("2026-01-01T10:00:00Z").unwrap();
        let f = Filter {
            only: Some(vec![("mine".to_owned(), created)]),
            ..Filter::default()
        };
        let rec = |name: &str, time: &str| serde_json::json!({"sandbox_name": name, "time": time});
        assert!(f.matches(&rec("mine", "2026-01-01T10:00:00.500Z")));
        assert!(
            !f.matches(&rec("mine", "2026-01-01T09:59:59Z")),
            "a same-named sandbox before it"
        );
        assert!(!f.matches(&rec("theirs", "2026-01-01T11:00:00Z")));
        assert!(!f.matches(&serde_json::json!({"time": "2026-01-01T11:00:00Z"})));
        // The same second: a record before the creation's millisecond is an earlier sandbox's.
        let later = humantime::parse_rfc3339("2026-01-01T10:00:00.600Z").unwrap();
        let f = Filter {
            only: Some(vec![("mine".to_owned(), later)]),
            ..Filter::default()
        };
        assert!(
            !f.matches(&rec("mine", "2026-01-01T10:00:00.500Z")),
            "a same-named sandbox earlier in the same second"
        );
        assert!(f.matches(&rec("mine", "2026-01-01T10:00:00.600Z")));
    }
}
