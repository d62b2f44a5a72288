//! Which audit records a reader asked for (`svc audit --sandbox … --layer … --verdict …
//! --since … --until … -n N`), decided on the records as written (JSON), so rotated files and records of
//! older versions are read the same way.

use std::time::{Duration, SystemTime};

use super::layer::AuditLayer;

/// A reader's filter. Every field that is set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// The sandbox's name, its id (as digits) or its incarnation.
    pub sandbox: Option<String>,
    /// The Kubernetes pod the records are of (`pod` of the record).
    pub pod: Option<crate::api::PodRef>,
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
    /// Only records of these incarnations (`AuditRecord::incarnation`): a non-root reader's
    /// own sandboxes (`policy::ownership`). Names and ids are reused, so neither tells a
    /// record of the reader's sandbox from one of an earlier sandbox of that name or id
    /// written late; a record without an incarnation (of an older version, or one the writer
    /// could not place) is not shown. `None`: every record.
    pub only: Option<Vec<String>>,
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
                "pod" => f.pod = Some(crate::api::PodRef::parse(v)?),
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
            let of = record["incarnation"].as_str();
            if !of.is_some_and(|of| only.iter().any(|mine| mine == of)) {
                return false;
            }
        }
        if let Some(s) = &self.sandbox {
            let by_name = record["sandbox_name"].as_str() == Some(s.as_str())
                || record["incarnation"].as_str() == Some(s.as_str());
            let by_id = record["sandbox"]
                .as_u64()
                .is_some_and(|id| id.to_string() == *s);
            if !(by_name || by_id) {
                return false;
            }
        }
        if let Some(p) = &self.pod
            && (record["pod"]["namespace"].as_str() != Some(p.namespace.as_str())
                || record["pod"]["name"].as_str() != Some(p.name.as_str()))
        {
            return false;
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
            "sandbox_name":"ci","pod":{"namespace":"team-a","name":"ci-0"},"layer":"http",
            "decision":"allow"});
        let drop = serde_json::json!({"time":"2026-11-22T11:59:00.000Z","sandbox":3,
            "sandbox_name":"dev","layer":"packet","verdict":"drop"});
        let cases: [Case; 12] = [
            ("everything", &[], [true, true, true]),
            ("by_pod", &[("pod", "team-a/ci-0")], [false, true, false]),
            (
                "another_pod",
                &[("pod", "team-b/ci-0")],
                [false, false, false],
            ),
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
            (&[("pod", "team-a")][..], "expected NAMESPACE/NAME"),
            (&[("pod", "Team/x")][..], "pod namespace \"Team\""),
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

    /// A reader's own sandboxes: by incarnation only (named cases: the record, whether the
    /// reader of incarnation `b2` sees it).
    #[test]
    fn a_readers_own_sandboxes_by_incarnation_only() {
        let f = Filter {
            only: Some(vec!["b2b2b2b2b2b2b2b2".to_owned()]),
            ..Filter::default()
        };
        let mine = serde_json::json!({"time": "2026-01-01T10:00:00.500Z", "sandbox": 3,
            "sandbox_name": "dev", "incarnation": "b2b2b2b2b2b2b2b2", "layer": "http"});
        let cases = [
            ("its_own", mine.clone(), true),
            (
                "same_id_and_name_later_but_an_earlier_incarnation",
                serde_json::json!({"time": "2026-01-01T11:00:00.000Z", "sandbox": 3,
                    "sandbox_name": "dev", "incarnation": "a1a1a1a1a1a1a1a1", "layer": "http"}),
                false,
            ),
            (
                "no_incarnation_an_older_version",
                serde_json::json!({"time": "2026-01-01T11:00:00.000Z", "sandbox": 3,
                    "sandbox_name": "dev", "layer": "http"}),
                false,
            ),
            (
                "no_sandbox_a_host_record",
                serde_json::json!({"time": "2026-01-01T11:00:00.000Z", "sandbox": 0,
                    "layer": "credential"}),
                false,
            ),
            (
                "incarnation_not_a_string",
                serde_json::json!({"sandbox": 3, "sandbox_name": "dev", "incarnation": 7}),
                false,
            ),
        ];
        for (name, record, want) in &cases {
            assert_eq!(f.matches(record), *want, "{name}");
        }
        let by_incarnation = Filter {
            sandbox: Some("b2b2b2b2b2b2b2b2".into()),
            ..Filter::default()
        };
        assert!(
            by_incarnation.matches(&mine),
            "--sandbox takes an incarnation too"
        );
        assert!(
            Filter::default().matches(&cases[2].1),
            "root reads every record"
        );
    }
}
