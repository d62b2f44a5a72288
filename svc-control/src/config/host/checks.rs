//! Small checks several sections of svcd.toml share (each reports under the key it is given).

use std::path::{Path, PathBuf};

/// `value`, or `default` when absent; an error at `key` unless it is absolute.
pub(super) fn absolute_or(
    key: &str,
    value: Option<PathBuf>,
    default: &str,
    err: &mut impl FnMut(&str, String),
) -> PathBuf {
    let p = value.unwrap_or_else(|| PathBuf::from(default));
    check_absolute(key, &p, err);
    p
}

/// An error at `key` unless `p` is absolute.
pub(super) fn check_absolute(key: &str, p: &Path, err: &mut impl FnMut(&str, String)) {
    if !p.is_absolute() {
        err(
            key,
            format!("expected an absolute path, got {}", p.display()),
        );
    }
}

/// A user or group name as svcd accepts one: letters, digits, `_` and `-`, not empty.
pub(super) fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
}
