//! Which protocol upgrades pass the proxy: a WebSocket handshake does, every other upgrade is
//! refused (never silently dropped).

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
