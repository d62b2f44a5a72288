//! `svc sandbox create`'s arguments that are decided before svcd is asked: `--context-path`
//! and the refused `-f`/`--file`.
#![expect(
    clippy::expect_used,
    reason = "test code: a helper that cannot run svc should panic"
)]

mod common;

use common::{output, svc_command};

#[test]
fn file_is_refused_naming_context_path() {
    for flag in ["-f", "--file"] {
        let out = output(
            svc_command()
                .args(["--socket", "/nonexistent/svcd.sock"])
                .args(["sandbox", "create", flag, "config.yaml", "dev"]),
        );
        assert_eq!(out.status.code(), Some(2), "{flag}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("allow-all sandbox for 72 hours") && err.contains("--context-path PATH"),
            "{flag}: {err}"
        );
        assert!(!err.contains("cannot reach svcd"), "{flag}: {err}");
    }
}

#[test]
fn help_names_context_path_and_its_warning_not_file() {
    let out = output(svc_command().args(["sandbox", "create", "--help"]));
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8(out.stdout).expect("utf-8");
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains("--context-path <PATH>"), "{help}");
    assert!(flat.contains("on a terminal or not"), "{help}");
    assert!(!help.contains("--file <"), "{help}");
}
