//! Brokered OAuth secrets: a stored secret that is a refresh grant rather than a fixed value
//! (`svc secret set NAME --oauth-token-endpoint URL`). svcd keeps its access token fresh on the
//! host with the refresh grant against the credential's own token endpoint; the sandboxes
//! given it swap their one placeholder for whatever access token is current, so placeholders
//! stay stable across refreshes and the guest's far-future expiry stays true.
//!
//! A refresh that fails is retried at each poll and audited; the access token in hand is used
//! until it really expires, after which the proxy refuses the swap with a 502 naming the
//! credential (never a hang, never the expired token sent on).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::Bearer;

/// The plaintext of a stored OAuth secret starts with this (then its [`GrantState`] as JSON).
pub const PREFIX: &str = "oauth:v1:";

/// Everything svcd keeps of one grant (sealed with the host key in the secret store).
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct GrantState {
    pub token_endpoint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    pub access_token: String,
    pub refresh_token: String,
    pub issued_at_ms: u64,
    pub expires_at_ms: u64,
}

impl std::fmt::Debug for GrantState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrantState")
            .field("token_endpoint", &self.token_endpoint)
            .field("client_id", &self.client_id)
            .field("expires_at_ms", &self.expires_at_ms)
            .finish_non_exhaustive()
    }
}

impl Drop for GrantState {
    fn drop(&mut self) {
        use zeroize::Zeroize as _;
        self.access_token.zeroize();
        self.refresh_token.zeroize();
    }
}

pub fn ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl GrantState {
    /// A stored secret's plaintext, if it is a grant.
    pub fn from_plaintext(plain: &[u8]) -> Option<Result<Self, String>> {
        let rest = plain.strip_prefix(PREFIX.as_bytes())?;
        Some(serde_json::from_slice(rest).map_err(|e| format!("a stored OAuth grant: {e}")))
    }

    /// What is sealed in the store.
    pub fn to_plaintext(&self) -> Zeroizing<Vec<u8>> {
        let mut v = Zeroizing::new(PREFIX.as_bytes().to_vec());
        v.extend_from_slice(&serde_json::to_vec(self).unwrap_or_default());
        v
    }

    /// Whether to refresh at `now_ms`: within `lead` of expiry, or past half the token's life
    /// when it lives less than twice `lead`.
    pub fn due(&self, now_ms: u64, lead: Duration) -> bool {
        let life = self.expires_at_ms.saturating_sub(self.issued_at_ms);
        let lead_ms = u64::try_from(lead.as_millis())
            .unwrap_or(u64::MAX)
            .min(life / 2);
        now_ms.saturating_add(lead_ms) >= self.expires_at_ms
    }

    /// The state after a refresh at `now_ms`.
    pub fn refreshed(&self, new: &Refreshed, now_ms: u64) -> Self {
        Self {
            token_endpoint: self.token_endpoint.clone(),
            client_id: self.client_id.clone(),
            access_token: new.access_token.as_str().to_owned(),
            refresh_token: new
                .refresh_token
                .as_ref()
                .map_or_else(|| self.refresh_token.clone(), |r| r.as_str().to_owned()),
            issued_at_ms: now_ms,
            expires_at_ms: now_ms
                .saturating_add(u64::try_from(new.expires_in.as_millis()).unwrap_or(u64::MAX)),
        }
    }
}

/// One grant as the broker holds it: shared by every sandbox given it.
pub struct Grant {
    /// `store:NAME@vN`, as the audit and refusals name it.
    pub credential: String,
    pub name: String,
    pub version: u32,
    state: Mutex<Option<GrantState>>,
    /// Why it cannot be refreshed any more (rotated, removed), if so.
    retired: Mutex<Option<String>>,
    /// The last refresh failure, while it lasts.
    last_error: Mutex<Option<String>>,
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("credential", &self.credential)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Grant {
    pub fn new(name: &str, version: u32, state: Option<GrantState>) -> Arc<Self> {
        Arc::new(Self {
            credential: format!("store:{name}@v{version}"),
            name: name.to_owned(),
            version,
            state: Mutex::new(state),
            retired: Mutex::new(None),
            last_error: Mutex::new(None),
        })
    }

    /// The reference a sandbox's variable holds for this grant.
    pub fn reference(&self) -> String {
        crate::policy::credentials::grant_reference(&self.name, self.version)
    }

    /// A sandbox variable's value read as a grant reference: (name, version).
    pub fn parse_reference(value: &str) -> Option<(String, u32)> {
        crate::policy::credentials::parse_grant_reference(value)
    }

    /// A copy of the state (for a refresh).
    pub fn state(&self) -> Option<GrantState> {
        lock(&self.state).clone()
    }

    pub fn set_state(&self, s: GrantState) {
        *lock(&self.state) = Some(s);
        *lock(&self.last_error) = None;
    }

    pub fn failed(&self, why: String) {
        *lock(&self.last_error) = Some(why);
    }

    /// No more refreshes: `why` is what requests are told once the token expires.
    pub fn retire(&self, why: String) {
        *lock(&self.retired) = Some(why);
    }

    pub fn is_retired(&self) -> bool {
        lock(&self.retired).is_some()
    }

    /// The access token to send at `now_ms`, or why there is none (naming the credential).
    pub fn bearer(&self, now_ms: u64) -> Result<Bearer, String> {
        let state = lock(&self.state);
        let Some(s) = state.as_ref() else {
            return Err(format!(
                "credential {} is not available in this svcd: {}",
                self.credential,
                lock(&self.retired)
                    .clone()
                    .unwrap_or_else(|| "it was never loaded".into())
            ));
        };
        if now_ms < s.expires_at_ms {
            return Ok(Bearer::new(s.access_token.clone()));
        }
        let why = lock(&self.retired)
            .clone()
            .or_else(|| lock(&self.last_error).clone())
            .unwrap_or_else(|| "it has not been refreshed yet".into());
        Err(format!(
            "credential {} expired at {} and could not be refreshed: {why}",
            self.credential,
            crate::audit::rfc3339(UNIX_EPOCH + Duration::from_millis(s.expires_at_ms)),
        ))
    }
}

/// What a token endpoint gave back.
pub struct Refreshed {
    pub access_token: Zeroizing<String>,
    /// A rotated refresh token, if the endpoint issued one.
    pub refresh_token: Option<Zeroizing<String>>,
    /// Lifetime of the new access token.
    pub expires_in: Duration,
}

/// The refresh grant against a token endpoint (the OAuth token endpoint in production).
pub trait Refresher: Send + Sync {
    fn refresh<'a>(
        &'a self,
        refresh_token: &'a str,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Refreshed, String>> + Send + 'a>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(issued: u64, expires: u64) -> GrantState {
        GrantState {
            token_endpoint: "https://id.example/token".into(),
            client_id: None,
            access_token: "at-1".into(),
            refresh_token: "rt-1".into(),
            issued_at_ms: issued,
            expires_at_ms: expires,
        }
    }

    #[test]
    fn due_within_the_lead_or_past_half_a_short_life() {
        let lead = Duration::from_secs(1800);
        let hour = 3_600_000;
        // An 8-hour token: due 30 minutes before expiry.
        let s = state(0, 8 * hour);
        assert!(!s.due(8 * hour - 31 * 60_000, lead));
        assert!(s.due(8 * hour - 29 * 60_000, lead));
        // A 20-second token: due after 10 seconds.
        let s = state(0, 20_000);
        assert!(!s.due(9_000, lead));
        assert!(s.due(10_000, lead));
    }

    #[test]
    fn the_access_token_serves_until_expiry_then_the_refusal_names_the_credential() {
        let g = Grant::new("mcp", 2, Some(state(0, 20_000)));
        assert_eq!(g.bearer(19_999).expect("valid").expose(), "at-1");
        g.failed("token endpoint https://id.example/token answered 400: invalid_grant".into());
        assert_eq!(g.bearer(19_999).expect("still valid").expose(), "at-1");
        let e = g.bearer(20_000).expect_err("expired");
        assert_eq!(
            e,
            "credential store:mcp@v2 expired at 1970-01-01T00:00:20.000Z and could not be \
             refreshed: token endpoint https://id.example/token answered 400: invalid_grant"
        );
        assert!(!e.contains("at-1") && !e.contains("rt-1"));
        assert!(!format!("{:?}", g.state().expect("state")).contains("rt-1"));
    }

    #[test]
    fn references_round_trip_and_no_stored_value_reads_as_one() {
        let g = Grant::new("team.mcp-1", 7, None);
        assert_eq!(
            Grant::parse_reference(&g.reference()),
            Some(("team.mcp-1".into(), 7))
        );
        assert_eq!(Grant::parse_reference("grant:x@v1"), None);
        assert!(super::super::check_value("x", &g.reference()).is_err());
        let plain = state(1, 2).to_plaintext();
        assert_eq!(
            GrantState::from_plaintext(&plain)
                .expect("a grant")
                .expect("parses"),
            state(1, 2)
        );
        assert!(GrantState::from_plaintext(b"plain-token").is_none());
    }
}
