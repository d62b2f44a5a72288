//! Property tests for the three parsers (workspace.json, config.yaml, compose): on any input
//! they return a value or errors that name the file and say why; they never panic. The case
//! count is fixed, so the run is bounded; `PROPTEST_CASES` raises it for a longer soak.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

use std::path::Path;

use proptest::prelude::*;
use svc_control::config::{ConfigErrors, compose, egress, workspace};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(512),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn errors_are_explained(e: &ConfigErrors, file: &str) -> Result<(), TestCaseError> {
    prop_assert!(!e.0.is_empty());
    for err in &e.0 {
        prop_assert_eq!(err.file.as_path(), Path::new(file));
        prop_assert!(!err.message.is_empty());
    }
    Ok(())
}

/// Arbitrary JSON values, biased toward the keys a workspace.json has.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let key = prop_oneof![
        Just("version".to_owned()),
        Just("$schema".to_owned()),
        Just("doctor".to_owned()),
        Just("probes".to_owned()),
        Just("tests".to_owned()),
        Just("name".to_owned()),
        Just("command".to_owned()),
        Just("timeoutMs".to_owned()),
        Just("runtime".to_owned()),
        Just("required".to_owned()),
        Just("capabilities".to_owned()),
        Just("spotlight".to_owned()),
        Just("defaults".to_owned()),
        Just("readiness".to_owned()),
        Just("profiles".to_owned()),
        "[a-zA-Z$]{0,8}",
    ];
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::Bool),
        any::<i64>().prop_map(|n| serde_json::json!(n)),
        Just(serde_json::json!(1)),
        any::<f64>().prop_map(|f| serde_json::json!(f)),
        "\\PC{0,12}".prop_map(serde_json::Value::String),
        Just(serde_json::json!("spotlight.tunnel")),
        Just(serde_json::json!("microvm")),
    ];
    leaf.prop_recursive(5, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6)
                .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn workspace_json_never_panics_on_bytes(text in "\\PC{0,256}") {
        if let Err(e) = workspace::parse(Path::new("w.json"), &text) {
            errors_are_explained(&e, "w.json")?;
        }
    }

    #[test]
    fn workspace_json_never_panics_on_structured_values(value in json_value()) {
        let text = value.to_string();
        if let Err(e) = workspace::parse(Path::new("w.json"), &text) {
            errors_are_explained(&e, "w.json")?;
        }
    }

    #[test]
    fn workspace_json_accepts_exactly_what_its_schema_and_rules_accept(version in 0u64..3, timeout in 0u64..3, dup in any::<bool>()) {
        let second = if dup { "a" } else { "b" };
        let text = format!(r#"{{"version":{version},"doctor":{{"probes":[{{"name":"a","command":"x","timeoutMs":{timeout}}}],"tests":[{{"name":"{second}","command":"y"}}]}}}}"#);
        let ok = workspace::parse(Path::new("w.json"), &text).is_ok();
        prop_assert_eq!(ok, version == 1 && timeout >= 1 && !dup);
    }

    #[test]
    fn config_yaml_never_panics(text in "(egress:\n  (allow|policy|secrets):( |\n    )[-a-z.:\\[\\]{}*&!|>\"' \n#]{0,80}){0,3}") {
        if let Err(e) = egress::parse(Path::new("c.yaml"), &text) {
            errors_are_explained(&e, "c.yaml")?;
        }
    }

    #[test]
    fn config_yaml_never_panics_on_bytes(text in "\\PC{0,200}") {
        if let Err(e) = egress::parse(Path::new("c.yaml"), &text) {
            errors_are_explained(&e, "c.yaml")?;
        }
    }

    #[test]
    fn allow_policy_clash_is_found_under_any_spelling(host in "[a-z]{1,8}\\.[a-z]{2,5}", upper in any::<bool>(), dot in any::<bool>()) {
        let mut spelled = if upper { host.to_uppercase() } else { host.clone() };
        if dot { spelled.push('.'); }
        let text = format!("egress:\n  allow: [\"{spelled}\"]\n  policy:\n    {host}: {{}}\n");
        let errors = egress::parse(Path::new("c.yaml"), &text).unwrap_err().0;
        prop_assert_eq!(&errors[0].message, &egress::clash_message(&spelled));
    }

    #[test]
    fn compose_ports_never_panic(entry in "[-0-9:\\[\\]a-f./${}A-Z_?+]{0,30}") {
        let text = format!("services:\n  app:\n    ports:\n      - \"{entry}\"\n");
        let env = compose::Environment::default();
        match compose::parse(Path::new("compose.yaml"), &text, &env) {
            Ok(p) => for f in p.forwards {
                prop_assert!(f.remote_port > 0 && f.local_port > 0);
            },
            Err(e) => errors_are_explained(&e, "compose.yaml")?,
        }
    }

    #[test]
    fn compose_short_ranges_pair_one_to_one(lo in 1u16..60000, len in 0u16..20, shift in 0u16..1000) {
        let spec = format!("{}-{}:{}-{}", lo + shift, lo + shift + len, lo, lo + len);
        let text = format!("services:\n  app:\n    ports: [\"{spec}\"]\n");
        let p = compose::parse(Path::new("compose.yaml"), &text, &compose::Environment::default()).unwrap();
        prop_assert_eq!(p.forwards.len(), usize::from(len) + 1);
        for f in p.forwards {
            prop_assert_eq!(f.local_port, f.remote_port + shift);
        }
    }

    #[test]
    fn interpolation_never_panics(s in "[$a-zA-Z_{}:?+\\-0-9 ]{0,40}") {
        let _ = compose::interpolate(&s, &compose::Environment::default());
    }

    #[test]
    fn dotenv_never_panics(s in "\\PC{0,200}") {
        let _ = compose::parse_dotenv(Path::new(".env"), &s);
    }
}
