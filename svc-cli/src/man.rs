//! `svc man DIR`: svc.1 and one page per subcommand (svc-sandbox-exec.1, …), from the same
//! definitions as `--help`, with svc's EXIT STATUS, ENVIRONMENT, FILES and SEE ALSO.

use std::{path::Path, process::ExitCode};

use anyhow::Context as _;
use svc_control::manual::{self, Extra};

use crate::exit::EXIT_STATUS;

/// What svc reads from its environment.
const ENVIRONMENT: &[(&str, &str)] = &[
    (
        "SVC_SOCKET",
        "svcd's API socket when --socket is not given (default /run/svc/svcd.sock).",
    ),
    (
        "COMPLETE",
        "Set by the script of svc completions when the shell asks svc what a word can be; \
         svc then prints the candidates and exits.",
    ),
];

/// The files svc uses.
const FILES: &[(&str, &str)] = &[
    (
        "/run/svc/svcd.sock",
        "svcd's API socket: root and the members of its group (api_group, default svc) may \
         call it.",
    ),
    (
        ".svc/workspace.json, .svc/config.yaml",
        "A project's workspace and egress configuration (svc config check, svc workspace up).",
    ),
    (
        "/etc/svc/svcd.toml",
        "svcd's host configuration; svc egress explain reads it too.",
    ),
];

/// Pages about svc that svcd writes (`svcd man DIR`).
const SVCD_PAGES: &[&str] = &["svcd(8)", "svcd.toml(5)"];

/// Write the pages into `dir`.
pub fn pages(dir: &Path) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let all = render_all().context("rendering the man pages")?;
    for (file, page) in &all {
        let path = dir.join(file);
        std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    }
    outln!("wrote {} man pages to {}", all.len(), dir.display());
    Ok(ExitCode::SUCCESS)
}

/// Every page: `(file name, roff)`, svc.1 first.
fn render_all() -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let extra = Extra {
        exit_status: EXIT_STATUS,
        environment: ENVIRONMENT,
        files: FILES,
        see_also: SVCD_PAGES,
    };
    manual::tree(crate::command::command(), "1", &extra)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svc_1_has_the_standard_sections_and_every_exit_status() {
        let all = render_all().expect("renders");
        let (file, svc) = &all[0];
        assert_eq!(file, "svc.1");
        let svc = String::from_utf8_lossy(svc);
        for s in [
            ".SH NAME",
            ".SH SYNOPSIS",
            ".SH DESCRIPTION",
            ".SH OPTIONS",
            ".SH \"EXIT STATUS\"",
            ".SH ENVIRONMENT",
            ".SH FILES",
            ".SH \"SEE ALSO\"",
        ] {
            assert!(svc.contains(s), "svc.1 lacks {s}");
        }
        for (code, _) in EXIT_STATUS {
            assert!(
                svc.contains(&format!("\\fB{code}\\fR")),
                "no exit status {code}"
            );
        }
        assert!(svc.contains("SVC_SOCKET") && svc.contains("/etc/svc/svcd.toml"));
    }

    #[test]
    fn every_page_svc_names_is_written_here_or_by_svcd() {
        let all = render_all().expect("renders");
        let written: Vec<String> = all
            .iter()
            .map(|(f, _)| format!("{}(1)", f.trim_end_matches(".1")))
            .collect();
        for (file, page) in &all {
            for r in manual::references(page) {
                assert!(
                    written.contains(&r) || SVCD_PAGES.contains(&r.as_str()),
                    "{file} names {r}, which is not written"
                );
            }
        }
        assert!(!written.iter().any(|p| p.contains("help")), "{written:?}");
        assert!(written.contains(&"svc-sandbox-exec(1)".to_owned()));
    }
}
