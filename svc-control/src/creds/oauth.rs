//! The OAuth 2.0 refresh grant (RFC 6749 section 6) against a provider's token endpoint, as
//! svcd asks it on the host: for the coding agent's credential guardian and for brokered
//! OAuth credentials. HTTPS only, through the same roots, resolver and forward proxy as the
//! proxy's upstream connections; the answer is capped and its error named without echoing any
//! token.

use std::{future::Future, pin::Pin, sync::Arc, time::Duration};

use http::Uri;
use zeroize::Zeroizing;

use super::grant::{Refreshed, Refresher};

/// Longest a token endpoint may take.
pub const TIMEOUT: Duration = Duration::from_secs(30);
/// Largest answer read from a token endpoint.
pub const MAX_ANSWER: usize = 64 * 1024;
/// An access token's lifetime when the endpoint does not say (`expires_in` is optional).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

/// What a token endpoint answered: its status and (capped) body.
pub type FormAnswer = Result<(u16, Zeroizing<Vec<u8>>), String>;

/// How a form is posted to a token endpoint over HTTPS (svcd: through its host client, with
/// the proxy's roots, resolver and forward proxy; `daemon::wiring::HostForms`).
pub trait FormPost: Send + Sync {
    /// POST `form` (`application/x-www-form-urlencoded`) to `url`, asking for JSON: the
    /// answer's status and at most `max` bytes of its body, or why there is none (never
    /// echoing the form).
    fn post_form<'a>(
        &'a self,
        url: &'a Uri,
        form: Zeroizing<Vec<u8>>,
        max: usize,
    ) -> Pin<Box<dyn Future<Output = FormAnswer> + Send + 'a>>;
}

/// One provider's token endpoint.
#[derive(Clone)]
pub struct TokenEndpoint {
    pub url: Uri,
    /// Sent as `client_id` when set (public clients).
    pub client_id: Option<String>,
    pub client: Arc<dyn FormPost>,
}

impl std::fmt::Debug for TokenEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEndpoint")
            .field("url", &self.url)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

pub use crate::config::host::parse_token_endpoint as parse_url;

/// The endpoint's JSON answer.
#[derive(serde::Deserialize)]
struct Answer {
    access_token: Option<String>,
    refresh_token: Option<String>,
    expires_in: Option<u64>,
    error: Option<String>,
    error_description: Option<String>,
}

impl TokenEndpoint {
    /// The refresh grant: a new access token (and perhaps a new refresh token).
    pub async fn refresh_grant(&self, refresh_token: &str) -> Result<Refreshed, String> {
        let body = Zeroizing::new({
            let mut form = form_urlencoded::Serializer::new(String::new());
            form.append_pair("grant_type", "refresh_token");
            form.append_pair("refresh_token", refresh_token);
            if let Some(id) = &self.client_id {
                form.append_pair("client_id", id);
            }
            form.finish()
        });
        let at = &self.url;
        let form = Zeroizing::new(body.as_bytes().to_vec());
        let (status, bytes) =
            tokio::time::timeout(TIMEOUT, self.client.post_form(at, form, MAX_ANSWER))
                .await
                .map_err(|_| format!("token endpoint {at}: no answer within {TIMEOUT:?}"))??;
        let answer: Option<Answer> = serde_json::from_slice(&bytes).ok();
        if !(200..300).contains(&status) {
            let why = answer
                .and_then(|a| {
                    a.error.map(|e| match a.error_description {
                        Some(d) => format!("{e} ({})", d.chars().take(200).collect::<String>()),
                        None => e,
                    })
                })
                .unwrap_or_else(|| "no OAuth error in the answer".into());
            return Err(format!("token endpoint {at} answered {status}: {why}"));
        }
        let Some(Answer {
            access_token: Some(access),
            refresh_token,
            expires_in,
            ..
        }) = answer
        else {
            return Err(format!(
                "token endpoint {at} answered {status} without an access_token in JSON"
            ));
        };
        if access.is_empty() || access.contains(['\r', '\n', '\0']) {
            return Err(format!(
                "token endpoint {at}: the access_token is empty or holds a line break"
            ));
        }
        Ok(Refreshed {
            access_token: Zeroizing::new(access),
            refresh_token: refresh_token.filter(|r| !r.is_empty()).map(Zeroizing::new),
            expires_in: expires_in.map_or(DEFAULT_LIFETIME, Duration::from_secs),
        })
    }
}

impl Refresher for TokenEndpoint {
    fn refresh<'a>(
        &'a self,
        refresh_token: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Refreshed, String>> + Send + 'a>> {
        Box::pin(self.refresh_grant(refresh_token))
    }
}
