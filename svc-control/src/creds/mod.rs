//! Credentials on the host. Real values never enter a guest: the proxy swaps a sandbox's
//! placeholders for them. Here: values sealed at rest with the host key ([`seal`]) — the named
//! secret store behind `svc secret` and each sandbox's brokered values in svcd's state — and
//! the rules for a stored secret's name and value.

pub mod broker;
pub mod grant;
pub mod guardian;
pub mod oauth;
pub mod seal;

pub use broker::{Bearer, Broker};
pub use seal::{HostKey, SealError};

/// Longest value a secret may hold (a bearer token; GitHub's are under 100 bytes).
pub const MAX_VALUE: usize = 16 * 1024;

/// A stored secret's name: 1–64 of letters, digits, `_`, `.` and `-`, not starting with `.`
/// or `-`.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&name.len())
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "secret name {:?}: 1-64 letters, digits, '_', '.' and '-', not starting with '.' or '-'",
            name.chars().take(80).collect::<String>()
        ))
    }
}

/// A value a secret may hold: not empty, at most [`MAX_VALUE`] bytes, no line break or NUL (it
/// is sent as an `Authorization` header). The message never shows the value.
pub fn check_value(name: &str, value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err(format!("secret {name}: the value is empty"));
    }
    if value.len() > MAX_VALUE {
        return Err(format!(
            "secret {name}: the value is over {MAX_VALUE} bytes"
        ));
    }
    if value.contains(['\r', '\n', '\0']) {
        return Err(format!(
            "secret {name}: the value holds a line break or NUL (one trailing newline is dropped when it is read)"
        ));
    }
    Ok(())
}

/// What a sealed value of sandbox `sandbox`'s variable `var` is sealed for.
pub fn sandbox_aad(sandbox: &str, var: &str) -> String {
    format!("sandbox:{sandbox}:{var}")
}

/// What a stored secret's sealed value is sealed for.
pub fn store_aad(name: &str) -> String {
    format!("store:{name}")
}

/// The prefix of a sealed value in the sandbox secrets table (older rows hold the value as
/// it was given, and are read as such).
pub const SEALED: &str = "sealed:v1:";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values_are_checked_by_rule() {
        for ok in ["gh", "GH_TOKEN", "team.ci-token", &"a".repeat(64)] {
            assert!(check_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".x", "-x", "a b", "a/b", &"a".repeat(65), "é"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_value("x", "tok").is_ok());
        for (bad, says) in [
            ("", "empty"),
            ("a\nb", "line break"),
            ("a\0", "NUL"),
            (&"x".repeat(MAX_VALUE + 1), "over"),
        ] {
            let e = check_value("x", bad).expect_err(says);
            assert!(e.contains(says), "{e}");
            assert!(!e.contains("a\nb"), "the value is not shown");
        }
    }
}
