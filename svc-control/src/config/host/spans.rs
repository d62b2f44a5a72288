//! Where in svcd.toml a key is written: the line and column of its value, found from its
//! dotted path (`microvm.accel`, `hosts.agent[1]`), so an error found after parsing still
//! names its line.

use toml::{
    Spanned,
    de::{DeTable, DeValue},
};

/// The (line, column), both 1-based, of the value at `path` in `text`; `None` when the key is
/// not written there (a default) or the text does not parse.
pub(super) fn position(text: &str, path: &str) -> Option<(usize, usize)> {
    let root = DeTable::parse(text).ok()?;
    let mut table: &DeTable<'_> = root.get_ref();
    let mut found: Option<&Spanned<DeValue<'_>>> = None;
    for segment in path.split('.') {
        let (key, indices) = split_indices(segment)?;
        let mut value = table.get(key)?;
        for i in indices {
            match value.get_ref() {
                DeValue::Array(items) => value = items.get(i)?,
                _ => return None,
            }
        }
        if let DeValue::Table(t) = value.get_ref() {
            table = t;
        }
        found = Some(value);
    }
    found.map(|v| line_column(text, v.span().start))
}

/// `agent[1][2]` as (`agent`, [1, 2]).
fn split_indices(segment: &str) -> Option<(&str, Vec<usize>)> {
    let (key, rest) = segment.split_once('[').unwrap_or((segment, ""));
    let indices = rest
        .split('[')
        .filter(|s| !s.is_empty())
        .map(|s| s.trim_end_matches(']').parse().ok())
        .collect::<Option<Vec<usize>>>()?;
    Some((key, indices))
}

/// The 1-based line and column of byte `offset` of `text`.
pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_value_is_found_by_its_path() {
        let text = "state_dir = \"x\"\n\n[microvm]\naccel = \"fast\"\n\n[hosts]\nagent = [\"a.test\",\n  \"b..test\"]\n";
        let cases = [
            ("top level", "state_dir", Some((1, 13))),
            ("in a table", "microvm.accel", Some((4, 9))),
            ("in an array", "hosts.agent[1]", Some((8, 3))),
            ("a default", "microvm.cpus", None),
            ("past the end", "hosts.agent[5]", None),
        ];
        for (name, path, want) in cases {
            assert_eq!(position(text, path), want, "{name}");
        }
        assert_eq!(position("not toml [", "a"), None);
    }
}
