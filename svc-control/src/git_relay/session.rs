//! What a sandbox may do over SSH ([`RelayPolicy`]) and what one session did ([`Session`], for
//! the audit).

use std::time::Duration;

use crate::policy::ssh::{RefUpdate, SshRequest};

/// What a sandbox may reach over SSH.
#[derive(Debug, Clone, Default)]
pub struct RelayPolicy {
    /// (host, `owner/repo`) pairs of `.svc/config.yaml` `egress.policy`.
    pub repos: Vec<(String, String)>,
    /// AllowedBranches globs (default `refs/heads/svc/**`).
    pub branches: Vec<String>,
}

/// What one session did, for the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub host: String,
    pub repo: String,
    pub command: String,
    pub refs: Vec<RefUpdate>,
    /// The push came with a signed certificate.
    pub signed: bool,
    /// `allow` or `deny`.
    pub decision: &'static str,
    /// Why it was refused (the line git's stderr got), if it was.
    pub reason: Option<String>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    pub duration: Duration,
    pub exit: i32,
}

impl Session {
    /// A session that has carried nothing yet, denied until the relay allows it: what
    /// `request` asked for (empty without one).
    pub(super) fn asked(request: Option<&SshRequest>) -> Self {
        Self {
            host: request.map(|r| r.host.clone()).unwrap_or_default(),
            repo: request.map(|r| r.repo.clone()).unwrap_or_default(),
            command: request
                .map(|r| r.service.command().to_owned())
                .unwrap_or_default(),
            refs: Vec::new(),
            signed: false,
            decision: "deny",
            reason: None,
            bytes_up: 0,
            bytes_down: 0,
            duration: Duration::ZERO,
            exit: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::ssh;

    #[test]
    fn a_session_is_denied_with_exit_1_until_the_relay_allows_it() {
        let blank = Session::asked(None);
        assert_eq!(
            (
                blank.host.as_str(),
                blank.repo.as_str(),
                blank.command.as_str()
            ),
            ("", "", "")
        );
        let args = ["git@github.com", "git-receive-pack '/owner/repo.git'"].map(String::from);
        let request = ssh::parse_request(&args).expect("a git request");
        let asked = Session::asked(Some(&request));
        assert_eq!(
            (
                asked.host.as_str(),
                asked.repo.as_str(),
                asked.command.as_str()
            ),
            ("github.com", "owner/repo", "git-receive-pack")
        );
        for s in [blank, asked] {
            assert_eq!((s.decision, s.exit, s.reason), ("deny", 1, None));
            assert_eq!((s.bytes_up, s.bytes_down, s.signed), (0, 0, false));
            assert!(s.refs.is_empty());
        }
    }
}
