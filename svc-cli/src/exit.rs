//! What svc's exit status means: one table for every command (written out in docs/cli.md and
//! in the man pages' EXIT STATUS section, both from [`EXIT_STATUS`]).
//!
//! `svc sandbox exec` ends with its command's own status, so its own failures take the codes
//! `docker exec` reserves (125, 126, 127) and a script can tell the command's `exit 1` from
//! svc's. Invalid configuration is 78 (`EX_CONFIG` of sysexits.h) from every command and from
//! svcd.

use std::process::ExitCode;

/// Success.
pub const OK: u8 = 0;
/// Any other failure of svc or svcd (refused, not found, svcd unreachable, a failed check).
pub const FAILURE: u8 = 1;
/// A usage error: an unknown flag, a missing argument, a value that cannot be parsed (clap's
/// own code).
pub const USAGE: u8 = 2;
/// `exec`: svc or svcd failed to run the command (svcd unreachable, no such sandbox, refused).
pub const EXEC_FAILED: u8 = 125;
/// `exec`: the command was found but cannot be run (permission denied, not an executable).
pub const CANNOT_RUN: u8 = 126;
/// `exec`: the command was not found.
pub const NOT_FOUND: u8 = 127;
/// The configuration is invalid (a workspace's `.svc/` files, or svcd's `svcd.toml`).
pub const CONFIG: u8 = 78;

/// The table, in order, for the documentation and the man pages' EXIT STATUS section.
pub const EXIT_STATUS: &[(u8, &str)] = &[
    (OK, "success"),
    (
        FAILURE,
        "svc or svcd failed (refused, not found, svcd unreachable, a required check failed)",
    ),
    (
        USAGE,
        "usage error: an unknown flag, a missing or bad argument",
    ),
    (
        CONFIG,
        "the configuration is invalid (a workspace's or svcd's)",
    ),
    (
        EXEC_FAILED,
        "exec: svc or svcd could not run the command (svcd unreachable, no such sandbox, \
         refused)",
    ),
    (
        CANNOT_RUN,
        "exec: the command cannot be run (permission denied, not an executable)",
    ),
    (NOT_FOUND, "exec: the command was not found"),
];

/// Where the table is written out, for `svc --help`.
pub const AFTER_HELP: &str = "\
Exit status: 0 success, 1 failure, 2 usage error, 78 invalid configuration; `svc sandbox \
exec` ends with its command's status (128+N after signal N), 125 when svc could not run it, \
126 when it cannot be run, 127 when it was not found. The table: docs/cli.md, or the man \
page svc(1), EXIT STATUS.";

/// An error that ends svc with `code` rather than [`FAILURE`]. Its text is the error's own.
#[derive(Debug)]
pub struct Coded {
    pub code: u8,
    pub error: anyhow::Error,
}

impl std::fmt::Display for Coded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

impl std::error::Error for Coded {}

/// `error`, ending svc with `code`.
pub fn coded(code: u8, error: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(Coded { code, error })
}

/// The status an error ends svc with: the code of the first [`Coded`] in its chain, else
/// [`FAILURE`].
pub fn status_of(error: &anyhow::Error) -> ExitCode {
    let code = error
        .chain()
        .find_map(|e| e.downcast_ref::<Coded>())
        .map_or(FAILURE, |c| c.code);
    ExitCode::from(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_coded_error_keeps_its_code_under_context_and_its_text() {
        let e = coded(CONFIG, anyhow::anyhow!("bad key"));
        assert_eq!(status_of(&e), ExitCode::from(CONFIG));
        let e = e.context("loading");
        assert_eq!(status_of(&e), ExitCode::from(CONFIG));
        assert_eq!(format!("{e:#}"), "loading: bad key");
        assert_eq!(status_of(&anyhow::anyhow!("x")), ExitCode::from(FAILURE));
    }

    #[test]
    fn docs_cli_md_writes_out_the_same_table() {
        let doc = include_str!("../../docs/cli.md");
        let rows: Vec<&str> = doc
            .lines()
            .skip_while(|l| !l.starts_with("| status |"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .collect();
        let ours: Vec<String> = EXIT_STATUS
            .iter()
            .map(|(c, m)| format!("| {c} | {m} |"))
            .collect();
        assert_eq!(
            rows, ours,
            "docs/cli.md's exit status table differs from EXIT_STATUS"
        );
    }

    #[test]
    fn the_table_has_each_code_once() {
        let mut codes: Vec<u8> = EXIT_STATUS.iter().map(|(c, _)| *c).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), EXIT_STATUS.len());
    }
}
