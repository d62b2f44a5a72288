//! Host configuration (svcd.toml), environment variables, the effective-config precedence
//! (API request, then workspace.json, then defaults), and the loader's file discovery.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

use std::{fs, path::Path};

use svc_control::config::{
    effective::{self, ApiParams, Source},
    env,
    host::{self, HostConfig},
    loader,
    workspace::{
        self, AuthDefaults, Backend, Capability, GitCredentialMode, Lifecycle, ServiceDefaults,
        SpotlightForward,
    },
};

// ---------- host configuration ----------

#[test]
fn host_defaults_are_valid_and_documented_values() {
    let h = HostConfig::default();
    assert_eq!(h.state_dir, Path::new("/var/lib/svc"));
    assert_eq!(h.socket, Path::new("/run/svc/svcd.sock"));
    assert_eq!(h.pin_dir, Path::new("/sys/fs/bpf/svc"));
    assert_eq!(h.api_group, "svc");
    assert_eq!((h.guard_port, h.proxy_port), (15353, 15443));
    assert_eq!(h.agent_hosts.len(), 2);
    assert_eq!(h.code.code_host.to_string(), "github.com");
    assert!(
        h.dns_upstreams.is_empty(),
        "empty upstreams mean: read resolv.conf"
    );
    assert_eq!(
        host::parse(Path::new("svcd.toml"), "").unwrap(),
        h,
        "an empty file is all defaults"
    );
}

#[test]
fn host_overrides() {
    let text = r#"
state_dir = "/srv/svc"
api_group = "devs"
[network]
ipv4_pool = "10.99.0.0/20"
allow_cidrs = ["192.0.2.0/24"]
[hosts]
agent = ["api.agent.test", "platform.agent.test"]
code_host = "code.test"
code_api_host = "api.code.test"
code_uploads_host = "uploads.code.test"
code_archive_host = "archive.code.test"
[dns]
upstreams = ["127.0.0.53", "[::1]:5353"]
guard_port = 5300
[proxy]
port = 8443
extra_roots = ["/etc/svc/private-ca.pem"]
[credentials]
code_host_token_file = "/etc/svc/code-host-token"
[upstream]
proxy = "http://proxy.test:3128"
no_proxy = [".corp.test", "10.0.0.0/8"]
[git_ssh]
known_hosts = "/etc/svc/known_hosts.code"
max_sessions = 3
"#;
    let h = host::parse(Path::new("svcd.toml"), text).unwrap();
    assert_eq!(h.state_dir, Path::new("/srv/svc"));
    assert_eq!(h.ipv4_pool.to_string(), "10.99.0.0/20");
    assert_eq!(h.code.archive_host.to_string(), "archive.code.test");
    assert_eq!(h.agent_hosts[1].to_string(), "platform.agent.test");
    assert_eq!(h.dns_upstreams[0].to_string(), "127.0.0.53:53");
    assert_eq!(h.dns_upstreams[1].to_string(), "[::1]:5353");
    assert_eq!((h.guard_port, h.proxy_port), (5300, 8443));
    assert_eq!(h.proxy_extra_roots, [Path::new("/etc/svc/private-ca.pem")]);
    assert_eq!(
        h.code_host_token_file.as_deref(),
        Some(Path::new("/etc/svc/code-host-token"))
    );
    let up = h.upstream_proxy.expect("upstream proxy");
    assert_eq!(up.url, "http://proxy.test:3128");
    assert_eq!(up.no_proxy, [".corp.test", "10.0.0.0/8"]);
    assert_eq!(
        h.git_ssh.known_hosts,
        Path::new("/etc/svc/known_hosts.code")
    );
    // `[git_ssh] max_sessions` is the older name of `[limits] git_ssh_sessions`.
    assert_eq!(h.limits.git_ssh_sessions, 3);
}

#[test]
fn limits_take_their_defaults_and_what_the_file_says() {
    let h = host::parse(Path::new("svcd.toml"), "").unwrap();
    assert_eq!(
        (
            h.limits.dns_tcp_connections,
            h.limits.proxy_connections,
            h.limits.exec_streams,
            h.limits.spotlight_streams,
            h.limits.git_ssh_sessions,
            h.limits.log_interval.as_secs(),
        ),
        (16, 192, 32, 16, 8, 60)
    );
    assert_eq!(
        (h.limits.audit_records_per_sec, h.limits.audit_burst),
        (50, 2000)
    );
    let text = "[limits]\ndns_tcp_connections = 4\nproxy_connections = 9\nexec_streams = 2\n\
                spotlight_streams = 3\ngit_ssh_sessions = 5\nlog_interval_secs = 1\n\
                [git_ssh]\nmax_sessions = 5\n";
    let h = host::parse(Path::new("svcd.toml"), text).unwrap();
    assert_eq!(
        (
            h.limits.dns_tcp_connections,
            h.limits.proxy_connections,
            h.limits.exec_streams,
            h.limits.spotlight_streams,
            h.limits.git_ssh_sessions,
            h.limits.log_interval.as_secs(),
        ),
        (4, 9, 2, 3, 5, 1)
    );
}

#[test]
fn disk_per_sandbox_defaults_to_10_gib_for_both_backends_and_0_turns_it_off() {
    let h = HostConfig::default();
    assert_eq!((h.container.disk_mib, h.microvm.disk_mib), (10240, 10240));
    let h = host::parse(Path::new("svcd.toml"), "[container]\ndisk_mib = 512\n").unwrap();
    assert_eq!((h.container.disk_mib, h.microvm.disk_mib), (512, 512));
    let h = host::parse(Path::new("svcd.toml"), "[container]\ndisk_mib = 0\n").unwrap();
    assert_eq!((h.container.disk_mib, h.microvm.disk_mib), (0, 0));
}

#[test]
fn host_refusals() {
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "unknown_key",
            "stat_dir = \"/x\"\n",
            "",
            "unknown field `stat_dir`",
        ),
        (
            "relative_state_dir",
            "state_dir = \"var/lib\"\n",
            "state_dir",
            "absolute path",
        ),
        (
            "bad_pool",
            "[network]\nipv4_pool = \"10.0.0.0/33\"\n",
            "network.ipv4_pool",
            "IPv4 CIDR",
        ),
        (
            "pool_too_small",
            "[network]\nipv4_pool = \"10.0.0.0/30\"\n",
            "network.ipv4_pool",
            "too small",
        ),
        (
            "v6_pool_is_v4",
            "[network]\nipv6_pool = \"10.0.0.0/8\"\n",
            "network.ipv6_pool",
            "IPv6 CIDR",
        ),
        (
            "bad_cidr",
            "[network]\nallow_cidrs = [\"nope\"]\n",
            "network.allow_cidrs[0]",
            "CIDR",
        ),
        (
            "bad_agent_host",
            "[hosts]\nagent = [\"bad host\"]\n",
            "hosts.agent[0]",
            "not a valid DNS name",
        ),
        (
            "bad_upstream",
            "[dns]\nupstreams = [\"resolver.example\"]\n",
            "dns.upstreams[0]",
            "IP or IP:port",
        ),
        (
            "same_ports",
            "[dns]\nguard_port = 9000\n[proxy]\nport = 9000\n",
            "proxy.port",
            "cannot share port 9000",
        ),
        (
            "port_zero",
            "[proxy]\nport = 0\n",
            "proxy.port",
            "from 1 to 65535",
        ),
        (
            "relative_root",
            "[proxy]\nextra_roots = [\"ca.pem\"]\n",
            "proxy.extra_roots[0]",
            "absolute path",
        ),
        (
            "disk_too_small",
            "[container]\ndisk_mib = 10\n",
            "container.disk_mib",
            "expected 0 (no limit) or 64 MiB to 16777216 MiB (16 TiB), got 10",
        ),
        (
            "disk_too_large",
            "[container]\ndisk_mib = 99999999999\n",
            "container.disk_mib",
            "got 99999999999",
        ),
        (
            "microvm_tiny_memory",
            "[microvm]\nmemory_mib = 64\n",
            "microvm.memory_mib",
            "128 MiB or more",
        ),
        (
            "microvm_small_overhead",
            "[microvm]\noverhead_mib = 16\n",
            "microvm.overhead_mib",
            "at least 64 MiB",
        ),
        (
            "microvm_no_cpus",
            "[microvm]\ncpus = 0\n",
            "microvm.cpus",
            "1 to 64",
        ),
        (
            "microvm_accel",
            "[microvm]\naccel = \"hvf\"\n",
            "microvm.accel",
            "\"auto\", \"kvm\" or \"tcg\"",
        ),
        (
            "microvm_user",
            "[microvm]\nuser = \"a b\"\n",
            "microvm.user",
            "user name",
        ),
        (
            "microvm_channel",
            "[microvm]\nchannel = \"pci\"\n",
            "microvm.channel",
            "\"virtio-serial\" or \"vsock\"",
        ),
        (
            "microvm_unknown_key",
            "[microvm]\nballoon = true\n",
            "microvm",
            "unknown field",
        ),
        (
            "agent_home_relative",
            "[credentials]\nagent_home = \".claude\"\n",
            "credentials.agent_home",
            "absolute path without `..`",
        ),
        (
            "agent_home_guest_dotdot",
            "[credentials]\nagent_home = \"/home/a/.claude\"\nagent_home_guest = \"/root/../etc\"\n",
            "credentials.agent_home_guest",
            "absolute path without `..`",
        ),
        (
            "upstream_proxy_https",
            "[upstream]\nproxy = \"https://proxy.test:3128\"\n",
            "upstream.proxy",
            "expected http://host:port",
        ),
        (
            "upstream_proxy_no_port",
            "[upstream]\nproxy = \"http://proxy.test\"\n",
            "upstream.proxy",
            "expected http://host:port",
        ),
        (
            "upstream_proxy_inline_credentials",
            "[upstream]\nproxy = \"http://u:p@proxy.test:3128\"\n",
            "upstream.proxy",
            "credentials go in proxy_credentials_file",
        ),
        (
            "upstream_no_proxy_bad",
            "[upstream]\nproxy = \"http://proxy.test:3128\"\nno_proxy = [\"a b\"]\n",
            "upstream.no_proxy[0]",
            "expected *, a domain",
        ),
        (
            "upstream_credentials_without_proxy",
            "[upstream]\nproxy_credentials_file = \"/etc/svc/p\"\n",
            "upstream.proxy",
            "need upstream.proxy",
        ),
        (
            "upstream_credentials_relative",
            "[upstream]\nproxy = \"http://proxy.test:3128\"\nproxy_credentials_file = \"p\"\n",
            "upstream.proxy_credentials_file",
            "absolute path",
        ),
        (
            "git_ssh_sessions_zero",
            "[git_ssh]\nmax_sessions = 0\n",
            "git_ssh.max_sessions",
            "1 to 256",
        ),
        (
            "limits_dns_tcp_zero",
            "[limits]\ndns_tcp_connections = 0\n",
            "limits.dns_tcp_connections",
            "expected 1 to 65536, got 0",
        ),
        (
            "limits_proxy_huge",
            "[limits]\nproxy_connections = 100000\n",
            "limits.proxy_connections",
            "expected 1 to 65536, got 100000",
        ),
        (
            "limits_audit_rate_zero",
            "[limits]\naudit_records_per_sec = 0\n",
            "limits.audit_records_per_sec",
            "expected 1 to 100000, got 0",
        ),
        (
            "limits_audit_burst_below_rate",
            "[limits]\naudit_records_per_sec = 100\naudit_burst = 10\n",
            "limits.audit_burst",
            "10 is less than limits.audit_records_per_sec = 100",
        ),
        (
            "limits_exec_zero",
            "[limits]\nexec_streams = 0\n",
            "limits.exec_streams",
            "1 to 65536",
        ),
        (
            "limits_spotlight_zero",
            "[limits]\nspotlight_streams = 0\n",
            "limits.spotlight_streams",
            "1 to 65536",
        ),
        (
            "limits_git_ssh_too_many",
            "[limits]\ngit_ssh_sessions = 300\n",
            "limits.git_ssh_sessions",
            "1 to 256",
        ),
        (
            "limits_git_ssh_both_names_differ",
            "[limits]\ngit_ssh_sessions = 4\n[git_ssh]\nmax_sessions = 6\n",
            "limits.git_ssh_sessions",
            "differs from git_ssh.max_sessions = 6",
        ),
        (
            "limits_log_interval_zero",
            "[limits]\nlog_interval_secs = 0\n",
            "limits.log_interval_secs",
            "1 to 86400",
        ),
        (
            "limits_unknown_key",
            "[limits]\nwebsockets = 3\n",
            "limits",
            "unknown field",
        ),
        (
            "git_ssh_known_hosts_relative",
            "[git_ssh]\nknown_hosts = \"known_hosts\"\n",
            "git_ssh.known_hosts",
            "absolute path",
        ),
        (
            "guardian_endpoint_not_https",
            "[credentials]\nagent_home = \"/home/a/.claude\"\nagent_token_endpoint = \"http://console.test/token\"\n",
            "credentials.agent_token_endpoint",
            "expected an https:// URL",
        ),
        (
            "guardian_endpoint_without_home",
            "[credentials]\nagent_token_endpoint = \"https://console.test/token\"\n",
            "credentials.agent_token_endpoint",
            "set agent_home too",
        ),
        (
            "refresh_poll_zero",
            "[credentials]\nrefresh_poll_secs = 0\n",
            "credentials.refresh_poll_secs",
            "1 to 3600",
        ),
        (
            "refresh_lead_short",
            "[credentials]\nrefresh_lead_secs = 5\n",
            "credentials.refresh_lead_secs",
            "60 to 86400",
        ),
        (
            "fence_log_level_unknown",
            "fence_log_level = \"loud\"\n",
            "fence_log_level",
            "unknown variant",
        ),
        ("wrong_type", "api_group = 5\n", "", "invalid type"),
        ("broken_toml", "state_dir = \n", "", ""),
    ];
    for (name, text, path, fragment) in cases {
        let errors = host::parse(Path::new("svcd.toml"), text).expect_err(name).0;
        assert!(
            errors
                .iter()
                .any(|e| e.location.path.starts_with(path) && e.message.contains(fragment)),
            "{name}: expected {path:?} / {fragment:?}, got {errors:#?}"
        );
    }
}

#[test]
fn the_agent_home_lands_under_roots_home_unless_told() {
    let h = host::parse(
        Path::new("svcd.toml"),
        "[credentials]\nagent_home = \"/home/alice/.claude\"\n",
    )
    .unwrap();
    assert_eq!(
        h.agent_home,
        Some(("/home/alice/.claude".into(), "/root/.claude".into()))
    );
    let h = host::parse(
        Path::new("svcd.toml"),
        "[credentials]\nagent_home = \"/srv/a\"\nagent_home_guest = \"/home/agent/.a\"\n",
    )
    .unwrap();
    assert_eq!(
        h.agent_home,
        Some(("/srv/a".into(), "/home/agent/.a".into()))
    );
    let d = host::parse(Path::new("svcd.toml"), "").unwrap();
    assert_eq!(d.agent_home, None);
    assert_eq!(
        (
            d.microvm.memory_mib,
            d.microvm.overhead_mib,
            d.microvm.cpus,
            d.microvm.accel.as_str()
        ),
        (512, 256, 1, "auto")
    );
}

#[test]
fn toml_errors_carry_a_line() {
    let errors = host::parse(
        Path::new("svcd.toml"),
        "state_dir = \"/x\"\n\napi_group = [\n",
    )
    .unwrap_err()
    .0;
    assert!(errors[0].location.line.is_some(), "{errors:#?}");
}

#[test]
fn resolv_conf_nameservers_are_read() {
    let got = host::resolv_conf_nameservers(
        "# c\nsearch x\nnameserver 10.0.0.2\nnameserver fe80::1%eth0\nnameserver bogus\n",
    );
    let got: Vec<String> = got.iter().map(ToString::to_string).collect();
    assert_eq!(got, ["10.0.0.2:53", "[fe80::1]:53"]);
}

#[test]
fn missing_explicit_host_config_is_an_error() {
    let errors = loader::load_host_config(Some(Path::new("/nonexistent/svcd.toml")))
        .unwrap_err()
        .0;
    assert!(errors[0].message.contains("not found"));
}

// ---------- environment ----------

#[test]
fn removed_variables_are_errors_naming_each() {
    for var in env::REMOVED_VARIABLES {
        let errors = env::check_removed(|v| (v == var).then(|| "1".to_owned()))
            .unwrap_err()
            .0;
        assert_eq!(errors.len(), 1);
        assert!(errors[0].message.contains(var), "{}", errors[0]);
        assert!(errors[0].message.contains("removed"), "{}", errors[0]);
    }
    let all = env::check_removed(|_| Some(String::new())).unwrap_err().0;
    assert_eq!(all.len(), 3);
    assert!(env::check_removed(|_| None).is_ok());
}

#[test]
fn microvm_images_need_both_variables() {
    let both = env::microvm_images(|v| Some(format!("/img/{v}"))).unwrap();
    assert_eq!(both.kernel, Path::new("/img/SVC_MICROVM_KERNEL"));
    let none = env::microvm_images(|_| None).unwrap_err().0;
    let vars: Vec<&str> = none.iter().map(|e| e.location.path.as_str()).collect();
    assert_eq!(vars, ["SVC_MICROVM_KERNEL", "SVC_MICROVM_ROOTFS"]);
}

// ---------- precedence ----------

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
        runtime_required: Some(vec![Backend::Netns]),
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
                assert_eq!(e.runtime.required, [Backend::Microvm]);
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
                assert_eq!(e.runtime.required, [Backend::Netns]);
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

// ---------- loader: files on disk ----------

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

#[test]
fn compose_is_used_only_without_workspace_json() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "docker-compose.yml",
        "services:\n  web:\n    ports: [\"8000:80\"]\n",
    );
    let l = loader::load_workspace(dir.path(), &ApiParams::default(), []).unwrap();
    assert_eq!(l.effective.sources["spotlight"], Source::Compose);
    assert_eq!(l.effective.spotlight[0].local_port, 8000);

    write(dir.path(), ".svc/workspace.json", r#"{"version":1}"#);
    let l = loader::load_workspace(dir.path(), &ApiParams::default(), []).unwrap();
    assert!(
        l.compose.is_none(),
        "workspace.json present: compose is not read"
    );
    assert!(l.effective.spotlight.is_empty());
}

#[test]
fn compose_file_order_and_ignored_files_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "docker-compose.yaml",
        "services:\n  a:\n    ports: [\"1:1\"]\n",
    );
    write(
        dir.path(),
        "docker-compose.yml",
        "services:\n  b:\n    ports: [\"2:2\"]\n",
    );
    let l = loader::load_workspace(dir.path(), &ApiParams::default(), []).unwrap();
    let c = l.compose.unwrap();
    assert!(
        c.file.ends_with("docker-compose.yml"),
        "docker-compose.yml comes before .yaml"
    );
    assert_eq!(c.ports.forwards[0].service, "b");
    assert_eq!(l.warnings.len(), 1);
    assert!(l.warnings[0].contains("docker-compose.yaml is ignored"));

    write(
        dir.path(),
        "compose.yaml",
        "services:\n  c:\n    ports: [\"3:3\"]\n",
    );
    let l = loader::load_workspace(dir.path(), &ApiParams::default(), []).unwrap();
    assert!(
        l.compose.unwrap().file.ends_with("compose.yaml"),
        "compose.yaml is preferred"
    );
    assert_eq!(l.warnings.len(), 2);
}

#[test]
fn dotenv_and_process_environment_feed_compose() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), ".env", "WEB_PORT=8100\nAPI_PORT=8200\n");
    write(
        dir.path(),
        "compose.yaml",
        "services:\n  web:\n    ports: [\"${WEB_PORT}:80\", \"${API_PORT}:81\"]\n",
    );
    let l = loader::load_workspace(
        dir.path(),
        &ApiParams::default(),
        [("API_PORT".to_owned(), "8300".to_owned())],
    )
    .unwrap();
    let locals: Vec<u16> = l.effective.spotlight.iter().map(|f| f.local_port).collect();
    assert_eq!(locals, [8100, 8300]);
}

#[test]
fn errors_from_every_file_are_reported_together() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), ".svc/workspace.json", r#"{"version":2}"#);
    write(
        dir.path(),
        ".svc/config.yaml",
        "egress:\n  allow: [a.example.com]\n  policy:\n    a.example.com: {}\n",
    );
    let errors = loader::load_workspace(dir.path(), &ApiParams::default(), [])
        .unwrap_err()
        .0;
    assert!(
        errors
            .iter()
            .any(|e| e.file.ends_with(".svc/workspace.json"))
    );
    assert!(errors.iter().any(|e| e.file.ends_with(".svc/config.yaml")));
}

#[test]
fn oversized_and_non_utf8_files_are_refused_before_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let big = format!(
        "{{\"version\":1,\"x\":\"{}\"}}",
        "a".repeat(2 * 1024 * 1024)
    );
    write(dir.path(), ".svc/workspace.json", &big);
    let errors = loader::load_workspace(dir.path(), &ApiParams::default(), [])
        .unwrap_err()
        .0;
    assert!(errors[0].message.contains("larger than"), "{errors:#?}");

    fs::write(
        dir.path().join(".svc/workspace.json"),
        b"{\"version\":1,\xff}",
    )
    .unwrap();
    let errors = loader::load_workspace(dir.path(), &ApiParams::default(), [])
        .unwrap_err()
        .0;
    assert!(errors[0].message.contains("UTF-8"), "{errors:#?}");
}

#[test]
fn every_section_reports_its_errors_together_in_file_order() {
    // One bad key or more in every table: all reported at once, in the order svcd has always
    // given them (svcd's paths first, then each table in turn).
    let text = r#"
state_dir = "rel"
socket = "rel"
pin_dir = "rel"
audit_dir = "rel"
api_group = "a b"
[network]
ipv4_pool = "x"
ipv6_pool = "x"
allow_cidrs = ["x"]
[hosts]
agent = ["bad host"]
code_host = "bad host"
[dns]
resolv_conf = "rel"
upstreams = ["x"]
guard_port = 0
[proxy]
port = 0
extra_roots = ["rel"]
[credentials]
key_file = "rel"
refresh_poll_secs = 0
refresh_lead_secs = 0
agent_credentials_entry = ""
agent_token_endpoint = "http://console.test/token"
agent_home = "rel"
code_host_token_file = "rel"
code_host_token_group = "no-such-group-svc-test"
[git_ssh]
ssh = "rel"
agent_socket = "rel"
known_hosts = "rel"
max_sessions = 0
[limits]
dns_tcp_connections = 0
log_interval_secs = 0
[upstream]
proxy = "https://proxy.test:3128"
proxy_credentials_file = "rel"
no_proxy = ["a b"]
[container]
image = "rel"
user = "a b"
cgroup_parent = "/x"
memory_mib = 1
pids_max = 1
cpus = -1.0
disk_mib = 1
[microvm]
memory_mib = 1
overhead_mib = 1
cpus = 0
accel = "x"
user = "a b"
channel = "x"
[metrics]
listen = "x"
"#;
    let errors = host::parse(Path::new("svcd.toml"), text).unwrap_err().0;
    let paths: Vec<&str> = errors.iter().map(|e| e.location.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "state_dir",
            "socket",
            "pin_dir",
            "audit_dir",
            "dns.resolv_conf",
            "credentials.key_file",
            "api_group",
            "network.ipv4_pool",
            "network.ipv6_pool",
            "network.allow_cidrs[0]",
            "hosts.agent[0]",
            "hosts.code_host",
            "dns.upstreams[0]",
            "dns.guard_port",
            "proxy.port",
            "proxy.port",
            "credentials.refresh_poll_secs",
            "credentials.refresh_lead_secs",
            "credentials.agent_credentials_entry",
            "credentials.agent_token_endpoint",
            "credentials.code_host_token_file",
            "credentials.code_host_token_group",
            "credentials.agent_home",
            "proxy.extra_roots[0]",
            "git_ssh.ssh",
            "git_ssh.agent_socket",
            "git_ssh.known_hosts",
            "git_ssh.max_sessions",
            "limits.dns_tcp_connections",
            "limits.log_interval_secs",
            "upstream.proxy",
            "upstream.proxy_credentials_file",
            "upstream.no_proxy[0]",
            "container.image",
            "container.user",
            "container.cgroup_parent",
            "container.memory_mib",
            "container.pids_max",
            "container.cpus",
            "container.disk_mib",
            "microvm.memory_mib",
            "microvm.overhead_mib",
            "microvm.cpus",
            "microvm.accel",
            "microvm.user",
            "microvm.channel",
            "metrics.listen",
        ],
        "{errors:#?}"
    );
    let messages: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(messages[0], "expected an absolute path, got rel");
    assert_eq!(messages[6], "expected a group name, got \"a b\"");
    assert_eq!(
        messages[15],
        "the proxy and the DNS guard cannot share port 0"
    );
    assert_eq!(
        messages[22],
        "expected an absolute path without `..`, got rel"
    );
}
