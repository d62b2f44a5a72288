//! The rest of a request's body, examined as it streams: the decision reads the head and the
//! body's prefix (`credentials::examine`); what follows, data and trailers, goes upstream only
//! as far as no placeholder of the sandbox is in it. Memory is bounded: the scanner keeps the
//! last `PLACEHOLDER_LEN - 1` bytes of what it has seen, so a placeholder split across two
//! chunks is still found, and never holds the body. [`BodyScanner::may_begin`] says how many of
//! the last bytes could be the start of a placeholder: those wait for the bytes after them, so
//! no byte of a placeholder goes upstream before the whole of it is seen and refused.

use super::credentials::{PLACEHOLDER_LEN, PlaceholderTable};

/// The streaming examiner of one request's body past its prefix.
#[derive(Debug, Clone)]
pub struct BodyScanner {
    table: PlaceholderTable,
    /// The last bytes seen (at most `PLACEHOLDER_LEN - 1`).
    carry: Vec<u8>,
}

/// Where a placeholder was found past the decision: the reason the request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("credential leak attempt: {0}")]
pub struct LateLeak(pub String);

impl BodyScanner {
    /// A scanner for `table`'s placeholders, carrying on from the body's `prefix` (already
    /// examined whole by the decision).
    pub fn after_prefix(table: PlaceholderTable, prefix: &[u8]) -> Self {
        let mut s = Self {
            table,
            carry: Vec::with_capacity(PLACEHOLDER_LEN),
        };
        s.keep_tail(prefix);
        s
    }

    /// Whether any placeholder can be found at all (a sandbox with none needs no scanning).
    pub fn is_idle(&self) -> bool {
        self.table.entries().is_empty()
    }

    /// The next chunk of the body; `Err` names the leak.
    pub fn data(&mut self, chunk: &[u8]) -> Result<(), LateLeak> {
        let mut hay = Vec::with_capacity(self.carry.len() + chunk.len());
        hay.extend_from_slice(&self.carry);
        hay.extend_from_slice(chunk);
        if !self.table.find_in(&hay).is_empty() {
            return Err(LateLeak(
                "placeholder in the request body, past its first bytes".into(),
            ));
        }
        self.keep_tail(&hay);
        Ok(())
    }

    /// The body's trailers, each name and value on its own; `Err` names the leak.
    pub fn trailers<'a>(
        &self,
        fields: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<(), LateLeak> {
        for (name, value) in fields {
            if !self.table.find_in(name.as_bytes()).is_empty()
                || !self.table.find_in(value).is_empty()
            {
                return Err(LateLeak(format!(
                    "placeholder in the {} trailer",
                    name.to_ascii_lowercase()
                )));
            }
        }
        Ok(())
    }

    /// How many of the last bytes of `seen` could begin one of the placeholders (the longest
    /// such run, shorter than a placeholder; case-insensitive, as placeholders are found).
    pub fn may_begin(&self, seen: &[u8]) -> usize {
        let longest = seen.len().min(PLACEHOLDER_LEN - 1);
        (1..=longest)
            .rev()
            .find(|&k| {
                let tail = &seen[seen.len() - k..];
                self.table.entries().iter().any(|e| {
                    let p = e.placeholder.expose().as_bytes();
                    p[..k].eq_ignore_ascii_case(tail)
                })
            })
            .unwrap_or(0)
    }

    fn keep_tail(&mut self, seen: &[u8]) {
        let keep = PLACEHOLDER_LEN - 1;
        if seen.len() >= keep {
            self.carry.clear();
            self.carry.extend_from_slice(&seen[seen.len() - keep..]);
        } else {
            self.carry.extend_from_slice(seen);
            let over = self.carry.len().saturating_sub(keep);
            self.carry.drain(..over);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        hosts::HostPattern,
        policy::credentials::{CredentialKind, Placeholder, PlaceholderEntry},
    };

    fn table() -> (PlaceholderTable, String) {
        let p = Placeholder::mint().unwrap();
        let s = p.expose().to_owned();
        let entry = PlaceholderEntry {
            placeholder: p,
            kind: CredentialKind::Host,
            hosts: vec![HostPattern::parse("api.example.com").unwrap()],
        };
        (PlaceholderTable::new(vec![entry]), s)
    }

    #[test]
    fn the_body_past_its_prefix_in_named_cases() {
        let (t, p) = table();
        let upper = p.to_ascii_uppercase();
        let (head, tail) = p.split_at(20);
        let cases: Vec<(&str, &str, Vec<String>, bool)> = vec![
            (
                "no placeholder",
                "",
                vec!["a".repeat(500), "b".repeat(9)],
                false,
            ),
            (
                "in one chunk",
                "",
                vec!["x".repeat(70_000), format!("k={p}")],
                true,
            ),
            ("upper-case", "", vec![format!("{upper}&")], true),
            (
                "split across chunks",
                "",
                vec![format!("a={head}"), format!("{tail}&b")],
                true,
            ),
            (
                "split one byte a chunk",
                "",
                p.chars().map(String::from).collect(),
                true,
            ),
            ("begun in the prefix", head, vec![tail.to_owned()], true),
            (
                "63 of its characters",
                "",
                vec![p[..63].to_owned(), "z".into()],
                false,
            ),
            ("another token", "", vec!["0".repeat(64)], false),
        ];
        for (name, prefix, chunks, leak) in cases {
            let mut s = BodyScanner::after_prefix(t.clone(), prefix.as_bytes());
            let found = chunks.iter().any(|c| s.data(c.as_bytes()).is_err());
            assert_eq!(found, leak, "{name}");
            assert!(s.carry.len() < PLACEHOLDER_LEN, "{name}: carry bounded");
        }
    }

    #[test]
    fn the_bytes_that_may_begin_a_placeholder_wait() {
        let (t, p) = table();
        let s = BodyScanner::after_prefix(t, b"");
        let upper = p.to_ascii_uppercase();
        let cases: Vec<(&str, String, usize)> = vec![
            ("nothing", String::new(), 0),
            ("unrelated", "hello world;".into(), 0),
            ("its first byte", format!("x={}", &p[..1]), 1),
            ("63 of its bytes", format!("x={}", &p[..63]), 63),
            ("upper-case start", format!("x={}", &upper[..10]), 10),
            ("a run that stops matching", format!("{}z", &p[..10]), 0),
        ];
        for (name, seen, want) in cases {
            assert_eq!(s.may_begin(seen.as_bytes()), want, "{name}");
        }
    }

    #[test]
    fn trailers_in_named_cases() {
        let (t, p) = table();
        let s = BodyScanner::after_prefix(t, b"");
        let bearer = format!("Bearer {p}");
        type Fields<'a> = Vec<(&'a str, &'a [u8])>;
        let cases: Vec<(&str, Fields<'_>, bool)> = vec![
            ("none", vec![], false),
            ("plain", vec![("x-checksum", b"abc")], false),
            (
                "authorization",
                vec![("Authorization", bearer.as_bytes())],
                true,
            ),
            (
                "any trailer",
                vec![("x-a", b"1"), ("X-Token", p.as_bytes())],
                true,
            ),
        ];
        for (name, fields, leak) in cases {
            assert_eq!(s.trailers(fields).is_err(), leak, "{name}");
        }
        let err = s.trailers([("X-Token", p.as_bytes())]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "credential leak attempt: placeholder in the x-token trailer"
        );
    }
}
