//! A project's git directory, which git on the host acts on: what of it the sandbox sees
//! read-only, and which changes to it `svc workspace down` reports.
//!
//! Git runs programs named by the repository's own configuration (`core.fsmonitor`,
//! `core.hooksPath`, `core.sshCommand`, aliases, filters, diff drivers, …) and by its hooks,
//! as whoever runs git. A guest that could write `.git/config` or `.git/hooks/*` would run code
//! as the project's owner, on the host, at their next `git status`. So, unless the workspace
//! opts out (`auth.defaults.gitConfigWritable`):
//!
//! - a `.git` directory is a mount point of its own in the sandbox (so it cannot be renamed
//!   away and replaced), and its `config` and `hooks` are read-only binds over it; commits,
//!   branches and fetches write other files (objects, refs, the index, logs) and still work;
//! - a `.git` file (a worktree's or submodule's pointer to its git directory) is read-only;
//! - a `.git` that is a symbolic link, or a `config` or `hooks` that is one, refuses the
//!   sandbox: the bind would show the guest the link's target instead.
//!
//! Git directories elsewhere in the tree (nested repositories, `.git/modules/*`) are not
//! covered; the report at `down` lists what changed in the project's own.

use std::collections::BTreeMap;

/// What `.git` is at the project's root, as `lstat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitEntry {
    Missing,
    Dir,
    File,
    Symlink,
    Other,
}

/// What the project's `.git` holds, as `lstat` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GitLayout {
    pub git: GitEntry,
    /// `.git/config` (for a `.git` directory).
    pub config: GitEntry,
    /// `.git/hooks` (for a `.git` directory).
    pub hooks: GitEntry,
}

/// The mounts that keep the guest from changing what host git executes: paths relative to
/// the project directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protection {
    /// Bound onto themselves read-write first, so each is a mount point (cannot be renamed).
    pub pinned: Vec<&'static str>,
    /// Then bound read-only.
    pub read_only: Vec<&'static str>,
    /// `.git/hooks` is missing: make it (empty, the project owner's) so it can be bound.
    pub make_hooks: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GitDirError {
    #[error(
        "{0} is a symbolic link: the sandbox would see its target read-only in its place; make \
         it a plain file or directory (or set auth.defaults.gitConfigWritable)"
    )]
    Symlink(&'static str),
    #[error("{0} is neither a file nor a directory")]
    Odd(&'static str),
}

/// The protection for `layout`; `writable` is the workspace's opt-out.
pub fn protection(layout: GitLayout, writable: bool) -> Result<Protection, GitDirError> {
    if writable {
        return Ok(Protection::default());
    }
    match layout.git {
        GitEntry::Missing => Ok(Protection::default()),
        GitEntry::File => Ok(Protection {
            read_only: vec![".git"],
            ..Protection::default()
        }),
        GitEntry::Symlink => Err(GitDirError::Symlink(".git")),
        GitEntry::Other => Err(GitDirError::Odd(".git")),
        GitEntry::Dir => {
            match layout.config {
                GitEntry::File | GitEntry::Missing => {}
                GitEntry::Symlink => return Err(GitDirError::Symlink(".git/config")),
                GitEntry::Dir | GitEntry::Other => return Err(GitDirError::Odd(".git/config")),
            }
            let make_hooks = match layout.hooks {
                GitEntry::Dir => false,
                GitEntry::Missing => true,
                GitEntry::Symlink => return Err(GitDirError::Symlink(".git/hooks")),
                GitEntry::File | GitEntry::Other => return Err(GitDirError::Odd(".git/hooks")),
            };
            let mut read_only = vec![".git/hooks"];
            // A missing config stays missing: git in the sandbox cannot create one at a
            // mount point's name, and the host's git has none to read.
            if layout.config == GitEntry::File {
                read_only.insert(0, ".git/config");
            }
            Ok(Protection {
                pinned: vec![".git"],
                read_only,
                make_hooks,
            })
        }
    }
}

/// Whether git runs, or is redirected by, the value of configuration key `key` (any case).
pub fn is_executable_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    let mut parts = key.splitn(2, '.');
    let section = parts.next().unwrap_or("");
    let rest = parts.next().unwrap_or("");
    // The variable name is after the last dot (a subsection may hold dots).
    let var = rest.rsplit('.').next().unwrap_or("");
    let sub = rest.contains('.');
    match section {
        "alias" | "pager" | "filter" | "include" | "includeif" | "credential" => true,
        "core" => matches!(
            var,
            "fsmonitor"
                | "hookspath"
                | "sshcommand"
                | "pager"
                | "editor"
                | "askpass"
                | "gitproxy"
                | "alternaterefscommand"
                | "worktree"
                | "attributesfile"
                | "excludesfile"
        ),
        "diff" => matches!(var, "textconv" | "command" | "external"),
        "merge" | "mergetool" | "difftool" => matches!(var, "driver" | "cmd" | "path"),
        "sequence" => var == "editor",
        "gpg" => var == "program",
        "uploadpack" => var == "packobjectshook",
        "remote" => sub && matches!(var, "uploadpack" | "receivepack" | "vcs"),
        "submodule" => sub && var == "update",
        "protocol" => var == "allow",
        "extensions" => var == "worktreeconfig",
        "web" => var == "browser",
        "browser" | "man" => var == "cmd" || var == "path",
        "sendemail" => matches!(var, "sendmailcmd" | "smtpserver" | "tocmd" | "cccmd"),
        "http" | "url" => matches!(var, "proxy" | "insteadof" | "pushinsteadof"),
        _ => false,
    }
}

/// What git on the host would act on in a project, as `svc workspace up` saw it and as
/// `down` sees it: its executable configuration and its hooks.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// Executable keys (lowercased) and their values, in the order git lists them.
    pub config: Vec<(String, String)>,
    /// Each entry of `.git/hooks` (name) and a digest of what it is (file content, or
    /// `symlink:` and its target).
    pub hooks: BTreeMap<String, String>,
}

impl Snapshot {
    /// From `git config --list` style `key=value` pairs: only the executable keys are kept.
    pub fn from_config(pairs: &[(String, String)], hooks: BTreeMap<String, String>) -> Self {
        Self {
            config: pairs
                .iter()
                .filter(|(k, _)| is_executable_key(k))
                .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
                .collect(),
            hooks,
        }
    }
}

/// What changed between `before` and `after`, one line each (empty: nothing).
pub fn changes(before: &Snapshot, after: &Snapshot) -> Vec<String> {
    let mut out = Vec::new();
    for kv in &after.config {
        if !before.config.contains(kv) {
            out.push(format!("config {} = {:?} (new)", kv.0, kv.1));
        }
    }
    for kv in &before.config {
        if !after.config.contains(kv) {
            out.push(format!("config {} = {:?} (gone)", kv.0, kv.1));
        }
    }
    for (name, d) in &after.hooks {
        match before.hooks.get(name) {
            None => out.push(format!("hook {name} (new)")),
            Some(b) if b != d => out.push(format!("hook {name} (changed)")),
            Some(_) => {}
        }
    }
    for name in before.hooks.keys() {
        if !after.hooks.contains_key(name) {
            out.push(format!("hook {name} (gone)"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protection_cases() {
        use GitEntry::{Dir, File, Missing, Other, Symlink};
        let l = |git, config, hooks| GitLayout { git, config, hooks };
        // (name, layout, writable, Ok((pinned, read_only, make_hooks)) or Err(fragment))
        type Want = Result<(&'static [&'static str], &'static [&'static str], bool), &'static str>;
        let cases: &[(&str, GitLayout, bool, Want)] = &[
            (
                "plain_repository",
                l(Dir, File, Dir),
                false,
                Ok((&[".git"], &[".git/config", ".git/hooks"], false)),
            ),
            (
                "no_hooks_dir_gets_one",
                l(Dir, File, Missing),
                false,
                Ok((&[".git"], &[".git/config", ".git/hooks"], true)),
            ),
            (
                "no_config_stays_none",
                l(Dir, Missing, Dir),
                false,
                Ok((&[".git"], &[".git/hooks"], false)),
            ),
            (
                "worktree_pointer_file",
                l(File, Missing, Missing),
                false,
                Ok((&[], &[".git"], false)),
            ),
            (
                "no_repository",
                l(Missing, Missing, Missing),
                false,
                Ok((&[], &[], false)),
            ),
            ("opted_out", l(Dir, File, Dir), true, Ok((&[], &[], false))),
            (
                "opted_out_even_with_links",
                l(Symlink, Missing, Missing),
                true,
                Ok((&[], &[], false)),
            ),
            (
                "git_is_a_link",
                l(Symlink, Missing, Missing),
                false,
                Err(".git is a symbolic link"),
            ),
            (
                "config_is_a_link",
                l(Dir, Symlink, Dir),
                false,
                Err(".git/config is a symbolic link"),
            ),
            (
                "hooks_is_a_link",
                l(Dir, File, Symlink),
                false,
                Err(".git/hooks is a symbolic link"),
            ),
            (
                "config_is_a_dir",
                l(Dir, Dir, Dir),
                false,
                Err(".git/config is neither"),
            ),
            (
                "hooks_is_a_file",
                l(Dir, File, File),
                false,
                Err(".git/hooks is neither"),
            ),
            (
                "git_is_a_fifo",
                l(Other, Missing, Missing),
                false,
                Err(".git is neither"),
            ),
        ];
        for (name, layout, writable, want) in cases {
            let got = protection(*layout, *writable);
            match (want, got) {
                (Ok((pinned, ro, make)), Ok(p)) => {
                    assert_eq!(p.pinned, *pinned, "{name}");
                    assert_eq!(p.read_only, *ro, "{name}");
                    assert_eq!(p.make_hooks, *make, "{name}");
                }
                (Err(frag), Err(e)) => assert!(e.to_string().contains(frag), "{name}: {e}"),
                (want, got) => panic!("{name}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn executable_key_cases() {
        let yes = [
            "core.fsmonitor",
            "core.hooksPath",
            "core.sshCommand",
            "core.pager",
            "core.editor",
            "core.askPass",
            "core.gitProxy",
            "core.worktree",
            "alias.st",
            "pager.log",
            "filter.lfs.clean",
            "filter.x.process",
            "diff.pdf.textconv",
            "diff.x.command",
            "diff.external",
            "merge.ours.driver",
            "mergetool.vim.cmd",
            "difftool.x.path",
            "sequence.editor",
            "gpg.program",
            "gpg.ssh.program",
            "uploadpack.packObjectsHook",
            "include.path",
            "includeIf.gitdir:/x/.path",
            "credential.helper",
            "credential.https://example.com.helper",
            "remote.origin.uploadpack",
            "remote.origin.receivepack",
            "remote.origin.vcs",
            "submodule.lib.update",
            "protocol.ext.allow",
            "extensions.worktreeConfig",
            "web.browser",
            "browser.firefox.cmd",
            "man.x.cmd",
            "sendemail.sendmailCmd",
            "url.https://evil.example/.insteadOf",
            "http.proxy",
            "CORE.FSMONITOR",
        ];
        let no = [
            "core.bare",
            "core.filemode",
            "core.repositoryformatversion",
            "remote.origin.url",
            "remote.origin.fetch",
            "branch.main.remote",
            "user.name",
            "user.email",
            "submodule.lib.url",
            "diff.renames",
            "merge.ff",
            "gc.auto",
            "init.defaultBranch",
        ];
        for k in yes {
            assert!(is_executable_key(k), "{k} should be executable");
        }
        for k in no {
            assert!(!is_executable_key(k), "{k} should not be executable");
        }
    }

    #[test]
    fn change_cases() {
        let kv = |k: &str, v: &str| (k.to_owned(), v.to_owned());
        let hooks = |h: &[(&str, &str)]| {
            h.iter()
                .map(|(n, d)| ((*n).to_owned(), (*d).to_owned()))
                .collect::<BTreeMap<_, _>>()
        };
        let before = Snapshot::from_config(
            &[kv("core.bare", "false"), kv("alias.st", "status")],
            hooks(&[("pre-commit.sample", "sha256:1")]),
        );
        assert_eq!(before.config, vec![kv("alias.st", "status")]);
        let cases: &[(&str, Snapshot, &[&str])] = &[
            ("unchanged", before.clone(), &[]),
            (
                "fsmonitor_added",
                Snapshot::from_config(
                    &[kv("alias.st", "status"), kv("core.fsmonitor", "/tmp/x")],
                    hooks(&[("pre-commit.sample", "sha256:1")]),
                ),
                &["config core.fsmonitor = \"/tmp/x\" (new)"],
            ),
            (
                "alias_changed",
                Snapshot::from_config(
                    &[kv("alias.st", "!sh -c evil")],
                    hooks(&[("pre-commit.sample", "sha256:1")]),
                ),
                &[
                    "config alias.st = \"!sh -c evil\" (new)",
                    "config alias.st = \"status\" (gone)",
                ],
            ),
            (
                "hook_added_and_sample_changed",
                Snapshot::from_config(
                    &[kv("alias.st", "status")],
                    hooks(&[
                        ("pre-commit.sample", "sha256:2"),
                        ("post-checkout", "sha256:3"),
                    ]),
                ),
                &[
                    "hook post-checkout (new)",
                    "hook pre-commit.sample (changed)",
                ],
            ),
            (
                "hook_removed",
                Snapshot::from_config(&[kv("alias.st", "status")], hooks(&[])),
                &["hook pre-commit.sample (gone)"],
            ),
            (
                "harmless_key_added",
                Snapshot::from_config(
                    &[kv("alias.st", "status"), kv("user.name", "guest")],
                    hooks(&[("pre-commit.sample", "sha256:1")]),
                ),
                &[],
            ),
        ];
        for (name, after, want) in cases {
            assert_eq!(changes(&before, after), *want, "{name}");
        }
    }
}
