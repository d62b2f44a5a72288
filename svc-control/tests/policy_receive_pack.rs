//! A push's command list as git's `receive-pack` reads it (`policy::receive_pack`): the push
//! certificate attack and its variants, pkt-line framing, capabilities, shallow lines, push
//! options, both hash lengths. Named cases; `svc-tests`' `git_receive_differential` checks the
//! same reader against the real `git receive-pack`.

use svc_control::policy::receive_pack::{PushCommands, PushError, parse_push};

fn pkt(s: &[u8]) -> Vec<u8> {
    let mut v = format!("{:04x}", s.len() + 4).into_bytes();
    v.extend_from_slice(s);
    v
}

fn pkts(lines: &[&[u8]]) -> Vec<u8> {
    lines.iter().flat_map(|l| pkt(l)).collect()
}

const A: &str = "1111111111111111111111111111111111111111";
const B: &str = "2222222222222222222222222222222222222222";

fn cmd(name: &str) -> Vec<u8> {
    format!("{A} {B} {name}\n").into_bytes()
}

/// A certificate as git writes it: one line a pkt-line, `certificate version 0.1` first, a
/// blank line, the commands, an SSH signature.
fn certificate(body: &[Vec<u8>]) -> Vec<u8> {
    let mut s = pkt(b"push-cert\0report-status side-band-64k");
    for l in [
        &b"certificate version 0.1\n"[..],
        b"pusher SHA256:abc 1700000000 +0000\n",
        b"pushee ssh://code.test/acme/widget.git\n",
        b"nonce 1700000000-abc\n",
    ] {
        s.extend(pkt(l));
    }
    for l in body {
        s.extend(pkt(l));
    }
    s
}

fn signature() -> Vec<Vec<u8>> {
    vec![
        b"-----BEGIN SSH SIGNATURE-----\n".to_vec(),
        b"U1NIU0lH\n".to_vec(),
        b"-----END SSH SIGNATURE-----\n".to_vec(),
        b"push-cert-end\n".to_vec(),
    ]
}

fn signed(commands: &[Vec<u8>]) -> Vec<u8> {
    let mut body = vec![b"\n".to_vec()];
    body.extend(commands.iter().cloned());
    body.extend(signature());
    let mut s = certificate(&body);
    s.extend(b"0000");
    s
}

enum Want {
    /// Read whole: these ref names, in order.
    Refs(&'static [&'static str]),
    /// Refused; the message holds this.
    Refused(&'static str),
}

fn check(case: &str, stream: &[u8], want: &Want) {
    let got = parse_push(stream);
    match want {
        Want::Refs(names) => {
            let p: PushCommands = got
                .unwrap_or_else(|e| panic!("{case}: refused: {e}"))
                .unwrap_or_else(|| panic!("{case}: incomplete"));
            let got: Vec<&str> = p.updates.iter().map(|u| u.name.as_str()).collect();
            assert_eq!(&got, names, "{case}");
        }
        Want::Refused(why) => match got {
            Err(e) => assert!(e.to_string().contains(why), "{case}: {e}"),
            Ok(p) => panic!("{case}: not refused: {p:?}"),
        },
    }
}

#[test]
fn push_certificates_are_read_as_git_reads_them_or_refused() {
    let main = cmd("refs/heads/main");
    let ok = cmd("refs/heads/svc/a");
    let with_end = |body: Vec<Vec<u8>>| {
        let mut s = certificate(&body);
        s.extend(b"0000");
        s
    };
    let sig_end = signature();
    let cases: Vec<(&str, Vec<u8>, Want)> = vec![
        (
            "a_signed_push",
            signed(std::slice::from_ref(&ok)),
            Want::Refs(&["refs/heads/svc/a"]),
        ),
        (
            "a_signed_push_of_two_refs",
            signed(&[ok.clone(), main.clone()]),
            Want::Refs(&["refs/heads/svc/a", "refs/heads/main"]),
        ),
        (
            // The attack: one pkt-line whose payload holds a blank line and a command. git
            // joins the certificate's pkt-lines, splits at the first blank line: main moves.
            "the_found_attack_a_command_after_a_blank_line_inside_one_pkt",
            {
                let mut s = pkt(b"push-cert\0report-status");
                s.extend(pkt(&[&b"x\n\n"[..], &main].concat()));
                s.extend(pkt(b"push-cert-end\n"));
                s.extend(b"0000PACK\0\0\0\x02\0\0\0\0");
                s
            },
            Want::Refused("not exactly one line"),
        ),
        (
            "a_command_split_across_pkt_lines",
            with_end(
                [
                    vec![b"\n".to_vec(), main[..50].to_vec(), main[50..].to_vec()],
                    sig_end.clone(),
                ]
                .concat(),
            ),
            Want::Refused("not exactly one line"),
        ),
        (
            "two_commands_in_one_pkt_line",
            with_end(
                [
                    vec![b"\n".to_vec(), [ok.clone(), main.clone()].concat()],
                    sig_end.clone(),
                ]
                .concat(),
            ),
            Want::Refused("not exactly one line"),
        ),
        (
            "an_empty_pkt_line_in_the_certificate",
            with_end([vec![b"\n".to_vec(), vec![], ok.clone()], sig_end.clone()].concat()),
            Want::Refused("not exactly one line"),
        ),
        (
            "a_nul_hiding_the_rest_of_a_certificate_line",
            with_end(
                [
                    vec![b"\n".to_vec(), [&ok[..ok.len() - 1], b"\0", &main].concat()],
                    sig_end.clone(),
                ]
                .concat(),
            ),
            Want::Refused("not exactly one line"),
        ),
        (
            "a_line_without_its_newline",
            with_end(
                [
                    vec![b"\n".to_vec(), ok[..ok.len() - 1].to_vec()],
                    sig_end.clone(),
                ]
                .concat(),
            ),
            Want::Refused("not exactly one line"),
        ),
        (
            // git: a flush inside a certificate ends the whole list and keeps its commands.
            "a_flush_inside_the_certificate",
            {
                let mut s = certificate(&[b"\n".to_vec(), main.clone()]);
                s.extend(b"0000");
                s
            },
            Want::Refused("not closed by push-cert-end"),
        ),
        (
            "a_delimiter_inside_the_certificate",
            {
                let mut s = certificate(&[b"\n".to_vec(), main.clone()]);
                s.extend(b"0001");
                s
            },
            Want::Refused("not closed by push-cert-end"),
        ),
        (
            "commands_after_the_certificate",
            {
                let mut s = signed(std::slice::from_ref(&ok));
                s.truncate(s.len() - 4);
                s.extend(pkt(&main));
                s.extend(b"0000");
                s
            },
            Want::Refused("commands outside it"),
        ),
        (
            "commands_before_the_certificate",
            [pkt(&main), signed(std::slice::from_ref(&ok))].concat(),
            Want::Refused("commands outside it"),
        ),
        (
            "two_certificates",
            {
                let mut s = signed(std::slice::from_ref(&ok));
                s.truncate(s.len() - 4);
                s.extend(signed(std::slice::from_ref(&main)));
                s
            },
            Want::Refused("comes twice"),
        ),
        (
            // git stops at the last signature marker; one in the header leaves no commands
            // for an old git and some for a new one.
            "a_signature_marker_in_the_header",
            with_end(
                [
                    vec![
                        b"-----BEGIN PGP SIGNATURE-----\n".to_vec(),
                        b"\n".to_vec(),
                        ok.clone(),
                    ],
                    sig_end.clone(),
                ]
                .concat(),
            ),
            Want::Refused("signature marker in its header"),
        ),
        (
            "no_signature",
            with_end(vec![
                b"\n".to_vec(),
                ok.clone(),
                b"push-cert-end\n".to_vec(),
            ]),
            Want::Refused("has no signature"),
        ),
        (
            // git takes everything before its *last* marker: the first marker line is then a
            // command (git dies), and an older git without SSH markers reads otherwise.
            "commands_between_two_signatures",
            with_end(
                [
                    vec![
                        b"\n".to_vec(),
                        ok.clone(),
                        b"-----BEGIN PGP SIGNATURE-----\n".to_vec(),
                        main.clone(),
                    ],
                    sig_end.clone(),
                ]
                .concat(),
            ),
            Want::Refused("second signature marker"),
        ),
        (
            "a_second_signature_after_the_first",
            with_end(
                [
                    vec![b"\n".to_vec(), ok.clone()],
                    sig_end[..3].to_vec(),
                    sig_end.clone(),
                ]
                .concat(),
            ),
            Want::Refused("second signature marker"),
        ),
        (
            "a_signature_of_a_kind_git_does_not_know",
            with_end(vec![
                b"\n".to_vec(),
                ok.clone(),
                b"-----BEGIN FUTURE SIGNATURE-----\n".to_vec(),
                b"push-cert-end\n".to_vec(),
            ]),
            Want::Refused("of a kind git does not know"),
        ),
        (
            "a_second_blank_line_before_more_commands",
            signed(&[ok.clone(), b"\n".to_vec(), main.clone()]),
            Want::Refused("bad command line"),
        ),
        (
            "no_header",
            {
                let mut s = pkt(b"push-cert\0report-status");
                for l in [&b"\n"[..], &main, &ok, b"\n", &main] {
                    s.extend(pkt(l));
                }
                for l in signature() {
                    s.extend(pkt(&l));
                }
                s.extend(b"0000");
                s
            },
            Want::Refused("does not start with"),
        ),
        (
            "an_empty_certificate",
            [
                pkts(&[b"push-cert\0x", b"push-cert-end\n"]),
                b"0000".to_vec(),
            ]
            .concat(),
            Want::Refused("is empty"),
        ),
        (
            "a_push_cert_end_without_its_newline_is_a_line",
            with_end(
                [
                    vec![b"\n".to_vec(), ok.clone(), b"push-cert-end".to_vec()],
                    sig_end.clone(),
                ]
                .concat(),
            ),
            Want::Refused("not exactly one line"),
        ),
        (
            "a_signed_push_of_sha256_ids",
            signed(&[
                format!("{} {} refs/heads/svc/x\n", "a".repeat(64), "B".repeat(64)).into_bytes(),
            ]),
            Want::Refs(&["refs/heads/svc/x"]),
        ),
    ];
    for (case, stream, want) in &cases {
        check(case, stream, want);
    }
}

#[test]
fn command_lists_are_framed_as_git_frames_them() {
    let main = cmd("refs/heads/main");
    let ok = cmd("refs/heads/svc/a");
    let cases: Vec<(&str, Vec<u8>, Want)> = vec![
        (
            "capabilities_on_a_later_line_add_up",
            [
                pkts(&[
                    &[&ok[..ok.len() - 1], b"\0report-status"].concat(),
                    &[&main[..main.len() - 1], b"\0push-options"].concat(),
                ]),
                b"0000".to_vec(),
                pkt(b"ci.skip\n"),
                b"0000".to_vec(),
            ]
            .concat(),
            Want::Refs(&["refs/heads/svc/a", "refs/heads/main"]),
        ),
        (
            "a_delimiter_ends_the_list",
            [pkt(&ok), b"0001".to_vec(), pkt(&main)].concat(),
            Want::Refs(&["refs/heads/svc/a"]),
        ),
        (
            "a_response_end_ends_the_list",
            [pkt(&ok), b"0002".to_vec(), pkt(&main)].concat(),
            Want::Refs(&["refs/heads/svc/a"]),
        ),
        (
            "an_empty_pkt_line_is_a_bad_command",
            [pkt(&ok), b"0004".to_vec(), b"0000".to_vec()].concat(),
            Want::Refused("bad command line"),
        ),
        (
            "a_lone_newline_is_a_bad_command",
            [pkt(&ok), pkt(b"\n"), b"0000".to_vec()].concat(),
            Want::Refused("bad command line"),
        ),
        (
            "shallow_lines_are_skipped",
            [
                pkt(format!("shallow {A}\n").as_bytes()),
                pkt(&ok),
                b"0000".to_vec(),
            ]
            .concat(),
            Want::Refs(&["refs/heads/svc/a"]),
        ),
        (
            "a_shallow_line_with_more_after_its_id",
            [
                pkt(format!("shallow {A} x\n").as_bytes()),
                pkt(&ok),
                b"0000".to_vec(),
            ]
            .concat(),
            Want::Refused("bad shallow line"),
        ),
        (
            "shallow_with_nothing_after_is_a_command",
            [pkt(b"shallow "), b"0000".to_vec()].concat(),
            Want::Refused("bad command line"),
        ),
        (
            "only_one_newline_is_dropped",
            [pkt(&[&main[..], b"\n"].concat()), b"0000".to_vec()].concat(),
            Want::Refused("bad command line"),
        ),
        (
            "a_newline_before_the_capabilities_stays_in_the_name",
            [
                pkt(&[&main[..], b"\0report-status"].concat()),
                b"0000".to_vec(),
            ]
            .concat(),
            Want::Refused("bad command line"),
        ),
        (
            "a_name_with_a_space",
            [
                pkt(&cmd("refs/heads/svc/a refs/heads/main")),
                b"0000".to_vec(),
            ]
            .concat(),
            Want::Refused("bad command line"),
        ),
        (
            "a_signed_length",
            [b"+02a".to_vec(), ok[..38].to_vec()].concat(),
            Want::Refused("bad pkt-line length"),
        ),
        (
            "an_upper_case_length_and_ids",
            {
                let line = format!("{} {} refs/heads/svc/a\n", "ABCDEF1234".repeat(4), B);
                format!("{:04X}{line}0000", line.len() + 4).into_bytes()
            },
            Want::Refs(&["refs/heads/svc/a"]),
        ),
        (
            "a_length_over_git_s_largest",
            b"fff4".to_vec(),
            Want::Refused("bad pkt-line length"),
        ),
        (
            "length_three",
            b"0003".to_vec(),
            Want::Refused("bad pkt-line length"),
        ),
        (
            "mixed_hash_lengths",
            [
                pkt(format!("{A} {} refs/heads/svc/a\n", "b".repeat(64)).as_bytes()),
                b"0000".to_vec(),
            ]
            .concat(),
            Want::Refused("bad command line"),
        ),
        (
            "sha256_ids",
            [
                pkt(format!(
                    "{} {} refs/heads/svc/a\0object-format=sha256\n",
                    "a".repeat(64),
                    "b".repeat(64)
                )
                .as_bytes()),
                b"0000".to_vec(),
            ]
            .concat(),
            Want::Refs(&["refs/heads/svc/a"]),
        ),
    ];
    for (case, stream, want) in &cases {
        check(case, stream, want);
    }
    // git's largest pkt-line (65523 bytes on the wire) is a line: incomplete, not refused.
    assert_eq!(parse_push(b"fff3"), Ok(None));
}

#[test]
fn a_stream_cut_anywhere_is_incomplete_not_refused() {
    let mut stream = signed(&[cmd("refs/heads/svc/a"), cmd("refs/heads/svc/b")]);
    let whole = stream.len();
    stream.extend(b"PACK\0\0\0\x02\0\0\0\0");
    for cut in 0..whole {
        assert_eq!(parse_push(&stream[..cut]), Ok(None), "cut at {cut}");
    }
    let p = parse_push(&stream).expect("read").expect("whole");
    assert!(p.signed);
    assert_eq!(p.consumed, whole);
    assert_eq!(p.capabilities, ["report-status", "side-band-64k"]);
    let _ = PushError::TooLong(1);
}
