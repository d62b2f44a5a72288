//! `svcd man DIR`: DIR/man8/svcd.8 and a page per svcd subcommand (from the same definitions
//! as `--help`), and DIR/man5/svcd.toml.5, the host configuration's keys as
//! docs/host-config.md lists them.

use std::path::Path;

use anyhow::Context as _;
use svc_control::manual::{self, Extra};

/// The host configuration's reference, whose annotated example is svcd.toml(5)'s body.
const HOST_CONFIG_DOC: &str = include_str!("../../../../docs/host-config.md");

/// Every status svcd exits with.
const EXIT_STATUS: &[(u8, &str)] = &[
    (
        0,
        "Stopped cleanly (SIGTERM or SIGINT), or the subcommand succeeded.",
    ),
    (
        1,
        "Failure: the error is printed (svcd run: it could not start or keep serving).",
    ),
    (2, "Usage: the command line is wrong."),
    (
        78,
        "Configuration invalid (EX_CONFIG): every error in svcd.toml or the environment is \
         printed, with the file, line and key; nothing was bound or changed.",
    ),
];

/// What svcd reads from its environment.
const ENVIRONMENT: &[(&str, &str)] = &[
    ("RUST_LOG", "Log detail of svcd run (default info)."),
    (
        "NOTIFY_SOCKET",
        "Set by systemd for Type=notify: svcd sends READY=1 once its API socket answers, \
         STOPPING=1 when it stops, RELOADING=1 before an upgrade re-executes it.",
    ),
    (
        "SVC_MICROVM_KERNEL",
        "The microvm backend's guest kernel image.",
    ),
    (
        "SVC_MICROVM_ROOTFS",
        "The microvm backend's guest root file system image.",
    ),
    (
        "SVC_MICROVM_INITRD",
        "The microvm backend's initramfs (optional).",
    ),
    (
        "SSH_AUTH_SOCK",
        "The host's SSH agent for the git-over-SSH relay unless git_ssh.agent_socket is set.",
    ),
];

/// The files svcd reads and writes (their defaults; svcd.toml moves most of them).
const FILES: &[(&str, &str)] = &[
    (
        "/etc/svc/svcd.toml",
        "The host configuration (svcd.toml(5)).",
    ),
    (
        "/run/svc/svcd.sock",
        "The API socket svc talks to (socket).",
    ),
    (
        "/var/lib/svc",
        "The state: sandboxes, secrets, approvals (state_dir).",
    ),
    (
        "/var/log/svc/audit.jsonl",
        "The audit log, one JSON record a line (audit_dir).",
    ),
    ("/sys/fs/bpf/svc", "The pinned eBPF fence (pin_dir)."),
    (
        "/var/lib/svc/images",
        "The sandboxes' images svcd images build makes: base/ (container.image) and microvm/ \
         (microvm.kernel, microvm.initrd, microvm.rootfs).",
    ),
    (
        "/usr/lib/svc/guest",
        "The statically linked guest binaries the images are built with (--guest-bins).",
    ),
    (
        "/etc/svc/secrets.key",
        "The host key the secret store is sealed with (credentials.key_file).",
    ),
];

/// Write svcd's pages under the man root `dir`, each in its section's directory.
pub fn write(cmd: clap::Command, dir: &Path) -> anyhow::Result<()> {
    let mut all = pages(cmd).context("rendering the man pages")?;
    all.push(("svcd.toml.5".to_owned(), config_page()));
    for (file, page) in &all {
        let section = file.rsplit('.').next().unwrap_or("8");
        let sub = dir.join(format!("man{section}"));
        std::fs::create_dir_all(&sub).with_context(|| format!("creating {}", sub.display()))?;
        let path = sub.join(file);
        std::fs::write(&path, page).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("wrote {} man pages under {}", all.len(), dir.display());
    Ok(())
}

/// svcd.8 and its subcommands' pages.
fn pages(cmd: clap::Command) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let extra = Extra {
        exit_status: EXIT_STATUS,
        environment: ENVIRONMENT,
        files: FILES,
        see_also: &["svcd.toml(5)", "svc(1)"],
    };
    manual::tree(cmd, "8", &extra)
}

/// svcd.toml(5): the reference's opening paragraphs, then its annotated example of every key
/// with its default, as it stands in docs/host-config.md.
fn config_page() -> Vec<u8> {
    let (intro, example) = host_config_parts(HOST_CONFIG_DOC);
    let mut page = format!(
        ".TH SVCD.TOML 5 \"\" \"svcd {}\"\n.SH NAME\nsvcd.toml \\- svcd's host configuration\n\
         .SH SYNOPSIS\n/etc/svc/svcd.toml\n.SH DESCRIPTION\n",
        env!("CARGO_PKG_VERSION")
    );
    for para in intro.split("\n\n").map(|p| p.replace('\n', " ")) {
        page.push_str(&format!(".PP\n{}\n", manual::escape(unmark(&para).trim())));
    }
    page.push_str(".SH KEYS\nEvery key, with its default and what it does:\n.PP\n.nf\n");
    for line in example.lines() {
        page.push_str(&format!("{}\n", manual::escape(line)));
    }
    page.push_str(".fi\n");
    let mut page = page.into_bytes();
    let _ = manual::see_also(&mut page, ["svcd(8)", "svc(1)"].into_iter());
    page
}

/// The text between the title and the example, and the example (`toml` block) itself.
fn host_config_parts(doc: &str) -> (&str, &str) {
    let body = doc.split_once('\n').map_or(doc, |(_, rest)| rest);
    let (intro, rest) = body.split_once("```toml\n").unwrap_or((body, ""));
    let example = rest.split_once("```").map_or(rest, |(e, _)| e);
    (intro.trim(), example.trim_end())
}

/// Markdown's inline code marks removed (a man page shows the words).
fn unmark(text: &str) -> String {
    text.replace('`', "")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svcd_toml_5_lists_every_table_of_the_reference() {
        let page = String::from_utf8_lossy(&config_page()).into_owned();
        for s in [
            ".TH SVCD.TOML 5",
            ".SH NAME",
            ".SH DESCRIPTION",
            ".SH KEYS",
            ".SH \"SEE ALSO\"",
        ] {
            assert!(page.contains(s), "no {s}");
        }
        for table in [
            "[network]",
            "[proxy]",
            "[credentials]",
            "[limits]",
            "[microvm]",
        ] {
            assert!(page.contains(table), "no {table}");
        }
        assert!(page.contains("state_dir = \"/var/lib/svc\""));
        assert!(!page.contains("```"), "no markdown left");
    }
}
