//! Configuration: parsing and validation of every file svc reads, in two layers (serde file
//! types with `deny_unknown_fields`, then validated types). Only [`loader`] touches the
//! filesystem; everything else parses text, so tests call it directly.

pub mod compose;
pub mod effective;
pub mod egress;
pub mod env;
pub mod error;
pub mod host;
pub mod loader;
mod unique_map;
pub mod workspace;

pub use error::{ConfigError, ConfigErrors, Location};
/// `[limits]` of svcd.toml: per-guest caps on every channel a guest can open.
pub use host::limits;
pub use unique_map::UniqueMap;

use std::path::Path;

use serde::de::DeserializeOwned;

/// Largest configuration file svc reads, in bytes. Larger files are refused before parsing.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;

/// Parse strict JSON into `T`, with the JSON pointer, line and column of the first error.
pub(crate) fn parse_json<T: DeserializeOwned>(file: &Path, text: &str) -> Result<T, ConfigError> {
    let json_error = |inner: &serde_json::Error, path: String| {
        ConfigError::new(
            file,
            Location {
                line: Some(inner.line()).filter(|&l| l > 0),
                column: Some(inner.column()).filter(|&c| c > 0),
                path,
            },
            strip_position(&inner.to_string()),
        )
    };
    let mut de = serde_json::Deserializer::from_str(text);
    let value = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| json_error(e.inner(), error::json_pointer(e.path())))?;
    de.end().map_err(|e| json_error(&e, String::new()))?;
    Ok(value)
}

/// Deepest flow-collection nesting (`[`/`{`) accepted in YAML. The YAML parser is slow on very
/// deep flow nesting, so it is refused before parsing.
pub const MAX_YAML_FLOW_DEPTH: usize = 64;

/// Parse YAML into `T`, with the YAML path, line and column of the first error.
pub(crate) fn parse_yaml<T: DeserializeOwned>(file: &Path, text: &str) -> Result<T, ConfigError> {
    if let Some((line, column)) = flow_too_deep(text) {
        return Err(ConfigError::new(
            file,
            Location {
                line: Some(line),
                column: Some(column),
                path: String::new(),
            },
            format!("collections nested deeper than {MAX_YAML_FLOW_DEPTH} levels"),
        ));
    }
    let de = serde_norway::Deserializer::from_str(text);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = error::yaml_path(e.path());
        let inner = e.inner();
        let (line, column) = inner
            .location()
            .map_or((None, None), |l| (Some(l.line()), Some(l.column())));
        ConfigError::new(
            file,
            Location { line, column, path },
            strip_position(&inner.to_string()),
        )
    })
}

/// serde_json and serde_norway append " at line N column M"; we report those separately.
fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(i) => message[..i].to_owned(),
        None => message.to_owned(),
    }
}

/// Where flow nesting first exceeds [`MAX_YAML_FLOW_DEPTH`], skipping quoted scalars and
/// comments. Conservative: it may count a bracket inside a plain scalar, never miss one.
fn flow_too_deep(text: &str) -> Option<(usize, usize)> {
    let mut depth = 0usize;
    for (line_no, line) in text.lines().enumerate() {
        let mut quote: Option<char> = None;
        let mut prev = ' ';
        for (col, c) in line.chars().enumerate() {
            match (quote, c) {
                (Some(q), c) if c == q && prev != '\\' => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '#') if prev.is_whitespace() => break,
                (None, '[' | '{') => {
                    depth += 1;
                    if depth > MAX_YAML_FLOW_DEPTH {
                        return Some((line_no + 1, col + 1));
                    }
                }
                (None, ']' | '}') => depth = depth.saturating_sub(1),
                _ => {}
            }
            prev = c;
        }
    }
    None
}
