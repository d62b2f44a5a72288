//! The workspace's `.env` file, whose values feed the compose file's interpolation.

use std::{collections::BTreeMap, path::Path};

use crate::config::{ConfigError, ConfigErrors, Location};

/// Parse a `.env` file: `KEY=VALUE` lines, `#` comments, optional `export `, single quotes
/// literal, double quotes with `\n`, `\t`, `\"`, `\\` escapes.
pub fn parse_dotenv(file: &Path, text: &str) -> Result<BTreeMap<String, String>, ConfigErrors> {
    let mut vars = BTreeMap::new();
    let mut errors = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let loc = Location {
            line: Some(i + 1),
            column: None,
            path: String::new(),
        };
        let Some((key, value)) = line.split_once('=') else {
            errors.push(ConfigError::new(
                file,
                loc,
                format!("expected KEY=VALUE, got {line:?}"),
            ));
            continue;
        };
        let key = key.trim();
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
        {
            errors.push(ConfigError::new(
                file,
                loc,
                format!("invalid variable name {key:?}"),
            ));
            continue;
        }
        let value = value.trim();
        let value = if let Some(inner) = value.strip_prefix('\'') {
            match inner.find('\'') {
                Some(end) => inner[..end].to_owned(),
                None => {
                    errors.push(ConfigError::new(file, loc, "unterminated single quote"));
                    continue;
                }
            }
        } else if let Some(inner) = value.strip_prefix('"') {
            match unescape_double(inner) {
                Some(v) => v,
                None => {
                    errors.push(ConfigError::new(file, loc, "unterminated double quote"));
                    continue;
                }
            }
        } else {
            match value.find(" #") {
                Some(i) => value[..i].trim_end().to_owned(),
                None => value.to_owned(),
            }
        };
        vars.insert(key.to_owned(), value);
    }
    if errors.is_empty() {
        Ok(vars)
    } else {
        Err(ConfigErrors(errors))
    }
}

fn unescape_double(s: &str) -> Option<String> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}
