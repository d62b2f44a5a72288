//! svcd's host configuration: `/etc/svc/svcd.toml`. Every key is optional; the defaults are
//! the constants of [`defaults`] and are documented in `docs/host-config.md`.
//!
//! The built-in agent hosts and the code-host family (`{agent_api_host}`,
//! `{code_host}`, … in the docs) are configuration: nothing else in svc names them.
//!
//! One file per table (firecracker's `vmm_config` style): each holds its table as written and
//! turns it into its validated type. This file holds the whole: the file type, the validated
//! [`HostConfig`], [`parse`], and the check that calls each section in turn.

mod audit;
mod checks;
mod container;
mod credentials;
pub mod defaults;
mod dns;
mod fence;
mod git_ssh;
mod hosts;
/// `[limits]` of svcd.toml: per-guest caps on every channel a guest can open.
pub mod limits;
mod metrics;
mod microvm;
mod network;
mod pool;
mod proxy;
mod spans;
mod upstream;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

pub use audit::{AuditConfig, AuditFile};
pub use container::{ContainerConfig, ContainerFile, IdRanges};
pub use credentials::{CredentialsFile, DEFAULT_ENTRY, GuardianConfig, parse_token_endpoint};
pub use dns::{DnsFile, parse_upstream, resolv_conf_nameservers};
pub use fence::LogLevel;
pub use git_ssh::{GitSshConfig, GitSshFile};
pub use hosts::{CodeHostFamily, HostsFile};
use limits::{LimitsConfig, LimitsFile};
pub use metrics::MetricsFile;
pub use microvm::{ImagePaths, MicrovmConfig, MicrovmFile};
pub use network::NetworkFile;
pub use pool::{PoolConfig, PoolFile};
pub use proxy::ProxyFile;
pub use upstream::{NoProxy, UpstreamFile, UpstreamProxyConfig};

use super::{ConfigError, ConfigErrors, Location};
use crate::hosts::HostPattern;

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
    pub fence_log_level: Option<LogLevel>,
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
    /// `[limits]`: what one sandbox may hold open in svcd (see [`limits`]).
    #[serde(default)]
    pub limits: LimitsFile,
    /// `[audit]`: the audit log's size cap and rotated files kept.
    #[serde(default)]
    pub audit: AuditFile,
    /// `[pool]`: sandboxes made ahead of their requests.
    #[serde(default)]
    pub pool: PoolFile,
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
    pub fence_log_level: LogLevel,
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
    pub limits: LimitsConfig,
    /// The audit log's retention (`[audit]`).
    pub audit: AuditConfig,
    /// The warm pools (`[pool]`).
    pub pool: PoolConfig,
}

impl HostConfig {
    /// The highest sandbox id: one per /30 of `ipv4_pool` (each sandbox's link is a /30 of it).
    pub fn max_sandbox_id(&self) -> u32 {
        let slots = 1u64 << 30u8.saturating_sub(self.ipv4_pool.prefix_len());
        u32::try_from(slots.min(u64::from(u32::MAX - 1))).unwrap_or(u32::MAX - 1)
    }
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

/// Parse and validate the text of a host configuration file. Every error is returned, in
/// the order svcd has always reported them (table by table), each naming its line when its key
/// is written in the file.
pub fn parse(file: &Path, text: &str) -> Result<HostConfig, ConfigErrors> {
    let parsed: HostConfigFile = {
        let de = toml::Deserializer::parse(text).map_err(|e| toml_error(file, text, &e))?;
        serde_path_to_error::deserialize(de).map_err(|e| {
            let mut err = toml_error(file, text, e.inner());
            err.location.path = e.path().to_string();
            err
        })?
    };
    validate(file, parsed).map_err(|mut errors| {
        for e in &mut errors.0 {
            locate(text, e);
        }
        errors
    })
}

/// Parse and validate as [`parse`] does, and also say what is valid but likely not meant
/// (warnings, each at its key's line).
pub fn check(file: &Path, text: &str) -> Result<(HostConfig, Vec<ConfigError>), ConfigErrors> {
    let config = parse(file, text)?;
    let warnings = config
        .code
        .warnings()
        .into_iter()
        .map(|(key, message)| {
            let mut w = ConfigError::new(file, Location::at(key), message);
            locate(text, &mut w);
            w
        })
        .collect();
    Ok((config, warnings))
}

/// Fill in the line and column of `e`'s key from where it is written in `text`.
fn locate(text: &str, e: &mut ConfigError) {
    if e.location.line.is_none()
        && let Some((line, column)) = spans::position(text, &e.location.path)
    {
        e.location.line = Some(line);
        e.location.column = Some(column);
    }
}

fn toml_error(file: &Path, text: &str, e: &toml::de::Error) -> ConfigError {
    let (line, column) = e.span().map_or((None, None), |span| {
        let (line, column) = spans::line_column(text, span.start);
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

/// Every rule of the file, every error reported together.
fn validate(file: &Path, f: HostConfigFile) -> Result<HostConfig, ConfigErrors> {
    let mut errors = Vec::new();
    let mut err = |path: &str, message: String| {
        errors.push(ConfigError::new(file, Location::at(path), message))
    };
    let config = check_sections(f, &mut err);
    if errors.is_empty() {
        Ok(config)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// Each table in turn, in the order svcd has always reported their errors (svcd's paths
/// first, `[dns] resolv_conf` and `[credentials] key_file` among them).
fn check_sections(f: HostConfigFile, err: &mut impl FnMut(&str, String)) -> HostConfig {
    let state_dir = checks::absolute_or("state_dir", f.state_dir, defaults::STATE_DIR, err);
    let socket = checks::absolute_or("socket", f.socket, defaults::SOCKET, err);
    let pin_dir = checks::absolute_or("pin_dir", f.pin_dir, defaults::PIN_DIR, err);
    let audit_dir = checks::absolute_or("audit_dir", f.audit_dir, defaults::AUDIT_DIR, err);
    let resolv_conf = checks::absolute_or(
        "dns.resolv_conf",
        f.dns.resolv_conf.clone(),
        defaults::RESOLV_CONF,
        err,
    );
    let key_file = checks::absolute_or(
        "credentials.key_file",
        f.credentials.key_file.clone(),
        defaults::KEY_FILE,
        err,
    );
    let api_group = api_group(f.api_group, err);
    let network = f.network.validate(err);
    let hosts = f.hosts.validate(err);
    let dns = f.dns.validate(err);
    let proxy_port = f.proxy.port(dns.guard_port, err);
    let credentials = f.credentials.validate(err);
    let proxy_extra_roots = f.proxy.extra_roots(err);
    let git_ssh = f.git_ssh.validate(err);
    let limits = f.limits.validate(f.git_ssh.max_sessions, err);
    let upstream_proxy = f.upstream.validate(err);
    let container = f.container.validate(err);
    let mut microvm = f.microvm.validate(err);
    microvm.disk_mib = container.disk_mib;
    let metrics_listen = f.metrics.validate(err);
    let audit = f.audit.validate(err);
    let pool = f.pool.validate(err);
    HostConfig {
        state_dir,
        socket,
        pin_dir,
        audit_dir,
        api_group,
        ipv4_pool: network.ipv4_pool,
        ipv6_pool: network.ipv6_pool,
        allow_cidrs: network.allow_cidrs,
        agent_hosts: hosts.agent,
        code: hosts.code,
        dns_upstreams: dns.upstreams,
        resolv_conf,
        guard_port: dns.guard_port,
        proxy_port,
        proxy_extra_roots,
        code_host_token_file: credentials.code_host_token_file,
        code_host_token_group: credentials.code_host_token_group,
        agent_home: credentials.agent_home,
        key_file,
        code_host_cli: credentials.code_host_cli,
        guardian: credentials.guardian,
        fence_log_level: f.fence_log_level.unwrap_or(LogLevel::Warn),
        refresh_poll: credentials.refresh_poll,
        refresh_lead: credentials.refresh_lead,
        container,
        microvm,
        metrics_listen,
        git_ssh,
        upstream_proxy,
        limits,
        audit,
        pool,
    }
}

/// `api_group`: a group name.
fn api_group(value: Option<String>, err: &mut impl FnMut(&str, String)) -> String {
    let api_group = value.unwrap_or_else(|| defaults::API_GROUP.to_owned());
    if !checks::is_plain_name(&api_group) {
        err(
            "api_group",
            format!("expected a group name, got {api_group:?}"),
        );
    }
    api_group
}
