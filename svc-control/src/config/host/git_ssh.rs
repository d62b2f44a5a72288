//! `[git_ssh]`: the git-over-SSH relay (how the host's own ssh reaches code hosts for the
//! sandboxes; which repositories and refs each sandbox may reach is its own policy).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{checks, defaults};

/// `[git_ssh]` as written.
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

/// The git SSH relay's settings, validated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GitSshConfig {
    pub ssh: PathBuf,
    /// `None`: svcd's own `SSH_AUTH_SOCK`.
    pub agent_socket: Option<PathBuf>,
    pub known_hosts: PathBuf,
}

impl GitSshFile {
    /// Check each path, reporting every error through `err` (`max_sessions` is checked with
    /// `[limits]`).
    pub(super) fn validate(&self, err: &mut impl FnMut(&str, String)) -> GitSshConfig {
        let git_ssh = GitSshConfig {
            ssh: self.ssh.clone().unwrap_or_else(|| defaults::GIT_SSH.into()),
            agent_socket: self.agent_socket.clone(),
            known_hosts: self
                .known_hosts
                .clone()
                .unwrap_or_else(|| defaults::GIT_SSH_KNOWN_HOSTS.into()),
        };
        checks::check_absolute("git_ssh.ssh", &git_ssh.ssh, err);
        if let Some(p) = &git_ssh.agent_socket {
            checks::check_absolute("git_ssh.agent_socket", p, err);
        }
        checks::check_absolute("git_ssh.known_hosts", &git_ssh.known_hosts, err);
        git_ssh
    }
}
