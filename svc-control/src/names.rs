//! Names: what a sandbox name may be (they become file names and parts of interface names),
//! and what an environment variable name may be. A [`SandboxName`] is one that passed the
//! check: requests carry it, so a bad name is refused where it enters (an API body's is
//! refused as the body is read).

use std::{fmt, ops::Deref, str::FromStr};

use serde::{Deserialize, Serialize};

/// Longest sandbox name.
pub const MAX_NAME: usize = 48;

/// A sandbox name that passed [`SandboxName::check`]: 1–48 characters of `a-z`, `0-9` and
/// `-`, starting and ending with a letter or digit.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxName(String);

impl SandboxName {
    /// `name`, if it is a valid sandbox name; else the reason it is not.
    pub fn new(name: impl Into<String>) -> Result<Self, String> {
        let name = name.into();
        Self::check(&name)?;
        Ok(Self(name))
    }

    /// Check a sandbox name: 1–48 characters of `a-z`, `0-9` and `-`, starting with a letter
    /// or digit. Names become file and interface-adjacent names, so nothing else is accepted.
    pub fn check(name: &str) -> Result<(), String> {
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

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SandboxName {
    type Error = String;
    fn try_from(name: String) -> Result<Self, String> {
        Self::new(name)
    }
}

impl TryFrom<&str> for SandboxName {
    type Error = String;
    fn try_from(name: &str) -> Result<Self, String> {
        Self::new(name)
    }
}

impl FromStr for SandboxName {
    type Err = String;
    fn from_str(name: &str) -> Result<Self, String> {
        Self::new(name)
    }
}

impl From<SandboxName> for String {
    fn from(name: SandboxName) -> Self {
        name.0
    }
}

impl fmt::Display for SandboxName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for SandboxName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Deref for SandboxName {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for SandboxName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for SandboxName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for SandboxName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// Whether `k` can name an environment variable a process reads back (not empty, no `=`,
/// no NUL). Workspace services' variables and svcd's exec requests are checked by it.
pub fn is_env_name(k: &str) -> bool {
    !k.is_empty() && !k.contains(['=', '\0'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_made_only_from_what_the_check_accepts() {
        let long = "a".repeat(MAX_NAME + 1);
        let cases: &[(&str, &str, Result<(), &str>)] = &[
            ("one letter", "a", Ok(())),
            ("letters, digits, dashes", "agent-2", Ok(())),
            ("a digit first", "9lives", Ok(())),
            ("the longest", &long[1..], Ok(())),
            ("empty", "", Err("a sandbox name cannot be empty")),
            (
                "one too long",
                &long,
                Err("sandbox name is 49 characters long; the limit is 48"),
            ),
            (
                "upper case",
                "Agent",
                Err("sandbox name \"Agent\" contains 'A'; use lowercase letters, digits and '-'"),
            ),
            (
                "a path",
                "../x",
                Err("sandbox name \"../x\" contains '.'; use lowercase letters, digits and '-'"),
            ),
            (
                "a space",
                "a b",
                Err("sandbox name \"a b\" contains ' '; use lowercase letters, digits and '-'"),
            ),
            (
                "not ASCII",
                "caf\u{e9}",
                Err("sandbox name \"café\" contains 'é'; use lowercase letters, digits and '-'"),
            ),
            (
                "a dash first",
                "-x",
                Err("sandbox name \"-x\" must start and end with a letter or digit"),
            ),
            (
                "a dash last",
                "x-",
                Err("sandbox name \"x-\" must start and end with a letter or digit"),
            ),
        ];
        for (what, name, want) in cases {
            let got = SandboxName::new(*name);
            match (got, want) {
                (Ok(n), Ok(())) => {
                    assert_eq!(n, *name, "{what}");
                    assert_eq!(n.to_string(), *name, "{what}: shown as given");
                    assert_eq!(name.parse::<SandboxName>(), Ok(n), "{what}: parsed alike");
                }
                (Err(e), Err(w)) => assert_eq!(e, *w, "{what}"),
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn serde_refuses_a_bad_name_with_the_checks_words() {
        let n: SandboxName = serde_json::from_str("\"agent-1\"").expect("valid");
        assert_eq!(serde_json::to_string(&n).expect("json"), "\"agent-1\"");
        let e = serde_json::from_str::<SandboxName>("\"Bad\"").expect_err("refused");
        assert!(
            e.to_string()
                .starts_with("sandbox name \"Bad\" contains 'B'; use lowercase letters"),
            "{e}"
        );
    }
}
