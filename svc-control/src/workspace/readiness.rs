//! When a workspace is ready: every service of its readiness profile is up (healthy, with a
//! health check; else running for `svc_guest::services::SETTLE`). Which profile: the one asked
//! for, else `default`, else the only one, else every service.

use std::collections::BTreeMap;

use crate::{api::ReadinessProfile, config::workspace::ReadinessEntry};

/// The readiness profile to wait for, or `None` for every service; an unknown name is an
/// error listing the profiles there are.
pub fn pick_profile(
    profiles: &BTreeMap<String, Vec<ReadinessEntry>>,
    asked: Option<&str>,
) -> Result<Option<ReadinessProfile>, String> {
    let chosen = match asked {
        Some(p) => Some(profiles.get_key_value(p).ok_or_else(|| {
            format!(
                "--profile {p}: the workspace has no such readiness profile (it has: {})",
                if profiles.is_empty() {
                    "none".to_owned()
                } else {
                    profiles.keys().cloned().collect::<Vec<_>>().join(", ")
                }
            )
        })?),
        None => profiles.get_key_value("default").or_else(|| {
            (profiles.len() == 1)
                .then(|| profiles.iter().next())
                .flatten()
        }),
    };
    Ok(chosen.map(|(name, entries)| ReadinessProfile {
        name: name.clone(),
        services: entries.iter().map(|e| e.service_name.clone()).collect(),
    }))
}

/// The services readiness waits for: the profile's, or all of `services`.
pub fn needed(profile: Option<&ReadinessProfile>, services: &[String]) -> Vec<String> {
    profile.map_or_else(|| services.to_vec(), |p| p.services.clone())
}

/// Whether every needed service is up (`up`: by name).
pub fn ready(needed: &[String], up: &BTreeMap<String, bool>) -> bool {
    needed.iter().all(|n| up.get(n).copied().unwrap_or(false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::workspace::ReadinessKind;

    fn entry(service: &str) -> ReadinessEntry {
        ReadinessEntry {
            name: service.into(),
            kind: ReadinessKind::Service,
            service_name: service.into(),
        }
    }

    #[test]
    fn profile_cases() {
        let mut both = BTreeMap::new();
        both.insert("default".to_owned(), vec![entry("web")]);
        both.insert("full".to_owned(), vec![entry("web"), entry("db")]);
        let mut one = BTreeMap::new();
        one.insert("only".to_owned(), vec![entry("db")]);
        let none = BTreeMap::new();
        let name = |r: Result<Option<ReadinessProfile>, String>| r.map(|p| p.map(|p| p.name));
        assert_eq!(name(pick_profile(&both, None)), Ok(Some("default".into())));
        assert_eq!(
            name(pick_profile(&both, Some("full"))),
            Ok(Some("full".into()))
        );
        assert_eq!(name(pick_profile(&one, None)), Ok(Some("only".into())));
        assert_eq!(name(pick_profile(&none, None)), Ok(None));
        let mut two = one.clone();
        two.insert("other".to_owned(), vec![entry("web")]);
        assert_eq!(
            name(pick_profile(&two, None)),
            Ok(None),
            "two, no default: every service"
        );
        let err = pick_profile(&both, Some("nope")).expect_err("unknown");
        assert!(err.contains("(it has: default, full)"), "{err}");
        assert!(
            pick_profile(&none, Some("x"))
                .expect_err("none")
                .contains("(it has: none)")
        );
    }

    #[test]
    fn ready_when_every_needed_service_is_up() {
        let all = ["web".to_owned(), "db".to_owned(), "crash".to_owned()];
        let profile = ReadinessProfile {
            name: "default".into(),
            services: vec!["web".into(), "db".into()],
        };
        let needed_p = needed(Some(&profile), &all);
        let needed_all = needed(None, &all);
        let mut up = BTreeMap::new();
        up.insert("web".to_owned(), true);
        assert!(!ready(&needed_p, &up), "db not up yet");
        up.insert("db".to_owned(), true);
        assert!(ready(&needed_p, &up), "crash is not in the profile");
        assert!(
            !ready(&needed_all, &up),
            "without a profile every service counts"
        );
        up.insert("crash".to_owned(), false);
        assert!(!ready(&needed_all, &up));
        assert!(
            ready(&needed(None, &[]), &BTreeMap::new()),
            "no services: ready"
        );
    }
}
