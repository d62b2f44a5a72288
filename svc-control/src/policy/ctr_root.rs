//! A pod container's root file system attached into its pod's sandbox (`POST
//! /v1/sandboxes/{name}/roots`, the containerd shim's `Create` of a pod's container): which
//! container ids and layer paths are taken, and who may hand them.
//!
//! - The route is the sandbox's owner's or root's, as every per-sandbox route is
//!   ([`ownership`](super::ownership)).
//! - The layers become part of the guest's files for as long as the container is attached, as
//!   `--rootfs` does: only root hands them (a tree its caller owns could be changed under the
//!   running guest, or hold ids the caller was never given). A sandbox's owner who is not root
//!   is refused, saying so.
//! - The container id names its mount point, `/.svc/ctr/<id>`, and the exec's `root`:
//!   containerd's identifier rule (alphanumerics, separated by single `.`, `_` or `-`, at most
//!   76 characters), so no id is a path step, hidden, or a separator.
//! - Each layer is an absolute path written plainly (no `.` or `..` step, no empty step, no
//!   trailing `/`), without the characters an overlay's options split on (`,`, `:`, `\`); at
//!   most [`MAX_LAYERS`]. svcd then checks each on disk as `--rootfs` (a directory, no link on
//!   the way).
//! - The places the guest's agent says it skipped while binding a tree (its words: the guest
//!   is hostile) reach the API's answer, the event and svcd's log only as [`skipped_places`]
//!   gives them: at most [`MAX_SKIPPED`] lines of at most [`MAX_SKIPPED_CHARS`] characters,
//!   no control or bidirectional-format character left as it is (no line break, carriage
//!   return or terminal escape lands in a log line or on an operator's terminal).

use std::path::{Component, Path, PathBuf};

/// The most layers one container's root file system may have (overlayfs stacks at most 500
/// lower layers; containerd images rarely pass 127).
pub const MAX_LAYERS: usize = 128;

/// The longest container id (containerd's identifiers).
pub const MAX_ID: usize = 76;

/// The most places skipped taken from what the guest's agent said (it binds fewer).
pub const MAX_SKIPPED: usize = 16;

/// The most characters of one place skipped, as shown.
pub const MAX_SKIPPED_CHARS: usize = 200;

/// Why an attach (or an exec's root) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CtrRootError {
    #[error(
        "container id {0:?}: expected 1 to {MAX_ID} letters and digits, separated by single '.', \
         '_' or '-' (containerd's identifiers)"
    )]
    Id(String),
    #[error(
        "attaching {id}'s root file system: only root may hand a sandbox a root file system (it \
         stays part of the guest's files while the container is attached; a tree its caller \
         can change is refused)"
    )]
    NotRoot { id: String },
    #[error("attaching {id}'s root file system: no layers given")]
    NoLayers { id: String },
    #[error("attaching {id}'s root file system: {count} layers, more than {MAX_LAYERS}")]
    TooManyLayers { id: String, count: usize },
    #[error(
        "attaching {id}'s root file system: layer {layer:?} {why}: give each layer's absolute, \
         plain path"
    )]
    Layer {
        id: String,
        layer: String,
        why: &'static str,
    },
}

/// Container id `id`, checked.
pub fn check_id(id: &str) -> Result<(), CtrRootError> {
    let parts_ok = id
        .split(['.', '_', '-'])
        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric()));
    if id.is_empty() || id.len() > MAX_ID || !parts_ok {
        return Err(CtrRootError::Id(id.to_owned()));
    }
    Ok(())
}

/// An attach of `layers` (top first) as container `id`'s root file system, asked by a caller
/// who is root or not: the layers as paths, checked (not yet on disk).
pub fn check_attach(
    id: &str,
    layers: &[String],
    caller_is_root: bool,
) -> Result<Vec<PathBuf>, CtrRootError> {
    check_id(id)?;
    if !caller_is_root {
        return Err(CtrRootError::NotRoot { id: id.to_owned() });
    }
    if layers.is_empty() {
        return Err(CtrRootError::NoLayers { id: id.to_owned() });
    }
    if layers.len() > MAX_LAYERS {
        return Err(CtrRootError::TooManyLayers {
            id: id.to_owned(),
            count: layers.len(),
        });
    }
    layers
        .iter()
        .map(|l| {
            layer_fault(l)
                .map(|why| CtrRootError::Layer {
                    id: id.to_owned(),
                    layer: l.clone(),
                    why,
                })
                .map_or_else(|| Ok(PathBuf::from(l)), Err)
        })
        .collect()
}

/// What the guest's agent `said` it skipped while binding a tree (one place a line), as svcd
/// passes it on: blank lines dropped, at most [`MAX_SKIPPED`] lines, each escaped
/// ([`shown`]) and cut to [`MAX_SKIPPED_CHARS`] characters (`…` said where it was).
pub fn skipped_places(said: &str) -> Vec<String> {
    said.split('\n')
        .filter(|l| !l.trim().is_empty())
        .take(MAX_SKIPPED)
        .map(shown)
        .collect()
}

/// `line` with every control character (`\r`, ESC, DEL, C1, …) and bidirectional-format
/// character (U+200E/F, U+202A–E, U+2066–9) written as an escape (`\u{1b}`), cut to
/// [`MAX_SKIPPED_CHARS`] characters.
fn shown(line: &str) -> String {
    let mut out = String::new();
    let mut count = 0;
    for c in line.chars() {
        let bidi = matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
        let piece = if c.is_control() || bidi {
            c.escape_unicode().to_string()
        } else {
            c.to_string()
        };
        count += piece.chars().count();
        if count > MAX_SKIPPED_CHARS {
            out.push('…');
            break;
        }
        out.push_str(&piece);
    }
    out
}

/// What is wrong with layer path `l`, if anything.
fn layer_fault(l: &str) -> Option<&'static str> {
    if !l.starts_with('/') {
        return Some("is not absolute");
    }
    if l.contains(['\0', ',', ':', '\\']) {
        return Some("holds ',', ':', '\\' or a NUL byte");
    }
    if l.len() > 1 && l.ends_with('/') {
        return Some("ends in '/'");
    }
    if l.contains("//") {
        return Some("has an empty step");
    }
    let plain = Path::new(l)
        .components()
        .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    // `Path::components` drops `.` steps in the middle: look at the text too.
    if !plain || l.split('/').any(|s| s == "." || s == "..") {
        return Some("has a '.' or '..' step");
    }
    if l == "/" {
        return Some("is the host's root");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_skipped_come_back_escaped_bounded_and_few() {
        let plain = "/etc/hosts: a symbolic link: left as it is, never followed";
        assert_eq!(skipped_places(&format!("{plain}\n\n")), vec![plain]);
        let cases: &[(&str, &str)] = &[
            ("/x\r/y: forged", "/x\\u{d}/y: forged"),
            ("\u{1b}[2J\u{1b}[31mred", "\\u{1b}[2J\\u{1b}[31mred"),
            ("a\u{202e}b\u{2066}c", "a\\u{202e}b\\u{2066}c"),
            ("nul\u{0}del\u{7f}c1\u{85}", "nul\\u{0}del\\u{7f}c1\\u{85}"),
        ];
        for (said, want) in cases {
            assert_eq!(skipped_places(said), vec![*want], "{said:?}");
        }
        let many = "x\n".repeat(100);
        assert_eq!(skipped_places(&many).len(), MAX_SKIPPED);
        let long = skipped_places(&"y".repeat(10_000));
        assert_eq!(long[0].chars().count(), MAX_SKIPPED_CHARS + 1);
        assert!(long[0].ends_with('…'));
        let escapes = skipped_places(&"\u{1b}".repeat(10_000));
        assert!(escapes[0].chars().count() <= MAX_SKIPPED_CHARS + 1);
    }

    #[test]
    fn container_ids_are_containerds_identifiers() {
        let cases: &[(&str, &str, bool)] = &[
            ("a CRI id", &"0123456789abcdef".repeat(4), true),
            ("a ctr name", "web-1", true),
            ("dots and underscores", "a.b_c-d", true),
            ("the longest", &"a".repeat(MAX_ID), true),
            ("empty", "", false),
            ("too long", &"a".repeat(MAX_ID + 1), false),
            ("a path step", "..", false),
            ("hidden", ".x", false),
            ("a separator", "a/b", false),
            ("two separators", "a--b", false),
            ("ends in a separator", "a-", false),
            ("a space", "a b", false),
            ("a NUL", "a\0b", false),
            ("not ASCII", "é", false),
        ];
        for (case, id, ok) in cases {
            assert_eq!(check_id(id).is_ok(), *ok, "{case}: {id:?}");
            if !ok {
                let e = check_id(id).expect_err(case).to_string();
                assert!(e.contains("containerd's identifiers"), "{case}: {e}");
            }
        }
    }

    #[test]
    fn only_root_hands_layers_and_each_is_a_plain_absolute_path() {
        let ok = ["/var/lib/containerd/snapshots/7/fs".to_owned()];
        assert_eq!(
            check_attach("c1", &ok, true),
            Ok(vec![PathBuf::from(&ok[0])])
        );
        let cases: &[(&str, &str, &[&str], bool, &str)] = &[
            ("a user", "c1", &["/l"], false, "only root may hand"),
            (
                "a bad id",
                "../x",
                &["/l"],
                true,
                "containerd's identifiers",
            ),
            ("no layers", "c1", &[], true, "no layers given"),
            ("relative", "c1", &["l/fs"], true, "is not absolute"),
            ("a dot-dot step", "c1", &["/l/../etc"], true, "'..' step"),
            ("a dot step", "c1", &["/l/./fs"], true, "'..' step"),
            ("an empty step", "c1", &["/l//fs"], true, "empty step"),
            ("a trailing slash", "c1", &["/l/fs/"], true, "ends in '/'"),
            ("a colon", "c1", &["/l:/etc"], true, "holds ','"),
            ("a comma", "c1", &["/l,upperdir=/etc"], true, "holds ','"),
            ("the root", "c1", &["/"], true, "the host's root"),
        ];
        for (case, id, layers, root, says) in cases {
            let layers: Vec<String> = layers.iter().map(|l| (*l).to_owned()).collect();
            let e = check_attach(id, &layers, *root)
                .expect_err(case)
                .to_string();
            assert!(e.contains(says), "{case}: {e}");
        }
        let many = vec!["/l".to_owned(); MAX_LAYERS + 1];
        let e = check_attach("c1", &many, true).expect_err("too many");
        assert!(e.to_string().contains("more than 128"), "{e}");
    }
}
