//! The request forms of the attack tests: where a case goes and what it sends (see
//! `attack/guest.py` for the fields the guest's client reads).

use serde_json::{Value, json};

/// A second allowed name with a server of its own (and an address of its own).
pub(crate) const OTHER: (&str, &str) = ("other.attack.test", "192.0.2.40");
pub(crate) const ALLOWED: &str = "allowed.example.test";
pub(crate) const FORBIDDEN: &str = "forbidden.example.test";

/// An HTTP/1.1 head: `method target`, `Host: host` (none when empty), `extra` lines (each
/// ending in CRLF), and `Connection: close` unless `keep`.
pub(crate) fn head(method: &str, target: &str, host: &str, extra: &str, keep: bool) -> String {
    let host = if host.is_empty() {
        String::new()
    } else {
        format!("Host: {host}\r\n")
    };
    let close = if keep { "" } else { "Connection: close\r\n" };
    format!("{method} {target} HTTP/1.1\r\n{host}{extra}{close}\r\n")
}

/// A case over TLS to `dial`'s address with SNI `sni`, sending each of `send` in turn.
pub(crate) fn tls(case: &str, dial: &str, sni: Option<&str>, send: &[String]) -> Value {
    json!({"case": case, "dial": dial, "sni": sni, "send": send})
}

/// A case over plain HTTP (port 80) to `dial`'s address.
pub(crate) fn plain(case: &str, dial: &str, send: &[String]) -> Value {
    json!({"case": case, "dial": dial, "tls": false, "send": send})
}

/// `case`, which got through (or went unanswered) when this file was written: it runs in
/// the test of its finding (`what`), not in the one every case must pass.
pub(crate) fn finding(mut case: Value, what: &str) -> Value {
    case["finding"] = json!(what);
    case
}

/// `case`, whose answers on its connection must be exactly `statuses`, in order.
pub(crate) fn all(mut case: Value, statuses: &[u16]) -> Value {
    case["expect_statuses"] = json!(statuses);
    case
}

/// WebSocket handshake lines (and `extra`).
pub(crate) fn ws_headers(extra: &str) -> String {
    format!(
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{extra}"
    )
}

/// `x:p` in base64 (Basic authorization).
pub(crate) fn basic(p: &str) -> String {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = format!("x:{p}").into_bytes();
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = c
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= c.len() {
                char::from(ABC[(n >> (18 - 6 * i) & 63) as usize])
            } else {
                '='
            });
        }
    }
    out
}
