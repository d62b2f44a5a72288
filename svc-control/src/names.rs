//! Sandbox names: what one may be (they become file names and parts of interface names).

/// Longest sandbox name.
pub const MAX_NAME: usize = 48;

/// Check a sandbox name: 1–48 characters of `a-z`, `0-9` and `-`, starting with a letter or
/// digit. Names become file and interface-adjacent names, so nothing else is accepted.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("a sandbox name cannot be empty".into());
    }
    if name.len() > MAX_NAME {
        return Err(format!(
            "sandbox name is {} characters long; the limit is {MAX_NAME}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(format!(
            "sandbox name {name:?} contains {c:?}; use lowercase letters, digits and '-'"
        ));
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err(format!(
            "sandbox name {name:?} must start and end with a letter or digit"
        ));
    }
    Ok(())
}
