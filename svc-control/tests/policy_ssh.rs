//! The git-over-SSH relay's rules (`policy::ssh`): which requests pass, how refs are matched,
//! how a push's command list is read. Named cases.

use svc_control::policy::ssh::{
    self, PushError, RefUpdate, Service, SshRefusal, parse_push, parse_request, ref_matches,
};

fn args(s: &[&str]) -> Vec<String> {
    s.iter().map(|a| (*a).to_owned()).collect()
}

#[test]
fn git_requests_pass_and_everything_else_is_refused() {
    let ok = parse_request(&args(&[
        "-o",
        "SendEnv=GIT_PROTOCOL",
        "-p",
        "2222",
        "git@code.test",
        "git-receive-pack '/acme/widget.git'",
    ]))
    .expect("a push");
    assert_eq!(
        (
            ok.user.as_deref(),
            ok.host.as_str(),
            ok.port,
            ok.service,
            ok.repo.as_str()
        ),
        (
            Some("git"),
            "code.test",
            Some(2222),
            Service::ReceivePack,
            "acme/widget"
        )
    );
    let ok = parse_request(&args(&["-4", "code.test", "git upload-pack 'acme/widget'"]))
        .expect("the two-word spelling");
    assert_eq!(
        (ok.service, ok.repo.as_str()),
        (Service::UploadPack, "acme/widget")
    );
    // git quotes a ' in a path as '\''.
    let quoted = parse_request(&args(&["h", "git-upload-pack 'a/it'\\''s'"]));
    assert!(matches!(quoted, Err(SshRefusal::Path(..))), "{quoted:?}");

    let refused: &[(&str, &[&str], &str)] = &[
        ("a shell", &["code.test"], "no command given"),
        ("a shell command", &["code.test", "sh -c id"], "not \"sh\""),
        (
            "sftp",
            &["code.test", "internal-sftp"],
            "not \"internal-sftp\"",
        ),
        ("scp", &["code.test", "scp -t /tmp"], "not \"scp\""),
        (
            "upload-archive",
            &["code.test", "git-upload-archive 'a/b'"],
            "not \"git-upload-archive\"",
        ),
        (
            "lfs",
            &["code.test", "git-lfs-authenticate a/b download"],
            "not \"git-lfs-authenticate\"",
        ),
        (
            "proxy command",
            &[
                "-oProxyCommand=nc evil 22",
                "code.test",
                "git-upload-pack 'a/b'",
            ],
            "ssh option",
        ),
        (
            "another -o",
            &["-o", "ProxyCommand=x", "code.test", "git-upload-pack 'a/b'"],
            "ssh option",
        ),
        (
            "-F config",
            &["-F", "/tmp/x", "code.test", "git-upload-pack 'a/b'"],
            "ssh option",
        ),
        (
            "host as option",
            &["--", "git-upload-pack 'a/b'"],
            "ssh option",
        ),
        ("host with -", &["-oX@code.test"], "ssh option"),
        (
            "user with -",
            &["-x@code.test", "git-upload-pack 'a/b'"],
            "ssh option",
        ),
        (
            "bad host",
            &["code test", "git-upload-pack 'a/b'"],
            "bad host",
        ),
        (
            "port 0",
            &["-p", "0", "h", "git-upload-pack 'a/b'"],
            "bad port",
        ),
        (
            "port word",
            &["-p", "ssh", "h", "git-upload-pack 'a/b'"],
            "bad port",
        ),
        (
            "unquoted path",
            &["h", "git-upload-pack a/b"],
            "single-quoted",
        ),
        (
            "two paths",
            &["h", "git-upload-pack 'a/b' 'c/d'"],
            "single-quoted",
        ),
        (
            "command after",
            &["h", "git-upload-pack 'a/b'; id"],
            "single-quoted",
        ),
        ("dot dot", &["h", "git-upload-pack '/acme/../etc'"], "'..'"),
        ("newline", &["h", "git-upload-pack 'a/b\nc'"], "line break"),
        (
            "NUL",
            &["h", "git-upload-pack 'a/b\0'"],
            "line break or NUL",
        ),
        (
            "dash path",
            &["h", "git-upload-pack '-x/y'"],
            "starts with '-'",
        ),
        (
            "three parts",
            &["h", "git-upload-pack 'a/b/c'"],
            "not owner/repo",
        ),
        (
            "home",
            &["h", "git-upload-pack '~/a'"],
            "characters a repository name does not",
        ),
        (
            "extra argument",
            &["h", "git-upload-pack 'a/b'", "x"],
            "more arguments",
        ),
    ];
    for (name, a, want) in refused {
        let e = parse_request(&args(a)).expect_err(name).to_string();
        assert!(e.contains(want), "{name}: {e}");
        assert!(e.len() < 200, "{name}: not echoed whole");
    }
}

#[test]
fn allowed_branches_match_like_git_wildmatch() {
    let cases: &[(&str, &str, bool)] = &[
        ("refs/heads/svc/**", "refs/heads/svc/a", true),
        ("refs/heads/svc/**", "refs/heads/svc/a/b/c", true),
        ("refs/heads/svc/**", "refs/heads/svc", false),
        ("refs/heads/svc/**", "refs/heads/svcx/a", false),
        ("refs/heads/svc/**", "refs/heads/main", false),
        ("refs/heads/svc/**", "refs/tags/svc/a", false),
        ("refs/heads/*", "refs/heads/main", true),
        ("refs/heads/*", "refs/heads/a/b", false),
        ("refs/heads/feat-?", "refs/heads/feat-1", true),
        ("refs/heads/feat-?", "refs/heads/feat-12", false),
        ("refs/heads/[ab]*", "refs/heads/bug", true),
        ("refs/heads/[!ab]*", "refs/heads/bug", false),
        ("refs/heads/[a-c]x", "refs/heads/bx", true),
        ("refs/**/wip", "refs/heads/wip", true),
        ("refs/**/wip", "refs/wip", true),
        ("refs/heads/main", "refs/heads/main", true),
        ("refs/heads/main", "refs/heads/main2", false),
    ];
    for (pattern, name, want) in cases {
        assert_eq!(ref_matches(pattern, name), *want, "{pattern} vs {name}");
    }
}

fn pkt(s: &str) -> Vec<u8> {
    format!("{:04x}{s}", s.len() + 4).into_bytes()
}

const A: &str = "1111111111111111111111111111111111111111";
const B: &str = "2222222222222222222222222222222222222222";
const Z: &str = "0000000000000000000000000000000000000000";

#[test]
fn a_push_command_list_is_read_whole_before_anything_passes() {
    let mut stream = pkt(&format!(
        "{A} {B} refs/heads/svc/a\0report-status side-band-64k\n"
    ));
    stream.extend(pkt(&format!("{Z} {B} refs/tags/v1\n")));
    stream.extend(pkt(&format!("{A} {Z} refs/heads/old\n")));
    stream.extend(b"0000");
    stream.extend(b"PACK....");
    for cut in 0..stream.len() - 8 {
        assert_eq!(parse_push(&stream[..cut]), Ok(None), "incomplete at {cut}");
    }
    let p = parse_push(&stream).expect("parses").expect("complete");
    assert_eq!(
        p.updates,
        vec![
            RefUpdate {
                old: A.into(),
                new: B.into(),
                name: "refs/heads/svc/a".into()
            },
            RefUpdate {
                old: Z.into(),
                new: B.into(),
                name: "refs/tags/v1".into()
            },
            RefUpdate {
                old: A.into(),
                new: Z.into(),
                name: "refs/heads/old".into()
            },
        ]
    );
    assert_eq!(p.capabilities, ["report-status", "side-band-64k"]);
    assert_eq!(&stream[p.consumed..], b"PACK....");

    // Push options follow the list when the client asked for them.
    let mut stream = pkt(&format!(
        "{A} {B} refs/heads/svc/a\0report-status push-options\n"
    ));
    stream.extend(b"0000");
    stream.extend(pkt("ci.skip\n"));
    stream.extend(b"0000");
    let p = parse_push(&stream).expect("parses").expect("complete");
    assert_eq!(p.push_options, ["ci.skip"]);
    assert_eq!(p.consumed, stream.len());

    // Shallow lines first, SHA-256 ids.
    let a256 = "a".repeat(64);
    let b256 = "b".repeat(64);
    let mut stream = pkt(&format!("shallow {A}\n"));
    stream.extend(pkt(&format!(
        "{a256} {b256} refs/heads/svc/x\0object-format=sha256\n"
    )));
    stream.extend(b"0000");
    let p = parse_push(&stream).expect("parses").expect("complete");
    assert_eq!(p.updates[0].name, "refs/heads/svc/x");

    // A signed push: the commands are inside the certificate.
    let mut stream = pkt("push-cert\0report-status\n");
    for l in [
        "certificate version 0.1\n",
        "pusher agent <a@b> 1700000000 +0000\n",
        "pushee ssh://code.test/acme/widget.git\n",
        "nonce 1700000000-abc\n",
        "\n",
        &format!("{A} {B} refs/heads/main\n"),
        "-----BEGIN PGP SIGNATURE-----\n",
        "abc\n",
        "-----END PGP SIGNATURE-----\n",
        "push-cert-end\n",
    ] {
        stream.extend(pkt(l));
    }
    stream.extend(b"0000");
    let p = parse_push(&stream).expect("parses").expect("complete");
    assert!(p.signed);
    assert_eq!(p.updates.len(), 1);
    assert_eq!(p.updates[0].name, "refs/heads/main");

    let bad: &[(&str, Vec<u8>, &str)] = &[
        ("not hex length", b"zzzz".to_vec(), "bad pkt-line length"),
        ("length 3", b"0003".to_vec(), "bad pkt-line length"),
        (
            "short id",
            [pkt(&format!("abc {B} refs/heads/x\n")), b"0000".to_vec()].concat(),
            "bad command line",
        ),
        (
            "mixed id lengths",
            [pkt(&format!("{A} {b256} refs/heads/x\n")), b"0000".to_vec()].concat(),
            "bad command line",
        ),
        (
            "no ref",
            [pkt(&format!("{A} {B}\n")), b"0000".to_vec()].concat(),
            "bad command line",
        ),
        (
            "cert without end",
            [
                pkt("push-cert\0x\n"),
                pkt("certificate version 0.1\n"),
                b"0000".to_vec(),
            ]
            .concat(),
            "push-cert-end",
        ),
    ];
    for (name, bytes, want) in bad {
        let e = parse_push(bytes).expect_err(name);
        assert!(e.to_string().contains(want), "{name}: {e}");
    }
    let _ = (ssh::MAX_COMMANDS, PushError::TooLong(1));
}

#[test]
fn the_relays_allow_checks() {
    let repos = vec![("code.test".to_owned(), "acme/widget".to_owned())];
    for (host, repo, want) in [
        ("code.test", "acme/widget", true),
        ("CODE.test", "Acme/Widget", true),
        ("code.test", "acme/other", false),
        ("other.test", "acme/widget", false),
    ] {
        assert_eq!(ssh::repo_allowed(&repos, host, repo), want, "{host} {repo}");
    }
    let branches = vec!["refs/heads/svc/**".to_owned()];
    let up = |name: &str| RefUpdate {
        old: A.into(),
        new: B.into(),
        name: name.into(),
    };
    let ok = [up("refs/heads/svc/a"), up("refs/heads/svc/b/c")];
    assert_eq!(ssh::first_refused(&branches, &ok), None);
    let mixed = [
        up("refs/heads/svc/a"),
        up("refs/heads/main"),
        up("refs/tags/v1"),
    ];
    assert_eq!(
        ssh::first_refused(&branches, &mixed).map(|u| u.name.as_str()),
        Some("refs/heads/main")
    );
    for (v, want) in [
        ("version=2", true),
        ("version=2:object-format=sha256", true),
        ("version=2 ; id", false),
        ("a\nb", false),
        (&"x".repeat(200)[..], false),
    ] {
        assert_eq!(ssh::git_protocol_ok(v), want, "{v:?}");
    }
}

#[test]
fn more_of_what_a_hostile_guest_sends_is_refused() {
    // Options ssh would honour, an empty command, shell syntax and odd paths.
    let refused: &[(&str, &[&str], &str)] = &[
        (
            "jump host",
            &["-J", "evil", "h", "git-upload-pack 'a/b'"],
            "ssh option",
        ),
        (
            "local forward",
            &["-L", "1:x:2", "h", "git-upload-pack 'a/b'"],
            "ssh option",
        ),
        (
            "remote forward",
            &["-R", "1:x:2", "h", "git-upload-pack 'a/b'"],
            "ssh option",
        ),
        (
            "socks",
            &["-D", "1080", "h", "git-upload-pack 'a/b'"],
            "ssh option",
        ),
        (
            "identity",
            &["-i", "/root/k", "h", "git-upload-pack 'a/b'"],
            "ssh option",
        ),
        ("empty command", &["h", ""], "not \"\""),
        (
            "command substitution",
            &["h", "git-upload-pack '$(id)/b'"],
            "characters a repository name does not",
        ),
        (
            "backticks",
            &["h", "git-upload-pack '`id`/b'"],
            "characters a repository name does not",
        ),
        (
            "semicolon",
            &["h", "git-upload-pack 'a;id/b'"],
            "characters a repository name does not",
        ),
        (
            "space",
            &["h", "git-upload-pack 'a b/c'"],
            "characters a repository name does not",
        ),
        (
            "user home",
            &["h", "git-upload-pack '~alice/b'"],
            "characters a repository name does not",
        ),
    ];
    for (name, a, want) in refused {
        let e = parse_request(&args(a)).expect_err(name).to_string();
        assert!(e.contains(want), "{name}: {e}");
    }
    // An absolute path is read as owner/repo and then has to be in the policy like any other.
    let r = parse_request(&args(&["h", "git-upload-pack '/etc/passwd'"])).expect("parses");
    assert_eq!(r.repo, "etc/passwd");
    let repos = vec![("h".to_owned(), "acme/widget".to_owned())];
    assert!(!ssh::repo_allowed(&repos, &r.host, &r.repo));
    // The allowed repository under another host name is another repository.
    assert!(!ssh::repo_allowed(&repos, "h.evil.test", "acme/widget"));

    // Ref names: outside the globs, or not names git would accept at all.
    let branches = vec![ssh::DEFAULT_BRANCHES.to_owned()];
    let up = |name: &str| RefUpdate {
        old: Z.into(),
        new: B.into(),
        name: name.into(),
    };
    for (name, refused) in [
        ("refs/heads/svc/work", false),
        ("refs/heads/svc/a/b", false),
        ("refs/heads/svc/../main", true),
        ("refs/heads/svc/./x", true),
        ("refs/heads/svc/.hidden", true),
        ("refs/heads/svc/x.lock", true),
        ("refs/heads/svc//x", true),
        ("refs/heads/svc/x@{1}", true),
        ("refs/heads/svc/x:y", true),
        ("refs/heads/svc/", true),
        ("refs/heads/svc", true),
        ("refs/notes/commits", true),
        ("refs/tags/svc/v1", true),
        ("refs/heads/main", true),
    ] {
        assert_eq!(
            ssh::first_refused(&branches, &[up(name)]).is_some(),
            refused,
            "{name}"
        );
        assert_eq!(
            ssh::ref_name_ok(name),
            !name.contains(['.', '@', ':']) && !name.ends_with('/') && !name.contains("//"),
            "{name}"
        );
    }

    // A certificate that shows one ref while the list outside it names another: git applies
    // both; no git client sends that, so the push is refused whole.
    let mut stream = pkt("push-cert\0report-status\n");
    for l in [
        "certificate version 0.1\n",
        "pusher agent <a@b> 1700000000 +0000\n",
        "\n",
        &format!("{A} {B} refs/heads/svc/a\n"),
        "-----BEGIN SSH SIGNATURE-----\n",
        "abc\n",
        "-----END SSH SIGNATURE-----\n",
        "push-cert-end\n",
    ] {
        stream.extend(pkt(l));
    }
    stream.extend(pkt(&format!("{A} {B} refs/heads/main\n")));
    stream.extend(b"0000");
    let e = parse_push(&stream).expect_err("refused");
    assert!(e.to_string().contains("commands outside it"), "{e}");
    // A line in the certificate's command section that is not a command: refused, so no
    // command can hide behind it.
    let mut stream = pkt("push-cert\0report-status\n");
    for l in [
        "certificate version 0.1\n",
        "\n",
        &format!("{A} {B} refs/heads/svc/a\n"),
        "note: nothing to see\n",
        &format!("{A} {B} refs/heads/main\n"),
        "-----BEGIN SSH SIGNATURE-----\n",
        "push-cert-end\n",
    ] {
        stream.extend(pkt(l));
    }
    stream.extend(b"0000");
    let e = parse_push(&stream).expect_err("refused");
    assert!(e.to_string().contains("note: nothing"), "{e}");
    // A pack sent before the command list ends is not a pkt-line: refused.
    let mut stream = pkt(&format!("{A} {B} refs/heads/svc/a\0report-status\n"));
    stream.extend(b"PACK\x00\x00\x00\x02");
    let e = parse_push(&stream).expect_err("refused");
    assert!(e.to_string().contains("bad pkt-line length"), "{e}");
}

#[test]
fn the_relay_is_on_unless_a_workspace_leaves_it_off() {
    let cases: &[(&str, Option<bool>, Result<(), &str>)] = &[
        ("no_workspace", None, Ok(())),
        ("workspace_forwards", Some(true), Ok(())),
        ("workspace_default_off", Some(false), Err(ssh::RELAY_OFF)),
    ];
    for (case, forward, want) in cases {
        assert_eq!(ssh::relay_on(*forward), *want, "{case}");
    }
    assert!(ssh::RELAY_OFF.contains("its workspace's auth.defaults.sshAgentForward is false"));
}
