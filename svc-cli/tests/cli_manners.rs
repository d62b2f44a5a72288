//! The CLI's manners: shell completions for bash, zsh and fish (names from the running svcd,
//! quietly nothing without one), man pages, `-o` formats and the aliases people type, all
//! generated from the same definitions as `--help`.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper that cannot run svc should panic"
)]

mod common;

use std::{
    io::{Read as _, Write as _},
    os::unix::net::UnixListener,
    path::Path,
    time::{Duration, Instant},
};

use common::{output, svc, svc_command};

/// What `svc` offers for the last of `words` (`svc` first), asked as bash's script asks,
/// with svcd's socket at `socket`.
fn complete(socket: &Path, words: &[&str]) -> (Vec<String>, std::process::Output) {
    let out = output(
        svc_command()
            .env("COMPLETE", "bash")
            .env("_CLAP_COMPLETE_INDEX", (words.len() - 1).to_string())
            .env("SVC_SOCKET", socket)
            .arg("--")
            .args(words),
    );
    let offered = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    (offered, out)
}

/// A stand-in svcd on `path` answering `GET /v1/secrets` with two secrets (and 404 to the
/// rest), for as long as the test runs.
fn fake_svcd(path: &Path) {
    let listener = UnixListener::bind(path).expect("bind");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { return };
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let secret = |name: &str| {
                format!(
                    r#"{{"name":"{name}","version":1,"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z"}}"#
                )
            };
            let (status, body) = if req.starts_with(b"GET /v1/secrets ") {
                (
                    "200 OK",
                    format!("[{},{}]", secret("gh"), secret("registry")),
                )
            } else {
                ("404 Not Found", r#"{"error":"no"}"#.to_owned())
            };
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
}

#[test]
fn each_shells_script_asks_svc_which_names_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let out = svc(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("COMPLETE") && script.contains("svc"),
            "{shell}'s script calls svc's completer:\n{script}"
        );
    }
    let nowhere = Path::new("/nonexistent/svcd.sock");
    let (top, _) = complete(nowhere, &["svc", ""]);
    for word in ["sandbox", "audit", "egress", "secret", "workspace"] {
        assert!(
            top.contains(&word.to_owned()),
            "svc <TAB> lacks {word}: {top:?}"
        );
    }
    // One candidate per command (its name or an alias), whichever the typed prefix fits.
    for (typed, word) in [
        ("e", "exec"),
        ("li", "list"),
        ("ls", "ls"),
        ("rm", "rm"),
        ("des", "destroy"),
    ] {
        let (offered, _) = complete(nowhere, &["svc", "sandbox", typed]);
        assert!(offered.contains(&word.to_owned()), "{typed}: {offered:?}");
    }
    let (follow, _) = complete(nowhere, &["svc", "events", "--f"]);
    assert!(follow.contains(&"--follow".to_owned()), "{follow:?}");
    let bad = svc(&["completions", "tcsh"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("possible values"));
}

#[test]
fn secret_names_complete_from_svcd() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("svcd.sock");
    fake_svcd(&socket);
    let (all, out) = complete(&socket, &["svc", "secret", "rm", ""]);
    let names: Vec<&String> = all.iter().filter(|w| !w.starts_with('-')).collect();
    assert_eq!(names, ["gh", "registry"], "{out:?}");
    let (some, _) = complete(&socket, &["svc", "secret", "share", "re"]);
    assert_eq!(some, ["registry"]);
}

#[test]
fn without_svcd_a_name_completes_to_nothing_quietly_and_fast() {
    let started = Instant::now();
    let (offered, out) = complete(
        Path::new("/nonexistent/svcd.sock"),
        &["svc", "sandbox", "show", ""],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(
        offered.iter().all(|w| w.starts_with('-')),
        "only flags: {offered:?}"
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn egress_completes_to_its_modes_not_to_file_names() {
    let (modes, _) = complete(
        Path::new("/nonexistent/svcd.sock"),
        &["svc", "sandbox", "create", "--egress", ""],
    );
    assert_eq!(modes, ["curated", "allow-all"]);
}

#[test]
fn man_pages_cover_every_visible_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = svc(&["man", dir.path().to_str().expect("utf-8")]);
    assert!(out.status.success(), "{out:?}");
    for page in [
        "svc.1",
        "svc-sandbox-exec.1",
        "svc-audit.1",
        "svc-supervisor-upgrade.1",
    ] {
        let text = std::fs::read_to_string(dir.path().join(page)).expect(page);
        assert!(
            text.starts_with(".ie") || text.contains(".TH"),
            "{page} is not a man page"
        );
    }
    let exec = std::fs::read_to_string(dir.path().join("svc-sandbox-exec.1")).expect("page");
    assert!(
        exec.contains("svc sandbox exec"),
        "the synopsis names the command as typed"
    );
    assert!(exec.contains("interactive"), "options are documented");
    assert!(
        !dir.path().join("svc-help.1").exists(),
        "no page for clap's help subcommand"
    );
    let svc1 = std::fs::read_to_string(dir.path().join("svc.1")).expect("svc.1");
    assert!(!svc1.contains("svc\\-help"), "svc.1 names no svc-help(1)");
}

#[test]
fn offline_commands_do_not_offer_socket() {
    for words in [
        &["config", "check", "--help"][..],
        &["completions", "--help"],
        &["man", "--help"],
    ] {
        let out = svc(words);
        assert!(out.status.success(), "{words:?}: {out:?}");
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(!help.contains("--socket"), "{words:?}:\n{help}");
    }
    let list = svc(&["sandbox", "list", "--help"]);
    let help = String::from_utf8_lossy(&list.stdout);
    assert!(
        help.contains("--socket") && help.contains("-o, --output <FORMAT>"),
        "{help}"
    );
}

#[test]
fn aliases_and_output_formats_are_checked_before_svcd_is_asked() {
    let nowhere = "/nonexistent/svcd.sock";
    for words in [
        &["sandbox", "ls", "-o", "yaml"][..],
        &["sandbox", "inspect", "dev", "-o", "name"],
        &["sandbox", "rm", "dev"],
        &["sandbox", "delete", "dev"],
        &["secret", "ls", "-o", "wide"],
    ] {
        let out = output(svc_command().env("SVC_SOCKET", nowhere).args(words));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cannot reach svcd"), "{words:?} parsed: {err}");
    }
    let out = svc(&["sandbox", "ls", "-o", "xml"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("xml") && err.contains("yaml"), "{err}");
    let both = svc(&["sandbox", "ls", "--json", "-o", "yaml"]);
    assert_eq!(both.status.code(), Some(2));
}
