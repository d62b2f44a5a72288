//! One error type for every configuration file: which file, where in it, what was expected.

use std::{fmt, path::PathBuf};

use serde::Serialize;

/// Where in a file an error is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Location {
    /// 1-based line, when the parser knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<usize>,
    /// 1-based column, when the parser knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column: Option<usize>,
    /// JSON pointer (`/doctor/probes/0/name`) for JSON files, YAML path
    /// (`services.web.ports[1]`) for YAML files, dotted key for TOML; empty for the root.
    pub path: String,
}

impl Location {
    /// A location known only by its path.
    pub fn at(path: impl Into<String>) -> Self {
        Self {
            line: None,
            column: None,
            path: path.into(),
        }
    }
}

/// A configuration error: the file, the location, and the reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
pub struct ConfigError {
    /// The file, or `<environment>` for environment variables.
    pub file: PathBuf,
    #[serde(flatten)]
    pub location: Location,
    /// What was wrong and what was expected. A refusal with fixed wording (the
    /// allow/policy clash) is exactly that wording.
    pub message: String,
}

impl ConfigError {
    pub fn new(file: impl Into<PathBuf>, location: Location, message: impl Into<String>) -> Self {
        Self {
            file: file.into(),
            location,
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.location.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.location.column {
                write!(f, ":{column}")?;
            }
        }
        if !self.location.path.is_empty() {
            write!(f, ": at {}", self.location.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Several errors from one load: every file is checked and every error reported.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{}", display_all(.0))]
pub struct ConfigErrors(pub Vec<ConfigError>);

fn display_all(errors: &[ConfigError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

impl From<ConfigError> for ConfigErrors {
    fn from(e: ConfigError) -> Self {
        Self(vec![e])
    }
}

/// Render a serde_path_to_error path as a JSON pointer (`/a/0/b`).
pub(crate) fn json_pointer(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Seq { index } => {
                out.push('/');
                out.push_str(&index.to_string());
            }
            Segment::Map { key } | Segment::Enum { variant: key } => {
                out.push('/');
                out.push_str(&key.replace('~', "~0").replace('/', "~1"));
            }
            // Not known yet (a syntax error before the key was read): stop at the parent.
            Segment::Unknown => break,
        }
    }
    out
}

/// Render a serde_path_to_error path as a YAML path (`egress.policy[0].paths`).
pub(crate) fn yaml_path(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut out = String::new();
    for seg in path.iter() {
        match seg {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Unknown => break,
        }
    }
    out
}
