//! One policy decision, as the proxy makes it per request: `cargo xtask bench policy`.
#![allow(clippy::unwrap_used, clippy::expect_used, reason = "benchmark fixture")]

use std::{hint::black_box, path::Path};

use criterion::{Criterion, criterion_group, criterion_main};
use svc_control::{
    config::{egress, host::HostConfig},
    hosts::HostPattern,
    policy::{
        credentials::Scheme,
        request::{self, HttpRequest, SandboxPolicy},
        target,
    },
};

fn fixture() -> SandboxPolicy {
    let egress = egress::parse(
        Path::new("config.yaml"),
        "egress:\n  allow: [open.example.com]\n  policy:\n    api.example.com:\n      paths: [\"/v1/models\", \"/v1/chat/**\"]\n",
    )
    .unwrap();
    let extra: Vec<HostPattern> = (0..20)
        .map(|i| HostPattern::parse(&format!("host{i}.example.com")).unwrap())
        .collect();
    SandboxPolicy::for_sandbox(
        &HostConfig::default(),
        &extra,
        Some(egress::RepoName::parse("acme/widget").unwrap()),
        egress,
    )
    .unwrap()
}

fn bench(c: &mut Criterion) {
    let policy = fixture();
    let code_token = policy
        .placeholders
        .entries()
        .iter()
        .find(|e| e.kind == svc_control::policy::credentials::CredentialKind::CodeHost)
        .unwrap()
        .placeholder
        .expose()
        .to_owned();
    let auth = format!("Bearer {code_token}");
    let headers: Vec<(&str, &[u8])> = vec![
        ("Authorization", auth.as_bytes()),
        ("User-Agent", b"git/2.47.3".as_slice()),
        ("Accept", b"*/*".as_slice()),
        (
            "Content-Type",
            b"application/x-git-upload-pack-request".as_slice(),
        ),
    ];
    let plain = HttpRequest {
        scheme: Scheme::Https,
        method: "POST",
        target: "/acme/widget.git/git-upload-pack",
        authority: Some("github.com"),
        sni: Some("github.com"),
        alt_authority: None,
        headers: &headers,
        body_prefix: b"0032want 0123456789abcdef0123456789abcdef01234567\n00000009done\n",
        body_complete: false,
        head_had_both_lengths: false,
        dialled_port: None,
    };
    let body = br#"{"query":"query { viewer { login } }"}"#;
    let graphql = HttpRequest {
        method: "POST",
        target: "/graphql",
        authority: Some("api.github.com"),
        sni: Some("api.github.com"),
        body_prefix: body,
        body_complete: true,
        head_had_both_lengths: false,
        dialled_port: None,
        ..plain
    };
    assert!(request::decide(&policy, &plain).allowed());
    assert!(request::decide(&policy, &graphql).allowed());

    c.bench_function("decide/smart-http-with-swap", |b| {
        b.iter(|| request::decide(black_box(&policy), black_box(&plain)))
    });
    c.bench_function("decide/graphql-viewer", |b| {
        b.iter(|| request::decide(black_box(&policy), black_box(&graphql)))
    });
    c.bench_function("target/canonicalize", |b| {
        b.iter(|| {
            target::canonicalize(black_box(
                "/repos/acme/widget/pulls/12/comments?per_page=100&page=2",
            ))
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
