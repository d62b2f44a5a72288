//! The OAuth 2.0 refresh grant (RFC 6749 section 6) against a provider's token endpoint, as
//! svcd asks it on the host: for the coding agent's credential guardian and for brokered
//! OAuth credentials. HTTPS only, through the same roots, resolver and forward proxy as the
//! proxy's upstream connections; the answer is capped and its error named without echoing any
//! token.

use std::{pin::Pin, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper::{Method, Request, Uri};
use zeroize::Zeroizing;

use super::grant::{Refreshed, Refresher};
use crate::proxy::resolve::{HostClient, error_chain};

/// Longest a token endpoint may take.
pub const TIMEOUT: Duration = Duration::from_secs(30);
/// Largest answer read from a token endpoint.
const MAX_ANSWER: usize = 64 * 1024;
/// An access token's lifetime when the endpoint does not say (`expires_in` is optional).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

/// One provider's token endpoint.
#[derive(Clone)]
pub struct TokenEndpoint {
    pub url: Uri,
    /// Sent as `client_id` when set (public clients).
    pub client_id: Option<String>,
    pub client: HostClient,
}

impl std::fmt::Debug for TokenEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenEndpoint")
            .field("url", &self.url)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

/// Parse a token endpoint's URL: `https://HOST[:PORT]/PATH`.
pub fn parse_url(s: &str) -> Result<Uri, String> {
    let u: Uri = s
        .parse()
        .map_err(|e| format!("token endpoint {s:?}: {e}"))?;
    if u.scheme_str() != Some("https") || u.host().is_none_or(str::is_empty) {
        return Err(format!(
            "token endpoint {s:?}: expected an https:// URL with a host"
        ));
    }
    Ok(u)
}

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
        let req = Request::builder()
            .method(Method::POST)
            .uri(self.url.clone())
            .header("content-type", "application/x-www-form-urlencoded")
            .header("accept", "application/json")
            .header("user-agent", concat!("svcd/", env!("CARGO_PKG_VERSION")))
            .body(Full::new(Bytes::from(body.as_bytes().to_vec())))
            .map_err(|e| format!("token request: {e}"))?;
        let at = &self.url;
        let exchange = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| format!("token endpoint {at}: {}", error_chain(&e)))?;
            let status = resp.status();
            let bytes = Limited::new(resp.into_body(), MAX_ANSWER)
                .collect()
                .await
                .map_err(|e| format!("token endpoint {at}: reading the answer: {e}"))?
                .to_bytes();
            Ok::<_, String>((status, Zeroizing::new(bytes.to_vec())))
        };
        let (status, bytes) = tokio::time::timeout(TIMEOUT, exchange)
            .await
            .map_err(|_| format!("token endpoint {at}: no answer within {TIMEOUT:?}"))??;
        let answer: Option<Answer> = serde_json::from_slice(&bytes).ok();
        if !status.is_success() {
            let why = answer
                .and_then(|a| {
                    a.error.map(|e| match a.error_description {
                        Some(d) => format!("{e} ({})", d.chars().take(200).collect::<String>()),
                        None => e,
                    })
                })
                .unwrap_or_else(|| "no OAuth error in the answer".into());
            return Err(format!(
                "token endpoint {at} answered {}: {why}",
                status.as_u16()
            ));
        }
        let Some(Answer {
            access_token: Some(access),
            refresh_token,
            expires_in,
            ..
        }) = answer
        else {
            return Err(format!(
                "token endpoint {at} answered {} without an access_token in JSON",
                status.as_u16()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_https_endpoints_with_a_host_are_taken() {
        assert!(parse_url("https://console.agent.test/v1/oauth/token").is_ok());
        for bad in [
            "http://console.agent.test/token",
            "https:///token",
            "console.agent.test",
            "",
        ] {
            assert!(parse_url(bad).is_err(), "{bad:?}");
        }
    }
}
