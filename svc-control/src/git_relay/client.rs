//! How the relay reaches the server: the host's ssh, the address it dials (resolved and checked
//! here, never by ssh) and the command line it runs with.

use std::{
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    process::Stdio,
    sync::Arc,
};

use crate::policy::{
    destination::{HostNetwork, classify_dial},
    ssh::{self, SshRequest},
};

/// How the relay runs the host's ssh.
#[derive(Debug, Clone)]
pub struct SshClient {
    pub binary: PathBuf,
    /// The host's agent (`SSH_AUTH_SOCK`); the only credential the relay uses.
    pub auth_sock: Option<PathBuf>,
    /// The known-hosts file servers are checked against (strictly).
    pub known_hosts: PathBuf,
    /// How the server's name is resolved (the host's resolver).
    pub resolver: RelayResolver,
    /// Every address the relay has ssh dial passes the destination classes with this.
    pub network: HostNetwork,
}

/// The resolver the relay finds a server's addresses with.
#[derive(Clone)]
pub struct RelayResolver(pub Arc<dyn crate::proxy::Resolve>);

impl std::fmt::Debug for RelayResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RelayResolver")
    }
}

/// The address ssh dials for `host:port`: the first of its addresses whose destination class
/// svc dials; refused with a line naming the classes when none is.
pub async fn dial_address(client: &SshClient, host: &str, port: u16) -> Result<SocketAddr, String> {
    let addrs: Vec<IpAddr> = client
        .resolver
        .0
        .resolve(host)
        .await
        .map_err(|e| format!("svc: refused: {host} could not be resolved: {e}"))?;
    let mut refused = Vec::new();
    for ip in addrs {
        let at = SocketAddr::new(ip, port);
        let verdict = classify_dial(at, &client.network);
        if verdict.reachable() {
            return Ok(at);
        }
        refused.push(format!("{at} ({})", verdict.class.name()));
    }
    Err(if refused.is_empty() {
        format!("svc: refused: {host} has no address")
    } else {
        format!(
            "svc: refused: {host} resolves only to addresses svc never dials for a sandbox: {}",
            refused.join(", ")
        )
    })
}

/// The ssh that carries `request` to the server at `dial`: no configuration but ours, the host
/// key checked strictly under the server's name, the host's agent the only credential.
pub(super) fn ssh_command(
    client: &SshClient,
    request: &SshRequest,
    dial: SocketAddr,
    git_protocol: Option<String>,
) -> tokio::process::Command {
    // The command is ours, rebuilt from the parsed request (its path holds only name
    // characters): no guest text reaches a shell.
    let command = format!("{} '/{}.git'", request.service.command(), request.repo);
    let port = request.port.unwrap_or(22);
    // ssh dials the checked address and checks the host key under the name (as known_hosts
    // writes it: `[name]:port` off port 22).
    let alias = if port == 22 {
        request.host.clone()
    } else {
        format!("[{}]:{port}", request.host)
    };
    let mut cmd = tokio::process::Command::new(&client.binary);
    cmd.args(["-F", "/dev/null", "-T", "-x", "-a"])
        .args(["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"])
        .arg("-o")
        .arg(format!(
            "UserKnownHostsFile={}",
            client.known_hosts.display()
        ))
        .args(["-o", "ClearAllForwardings=yes", "-o", "ProxyCommand=none"])
        .args(["-o", "ConnectTimeout=15", "-o", "CheckHostIP=no"])
        .arg("-o")
        .arg(format!("HostName={}", dial.ip()))
        .arg("-o")
        .arg(format!("HostKeyAlias={alias}"));
    if let Some(v) = git_protocol.filter(|v| ssh::git_protocol_ok(v)) {
        cmd.arg("-o").arg(format!("SetEnv=GIT_PROTOCOL={v}"));
    }
    if let Some(port) = request.port {
        cmd.arg("-p").arg(port.to_string());
    }
    let target = match &request.user {
        Some(u) => format!("{u}@{}", request.host),
        None => request.host.clone(),
    };
    cmd.arg("--").arg(target).arg(command);
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(sock) = &client.auth_sock {
        cmd.env("SSH_AUTH_SOCK", sock);
    }
    cmd
}
