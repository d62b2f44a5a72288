//! The generator of `git_receive_differential`: client streams near what git sends, with the
//! framing games a hostile client can play.

use super::{Piece, Rng};

const NAMES: &[&str] = &[
    "refs/heads/svc/a",
    "refs/heads/svc/b",
    "refs/heads/svc/new",
    "refs/heads/main",
    "refs/tags/v1",
    "refs/heads/other",
    "refs/heads/svc/../main",
];

const CAPS: &[&str] = &[
    "report-status",
    "report-status-v2",
    "side-band-64k",
    "push-options",
    "atomic",
    "quiet",
    "delete-refs",
    "object-format=sha1",
    "agent=git/2.47.3",
];

const MARKERS: &[&str] = &[
    "-----BEGIN SSH SIGNATURE-----\n",
    "-----BEGIN PGP SIGNATURE-----\n",
    "-----BEGIN PGP MESSAGE-----\n",
    "-----BEGIN SIGNED MESSAGE-----\n",
    "-----BEGIN FUTURE SIGNATURE-----\n",
];

fn command(rng: &mut Rng) -> Vec<u8> {
    let old = rng.pick(&["{C1}", "{C1}", "{ZERO}", "{C2}", "{X}"]);
    let new = rng.pick(&["{C2}", "{C2}", "{C1}", "{ZERO}", "{C2U}"]);
    let name = if rng.chance(60) {
        rng.pick(&NAMES[..3])
    } else {
        rng.pick(NAMES)
    };
    format!("{old} {new} {name}").into_bytes()
}

fn caps(rng: &mut Rng, options: &mut bool) -> Vec<u8> {
    let mut c: Vec<&str> = (0..1 + rng.below(3)).map(|_| *rng.pick(CAPS)).collect();
    if rng.chance(30) {
        c.push("push-options");
    }
    if rng.chance(85) {
        c.push("object-format={FMT}");
    }
    *options |= c.contains(&"push-options");
    c.join(" ").into_bytes()
}

/// One stream: shallow lines, commands, a certificate, a terminator, push options, a pack,
/// then now and then a random change to its pieces.
pub fn generate(rng: &mut Rng) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut options = false;
    if rng.chance(15) {
        out.push(Piece::Pkt(b"shallow {C1}\n".to_vec()));
    }
    let signed = rng.chance(50);
    let unsigned = match (signed, rng.chance(10)) {
        (true, false) => 0,
        (true, true) => 1,
        (false, _) => 1 + rng.below(3),
    };
    for i in 0..unsigned {
        let mut line = command(rng);
        if i == 0 || rng.chance(10) {
            line.push(0);
            line.extend(caps(rng, &mut options));
        }
        if rng.chance(85) {
            line.push(b'\n');
        }
        out.push(Piece::Pkt(line));
    }
    let mut ended = false;
    if signed {
        ended = certificate(rng, &mut out, &mut options);
        if !ended && rng.chance(10) {
            let mut line = command(rng);
            line.push(b'\n');
            out.push(Piece::Pkt(line));
        }
    }
    if !ended {
        out.push(match rng.below(20) {
            0 => Piece::Delim,
            1 => Piece::End,
            _ => Piece::Flush,
        });
    }
    if options {
        for _ in 0..rng.below(3) {
            out.push(Piece::Pkt(b"ci.skip\n".to_vec()));
        }
        out.push(Piece::Flush);
    }
    if !rng.chance(10) {
        out.push(Piece::Pack);
    }
    if rng.chance(30) {
        for _ in 0..1 + rng.below(2) {
            mutate(rng, &mut out);
        }
    }
    out
}

/// A push certificate, pkt-lines and all, with the games; whether a flush ended it (and the
/// command list with it).
fn certificate(rng: &mut Rng, out: &mut Vec<Piece>, options: &mut bool) -> bool {
    let mut first = b"push-cert\0".to_vec();
    first.extend(caps(rng, options));
    out.push(Piece::Pkt(first));
    let mut lines: Vec<Vec<u8>> = Vec::new();
    if !rng.chance(5) {
        lines.push(b"certificate version 0.1\n".to_vec());
    }
    lines.push(b"pusher SHA256:abc 1700000000 +0000\n".to_vec());
    if rng.chance(50) {
        lines.push(b"pushee ssh://code.test/acme/widget.git\n".to_vec());
    }
    lines.push(b"nonce 1700000000-abc\n".to_vec());
    if rng.chance(5) {
        lines.push(rng.pick(MARKERS).as_bytes().to_vec());
    }
    lines.push(b"\n".to_vec());
    for _ in 0..1 + rng.below(3) {
        let mut c = command(rng);
        c.push(b'\n');
        lines.push(c);
    }
    if rng.chance(10) {
        let at = 1 + rng.below(lines.len() - 1);
        lines.insert(at, b"\n".to_vec());
    }
    if !rng.chance(5) {
        let marker = if rng.chance(90) {
            MARKERS[0]
        } else {
            *rng.pick(MARKERS)
        };
        lines.push(marker.as_bytes().to_vec());
        lines.push(b"U1NIU0lHAAAAAQ==\n".to_vec());
        lines.push(b"-----END SSH SIGNATURE-----\n".to_vec());
    }
    if rng.chance(5) {
        let mut c = command(rng);
        c.push(b'\n');
        lines.push(c);
    }
    if rng.chance(5) {
        lines.push(rng.pick(MARKERS).as_bytes().to_vec());
    }
    if rng.chance(30) && lines.len() > 1 {
        // Two lines in one pkt-line (the found attack's shape).
        let at = rng.below(lines.len() - 1);
        let next = lines.remove(at + 1);
        lines[at].extend(next);
    }
    if rng.chance(20) {
        let at = rng.below(lines.len());
        if lines[at].len() > 1 {
            let cut = 1 + rng.below(lines[at].len() - 1);
            let tail = lines[at].split_off(cut);
            lines.insert(at + 1, tail);
        }
    }
    if rng.chance(10) {
        let at = rng.below(lines.len() + 1);
        lines.insert(at, Vec::new());
    }
    if rng.chance(10) {
        let at = rng.below(lines.len());
        if lines[at].last() == Some(&b'\n') {
            lines[at].pop();
        }
    }
    if rng.chance(5) {
        let at = rng.below(lines.len());
        let cut = rng.below(lines[at].len() + 1);
        lines[at].insert(cut, 0);
    }
    out.extend(lines.into_iter().map(Piece::Pkt));
    if rng.chance(8) {
        out.push(Piece::Flush);
        return true;
    }
    out.push(Piece::Pkt(b"push-cert-end\n".to_vec()));
    false
}

/// One random change: an empty pkt-line, a flush, a delimiter or a pack somewhere; a piece
/// dropped, doubled or swapped with its neighbour.
fn mutate(rng: &mut Rng, out: &mut Vec<Piece>) {
    let at = rng.below(out.len() + 1);
    match rng.below(7) {
        0 => out.insert(at, Piece::Pkt(Vec::new())),
        1 => out.insert(at, Piece::Flush),
        2 => out.insert(at, Piece::Delim),
        3 => out.insert(at, Piece::Pack),
        4 if at < out.len() => {
            out.remove(at);
        }
        5 if at < out.len() => {
            let p = out[at].clone();
            out.insert(at, p);
        }
        _ if at + 1 < out.len() => out.swap(at, at + 1),
        _ => {}
    }
}
