//! The audit record's shapes: `schema/audit.v1.json` is what the types generate, every layer's
//! record validates against it, and no record carries a key twice (the sandbox's name and a DNS
//! question's name used to share `name`).

use std::net::IpAddr;

use svc_control::audit::{
    self, AuditEvent, AuditRecord, DnsEvent, HttpEvent, PacketEvent, parse_strict,
};

fn records() -> Vec<(&'static str, AuditRecord)> {
    let base = |event| AuditRecord {
        time: "2026-11-22T10:00:00.000Z".into(),
        sandbox: 3,
        sandbox_name: Some("dev".into()),
        incarnation: Some("5f0c2a9e41d7b638".into()),
        pod: Some(
            svc_control::api::PodRef::new("team-a", "agent-7")
                .unwrap_or_else(|e| panic!("a valid pod: {e}")),
        ),
        event,
    };
    vec![
        (
            "dns",
            base(AuditEvent::Dns(DnsEvent {
                name: "forbidden.example.test.".into(),
                qtype: "A".into(),
                decision: "refused",
                reason: Some("name not allowed for this sandbox".into()),
                answers: Vec::new(),
                removed: Vec::new(),
                upstream_ms: None,
                cached: false,
            })),
        ),
        (
            "packet",
            base(AuditEvent::Packet(PacketEvent {
                verdict: "drop",
                reason: "drop_tcp_not_allowed",
                protocol: Some("tcp".into()),
                src: Some(IpAddr::from([10, 203, 0, 2])),
                dst: Some(IpAddr::from([192, 0, 2, 66])),
                src_port: Some(40312),
                dst_port: Some(443),
                link: 7,
                suppressed: 0,
            })),
        ),
        (
            "http",
            base(AuditEvent::Http(HttpEvent {
                host: Some("api.code.test".into()),
                method: "GET".into(),
                path: Some("/repos/acme/widget".into()),
                status: 200,
                decision: "allow",
                rule: "code-host-api".into(),
                credential: "swapped",
                bytes_up: 0,
                bytes_down: 5120,
                duration_ms: 84,
                upgrade: None,
                dialled: None,
                refs: Vec::new(),
                reason: None,
            })),
        ),
        (
            "http", // a push held to AllowedBranches, with its refs
            base(AuditEvent::Http(HttpEvent {
                host: Some("code.test".into()),
                method: "POST".into(),
                path: Some("/acme/widget.git/git-receive-pack".into()),
                status: 403,
                decision: "deny",
                rule: "smart-http-push-refused".into(),
                credential: "none",
                bytes_up: 0,
                bytes_down: 240,
                duration_ms: 3,
                upgrade: None,
                dialled: None,
                refs: vec![svc_control::audit::SshRef {
                    name: "refs/heads/main".into(),
                    old: "1".repeat(40),
                    new: "2".repeat(40),
                }],
                reason: None,
            })),
        ),
        (
            "suppressed", // a sandbox past its share of the log
            base(AuditEvent::Suppressed(
                svc_control::audit::SuppressedEvent {
                    records: [("dns".to_owned(), 812), ("http".to_owned(), 3)].into(),
                    per_sec: 50,
                    burst: 2000,
                },
            )),
        ),
    ]
}

#[test]
fn the_shipped_schema_is_the_generated_one() {
    let committed: serde_json::Value =
        serde_json::from_str(include_str!("../../schema/audit.v1.json")).expect("valid JSON");
    assert_eq!(
        committed,
        audit::schema(),
        "schema/audit.v1.json is stale: regenerate it with `svcd audit-schema > schema/audit.v1.json`"
    );
}

#[test]
fn every_layers_record_has_unique_keys_and_fits_the_schema() {
    let validator = jsonschema::validator_for(&audit::schema()).expect("the schema compiles");
    for (layer, record) in records() {
        let line = serde_json::to_string(&record).expect("serialises");
        let value = parse_strict(&line).unwrap_or_else(|e| panic!("{layer}: {e}: {line}"));
        assert!(
            validator.is_valid(&value),
            "{layer} does not fit the schema: {line}"
        );
        assert_eq!(value["sandbox_name"], "dev", "{layer}: {line}");
        assert_eq!(value["layer"], layer);
    }
    // The DNS record keeps both names.
    let dns = serde_json::to_string(&records()[0].1).expect("serialises");
    let v = parse_strict(&dns).expect("unique keys");
    assert_eq!(v["name"], "forbidden.example.test.");
    assert_eq!(v["sandbox_name"], "dev");
}

#[test]
fn a_line_with_a_key_twice_is_refused() {
    let err = parse_strict(r#"{"sandbox":1,"name":"demo","layer":"dns","name":"x.test."}"#)
        .expect_err("duplicate key");
    assert!(err.contains("\"name\" appears twice"), "{err}");
    assert!(
        parse_strict(r#"{"a":{"b":1,"b":2}}"#).is_err(),
        "nested duplicates too"
    );
    assert!(
        parse_strict(r#"{"a":1} trailing"#).is_err(),
        "one value per line"
    );
    assert!(parse_strict(r#"{"a":[1,{"b":2}],"c":null}"#).is_ok());
}

#[test]
fn a_record_that_breaks_the_schema_is_caught() {
    let validator = jsonschema::validator_for(&audit::schema()).expect("the schema compiles");
    for (name, line) in [
        ("no_layer", r#"{"time":"t","sandbox":1}"#),
        (
            "unknown_layer",
            r#"{"time":"t","sandbox":1,"layer":"smtp"}"#,
        ),
        (
            "packet_without_reason",
            r#"{"time":"t","sandbox":1,"layer":"packet","verdict":"drop","link":2}"#,
        ),
        (
            "sandbox_not_a_number",
            r#"{"time":"t","sandbox":"x","layer":"dns","name":"a","qtype":"A","decision":"answered"}"#,
        ),
    ] {
        let v = parse_strict(line).expect("valid JSON");
        assert!(!validator.is_valid(&v), "{name} passed the schema");
    }
}
