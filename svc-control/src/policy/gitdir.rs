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
//!   away and replaced), and its `config` and `hooks` are read-only binds over it, as are its
//!   `commondir`, `config.worktree` and `worktrees` when they exist (git writes none of them
//!   during commit, branch, fetch or checkout; `.git` itself stays writable, since git writes
//!   `index.lock`, `HEAD.lock` there and renames them); commits, branches and fetches write
//!   other files (objects, refs, the index, logs) and still work;
//! - a `.git` file (a worktree's or submodule's pointer to its git directory) is read-only;
//! - a `.git` that is a symbolic link, or one of the protected paths that is one, refuses the
//!   sandbox: the bind would show the guest the link's target instead.
//!
//! What cannot be made read-only because it does not exist yet, or because git writes beside
//! it, is reported instead ([`Snapshot::others`], [`findings`], [`changes`]): a new
//! `.git/commondir` (it moves the common directory, so git takes `config` and `hooks` from
//! wherever it points), `config.worktree` keys, `worktrees/*/` redirections, submodules'
//! `.git/modules/**/config` and hooks, and the git directories of gitlinks in the index (a
//! nested repository whose own `config` runs code when host `git status` looks into it).
//! `objects/info/alternates` is not code but lets a repository read another's objects: its
//! changes are reported too. `info/attributes` only selects filters and drivers that
//! configuration defines, which is covered above.

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
    /// `.git/commondir`, `.git/config.worktree`, `.git/worktrees` (for a `.git` directory):
    /// bound read-only when they exist.
    pub commondir: GitEntry,
    pub config_worktree: GitEntry,
    pub worktrees: GitEntry,
}

impl GitLayout {
    /// A layout with only `.git`, `config` and `hooks` (the rest missing).
    pub const fn basic(git: GitEntry, config: GitEntry, hooks: GitEntry) -> Self {
        Self {
            git,
            config,
            hooks,
            commondir: GitEntry::Missing,
            config_worktree: GitEntry::Missing,
            worktrees: GitEntry::Missing,
        }
    }
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
    #[error("{0} is not what git keeps there (a file, or a directory for hooks and worktrees)")]
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
            for (path, entry, want) in [
                (".git/commondir", layout.commondir, GitEntry::File),
                (
                    ".git/config.worktree",
                    layout.config_worktree,
                    GitEntry::File,
                ),
                (".git/worktrees", layout.worktrees, GitEntry::Dir),
            ] {
                match entry {
                    GitEntry::Missing => {}
                    e if e == want => read_only.push(path),
                    GitEntry::Symlink => return Err(GitDirError::Symlink(path)),
                    _ => return Err(GitDirError::Odd(path)),
                }
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
    /// Everywhere else git on the host takes configuration or code from, by location (a path
    /// relative to the project, and for a key `path: key`): see the module's documentation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub others: BTreeMap<String, Other>,
}

/// One entry of [`Snapshot::others`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Other {
    pub kind: OtherKind,
    /// The key's values (one a line), the hook's digest, the file's content, the gitlink's
    /// git directory (`dir`, or its `gitdir:` line).
    pub value: String,
}

/// What an entry of [`Snapshot::others`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OtherKind {
    /// An executable key ([`is_executable_key`]) of a config file other than `.git/config`.
    Key,
    /// A hook of a git directory other than the project's own.
    Hook,
    /// A file that moves where git reads configuration and hooks from (`commondir`).
    Redirect,
    /// A gitlink in the index whose git directory is there.
    Gitlink,
    /// `objects/info/alternates`: where else objects are read from (not code).
    Alternates,
    /// A symbolic link inside `.git`: git never makes one there, and host git writes through
    /// it (`FETCH_HEAD`, `COMMIT_EDITMSG`, `logs/*` are written or appended in place) to a file
    /// of the owner's outside the project, such as a shell's start-up file.
    Symlink,
}

/// The keys of config file `file` (relative to the project) that belong in
/// [`Snapshot::others`]; `module`: a submodule's or nested repository's own, whose
/// `core.worktree` git writes itself and is left out.
pub fn other_keys(file: &str, pairs: &[(String, String)], module: bool) -> Vec<(String, Other)> {
    let mut out: BTreeMap<String, Other> = BTreeMap::new();
    for (k, v) in pairs {
        let k = k.to_ascii_lowercase();
        if !is_executable_key(&k) || (module && k == "core.worktree") {
            continue;
        }
        out.entry(format!("{file}: {k}"))
            .and_modify(|o| {
                o.value.push('\n');
                o.value.push_str(v);
            })
            .or_insert_with(|| Other {
                kind: OtherKind::Key,
                value: v.clone(),
            });
    }
    out.into_iter().collect()
}

/// Whether `.git/worktrees/<id>/commondir` holding `content` is what `git worktree add`
/// writes (`../..`), so not worth a report.
pub fn usual_worktree_commondir(content: &str) -> bool {
    content.trim_end_matches(['\n', '\r']) == "../.."
}

/// What git on the host would run or be redirected by in `s` beyond the project's own
/// `.git/config` and hooks, one line each: what `svc workspace up` shows before it starts
/// anything. Hooks named `*.sample` (git's templates, never run) and gitlinks themselves
/// (their keys and hooks are listed) are not findings.
pub fn findings(s: &Snapshot) -> Vec<String> {
    s.others
        .iter()
        .filter(|(loc, o)| {
            counts(loc, o)
                && matches!(
                    o.kind,
                    OtherKind::Key | OtherKind::Redirect | OtherKind::Hook | OtherKind::Symlink
                )
        })
        .map(|(loc, o)| describe(loc, o))
        .collect()
}

/// Whether an entry of [`Snapshot::others`] is worth a line: all but git's sample hooks
/// (`*.sample`, which git never runs).
fn counts(loc: &str, o: &Other) -> bool {
    !(o.kind == OtherKind::Hook && loc.ends_with(".sample"))
}

/// One entry, named by its file (and key), with how to look at or remove it.
fn describe(loc: &str, o: &Other) -> String {
    match o.kind {
        OtherKind::Key => {
            let (file, key) = loc.split_once(": ").unwrap_or((loc, ""));
            format!(
                "{file}: {key} = {:?} (remove: git config --file {file} --unset-all {key})",
                o.value
            )
        }
        OtherKind::Hook => format!("hook {loc} (remove: rm {loc})"),
        OtherKind::Redirect => format!(
            "{loc} = {:?}: git takes config and hooks from there (remove: rm {loc})",
            o.value.trim_end()
        ),
        OtherKind::Gitlink => format!(
            "gitlink {loc} ({}): host git looks into it (inspect: ls -la {loc}; remove its \
             git directory: rm -rf {loc}/.git)",
            o.value.trim_end()
        ),
        OtherKind::Alternates => format!(
            "{loc} = {:?}: objects read from there (not code; remove: rm {loc})",
            o.value.trim_end()
        ),
        OtherKind::Symlink => format!(
            "{loc} -> {:?}: a symbolic link in the git directory; host git writes through it \
             (remove: rm {loc})",
            o.value
        ),
    }
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
            others: BTreeMap::new(),
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
    for (loc, o) in after.others.iter().filter(|(l, o)| counts(l, o)) {
        match before.others.get(loc) {
            None => out.push(format!("{} (new)", describe(loc, o))),
            Some(b) if b != o => out.push(format!("{} (changed)", describe(loc, o))),
            Some(_) => {}
        }
    }
    for (loc, o) in before.others.iter().filter(|(l, o)| counts(l, o)) {
        if !after.others.contains_key(loc) {
            out.push(format!("{} (gone)", describe(loc, o)));
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
        let l = GitLayout::basic;
        let with = |commondir, config_worktree, worktrees| GitLayout {
            commondir,
            config_worktree,
            worktrees,
            ..GitLayout::basic(Dir, File, Dir)
        };
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
                Err(".git/config is not what git keeps"),
            ),
            (
                "hooks_is_a_file",
                l(Dir, File, File),
                false,
                Err(".git/hooks is not what git keeps"),
            ),
            (
                "linked_worktrees_and_their_redirections_read_only",
                with(File, File, Dir),
                false,
                Ok((
                    &[".git"],
                    &[
                        ".git/config",
                        ".git/hooks",
                        ".git/commondir",
                        ".git/config.worktree",
                        ".git/worktrees",
                    ],
                    false,
                )),
            ),
            (
                "worktrees_only",
                with(Missing, Missing, Dir),
                false,
                Ok((
                    &[".git"],
                    &[".git/config", ".git/hooks", ".git/worktrees"],
                    false,
                )),
            ),
            (
                "commondir_is_a_link",
                with(Symlink, Missing, Missing),
                false,
                Err(".git/commondir is a symbolic link"),
            ),
            (
                "commondir_is_a_dir",
                with(Dir, Missing, Missing),
                false,
                Err(".git/commondir is not what git keeps"),
            ),
            (
                "worktrees_is_a_file",
                with(Missing, Missing, File),
                false,
                Err(".git/worktrees is not what git keeps"),
            ),
            (
                "config_worktree_is_a_link",
                with(Missing, Symlink, Missing),
                false,
                Err(".git/config.worktree is a symbolic link"),
            ),
            (
                "git_is_a_fifo",
                l(Other, Missing, Missing),
                false,
                Err(".git is not what git keeps"),
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

    fn kv(k: &str, v: &str) -> (String, String) {
        (k.to_owned(), v.to_owned())
    }

    fn others(entries: &[(&str, OtherKind, &str)]) -> Snapshot {
        Snapshot {
            others: entries
                .iter()
                .map(|(l, kind, v)| {
                    (
                        (*l).to_owned(),
                        Other {
                            kind: *kind,
                            value: (*v).to_owned(),
                        },
                    )
                })
                .collect(),
            ..Snapshot::default()
        }
    }

    #[test]
    fn other_key_cases() {
        let pairs = [
            kv("core.fsmonitor", "/x/run"),
            kv("core.worktree", "../../../sub"),
            kv("core.bare", "false"),
            kv("alias.a", "!one"),
            kv("ALIAS.A", "!two"),
        ];
        let module = other_keys(".git/modules/sub/config", &pairs, true);
        let names: Vec<&str> = module.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            names,
            [
                ".git/modules/sub/config: alias.a",
                ".git/modules/sub/config: core.fsmonitor"
            ]
        );
        assert_eq!(
            module[0].1.value, "!one\n!two",
            "both values of a repeated key"
        );
        let own = other_keys(".git/config.worktree", &pairs, false);
        assert!(
            own.iter()
                .any(|(l, _)| l == ".git/config.worktree: core.worktree"),
            "outside a module core.worktree is a redirection: {own:?}"
        );
        assert!(usual_worktree_commondir("../..\n"));
        assert!(!usual_worktree_commondir("/tmp/evil"));
    }

    #[test]
    fn finding_cases() {
        use OtherKind::{Alternates, Gitlink, Hook, Key, Redirect, Symlink};
        // (name, entry, Some(fragment of the line) or None: not a finding)
        type Entry<'a> = (&'a str, OtherKind, &'a str);
        let cases: &[(&str, Entry<'_>, Option<&str>)] = &[
            (
                "commondir",
                (".git/commondir", Redirect, "../evil\n"),
                Some(
                    ".git/commondir = \"../evil\": git takes config and hooks from there (remove: rm .git/commondir)",
                ),
            ),
            (
                "nested_fsmonitor",
                ("sub/.git/config: core.fsmonitor", Key, "/w/run"),
                Some(
                    "sub/.git/config: core.fsmonitor = \"/w/run\" (remove: git config --file sub/.git/config --unset-all core.fsmonitor)",
                ),
            ),
            (
                "module_hook",
                (".git/modules/lib/hooks/post-checkout", Hook, "sha256:1"),
                Some(
                    "hook .git/modules/lib/hooks/post-checkout (remove: rm .git/modules/lib/hooks/post-checkout)",
                ),
            ),
            (
                "sample_hook",
                (".git/modules/lib/hooks/pre-commit.sample", Hook, "sha256:1"),
                None,
            ),
            ("gitlink_itself", ("sub", Gitlink, "dir"), None),
            (
                "symlink_in_git_dir",
                (".git/FETCH_HEAD", Symlink, "/home/o/.bashrc"),
                Some(
                    ".git/FETCH_HEAD -> \"/home/o/.bashrc\": a symbolic link in the git directory; host git writes through it (remove: rm .git/FETCH_HEAD)",
                ),
            ),
            (
                "alternates",
                (".git/objects/info/alternates", Alternates, "/srv/o"),
                None,
            ),
        ];
        for (name, (loc, kind, v), want) in cases {
            let got = findings(&others(&[(loc, *kind, v)]));
            match want {
                None => assert!(got.is_empty(), "{name}: {got:?}"),
                Some(frag) => assert_eq!(got, [(*frag).to_owned()], "{name}"),
            }
        }
    }

    #[test]
    fn other_change_cases() {
        use OtherKind::{Gitlink, Key, Redirect};
        let before = others(&[("sub", Gitlink, "dir")]);
        let after = others(&[
            ("sub", Gitlink, "gitdir: ../elsewhere"),
            (".git/commondir", Redirect, "../evil"),
            ("sub/.git/config: core.fsmonitor", Key, "/w/run"),
        ]);
        let got = changes(&before, &after);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got[0].starts_with(".git/commondir = \"../evil\"") && got[0].ends_with("(new)"));
        assert!(
            got[1].starts_with("gitlink sub (gitdir: ../elsewhere)")
                && got[1].ends_with("(changed)")
        );
        assert!(got[2].starts_with("sub/.git/config: core.fsmonitor") && got[2].ends_with("(new)"));
        let samples = others(&[(
            "sub/.git/hooks/pre-push.sample",
            OtherKind::Hook,
            "sha256:1",
        )]);
        assert!(
            changes(&before, &samples).len() == 1,
            "only the gitlink's going counts"
        );
        let gone = changes(&after, &Snapshot::default());
        assert!(
            gone.iter().all(|l| l.ends_with("(gone)")) && gone.len() == 3,
            "{gone:?}"
        );
    }
}
