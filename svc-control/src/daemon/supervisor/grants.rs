//! Brokered OAuth secrets in svcd (see `creds::grant`): the first refresh that proves a new
//! grant, the grants sandboxes hold, and the refresher that keeps them fresh, audits each
//! refresh and seals the new tokens back into the store.

use std::sync::Arc;

use tracing::{info, warn};

use super::{Supervisor, now_text};
use crate::{
    api,
    audit::{AuditEvent, CredentialEvent, rfc3339},
    creds::{
        self,
        grant::{Grant, GrantState, ms},
        oauth::TokenEndpoint,
    },
    daemon::failure::Failure,
};

impl Supervisor {
    fn grants(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Arc<Grant>>> {
        self.grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn endpoint(&self, url: &str, client_id: Option<String>) -> Result<TokenEndpoint, String> {
        let client = self
            .config
            .host_client
            .clone()
            .ok_or("this svcd has no client for token endpoints")?;
        Ok(TokenEndpoint {
            url: creds::oauth::parse_url(url)?,
            client_id,
            client,
        })
    }

    /// A new OAuth secret's grant: the refresh token is exchanged at once, so a wrong token or
    /// endpoint is refused now, not at a sandbox's first request.
    pub(super) async fn first_grant(
        &self,
        name: &str,
        refresh_token: &str,
        spec: api::OAuthSpec,
    ) -> Result<GrantState, Failure> {
        let endpoint = self
            .endpoint(&spec.token_endpoint, spec.client_id.clone())
            .map_err(|e| Failure::bad(format!("secret {name}: {e}")))?;
        let now = ms(std::time::SystemTime::now());
        let new = endpoint.refresh_grant(refresh_token).await.map_err(|e| {
            Failure::bad(format!(
                "secret {name}: the refresh token was not accepted: {e}"
            ))
        })?;
        let seed = GrantState {
            token_endpoint: spec.token_endpoint,
            client_id: spec.client_id,
            access_token: String::new(),
            refresh_token: refresh_token.to_owned(),
            issued_at_ms: now,
            expires_at_ms: now,
        };
        Ok(seed.refreshed(&new, now))
    }

    /// The stored grant of `name`, if it is an OAuth secret.
    pub(super) fn stored_grant(&self, name: &str) -> Result<Option<GrantState>, Failure> {
        let Some((_, sealed)) = self.store().secret_get(name)? else {
            return Ok(None);
        };
        let plain = self
            .config
            .key
            .open(&creds::store_aad(name), &sealed)
            .map_err(|e| Failure::internal(e.to_string()))?;
        GrantState::from_plaintext(&plain)
            .transpose()
            .map_err(Failure::internal)
    }

    /// The grant `name@v{version}` a sandbox was given. The current version is shared by
    /// every sandbox given it (and refreshed); an older or removed one is retired: it serves
    /// nothing it does not already hold.
    pub(super) fn grant(&self, name: &str, version: u32) -> Arc<Grant> {
        if let Some(g) = self.grants().get(name)
            && g.version == version
        {
            return g.clone();
        }
        let stored = self
            .store()
            .secret_get(name)
            .map_err(|e| e.to_string())
            .map(|row| row.map(|(r, _)| r.version));
        let loaded = match stored {
            Ok(Some(v)) if v == version => self.stored_grant(name).map_err(|f| f.message),
            Ok(Some(v)) => Err(format!(
                "secret {name} was rotated to v{v}: recreate the sandbox to get it"
            )),
            Ok(None) => Err(format!("secret {name} was removed")),
            Err(e) => Err(e),
        };
        match loaded {
            Ok(Some(state)) => {
                let g = Grant::new(name, version, Some(state));
                self.grants().insert(name.to_owned(), g.clone());
                g
            }
            Ok(None) => {
                let g = Grant::new(name, version, None);
                g.retire(format!("secret {name} is not an OAuth secret any more"));
                g
            }
            Err(why) => {
                let g = Grant::new(name, version, None);
                g.retire(why);
                g
            }
        }
    }

    /// `name` was rotated or removed: its grant is refreshed no more.
    pub(super) fn retire_grant(&self, name: &str, why: &str) {
        if let Some(g) = self.grants().remove(name) {
            g.retire(why.to_owned());
        }
    }

    /// Refresh every held grant that is due (called every `credentials.refresh_poll_secs`).
    pub async fn refresh_grants(&self) {
        let lead = self.config.host.refresh_lead;
        let held: Vec<Arc<Grant>> = self.grants().values().cloned().collect();
        for g in held {
            let Some(state) = g.state() else { continue };
            let now = ms(std::time::SystemTime::now());
            if g.is_retired() || !state.due(now, lead) {
                continue;
            }
            let (outcome, reason, expires) = self.refresh_one(&g, state).await;
            self.report_refresh(&g, outcome, reason, expires);
        }
    }

    /// Refresh `g` (now in `state`) at its token endpoint and keep what it gets: the outcome,
    /// why it failed, and when its token expires now.
    async fn refresh_one(
        &self,
        g: &Grant,
        state: GrantState,
    ) -> (&'static str, Option<String>, u64) {
        let result = match self.endpoint(&state.token_endpoint, state.client_id.clone()) {
            Ok(e) => e.refresh_grant(&state.refresh_token).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(new) => {
                let fresh = state.refreshed(&new, ms(std::time::SystemTime::now()));
                if let Err(e) = self.keep_refreshed(g, &fresh) {
                    warn!(credential = %g.credential, error = %e,
                        "the refreshed grant was not stored; it serves until svcd restarts");
                }
                let expires = fresh.expires_at_ms;
                g.set_state(fresh);
                info!(credential = %g.credential, expires_at_ms = expires, "OAuth secret refreshed");
                ("refreshed", None, expires)
            }
            Err(why) => {
                warn!(credential = %g.credential, reason = %why,
                    "OAuth secret refresh failed; its token serves until it expires");
                g.failed(why.clone());
                ("failed", Some(why), state.expires_at_ms)
            }
        }
    }

    /// Seal `fresh` into `g`'s stored secret, if it is still the version `g` holds.
    fn keep_refreshed(&self, g: &Grant, fresh: &GrantState) -> Result<(), String> {
        let sealed = self
            .config
            .key
            .seal(&creds::store_aad(&g.name), &fresh.to_plaintext())
            .map_err(|e| e.to_string())?;
        let kept = self
            .store()
            .secret_refresh(&g.name, g.version, &sealed, &now_text())
            .map_err(|e| e.to_string())?;
        if kept {
            Ok(())
        } else {
            Err("the secret was rotated or removed meanwhile".to_owned())
        }
    }

    /// A refresh of `g` counted, audited and told to its secret's owner.
    fn report_refresh(
        &self,
        g: &Grant,
        outcome: &'static str,
        reason: Option<String>,
        expires: u64,
    ) {
        self.config
            .metrics
            .credential_refresh(&g.credential, outcome);
        let expires_at = rfc3339(std::time::UNIX_EPOCH + std::time::Duration::from_millis(expires));
        let event = AuditEvent::Credential(CredentialEvent {
            credential: g.credential.clone(),
            outcome,
            reason: reason.clone(),
            expires_at: expires_at.clone(),
        });
        if let Err(e) = self.config.audit.emit(0, event) {
            warn!(credential = %g.credential, error = %e, "writing a credential audit record");
        }
        // The secret's owner's event (root's when it is gone meanwhile).
        let owner = self
            .store()
            .secret_get(&g.name)
            .ok()
            .flatten()
            .map_or(0, |(r, _)| r.owner_uid);
        self.event_owned(
            if reason.is_some() {
                "secret.refresh_failed"
            } else {
                "secret.refreshed"
            },
            None,
            Some(owner),
            serde_json::json!({"name": g.name, "version": g.version, "expires_at": expires_at, "reason": reason}),
        );
    }
}
