//! Host configuration (svcd.toml) refused: each bad value with its path and message, and every
//! section's errors reported together in file order.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: a broken fixture should panic"
)]

use std::path::Path;

use svc_control::config::host;

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
            "id_ranges_unknown",
            "[container]\nid_ranges = \"per_sandbox\"\n",
            "container.id_ranges",
            "expected \"shared\" or \"per-sandbox\", got \"per_sandbox\"",
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
