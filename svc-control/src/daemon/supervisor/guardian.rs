//! The coding agent's credential guardian per running sandbox: a task that checks
//! the shared home's `.credentials.json` every poll interval and refreshes the token before it
//! expires. The tasks of several sandboxes (and of other svcd's or `svcd guardian` runs on the
//! same home) serialise on the sidecar lock file; see `creds::guardian`.

use std::sync::Arc;

use tracing::{debug, info, warn};

use super::{Supervisor, sandbox::Live, task::TaskGuard};
use crate::creds::guardian::Outcome;

impl Supervisor {
    /// Start `live`'s guardian if svcd has one and the sandbox shares the agent's home.
    pub(super) fn start_guardian(&self, live: &Live) -> Option<Arc<TaskGuard>> {
        let g = self.config.guardian.clone()?;
        if !live.envelope.live_mounts.iter().any(|m| m.host == g.home) {
            return None;
        }
        let poll = self
            .config
            .host
            .guardian
            .as_ref()
            .map_or(crate::creds::guardian::DEFAULT_POLL, |c| c.poll);
        let (name, metrics) = (live.name.clone(), self.config.metrics.clone());
        let home = g.home.clone();
        let task = tokio::spawn(g.run(poll, move |o| {
            let outcome = match o {
                Outcome::Fresh { expires_at_ms } => {
                    debug!(sandbox = %name, home = %home.display(), expires_at_ms, "agent credential fresh");
                    return;
                }
                Outcome::NoFile => {
                    debug!(sandbox = %name, home = %home.display(), "no agent credentials file");
                    return;
                }
                Outcome::Refreshed { expires_at_ms } => {
                    info!(sandbox = %name, home = %home.display(), expires_at_ms,
                        "agent credential refreshed");
                    "refreshed"
                }
                Outcome::RefreshedByAnother { expires_at_ms } => {
                    info!(sandbox = %name, home = %home.display(), expires_at_ms,
                        "agent credential already refreshed by another guardian");
                    "refreshed_by_another"
                }
                Outcome::Failed { reason } => {
                    warn!(sandbox = %name, home = %home.display(), %reason,
                        "agent credential refresh failed; the token stays as it was");
                    "failed"
                }
            };
            metrics.credential_refresh("agent", outcome);
        }));
        Some(Arc::new(TaskGuard(task.abort_handle())))
    }
}
