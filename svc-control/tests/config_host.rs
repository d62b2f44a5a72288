//! Host configuration (svcd.toml): defaults, overrides, limits, the agent home, TOML errors,
//! resolv.conf and a missing explicit file.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

use std::path::Path;

use svc_control::config::{
    host::{self, HostConfig},
    loader,
};

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

/// The per-sandbox connection and stream limits, and the log interval in seconds.
fn limits(h: &host::HostConfig) -> (u32, u32, u32, u32, u32, u64) {
    (
        h.limits.dns_tcp_connections,
        h.limits.proxy_connections,
        h.limits.exec_streams,
        h.limits.spotlight_streams,
        h.limits.git_ssh_sessions,
        h.limits.log_interval.as_secs(),
    )
}

#[test]
fn limits_take_their_defaults_and_what_the_file_says() {
    let h = host::parse(Path::new("svcd.toml"), "").unwrap();
    assert_eq!(limits(&h), (16, 192, 32, 16, 8, 60));
    assert_eq!(
        (h.limits.audit_records_per_sec, h.limits.audit_burst),
        (50, 2000)
    );
    let text = "[limits]\ndns_tcp_connections = 4\nproxy_connections = 9\nexec_streams = 2\n\
                spotlight_streams = 3\ngit_ssh_sessions = 5\nlog_interval_secs = 1\n\
                [git_ssh]\nmax_sessions = 5\n";
    let h = host::parse(Path::new("svcd.toml"), text).unwrap();
    assert_eq!(limits(&h), (4, 9, 2, 3, 5, 1));
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
fn container_id_ranges_default_to_per_sandbox_and_take_shared() {
    use svc_control::config::host::IdRanges;
    assert_eq!(
        HostConfig::default().container.id_ranges,
        IdRanges::PerSandbox
    );
    for (text, want) in [
        ("id_ranges = \"per-sandbox\"", IdRanges::PerSandbox),
        ("id_ranges = \"shared\"", IdRanges::Shared),
        ("", IdRanges::PerSandbox),
    ] {
        let h = host::parse(Path::new("svcd.toml"), &format!("[container]\n{text}\n")).unwrap();
        assert_eq!(h.container.id_ranges, want, "{text:?}");
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
