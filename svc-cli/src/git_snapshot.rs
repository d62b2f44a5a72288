//! What host git would execute in a project (`policy::gitdir::Snapshot`), read as the calling
//! user without running anything the project configures: `git config --file` with includes
//! off, from `/`, the hooks directories listed without following links, and the index's
//! gitlinks listed by `git ls-files` with the repository's programs turned off.

use std::{
    collections::BTreeMap,
    io::Read as _,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::Command,
};

use svc_control::policy::{
    gitdir::{Other, OtherKind, Snapshot, other_keys, usual_worktree_commondir},
    trust::digest_bytes,
};

/// Most git directories (linked worktrees, submodules, gitlinks) looked into.
const MAX_GIT_DIRS: usize = 256;
/// Deepest `.git/modules` nesting followed (a submodule's name may hold slashes).
const MAX_MODULE_DEPTH: usize = 8;
/// Largest redirection file read (`commondir`, a `.git` file, `alternates`).
const MAX_SMALL_FILE: u64 = 4096;

/// Most entries of `.git` looked at for symbolic links (beyond it, one finding says so).
const MAX_GIT_ENTRIES: usize = 200_000;

/// Largest hook read whole for its digest; a bigger one is named by its size.
const MAX_HOOK_BYTES: u64 = 4 * 1024 * 1024;

/// The snapshot of the project at `root`; `None` without a `.git` directory.
pub fn take(root: &Path) -> Option<Snapshot> {
    let git = root.join(".git");
    let meta = std::fs::symlink_metadata(&git).ok()?;
    if !meta.is_dir() {
        return None;
    }
    let mut s = Snapshot::from_config(&config(&git.join("config")), hooks(&git.join("hooks")));
    s.others = Others::read(root);
    Some(s)
}

/// The other places of [`Snapshot::others`], as read under one project.
struct Others<'a> {
    root: &'a Path,
    out: BTreeMap<String, Other>,
    dirs: usize,
}

impl<'a> Others<'a> {
    fn read(root: &'a Path) -> BTreeMap<String, Other> {
        let mut o = Others {
            root,
            out: BTreeMap::new(),
            dirs: 0,
        };
        o.file(".git/commondir", OtherKind::Redirect);
        // git takes `config` and `hooks` from where `commondir` points.
        if let Some(c) = read_small(&root.join(".git/commondir")) {
            o.linked(".git", c.trim_end_matches(['\n', '\r']), false);
        }
        o.keys(".git/config.worktree", false);
        o.file(".git/objects/info/alternates", OtherKind::Alternates);
        for id in children(&root.join(".git/worktrees")) {
            let dir = format!(".git/worktrees/{id}");
            let commondir = read_small(&root.join(&dir).join("commondir"));
            if commondir
                .as_deref()
                .is_some_and(|c| !usual_worktree_commondir(c))
            {
                o.file(&format!("{dir}/commondir"), OtherKind::Redirect);
            }
            o.keys(&format!("{dir}/config.worktree"), false);
        }
        o.modules(".git/modules", 0);
        o.symlinks();
        for path in gitlinks(root) {
            o.gitlink(&path);
        }
        o.out
    }

    /// Every symbolic link under `.git` (none followed), each with where it points.
    fn symlinks(&mut self) {
        let mut todo = vec![PathBuf::from(".git")];
        let mut seen = 0usize;
        while let Some(rel) = todo.pop() {
            let Ok(dir) = std::fs::read_dir(self.root.join(&rel)) else {
                continue;
            };
            for e in dir.flatten() {
                seen += 1;
                if seen > MAX_GIT_ENTRIES {
                    self.put(
                        ".git".into(),
                        OtherKind::Symlink,
                        format!("(more than {MAX_GIT_ENTRIES} entries: not all checked)"),
                    );
                    return;
                }
                let path = rel.join(e.file_name());
                match e.file_type() {
                    Ok(t) if t.is_symlink() => {
                        let to = std::fs::read_link(self.root.join(&path))
                            .map_or_else(|_| "?".into(), |p| p.display().to_string());
                        self.put(path.display().to_string(), OtherKind::Symlink, to);
                    }
                    Ok(t) if t.is_dir() => todo.push(path),
                    _ => {}
                }
            }
        }
    }

    fn put(&mut self, loc: String, kind: OtherKind, value: String) {
        self.out.insert(loc, Other { kind, value });
    }

    fn file(&mut self, rel: &str, kind: OtherKind) {
        if let Some(c) = read_small(&self.root.join(rel)) {
            self.put(rel.to_owned(), kind, c);
        }
    }

    fn keys(&mut self, rel: &str, module: bool) {
        let path = self.root.join(rel);
        if path.is_file() {
            self.out.extend(other_keys(rel, &config(&path), module));
        }
    }

    /// A git directory other than the project's own: its keys and hooks.
    fn git_dir(&mut self, rel: &str, module: bool) {
        self.dirs += 1;
        if self.dirs > MAX_GIT_DIRS {
            return;
        }
        self.keys(&format!("{rel}/config"), module);
        for (name, what) in hooks(&self.root.join(rel).join("hooks")) {
            self.put(format!("{rel}/hooks/{name}"), OtherKind::Hook, what);
        }
    }

    /// `.git/modules/…`: each git directory in it (one with a `HEAD`), and theirs.
    fn modules(&mut self, rel: &str, depth: usize) {
        if depth > MAX_MODULE_DEPTH || self.dirs > MAX_GIT_DIRS {
            return;
        }
        for name in children(&self.root.join(rel)) {
            let sub = format!("{rel}/{name}");
            if self.root.join(&sub).join("HEAD").is_file() {
                self.git_dir(&sub, true);
                self.modules(&format!("{sub}/modules"), depth + 1);
            } else {
                self.modules(&sub, depth + 1);
            }
        }
    }

    /// A gitlink at `path`: where its git directory is, and what that holds.
    fn gitlink(&mut self, path: &str) {
        let dotgit = self.root.join(path).join(".git");
        let Ok(meta) = std::fs::symlink_metadata(&dotgit) else {
            return; // not checked out: host git does not look into it
        };
        if meta.is_dir() {
            self.put(path.to_owned(), OtherKind::Gitlink, "dir".into());
            self.git_dir(&format!("{path}/.git"), true);
        } else if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&dotgit).unwrap_or_default();
            self.put(
                path.to_owned(),
                OtherKind::Gitlink,
                format!("symlink:{}", target.display()),
            );
        } else if let Some(line) = read_small(&dotgit) {
            self.put(
                path.to_owned(),
                OtherKind::Gitlink,
                line.trim_end().to_owned(),
            );
            if let Some(target) = line.trim().strip_prefix("gitdir:") {
                self.linked(path, target.trim(), true);
            }
        }
    }

    /// The git directory `target` names from `from` (relative to the project): its keys and
    /// hooks, unless it is read as part of `.git/modules`.
    fn linked(&mut self, from: &str, target: &str, module: bool) {
        let dir = normalise(&self.root.join(from).join(target));
        if dir.starts_with(self.root.join(".git/modules")) || dir == self.root.join(".git") {
            return;
        }
        let rel = dir
            .strip_prefix(self.root)
            .map_or_else(|_| dir.clone(), Path::to_path_buf);
        self.git_dir(&rel.display().to_string(), module);
    }
}

/// Names in directory `dir`, sorted (none if it cannot be read).
fn children(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names.truncate(MAX_GIT_DIRS);
    names
}

/// A small regular file's text (not following a link).
fn read_small(path: &Path) -> Option<String> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    if !meta.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_SMALL_FILE).read_to_end(&mut bytes))
        .ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// `path` with `.` and `..` folded away (without asking the file system).
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// The paths of the index's gitlinks (mode 160000): `git ls-files` with the repository's
/// fsmonitor and hooks off and no global or system configuration.
fn gitlinks(root: &Path) -> Vec<String> {
    let out = Command::new("git")
        .current_dir("/")
        .env("GIT_DIR", root.join(".git"))
        .env("GIT_WORK_TREE", root)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_OPTIONAL_LOCKS", "0")
        .args([
            "-c",
            "core.fsmonitor=false",
            "-c",
            "core.hooksPath=/dev/null",
            "ls-files",
            "--stage",
            "-z",
        ])
        .output();
    let Ok(out) = out else {
        return Vec::new();
    };
    out.stdout
        .split(|b| *b == 0)
        .filter(|e| e.starts_with(b"160000 "))
        .filter_map(|e| {
            let tab = e.iter().position(|b| *b == b'\t')?;
            Some(String::from_utf8_lossy(&e[tab + 1..]).into_owned())
        })
        .take(MAX_GIT_DIRS)
        .collect()
}

/// `key`/`value` pairs of one config file, as git parses it.
fn config(file: &Path) -> Vec<(String, String)> {
    let out = Command::new("git")
        .current_dir("/")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .args(["config", "--no-includes", "--null", "--list", "--file"])
        .arg(file)
        .output();
    let Ok(out) = out else {
        return Vec::new();
    };
    out.stdout
        .split(|b| *b == 0)
        .filter(|e| !e.is_empty())
        .map(|e| {
            let e = String::from_utf8_lossy(e);
            match e.split_once('\n') {
                Some((k, v)) => (k.to_owned(), v.to_owned()),
                None => (e.into_owned(), String::new()),
            }
        })
        .collect()
}

/// Each entry of the hooks directory and what it is.
fn hooks(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        let what = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => format!(
                "symlink:{}",
                std::fs::read_link(&path)
                    .map(|t| t.display().to_string())
                    .unwrap_or_default()
            ),
            Ok(m) if m.is_file() && m.len() <= MAX_HOOK_BYTES => {
                let mut bytes = Vec::new();
                match std::fs::File::open(&path)
                    .and_then(|f| f.take(MAX_HOOK_BYTES).read_to_end(&mut bytes))
                {
                    Ok(_) => format!("{} mode:{:o}", digest_bytes(&bytes), m.mode() & 0o7777),
                    Err(e) => format!("unreadable:{e}"),
                }
            }
            Ok(m) if m.is_file() => format!("size:{} mode:{:o}", m.len(), m.mode() & 0o7777),
            Ok(m) if m.is_dir() => "dir".into(),
            Ok(_) => "other".into(),
            Err(e) => format!("unreadable:{e}"),
        };
        out.insert(name, what);
    }
    out
}
