//! svcd's host configuration: `/etc/svc/svcd.toml`. Every key is optional; the defaults are
//! the constants below and are documented in `docs/host-config.md`.
//!
//! The built-in agent hosts and the code-host family (the spec's `{agent_api_host}`,
//! `{code_host}`, …) are configuration: nothing else in svc names them.

use std::{
    net::{IpAddr, SocketAddr},
    path::{Path, PathBuf},
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use super::{ConfigError, ConfigErrors, Location};
use crate::policy::host::HostPattern;

/// Where svcd looks for its configuration when not told otherwise.
pub const DEFAULT_PATH: &str = "/etc/svc/svcd.toml";

/// The file as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HostConfigFile {
    pub state_dir: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    pub pin_dir: Option<PathBuf>,
    pub audit_dir: Option<PathBuf>,
    /// Members of this group may call the API besides root.
    pub api_group: Option<String>,
    /// The least severe diagnostic of the eBPF programs svcd logs (`off`, `error`, `warn`,
    /// `info`, `debug`, `trace`; default `warn`).
    pub fence_log_level: Option<crate::dataplane::LogLevel>,
    #[serde(default)]
    pub network: NetworkFile,
    #[serde(default)]
    pub hosts: HostsFile,
    #[serde(default)]
    pub dns: DnsFile,
    #[serde(default)]
    pub proxy: ProxyFile,
    #[serde(default)]
    pub credentials: CredentialsFile,
    #[serde(default)]
    pub container: ContainerFile,
    #[serde(default)]
    pub microvm: MicrovmFile,
    #[serde(default)]
    pub metrics: MetricsFile,
    #[serde(default)]
    pub git_ssh: GitSshFile,
    #[serde(default)]
    pub upstream: UpstreamFile,
    /// `[limits]`: what one sandbox may hold open in svcd (see [`super::limits`]).
    #[serde(default)]
    pub limits: super::limits::LimitsFile,
}

/// `[upstream]`: how svcd's proxy reaches the internet (directly unless `proxy` is set).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamFile {
    /// The operator's HTTP forward proxy, `http://host:port`: HTTPS goes through it as
    /// `CONNECT` tunnels, plain HTTP as absolute-form requests.
    pub proxy: Option<String>,
    /// A root-only file holding `user:password` for the forward proxy (Basic).
    pub proxy_credentials_file: Option<PathBuf>,
    /// Hosts dialled directly: `*`, domains (`example.com`, `.example.com`), addresses, CIDRs.
    pub no_proxy: Option<Vec<String>>,
}

/// The forward proxy's settings, validated (defined with the connector that uses them).
pub use crate::proxy::upstream::UpstreamProxyConfig;

/// `[git_ssh]`: the git-over-SSH relay (how the host's own ssh reaches code hosts for the
/// sandboxes; which repositories and refs each sandbox may reach is its own policy).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GitSshFile {
    /// The OpenSSH client the relay runs.
    pub ssh: Option<PathBuf>,
    /// The host's SSH agent socket, the relay's only credential (absent: `SSH_AUTH_SOCK` of
    /// svcd's environment; neither: servers that need a key refuse).
    pub agent_socket: Option<PathBuf>,
    /// The known-hosts file servers' keys are checked against, strictly.
    pub known_hosts: Option<PathBuf>,
    /// Git sessions at once per sandbox: the older name of `[limits] git_ssh_sessions`.
    pub max_sessions: Option<u32>,
}

/// `[microvm]`: the microvm backend (QEMU `-M microvm`). The kernel and root file system come
/// from `SVC_MICROVM_KERNEL` / `SVC_MICROVM_ROOTFS` (and `SVC_MICROVM_INITRD`) in svcd's
/// environment, not from this file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MicrovmFile {
    /// The QEMU system emulator (a name is looked up on PATH).
    pub qemu: Option<PathBuf>,
    /// Guest memory in MiB (the guest's RAM; the ceiling on the QEMU process adds
    /// `overhead_mib`).
    pub memory_mib: Option<u64>,
    /// What QEMU itself may use beyond the guest's RAM, in MiB (its code cache, devices).
    pub overhead_mib: Option<u64>,
    /// Virtual CPUs per guest.
    pub cpus: Option<u32>,
    /// `auto` (KVM where the host can run guests with it, else TCG), `kvm` or `tcg`.
    pub accel: Option<String>,
    /// The system user whose `/etc/subuid` and `/etc/subgid` range QEMU runs in: sandbox id
    /// N's QEMU runs as the range's start + N once it has opened its devices (a uid per VM).
    pub user: Option<String>,
    /// virtiofsd (1.11 or later), which serves the coding agent's live mount.
    pub virtiofsd: Option<PathBuf>,
    /// The agent's channel: `virtio-serial` (default; survives fork) or `vsock` (a
    /// vhost-user vsock device with Firecracker's hybrid handshake; such VMs cannot fork).
    pub channel: Option<String>,
    /// vhost-device-vsock, for `channel = "vsock"`.
    pub vhost_vsock: Option<PathBuf>,
}

/// `[metrics]`: Prometheus metrics over HTTP (off unless `listen` is set).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsFile {
    /// `IP:port` to serve `/metrics` on, e.g. `127.0.0.1:9464`.
    pub listen: Option<String>,
}

/// `[container]`: the container backend (the embedded default).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ContainerFile {
    /// The OCI runtime binary (runc 1.1 or later; a name is looked up on PATH).
    pub runtime: Option<PathBuf>,
    /// The base image: a directory holding `rootfs/` (made by `cargo xtask images`).
    pub image: Option<PathBuf>,
    /// The system user whose `/etc/subuid` and `/etc/subgid` range the guests' ids map to.
    pub user: Option<String>,
    /// The cgroup (relative to the hierarchy root) every sandbox's cgroup is made under.
    pub cgroup_parent: Option<String>,
    /// Memory limit per sandbox in MiB (0: no limit).
    pub memory_mib: Option<u64>,
    /// Process (task) limit per sandbox (0: no limit).
    pub pids_max: Option<u64>,
    /// CPU limit per sandbox, in CPUs (e.g. 1.5; 0: no limit).
    pub cpus: Option<f64>,
    /// Disk per sandbox in MiB: the size of its writable layer (an ext4 image of its own),
    /// and of a microvm guest's disk (0: no limit for containers, the image's size for VMs).
    pub disk_mib: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialsFile {
    /// The host's code-host token (one line): what `svc sandbox create --repo` brokers as
    /// CODE_HOST_TOKEN when no `--secret CODE_HOST_TOKEN@…` is given. Read at each creation.
    pub code_host_token_file: Option<PathBuf>,
    /// A group whose members' sandboxes may use the host's code-host token (root's always
    /// may; without it no other caller's may).
    pub code_host_token_group: Option<String>,
    /// The coding agent's home on the host (SPEC 5.2, e.g. `/home/alice/.claude`): mounted
    /// read-write into every sandbox made while this is set (microvm backend: virtiofs).
    pub agent_home: Option<PathBuf>,
    /// Where the guest sees it (default: `/root/` and the host directory's name).
    pub agent_home_guest: Option<PathBuf>,
    /// The host key stored secrets and sandboxes' values are sealed with (32 bytes, root's
    /// alone; made on first start).
    pub key_file: Option<PathBuf>,
    /// The code-host CLI whose login `--repo` falls back to (`gh`; `""` turns it off).
    pub code_host_cli: Option<PathBuf>,
    /// The agent platform's OAuth token endpoint (`https://…`): with `agent_home`, it turns
    /// the credential guardian on (SPEC 5.2.4).
    pub agent_token_endpoint: Option<String>,
    /// The `client_id` the guardian sends with its refresh grant, if the platform wants one.
    pub agent_client_id: Option<String>,
    /// The key of the OAuth object in `.credentials.json` (default `claudeAiOauth`).
    pub agent_credentials_entry: Option<String>,
    /// Seconds between looks at tokens svcd refreshes: the guardian's and brokered OAuth
    /// secrets' (default 60, SPEC 8).
    pub refresh_poll_secs: Option<u64>,
    /// Seconds before expiry a token is refreshed (default 1800, SPEC 8; a brokered OAuth
    /// token shorter-lived than twice this is refreshed at half its life).
    pub refresh_lead_secs: Option<u64>,
}

/// The coding agent's credential guardian, validated (on when `agent_home` and
/// `agent_token_endpoint` are set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuardianConfig {
    pub token_endpoint: String,
    pub client_id: Option<String>,
    pub entry: String,
    pub poll: std::time::Duration,
    pub lead: std::time::Duration,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyFile {
    /// Port the HTTPS proxy listens on (the fence redirects guests' web traffic to it).
    pub port: Option<u16>,
    /// PEM files of CAs trusted for upstream servers besides the public roots (an operator's
    /// private CA; the demo's test CA). Verification is never turned off.
    pub extra_roots: Option<Vec<PathBuf>>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkFile {
    /// Pool the per-sandbox IPv4 /30 links are cut from.
    pub ipv4_pool: Option<String>,
    /// Pool the per-sandbox IPv6 /64 links are cut from.
    pub ipv6_pool: Option<String>,
    /// Destination CIDRs the operator explicitly allows although policy's destination classes
    /// would refuse them (e.g. a private registry mirror).
    pub allow_cidrs: Option<Vec<String>>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HostsFile {
    /// The coding agent's built-in hosts ({agent_api_host}, {agent_platform_host}).
    pub agent: Option<Vec<String>>,
    pub code_host: Option<String>,
    pub code_api_host: Option<String>,
    pub code_uploads_host: Option<String>,
    pub code_archive_host: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DnsFile {
    /// Upstream resolvers (`IP` or `IP:port`); empty or absent: the nameservers of `resolv_conf`.
    pub upstreams: Option<Vec<String>>,
    pub resolv_conf: Option<PathBuf>,
    /// Port the DNS guard listens on (the fence redirects guests' DNS to it).
    pub guard_port: Option<u16>,
}

/// Defaults of every key.
pub mod defaults {
    pub const STATE_DIR: &str = "/var/lib/svc";
    pub const SOCKET: &str = "/run/svc/svcd.sock";
    pub const PIN_DIR: &str = "/sys/fs/bpf/svc";
    pub const AUDIT_DIR: &str = "/var/log/svc";
    pub const API_GROUP: &str = "svc";
    pub const IPV4_POOL: &str = "10.203.0.0/16";
    pub const IPV6_POOL: &str = "fd73:7663:7663::/48";
    pub const AGENT_HOSTS: [&str; 2] = ["api.anthropic.com", "console.anthropic.com"];
    pub const CODE_HOST: &str = "github.com";
    pub const CODE_API_HOST: &str = "api.github.com";
    pub const CODE_UPLOADS_HOST: &str = "uploads.github.com";
    pub const CODE_ARCHIVE_HOST: &str = "codeload.github.com";
    pub const RESOLV_CONF: &str = "/etc/resolv.conf";
    pub const GUARD_PORT: u16 = 15353;
    pub const PROXY_PORT: u16 = 15443;
    pub const CONTAINER_RUNTIME: &str = "runc";
    pub const CONTAINER_IMAGE: &str = "/var/lib/svc/images/base";
    pub const CONTAINER_USER: &str = "svc-sandbox";
    pub const MICROVM_USER: &str = "svc-vm";
    pub const CGROUP_PARENT: &str = "svc";
    pub const MEMORY_MIB: u64 = 4096;
    pub const MICROVM_MEMORY_MIB: u64 = 512;
    pub const MICROVM_OVERHEAD_MIB: u64 = 256;
    pub const PIDS_MAX: u64 = 4096;
    /// Disk per sandbox: 10 GiB.
    pub const DISK_MIB: u64 = 10 * 1024;
    pub const CPUS: f64 = 2.0;
    pub const KEY_FILE: &str = "/etc/svc/secrets.key";
    pub const CODE_HOST_CLI: &str = "gh";
    /// The credential guardian's poll interval (SPEC 8: once per minute).
    pub const REFRESH_POLL_SECS: u64 = 60;
    /// The credential guardian's refresh lead time (SPEC 8: 30 minutes before expiry).
    pub const REFRESH_LEAD_SECS: u64 = 1800;
    pub const GIT_SSH: &str = "/usr/bin/ssh";
    pub const GIT_SSH_KNOWN_HOSTS: &str = "/etc/svc/known_hosts";
}

/// The git SSH relay's settings, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GitSshConfig {
    pub ssh: PathBuf,
    /// `None`: svcd's own `SSH_AUTH_SOCK`.
    pub agent_socket: Option<PathBuf>,
    pub known_hosts: PathBuf,
}

/// The container backend's settings, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContainerConfig {
    pub runtime: PathBuf,
    pub image: PathBuf,
    pub user: String,
    pub cgroup_parent: String,
    /// Bytes; 0: no limit.
    pub memory_bytes: u64,
    /// 0: no limit.
    pub pids_max: u64,
    /// Thousandths of a CPU; 0: no limit.
    pub cpu_millis: u64,
    /// The writable layer's size in MiB; 0: no limit (a directory on the state file system).
    pub disk_mib: u64,
}

/// The microvm backend's settings, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MicrovmConfig {
    pub qemu: PathBuf,
    pub memory_mib: u64,
    pub overhead_mib: u64,
    pub cpus: u32,
    /// `auto`, `kvm` or `tcg`.
    pub accel: String,
    pub user: String,
    pub virtiofsd: PathBuf,
    /// `virtio-serial` or `vsock`.
    pub channel: String,
    pub vhost_vsock: PathBuf,
    /// The guest's disk size in MiB (`[container] disk_mib`); 0: the image's own size.
    pub disk_mib: u64,
}

/// The code-hosting site and its API, upload and archive hosts (SPEC 5.5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CodeHostFamily {
    pub code_host: HostPattern,
    pub api_host: HostPattern,
    pub uploads_host: HostPattern,
    pub archive_host: HostPattern,
}

/// Validated host configuration with every default applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostConfig {
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    pub pin_dir: PathBuf,
    pub audit_dir: PathBuf,
    pub api_group: String,
    pub ipv4_pool: Ipv4Net,
    pub ipv6_pool: Ipv6Net,
    pub allow_cidrs: Vec<IpNet>,
    pub agent_hosts: Vec<HostPattern>,
    pub code: CodeHostFamily,
    /// Explicit upstreams; empty means "read `resolv_conf` at start".
    pub dns_upstreams: Vec<SocketAddr>,
    pub resolv_conf: PathBuf,
    pub guard_port: u16,
    pub proxy_port: u16,
    /// Extra upstream roots (PEM files).
    pub proxy_extra_roots: Vec<PathBuf>,
    /// The host's code-host token file (`credentials.code_host_token_file`).
    pub code_host_token_file: Option<PathBuf>,
    /// The group whose members may use it (gid, name) (`credentials.code_host_token_group`).
    pub code_host_token_group: Option<(u32, String)>,
    /// The coding agent's home: (host directory, guest path) (`credentials.agent_home`).
    pub agent_home: Option<(PathBuf, PathBuf)>,
    /// The host key (`credentials.key_file`).
    pub key_file: PathBuf,
    /// The code-host CLI (`gh`), if any (`credentials.code_host_cli`).
    pub code_host_cli: Option<PathBuf>,
    /// The coding agent's credential guardian, if on.
    pub guardian: Option<GuardianConfig>,
    /// The eBPF programs' diagnostics svcd logs (`fence_log_level`).
    pub fence_log_level: crate::dataplane::LogLevel,
    /// How often svcd looks at the tokens it refreshes, and how long before expiry it
    /// refreshes them (`credentials.refresh_poll_secs`, `credentials.refresh_lead_secs`).
    pub refresh_poll: std::time::Duration,
    pub refresh_lead: std::time::Duration,
    pub container: ContainerConfig,
    pub microvm: MicrovmConfig,
    /// Where `/metrics` is served; `None`: not served.
    pub metrics_listen: Option<SocketAddr>,
    pub git_ssh: GitSshConfig,
    /// The operator's forward proxy, if upstreams are reached through one.
    pub upstream_proxy: Option<UpstreamProxyConfig>,
    /// What one sandbox may hold open in svcd, per channel (`[limits]`).
    pub limits: super::limits::LimitsConfig,
}

impl Default for HostConfig {
    fn default() -> Self {
        // The defaults are constants that the test `defaults_are_valid` parses.
        #[expect(
            clippy::expect_used,
            reason = "built-in defaults are checked by a unit test"
        )]
        validate(Path::new("<defaults>"), HostConfigFile::default())
            .expect("built-in host defaults are valid")
    }
}

/// Parse and validate the text of a host configuration file.
pub fn parse(file: &Path, text: &str) -> Result<HostConfig, ConfigErrors> {
    let parsed: HostConfigFile = {
        let de = toml::Deserializer::parse(text).map_err(|e| toml_error(file, text, &e))?;
        serde_path_to_error::deserialize(de).map_err(|e| {
            let mut err = toml_error(file, text, e.inner());
            err.location.path = e.path().to_string();
            err
        })?
    };
    validate(file, parsed)
}

fn toml_error(file: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let (line, column) = e.span().map_or((None, None), |span| {
        let before = &text[..span.start.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before
            .rfind('\n')
            .map_or(before.len(), |i| before.len() - i - 1)
            + 1;
        (Some(line), Some(column))
    });
    ConfigError::new(
        file,
        Location {
            line,
            column,
            path: String::new(),
        },
        e.message().to_owned(),
    )
}

/// `[upstream]`: an `http://host:port` URL without path or credentials, a root-readable
/// credentials file path, `no_proxy` entries that parse.
fn upstream_proxy(
    f: UpstreamFile,
    err: &mut impl FnMut(&str, String),
) -> Option<UpstreamProxyConfig> {
    let Some(url) = f.proxy else {
        if f.proxy_credentials_file.is_some() || f.no_proxy.is_some() {
            err(
                "upstream.proxy",
                "proxy_credentials_file and no_proxy need upstream.proxy".into(),
            );
        }
        return None;
    };
    match url.parse::<http::Uri>() {
        Ok(u)
            if u.scheme_str() == Some("http")
                && u.host().is_some_and(|h| !h.is_empty())
                && u.port_u16().is_some()
                && u.path_and_query().is_none_or(|p| p.as_str() == "/")
                && !u.authority().is_some_and(|a| a.as_str().contains('@')) => {}
        _ => err(
            "upstream.proxy",
            format!(
                "expected http://host:port (credentials go in proxy_credentials_file), got {url:?}"
            ),
        ),
    }
    if let Some(p) = &f.proxy_credentials_file
        && !p.is_absolute()
    {
        err(
            "upstream.proxy_credentials_file",
            format!("expected an absolute path, got {}", p.display()),
        );
    }
    let no_proxy = f.no_proxy.unwrap_or_default();
    for (i, n) in no_proxy.iter().enumerate() {
        if let Err(e) = crate::proxy::upstream::NoProxy::parse(n) {
            err(&format!("upstream.no_proxy[{i}]"), e);
        }
    }
    Some(UpstreamProxyConfig {
        url,
        credentials_file: f.proxy_credentials_file,
        no_proxy,
    })
}

fn validate(file: &Path, f: HostConfigFile) -> Result<HostConfig, ConfigErrors> {
    let mut errors = Vec::new();
    let mut err = |path: &str, message: String| {
        errors.push(ConfigError::new(file, Location::at(path), message))
    };

    let mut dir = |key: &str, value: Option<PathBuf>, default: &str| -> PathBuf {
        let p = value.unwrap_or_else(|| PathBuf::from(default));
        if !p.is_absolute() {
            err(
                key,
                format!("expected an absolute path, got {}", p.display()),
            );
        }
        p
    };
    let state_dir = dir("state_dir", f.state_dir, defaults::STATE_DIR);
    let socket = dir("socket", f.socket, defaults::SOCKET);
    let pin_dir = dir("pin_dir", f.pin_dir, defaults::PIN_DIR);
    let audit_dir = dir("audit_dir", f.audit_dir, defaults::AUDIT_DIR);
    let resolv_conf = dir("dns.resolv_conf", f.dns.resolv_conf, defaults::RESOLV_CONF);
    let key_file = dir(
        "credentials.key_file",
        f.credentials.key_file.clone(),
        defaults::KEY_FILE,
    );

    let api_group = f
        .api_group
        .unwrap_or_else(|| defaults::API_GROUP.to_owned());
    if api_group.is_empty()
        || !api_group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
    {
        err(
            "api_group",
            format!("expected a group name, got {api_group:?}"),
        );
    }

    let v4 = f
        .network
        .ipv4_pool
        .as_deref()
        .unwrap_or(defaults::IPV4_POOL);
    let ipv4_pool = match v4.parse::<Ipv4Net>() {
        Ok(n) if n.prefix_len() <= 28 => n,
        Ok(_) => {
            err(
                "network.ipv4_pool",
                format!("pool {v4} is too small: a prefix of /28 or shorter is needed"),
            );
            Ipv4Net::default()
        }
        Err(_) => {
            err(
                "network.ipv4_pool",
                format!(
                    "expected an IPv4 CIDR such as {}, got {v4:?}",
                    defaults::IPV4_POOL
                ),
            );
            Ipv4Net::default()
        }
    };
    let v6 = f
        .network
        .ipv6_pool
        .as_deref()
        .unwrap_or(defaults::IPV6_POOL);
    let ipv6_pool = match v6.parse::<Ipv6Net>() {
        Ok(n) if n.prefix_len() <= 56 => n,
        Ok(_) => {
            err(
                "network.ipv6_pool",
                format!("pool {v6} is too small: a prefix of /56 or shorter is needed"),
            );
            Ipv6Net::default()
        }
        Err(_) => {
            err(
                "network.ipv6_pool",
                format!(
                    "expected an IPv6 CIDR such as {}, got {v6:?}",
                    defaults::IPV6_POOL
                ),
            );
            Ipv6Net::default()
        }
    };
    let mut allow_cidrs = Vec::new();
    for (i, c) in f.network.allow_cidrs.unwrap_or_default().iter().enumerate() {
        match c.parse::<IpNet>() {
            Ok(n) => allow_cidrs.push(n),
            Err(_) => err(
                &format!("network.allow_cidrs[{i}]"),
                format!("expected a CIDR, got {c:?}"),
            ),
        }
    }

    let mut host = |key: &str, value: Option<String>, default: &str| -> HostPattern {
        let v = value.unwrap_or_else(|| default.to_owned());
        HostPattern::parse(&v).unwrap_or_else(|e| {
            err(key, e.to_string());
            HostPattern {
                kind: crate::policy::host::HostKind::Exact(String::new()),
                port: None,
            }
        })
    };
    let agent_hosts: Vec<HostPattern> = f
        .hosts
        .agent
        .unwrap_or_else(|| defaults::AGENT_HOSTS.map(String::from).to_vec())
        .into_iter()
        .enumerate()
        .map(|(i, h)| host(&format!("hosts.agent[{i}]"), Some(h), ""))
        .collect();
    let code = CodeHostFamily {
        code_host: host("hosts.code_host", f.hosts.code_host, defaults::CODE_HOST),
        api_host: host(
            "hosts.code_api_host",
            f.hosts.code_api_host,
            defaults::CODE_API_HOST,
        ),
        uploads_host: host(
            "hosts.code_uploads_host",
            f.hosts.code_uploads_host,
            defaults::CODE_UPLOADS_HOST,
        ),
        archive_host: host(
            "hosts.code_archive_host",
            f.hosts.code_archive_host,
            defaults::CODE_ARCHIVE_HOST,
        ),
    };

    let mut dns_upstreams = Vec::new();
    for (i, u) in f.dns.upstreams.unwrap_or_default().iter().enumerate() {
        match parse_upstream(u) {
            Some(a) => dns_upstreams.push(a),
            None => err(
                &format!("dns.upstreams[{i}]"),
                format!("expected IP or IP:port (IPv6 as [addr]:port), got {u:?}"),
            ),
        }
    }

    let guard_port = f.dns.guard_port.unwrap_or(defaults::GUARD_PORT);
    let proxy_port = f.proxy.port.unwrap_or(defaults::PROXY_PORT);
    for (key, port) in [("dns.guard_port", guard_port), ("proxy.port", proxy_port)] {
        if port == 0 {
            err(key, "expected a port from 1 to 65535, got 0".into());
        }
    }
    if guard_port == proxy_port {
        err(
            "proxy.port",
            format!("the proxy and the DNS guard cannot share port {proxy_port}"),
        );
    }
    let refresh = refresh_timing(&f.credentials, &mut err);
    let guardian = guardian(
        &f.credentials,
        f.credentials.agent_home.is_some(),
        refresh,
        &mut err,
    );
    let code_host_token_file = f.credentials.code_host_token_file;
    if let Some(p) = &code_host_token_file
        && !p.is_absolute()
    {
        err(
            "credentials.code_host_token_file",
            format!("expected an absolute path, got {}", p.display()),
        );
    }
    let code_host_token_group =
        f.credentials
            .code_host_token_group
            .and_then(|g| match nix::unistd::Group::from_name(&g) {
                Ok(Some(found)) => Some((found.gid.as_raw(), g)),
                _ => {
                    err(
                        "credentials.code_host_token_group",
                        format!("no group {g:?} on this host (getent group {g})"),
                    );
                    None
                }
            });
    let agent_home = match f.credentials.agent_home {
        None => None,
        Some(host) => {
            let guest = f.credentials.agent_home_guest.unwrap_or_else(|| {
                Path::new("/root").join(host.file_name().unwrap_or(std::ffi::OsStr::new("agent")))
            });
            for (key, p) in [
                ("credentials.agent_home", &host),
                ("credentials.agent_home_guest", &guest),
            ] {
                if !p.is_absolute() || p.components().any(|c| c == std::path::Component::ParentDir)
                {
                    err(
                        key,
                        format!(
                            "expected an absolute path without `..`, got {}",
                            p.display()
                        ),
                    );
                }
            }
            Some((host, guest))
        }
    };
    let code_host_cli = match f.credentials.code_host_cli {
        Some(p) if p.as_os_str().is_empty() => None,
        Some(p) => Some(p),
        None => Some(PathBuf::from(defaults::CODE_HOST_CLI)),
    };
    let proxy_extra_roots = f.proxy.extra_roots.unwrap_or_default();
    for (i, r) in proxy_extra_roots.iter().enumerate() {
        if !r.is_absolute() {
            err(
                &format!("proxy.extra_roots[{i}]"),
                format!("expected an absolute path, got {}", r.display()),
            );
        }
    }

    let git_ssh = GitSshConfig {
        ssh: f.git_ssh.ssh.unwrap_or_else(|| defaults::GIT_SSH.into()),
        agent_socket: f.git_ssh.agent_socket,
        known_hosts: f
            .git_ssh
            .known_hosts
            .unwrap_or_else(|| defaults::GIT_SSH_KNOWN_HOSTS.into()),
    };
    for (key, p) in [
        ("git_ssh.ssh", Some(&git_ssh.ssh)),
        ("git_ssh.agent_socket", git_ssh.agent_socket.as_ref()),
        ("git_ssh.known_hosts", Some(&git_ssh.known_hosts)),
    ] {
        if let Some(p) = p
            && !p.is_absolute()
        {
            err(
                key,
                format!("expected an absolute path, got {}", p.display()),
            );
        }
    }
    let limits = super::limits::validate(f.limits, f.git_ssh.max_sessions, &mut err);
    let upstream_proxy = upstream_proxy(f.upstream, &mut err);
    let container = container(f.container, &mut err);
    let mut microvm = microvm(f.microvm, &mut err);
    microvm.disk_mib = container.disk_mib;
    let metrics_listen = match f.metrics.listen.as_deref() {
        None => None,
        Some(l) => match l.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                err(
                    "metrics.listen",
                    format!("expected IP:port such as 127.0.0.1:9464, got {l:?}"),
                );
                None
            }
        },
    };

    if errors.is_empty() {
        Ok(HostConfig {
            state_dir,
            socket,
            pin_dir,
            audit_dir,
            api_group,
            ipv4_pool,
            ipv6_pool,
            allow_cidrs,
            agent_hosts,
            code,
            dns_upstreams,
            resolv_conf,
            guard_port,
            proxy_port,
            proxy_extra_roots,
            code_host_token_file,
            code_host_token_group,
            agent_home,
            key_file,
            code_host_cli,
            guardian,
            fence_log_level: f
                .fence_log_level
                .unwrap_or(crate::dataplane::LogLevel::Warn),
            refresh_poll: refresh.0,
            refresh_lead: refresh.1,
            container,
            microvm,
            metrics_listen,
            git_ssh,
            upstream_proxy,
            limits,
        })
    } else {
        Err(ConfigErrors(errors))
    }
}

/// (poll, lead) of svcd's token refreshes.
fn refresh_timing(
    c: &CredentialsFile,
    err: &mut impl FnMut(&str, String),
) -> (std::time::Duration, std::time::Duration) {
    let poll = c.refresh_poll_secs.unwrap_or(defaults::REFRESH_POLL_SECS);
    if !(1..=3600).contains(&poll) {
        err(
            "credentials.refresh_poll_secs",
            format!("expected 1 to 3600 seconds, got {poll}"),
        );
    }
    let lead = c.refresh_lead_secs.unwrap_or(defaults::REFRESH_LEAD_SECS);
    if !(60..=86_400).contains(&lead) {
        err(
            "credentials.refresh_lead_secs",
            format!("expected 60 to 86400 seconds, got {lead}"),
        );
    }
    (
        std::time::Duration::from_secs(poll),
        std::time::Duration::from_secs(lead),
    )
}

fn guardian(
    c: &CredentialsFile,
    has_home: bool,
    (poll, lead): (std::time::Duration, std::time::Duration),
    err: &mut impl FnMut(&str, String),
) -> Option<GuardianConfig> {
    let entry = c
        .agent_credentials_entry
        .clone()
        .unwrap_or_else(|| crate::creds::guardian::DEFAULT_ENTRY.to_owned());
    if entry.is_empty() {
        err("credentials.agent_credentials_entry", "is empty".into());
    }
    let endpoint = c.agent_token_endpoint.clone()?;
    if let Err(e) = crate::creds::oauth::parse_url(&endpoint) {
        err("credentials.agent_token_endpoint", e);
    }
    if !has_home {
        err(
            "credentials.agent_token_endpoint",
            "the guardian keeps credentials.agent_home's token fresh: set agent_home too".into(),
        );
    }
    Some(GuardianConfig {
        token_endpoint: endpoint,
        client_id: c.agent_client_id.clone(),
        entry,
        poll,
        lead,
    })
}

fn container(f: ContainerFile, err: &mut impl FnMut(&str, String)) -> ContainerConfig {
    let image = f
        .image
        .unwrap_or_else(|| PathBuf::from(defaults::CONTAINER_IMAGE));
    if !image.is_absolute() {
        err(
            "container.image",
            format!("expected an absolute path, got {}", image.display()),
        );
    }
    let user = f
        .user
        .unwrap_or_else(|| defaults::CONTAINER_USER.to_owned());
    if user.is_empty()
        || !user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
    {
        err(
            "container.user",
            format!("expected a user name, got {user:?}"),
        );
    }
    let cgroup_parent = f
        .cgroup_parent
        .unwrap_or_else(|| defaults::CGROUP_PARENT.to_owned());
    if cgroup_parent.is_empty()
        || cgroup_parent.starts_with('/')
        || cgroup_parent
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
        || !cgroup_parent
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./".contains(&b))
    {
        err(
            "container.cgroup_parent",
            format!(
                "expected a relative cgroup path of letters, digits, '-', '_' and '.' such as \
                 {:?}, got {cgroup_parent:?}",
                defaults::CGROUP_PARENT
            ),
        );
    }
    let memory_mib = f.memory_mib.unwrap_or(defaults::MEMORY_MIB);
    if memory_mib != 0 && memory_mib < 64 {
        err(
            "container.memory_mib",
            format!("expected 0 (no limit) or at least 64 MiB, got {memory_mib}"),
        );
    }
    let pids_max = f.pids_max.unwrap_or(defaults::PIDS_MAX);
    if pids_max != 0 && pids_max < 16 {
        err(
            "container.pids_max",
            format!("expected 0 (no limit) or at least 16, got {pids_max}"),
        );
    }
    let cpus = f.cpus.unwrap_or(defaults::CPUS);
    if !cpus.is_finite() || !(cpus == 0.0 || (0.01..=4096.0).contains(&cpus)) {
        err(
            "container.cpus",
            format!("expected 0 (no limit) or a number of CPUs from 0.01, got {cpus}"),
        );
    }
    let disk_mib = f.disk_mib.unwrap_or(defaults::DISK_MIB);
    if disk_mib != 0 && !(64..=MAX_DISK_MIB).contains(&disk_mib) {
        err(
            "container.disk_mib",
            format!(
                "expected 0 (no limit) or 64 MiB to {MAX_DISK_MIB} MiB (16 TiB), got {disk_mib}"
            ),
        );
    }
    ContainerConfig {
        disk_mib,
        runtime: f
            .runtime
            .unwrap_or_else(|| PathBuf::from(defaults::CONTAINER_RUNTIME)),
        image,
        user,
        cgroup_parent,
        memory_bytes: memory_mib.saturating_mul(1024 * 1024),
        pids_max,
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "checked above: finite, 0 or 0.01..=4096"
        )]
        cpu_millis: if cpus.is_finite() && cpus >= 0.0 {
            (cpus * 1000.0).round() as u64
        } else {
            0
        },
    }
}

fn microvm(f: MicrovmFile, err: &mut impl FnMut(&str, String)) -> MicrovmConfig {
    let memory_mib = f.memory_mib.unwrap_or(defaults::MICROVM_MEMORY_MIB);
    if !(128..=1 << 20).contains(&memory_mib) {
        err(
            "microvm.memory_mib",
            format!("expected 128 MiB or more, got {memory_mib}"),
        );
    }
    let overhead_mib = f.overhead_mib.unwrap_or(defaults::MICROVM_OVERHEAD_MIB);
    if overhead_mib < 64 {
        err(
            "microvm.overhead_mib",
            format!("expected at least 64 MiB (QEMU needs it), got {overhead_mib}"),
        );
    }
    let cpus = f.cpus.unwrap_or(1);
    if !(1..=64).contains(&cpus) {
        err("microvm.cpus", format!("expected 1 to 64, got {cpus}"));
    }
    let accel = f.accel.unwrap_or_else(|| "auto".to_owned());
    if !["auto", "kvm", "tcg"].contains(&accel.as_str()) {
        err(
            "microvm.accel",
            format!("expected \"auto\", \"kvm\" or \"tcg\", got {accel:?}"),
        );
    }
    let user = f.user.unwrap_or_else(|| defaults::MICROVM_USER.to_owned());
    if user.is_empty()
        || !user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
    {
        err(
            "microvm.user",
            format!("expected a user name, got {user:?}"),
        );
    }
    let channel = f.channel.unwrap_or_else(|| "virtio-serial".to_owned());
    if !["virtio-serial", "vsock"].contains(&channel.as_str()) {
        err(
            "microvm.channel",
            format!("expected \"virtio-serial\" or \"vsock\", got {channel:?}"),
        );
    }
    MicrovmConfig {
        qemu: f
            .qemu
            .unwrap_or_else(|| PathBuf::from("qemu-system-x86_64")),
        memory_mib,
        overhead_mib,
        cpus,
        accel,
        user,
        virtiofsd: f.virtiofsd.unwrap_or_else(|| PathBuf::from("virtiofsd")),
        channel,
        vhost_vsock: f
            .vhost_vsock
            .unwrap_or_else(|| PathBuf::from("vhost-device-vsock")),
        disk_mib: 0,
    }
}

/// The largest `container.disk_mib`: 16 TiB, ext4's file system limit with 4 KiB blocks.
const MAX_DISK_MIB: u64 = 16 << 20;

/// `IP` (port 53) or `IP:port` / `[IPv6]:port`.
pub fn parse_upstream(s: &str) -> Option<SocketAddr> {
    s.parse::<SocketAddr>()
        .ok()
        .or_else(|| s.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, 53)))
}

/// Nameservers of a resolv.conf text, as upstream addresses.
pub fn resolv_conf_nameservers(text: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|ip| ip.split('%').next()?.parse::<IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}
