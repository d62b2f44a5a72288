//! JSON pointers into workspace.json, for error locations.

/// `key` escaped as one JSON pointer segment (`~` as `~0`, `/` as `~1`).
pub(super) fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}
