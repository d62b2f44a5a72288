//! The Debian package's default `/etc/svc/svcd.toml` (packaging/svcd.toml): every key at its
//! default, commented out, so the shipped file changes nothing; uncommented, it is still the
//! defaults; and it names every key docs/host-config.md documents, no more, no fewer.
#![allow(
    clippy::expect_used,
    reason = "test code: a missing packaging file should panic"
)]

use std::{collections::BTreeSet, path::Path};

use svc_control::config::host::{HostConfig, parse};

fn conffile() -> String {
    std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../packaging/svcd.toml"
    ))
    .expect("packaging/svcd.toml")
}

/// Lines `#key = value` and `#[table]` with their `#` removed (the defaults); prose and the
/// optional keys without a default (`# key = example`) stay comments.
fn uncommented(text: &str) -> String {
    text.lines()
        .map(|l| match l.strip_prefix('#') {
            Some(rest)
                if rest.starts_with('[') || rest.starts_with(|c: char| c.is_ascii_lowercase()) =>
            {
                rest
            }
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// `table.key` for each `key =` line of TOML-looking text (commented or not), by its table.
fn keys(text: &str, with_examples: bool) -> BTreeSet<String> {
    let mut table = String::new();
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let l = line.trim_start();
        let l = match l.strip_prefix("# ") {
            Some(rest) if with_examples => rest.trim_start(),
            _ => l.strip_prefix('#').unwrap_or(l),
        };
        if let Some(t) = l.strip_prefix('[') {
            table = t.split(']').next().unwrap_or("").to_owned();
        } else if let Some((k, _)) = l.split_once(" = ").or_else(|| l.split_once('=')) {
            let k = k.trim();
            if !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                out.insert(if table.is_empty() {
                    k.to_owned()
                } else {
                    format!("{table}.{k}")
                });
            }
        }
    }
    out
}

#[test]
fn the_shipped_file_is_every_default() {
    let text = conffile();
    let path = Path::new("/etc/svc/svcd.toml");
    let as_shipped = parse(path, &text).expect("the shipped file parses");
    assert_eq!(
        as_shipped,
        HostConfig::default(),
        "as shipped: all commented out"
    );
    let open = uncommented(&text);
    let defaults = parse(path, &open).unwrap_or_else(|e| panic!("uncommented:\n{open}\n{e}"));
    assert_eq!(
        defaults,
        HostConfig::default(),
        "uncommented, every value is the default"
    );
}

#[test]
fn the_shipped_file_names_every_documented_key() {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/host-config.md"
    ))
    .expect("docs/host-config.md");
    let block = doc
        .split("```toml\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("docs/host-config.md's first toml block");
    let documented = keys(block, false);
    let shipped = keys(&conffile(), true);
    assert!(documented.len() > 50, "read the doc's keys: {documented:?}");
    let missing: Vec<_> = documented.difference(&shipped).collect();
    let extra: Vec<_> = shipped.difference(&documented).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "packaging/svcd.toml and docs/host-config.md disagree: not shipped {missing:?}, not documented {extra:?}"
    );
}
