//! Which protocol upgrades pass the proxy: a WebSocket handshake does, every other upgrade is
//! refused (never silently dropped). A handshake that carries a placeholder to swap is refused
//! too: the upgraded stream is relayed as raw bytes (possibly compressed, permessage-deflate),
//! so an upstream echoing the real token in it could not be scrubbed.

use super::decision::CredentialAction;

/// What a request's `Upgrade` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpgradeAsk {
    /// No protocol upgrade.
    None,
    /// An HTTP/1.1 WebSocket handshake: forwarded after the same checks as any request, then
    /// relayed both ways.
    WebSocket,
    /// Any other upgrade (`h2c`, TLS, …) or a malformed WebSocket handshake: refused (400).
    Refused(String),
}

/// Whether a request's protocol upgrade may pass: a WebSocket handshake (`GET`, HTTP/1.1,
/// `Upgrade: websocket`, `Connection: upgrade`) does; every other upgrade is refused, never
/// silently dropped.
pub fn upgrade(method: &str, http11: bool, headers: &[(&str, &[u8])]) -> UpgradeAsk {
    let values = |name: &str| -> Vec<String> {
        headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .flat_map(|(_, v)| {
                String::from_utf8_lossy(v)
                    .split(',')
                    .map(|t| t.trim().to_ascii_lowercase())
                    .collect::<Vec<_>>()
            })
            .filter(|t| !t.is_empty())
            .collect()
    };
    let upgrade = values("upgrade");
    if upgrade.is_empty() {
        return UpgradeAsk::None;
    }
    if upgrade != ["websocket"] {
        return UpgradeAsk::Refused(format!(
            "upgrade to {} is refused: only WebSocket upgrades pass the perimeter",
            upgrade.join(", ")
        ));
    }
    if !http11 || !method.eq_ignore_ascii_case("GET") {
        return UpgradeAsk::Refused("a WebSocket handshake is an HTTP/1.1 GET".into());
    }
    if !values("connection").iter().any(|t| t == "upgrade") {
        return UpgradeAsk::Refused("Upgrade: websocket without Connection: upgrade".into());
    }
    UpgradeAsk::WebSocket
}

/// The audit rule of a handshake refused for its credential.
pub const CREDENTIAL_RULE: &str = "upgrade-credential";

/// Why an allowed request's upgrade is refused for the credential it carries, if it is: a
/// placeholder is never swapped on a protocol upgrade, because the upgraded stream cannot be
/// scrubbed of the real token (refused 403).
pub fn credential_refused(ask: &UpgradeAsk, credential: &CredentialAction) -> Option<&'static str> {
    match (ask, credential) {
        (UpgradeAsk::WebSocket, CredentialAction::Swap { .. }) => Some(
            "credentials are not swapped on protocol upgrades: the upgraded stream cannot be \
             scrubbed of the real token",
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::credentials::{CredentialKind, Placeholder};

    #[test]
    fn credential_on_an_upgrade_cases() {
        let swap = CredentialAction::Swap {
            kind: CredentialKind::Host,
            placeholder: Placeholder::mint().unwrap(),
        };
        let cases: &[(&str, UpgradeAsk, CredentialAction, bool)] = &[
            (
                "websocket_with_a_swap_is_refused",
                UpgradeAsk::WebSocket,
                swap.clone(),
                true,
            ),
            (
                "websocket_without_credential_passes",
                UpgradeAsk::WebSocket,
                CredentialAction::Passthrough,
                false,
            ),
            (
                "websocket_with_a_stripped_credential_passes",
                UpgradeAsk::WebSocket,
                CredentialAction::Strip,
                false,
            ),
            (
                "no_upgrade_with_a_swap_passes",
                UpgradeAsk::None,
                swap.clone(),
                false,
            ),
            (
                "refused_upgrade_is_refused_before",
                UpgradeAsk::Refused("h2c".into()),
                swap,
                false,
            ),
        ];
        for (name, ask, credential, refused) in cases {
            assert_eq!(
                credential_refused(ask, credential).is_some(),
                *refused,
                "{name}"
            );
        }
    }
}
