//! Headers of one hop: never forwarded either way, except the two a WebSocket handshake and
//! its answer carry on.

use http::{HeaderMap, HeaderName, HeaderValue, header};

/// Headers of one hop, never forwarded (RFC 9110 §7.6.1, and the older ones still met).
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Remove the hop-by-hop headers, and those `Connection` names.
pub(super) fn strip_hop_by_hop(h: &mut HeaderMap) {
    // The names `Connection` lists go too (read before it is removed).
    let listed: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|s| HeaderName::from_bytes(s.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(&listed) {
        h.remove(name);
    }
}

/// The two hop-by-hop headers a WebSocket handshake (and its 101 answer) carries on.
pub(super) fn websocket_headers(h: &mut HeaderMap) {
    h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_not_forwarded() {
        let mut h = HeaderMap::new();
        for (name, value) in [
            ("connection", "close, X-Private"),
            ("connection", "Keep-Alive"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authorization", "Basic eDp5"),
            ("te", "trailers"),
            ("trailer", "x-sum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("x-private", "secret"),
            ("accept", "*/*"),
            ("x-kept", "1"),
        ] {
            h.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(HeaderName::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "x-kept"]);
    }
}
