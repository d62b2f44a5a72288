//! The effective configuration's precedence: API parameters over the workspace file over
//! svcd's defaults, case by case.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

use std::path::Path;

use svc_control::config::{
    effective::{self, ApiParams, Source},
    workspace::{
        self, AuthDefaults, Backend, Capability, GitCredentialMode, Lifecycle, ServiceDefaults,
        SpotlightForward,
    },
};

fn file(text: &str) -> workspace::Workspace {
    workspace::parse(Path::new("w.json"), text).unwrap()
}

#[test]
fn precedence_table() {
    let ws = file(
        r#"{"version":1,
        "services":{"defaults":{"stopTimeoutMs":5000,"maxRestarts":9}},
        "spotlight":{"defaults":[{"service":"f","remotePort":1,"localPort":2}]},
        "auth":{"defaults":{"sshAgentForward":true}},
        "lifecycle":{"onStart":["file"]},
        "runtime":{"required":["microvm"]},
        "capabilities":{"required":["spotlight.tunnel"]}}"#,
    );
    let api = ApiParams {
        service_defaults: ServiceDefaults {
            stop_timeout_ms: Some(1),
            ..Default::default()
        },
        spotlight: Some(vec![SpotlightForward {
            service: "a".into(),
            remote_port: 3,
            local_port: 4,
        }]),
        auth: AuthDefaults {
            git_credential_mode: Some(GitCredentialMode::HostHelper),
            ..Default::default()
        },
        lifecycle: Some(Lifecycle {
            on_setup: Some(vec!["api".into()]),
            ..Default::default()
        }),
        runtime_required: Some(vec![Backend::named("netns").expect("container's old name")]),
        runtime_selection: None,
        capabilities: Some(vec![]),
    };
    let none = ApiParams::default();

    struct Case {
        name: &'static str,
        api: &'static ApiParams,
        file: Option<&'static workspace::Workspace>,
        check: fn(&effective::EffectiveWorkspace),
    }
    let ws: &'static workspace::Workspace = Box::leak(Box::new(ws));
    let api: &'static ApiParams = Box::leak(Box::new(api));
    let none: &'static ApiParams = Box::leak(Box::new(none));
    let cases = [
        Case {
            name: "defaults_only",
            api: none,
            file: None,
            check: |e| {
                assert_eq!(
                    e.services.stop_timeout_ms,
                    effective::defaults::STOP_TIMEOUT_MS
                );
                assert_eq!(e.services.max_restarts, effective::defaults::MAX_RESTARTS);
                assert!(e.runtime.required.is_empty(), "no runtime block: automatic");
                assert!(e.spotlight.is_empty());
                assert_eq!(e.sources["services.stopTimeoutMs"], Source::Default);
            },
        },
        Case {
            name: "file_over_defaults",
            api: none,
            file: Some(ws),
            check: |e| {
                assert_eq!(e.services.stop_timeout_ms, 5000);
                assert_eq!(e.services.max_restarts, 9);
                assert_eq!(
                    e.services.restart_delay_ms,
                    effective::defaults::RESTART_DELAY_MS,
                    "unset key falls to default"
                );
                assert!(e.auth.ssh_agent_forward);
                assert_eq!(e.lifecycle.on_start, ["file"]);
                assert_eq!(e.runtime.required, [Backend::MICROVM]);
                assert_eq!(e.capabilities, [Capability::SpotlightTunnel]);
                assert_eq!(e.sources["services.maxRestarts"], Source::WorkspaceJson);
            },
        },
        Case {
            name: "api_over_file_per_key",
            api,
            file: Some(ws),
            check: |e| {
                assert_eq!(e.services.stop_timeout_ms, 1, "api wins");
                assert_eq!(
                    e.services.max_restarts, 9,
                    "file keeps keys the api did not give"
                );
                assert_eq!(e.sources["services.stopTimeoutMs"], Source::Api);
                assert_eq!(e.sources["services.maxRestarts"], Source::WorkspaceJson);
                assert!(e.auth.ssh_agent_forward, "auth merges per key");
                assert_eq!(
                    e.auth.git_credential_mode,
                    Some(GitCredentialMode::HostHelper)
                );
            },
        },
        Case {
            name: "api_replaces_whole_blocks",
            api,
            file: Some(ws),
            check: |e| {
                assert_eq!(e.spotlight[0].service, "a");
                assert_eq!(e.lifecycle.on_setup, ["api"]);
                assert!(
                    e.lifecycle.on_start.is_empty(),
                    "lifecycle is replaced as a block"
                );
                assert_eq!(
                    e.runtime.required,
                    [Backend::named("netns").expect("container's old name")]
                );
                assert!(
                    e.capabilities.is_empty(),
                    "an explicit empty list is a value"
                );
            },
        },
        Case {
            name: "api_over_defaults_without_file",
            api,
            file: None,
            check: |e| {
                assert_eq!(e.services.stop_timeout_ms, 1);
                assert_eq!(e.services.max_restarts, effective::defaults::MAX_RESTARTS);
            },
        },
    ];
    for case in cases {
        let e = effective::resolve(case.api, case.file, None);
        let result = std::panic::catch_unwind(|| (case.check)(&e));
        assert!(result.is_ok(), "case {} failed", case.name);
    }
}
