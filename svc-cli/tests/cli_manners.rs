//! The CLI's manners: shell completions for bash, zsh and fish, and man pages, generated from
//! the same definitions as `--help`.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper that cannot run svc should panic"
)]

mod common;

use common::svc;

#[test]
fn completions_name_every_command_in_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = svc(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = String::from_utf8_lossy(&out.stdout);
        for word in ["sandbox", "exec", "audit", "egress", "follow"] {
            assert!(script.contains(word), "{shell} completion lacks {word}");
        }
    }
    let bad = svc(&["completions", "tcsh"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("possible values"));
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
}
