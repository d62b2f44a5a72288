//! The git SSH relay's service for each sandbox: every connection its guest opens (the
//! `svc-git-ssh` shim) is one git session, decided by `policy::ssh` with the sandbox's own
//! repositories and branches, run with the host's ssh and agent, and audited.

use std::sync::Arc;

use tracing::{info, warn};

use super::{Supervisor, sandbox::Live};
use crate::{
    audit::{AuditEvent, SshEvent, SshRef},
    git_relay::{self, RelayPolicy, Session, SshClient},
    limits::{Channel, GuestLimits},
    runtime::{GuestConn, GuestService},
};

impl Supervisor {
    /// The host's ssh as the relay runs it: `[git_ssh]`, the agent socket defaulting to
    /// svcd's own `SSH_AUTH_SOCK`.
    pub(super) fn ssh_client(&self) -> SshClient {
        let c = &self.config.host.git_ssh;
        SshClient {
            binary: c.ssh.clone(),
            auth_sock: c
                .agent_socket
                .clone()
                .or_else(|| std::env::var_os("SSH_AUTH_SOCK").map(Into::into)),
            known_hosts: c.known_hosts.clone(),
            resolver: git_relay::RelayResolver(self.config.resolver.clone()),
            network: self.config.network.clone(),
        }
    }

    /// Hand the connections `live`'s guest opens to the relay (at creation, and again when
    /// svcd re-adopts the sandbox).
    pub(super) async fn serve_git_ssh(
        &self,
        live: &Live,
    ) -> Result<(), crate::runtime::RuntimeError> {
        let forward = live
            .envelope
            .workspace
            .as_ref()
            .map(|w| w.auth.ssh_agent_forward);
        let off = crate::policy::ssh::relay_on(forward)
            .err()
            .map(str::to_owned);
        let service = relay_service(
            live.id,
            live.incarnation.clone(),
            off,
            RelayPolicy {
                repos: live
                    .envelope
                    .ssh_repos
                    .iter()
                    .map(|r| (r.host.clone(), r.repo.clone()))
                    .collect(),
                branches: live.envelope.allowed_branches.clone(),
            },
            self.ssh_client(),
            self.config.limits.clone(),
            self.config.audit.clone(),
        );
        self.backends
            .get(&live.envelope.backend)
            .serve_guest(&live.guest, &self.sandbox_dir(&live.name), service)
            .await
    }
}

/// Each connection: a session (or a refusal when the sandbox already runs
/// `limits.git_ssh_sessions`, counted for incarnation `of` only), its audit record (of `of`,
/// the sandbox served, even when the session ends after it was destroyed). The sandbox's
/// teardown ends its sessions (the host's ssh is killed with them).
fn relay_service(
    id: u32,
    of: crate::audit::Incarnation,
    off: Option<String>,
    policy: RelayPolicy,
    client: SshClient,
    limits: Arc<GuestLimits>,
    audit: Arc<dyn crate::audit::AuditSink>,
) -> GuestService {
    let whose = crate::limits::Guest::new(id, of.key.clone());
    let shared = Arc::new((of, policy, client, audit, off, whose));
    Arc::new(move |conn: GuestConn| {
        let (limits, shared) = (limits.clone(), shared.clone());
        tokio::spawn(async move {
            let (of, policy, client, audit, off, whose) = &*shared;
            let name = &*of.name;
            let result = match off {
                Some(off) => git_relay::refuse(conn.reader, conn.writer, off).await,
                None => match limits.acquire(whose, Channel::GitSsh) {
                    Ok(slot) => tokio::select! {
                        r = git_relay::serve(conn.reader, conn.writer, policy, client) => r,
                        () = slot.ended() => {
                            warn!(sandbox = %name, "a git SSH session cut: its sandbox was torn down");
                            return;
                        }
                    },
                    Err(hit) => {
                        let line = format!("svc: refused: {hit}");
                        git_relay::refuse(conn.reader, conn.writer, &line).await
                    }
                },
            };
            match result {
                Ok(s) => {
                    info!(sandbox = %name, host = %s.host, repo = %s.repo, command = %s.command,
                        decision = s.decision, reason = s.reason.as_deref().unwrap_or(""),
                        refs = s.refs.len(), exit = s.exit,
                        "git SSH session");
                    if let Err(e) = audit.emit_of(id, of, event(&s)) {
                        warn!(sandbox = %name, error = %e, "writing a git SSH audit record");
                    }
                }
                Err(e) => {
                    warn!(sandbox = %name, error = %e, "a git SSH relay connection ended without a request")
                }
            }
        });
    })
}

fn event(s: &Session) -> AuditEvent {
    AuditEvent::Ssh(SshEvent {
        host: s.host.clone(),
        repo: s.repo.clone(),
        command: s.command.clone(),
        refs: s
            .refs
            .iter()
            .map(|r| SshRef {
                name: r.name.clone(),
                old: r.old.clone(),
                new: r.new.clone(),
            })
            .collect(),
        signed: s.signed,
        decision: s.decision,
        reason: s.reason.clone(),
        bytes_up: s.bytes_up,
        bytes_down: s.bytes_down,
        duration_ms: u64::try_from(s.duration.as_millis()).unwrap_or(u64::MAX),
        exit: s.exit,
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_session_becomes_one_ssh_audit_record() {
        let s = Session {
            host: "code.test".into(),
            repo: "acme/widget".into(),
            command: "git-receive-pack".into(),
            refs: vec![crate::policy::ssh::RefUpdate {
                old: "0".repeat(40),
                new: "1".repeat(40),
                name: "refs/heads/main".into(),
            }],
            signed: true,
            decision: "deny",
            reason: Some("svc: refused: ref refs/heads/main not in allowed branches".into()),
            bytes_up: 10,
            bytes_down: 20,
            duration: Duration::from_millis(1500),
            exit: 1,
        };
        // What `emit_of(7, demo's incarnation, …)` writes.
        let of = crate::audit::Incarnation::new("demo", "0123456789abcdef");
        let record = crate::audit::AuditRecord::now_of(7, &of, event(&s));
        let v = serde_json::to_value(record).expect("json");
        assert_eq!(v["layer"], "ssh");
        assert_eq!(v["sandbox"], 7);
        assert_eq!(v["sandbox_name"], "demo");
        assert_eq!(v["incarnation"], "0123456789abcdef");
        assert_eq!(v["refs"][0]["name"], "refs/heads/main");
        assert_eq!(v["signed"], true);
        assert_eq!(v["duration_ms"], 1500);
        assert_eq!(v["decision"], "deny");
    }
}
