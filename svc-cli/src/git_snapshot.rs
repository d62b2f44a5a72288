//! What host git would execute in a project (`policy::gitdir::Snapshot`), read as the calling
//! user without running anything the project configures: `git config --file` with includes
//! off, from `/`, and the hooks directory listed without following links.

use std::{
    collections::BTreeMap, io::Read as _, os::unix::fs::MetadataExt as _, path::Path,
    process::Command,
};

use svc_control::policy::{gitdir::Snapshot, trust::digest_bytes};

/// Largest hook read whole for its digest; a bigger one is named by its size.
const MAX_HOOK_BYTES: u64 = 4 * 1024 * 1024;

/// The snapshot of the project at `root`; `None` without a `.git` directory.
pub fn take(root: &Path) -> Option<Snapshot> {
    let git = root.join(".git");
    let meta = std::fs::symlink_metadata(&git).ok()?;
    if !meta.is_dir() {
        return None;
    }
    Some(Snapshot::from_config(
        &config(&git.join("config")),
        hooks(&git.join("hooks")),
    ))
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
