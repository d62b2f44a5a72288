//! The answer to a smart-HTTP push the perimeter refused (`policy::http_push`), in the form git
//! shows its user.
//!
//! git never shows the body of an HTTP error to `POST …/git-receive-pack` (curl fails the
//! request first: "RPC failed; HTTP 403"), so the refusal is a receive-pack result git reads:
//! `200` with `application/x-git-receive-pack-result`, the refusal line on the progress band
//! (git prints it as `remote: svc: refused: …`) and a report that rejects every ref of the
//! push with the same line (` ! [remote rejected] … (svc: refused: …)`, git exits 1). The
//! audit record keeps the decision's own status, 403, and `x-svc-perimeter: refused` marks the
//! answer. Nothing reached the server.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, header};
use http_body_util::{BodyExt as _, Full};

use super::body::ProxyBody;
use crate::{audit::SshRef, policy::receive_pack::PushCommands};

/// git's largest pkt-line payload (`LARGE_PACKET_MAX` less the length); a band's pkt holds one
/// byte of band number more.
const MAX_BAND_DATA: usize = 65515;

/// The refs of a checked push, for its audit record.
pub(super) fn refs(push: Option<&PushCommands>) -> Vec<SshRef> {
    push.map(|p| {
        p.updates
            .iter()
            .map(|u| SshRef {
                name: u.name.clone(),
                old: u.old.clone(),
                new: u.new.clone(),
            })
            .collect()
    })
    .unwrap_or_default()
}

/// The body git reads as the refusal of `push` (its capabilities, its refs) with `line`. When
/// the command list could not be read, git's own client is assumed (`side-band-64k`) and the
/// line goes on the error band.
pub(super) fn refusal(push: Option<&PushCommands>, line: &str) -> Vec<u8> {
    let has = |c: &str| push.is_some_and(|p| p.capabilities.iter().any(|x| x == c));
    let sideband = push.is_none() || has("side-band-64k") || has("side-band");
    let report = has("report-status") || has("report-status-v2");
    let mut out = Vec::new();
    let mut report_body = Vec::new();
    if report {
        pkt(&mut report_body, b"unpack ok\n");
        for u in push.map(|p| p.updates.as_slice()).unwrap_or_default() {
            pkt(
                &mut report_body,
                format!("ng {} {line}\n", u.name).as_bytes(),
            );
        }
        report_body.extend_from_slice(b"0000");
    }
    if !sideband {
        if report {
            return report_body;
        }
        pkt(&mut out, format!("ERR {line}\n").as_bytes());
        return out;
    }
    let message_band = if report { 2 } else { 3 };
    band(&mut out, message_band, format!("{line}\n").as_bytes());
    band(&mut out, 1, &report_body);
    out.extend_from_slice(b"0000");
    out
}

/// The HTTP answer carrying `body`.
pub(super) fn response(body: Vec<u8>) -> Response<ProxyBody> {
    let mut r = Response::new(
        Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-git-receive-pack-result"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r.headers_mut().insert(
        HeaderName::from_static("x-svc-perimeter"),
        HeaderValue::from_static("refused"),
    );
    r
}

fn pkt(out: &mut Vec<u8>, payload: &[u8]) {
    out.extend_from_slice(format!("{:04x}", payload.len() + 4).as_bytes());
    out.extend_from_slice(payload);
}

/// `data` on side band `n`, in as many pkt-lines as it takes.
fn band(out: &mut Vec<u8>, n: u8, data: &[u8]) {
    for chunk in data.chunks(MAX_BAND_DATA) {
        let mut p = Vec::with_capacity(chunk.len() + 1);
        p.push(n);
        p.extend_from_slice(chunk);
        pkt(out, &p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::receive_pack::RefUpdate;

    fn push(caps: &[&str]) -> PushCommands {
        PushCommands {
            updates: vec![RefUpdate {
                old: "0".repeat(40),
                new: "1".repeat(40),
                name: "refs/heads/main".into(),
            }],
            capabilities: caps.iter().map(|c| (*c).to_owned()).collect(),
            ..PushCommands::default()
        }
    }

    #[test]
    fn refusal_forms() {
        let line = "svc: refused: ref refs/heads/main not in allowed branches";
        let report = format!(
            "000eunpack ok\n{:04x}ng refs/heads/main {line}\n0000",
            line.len() + 24
        );
        let cases: Vec<(&str, Option<PushCommands>, String)> = vec![
            (
                "git_default",
                Some(push(&["report-status", "side-band-64k", "agent=git/2"])),
                format!(
                    "{:04x}\u{2}{line}\n{:04x}\u{1}{report}0000",
                    line.len() + 6,
                    report.len() + 5
                ),
            ),
            (
                "report_only",
                Some(push(&["report-status"])),
                report.clone(),
            ),
            (
                "nothing_asked",
                Some(push(&[])),
                format!("{:04x}ERR {line}\n", line.len() + 9),
            ),
            (
                "unread_command_list",
                None,
                format!("{:04x}\u{3}{line}\n0000", line.len() + 6),
            ),
        ];
        for (name, p, want) in cases {
            let got = refusal(p.as_ref(), line);
            assert_eq!(String::from_utf8_lossy(&got), want, "{name}");
        }
    }
}
