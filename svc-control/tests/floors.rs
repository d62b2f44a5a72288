//! The floors of `svc-control` (docs/design.md, "Rooms and floors"): a module imports only
//! modules on its own floor or below. This reads every source file's `crate::…` paths (grouped
//! ones too) and fails on an import that goes up a floor, or on a top-level module no floor
//! names (a new module is given its floor here and in the docs).
#![allow(
    clippy::expect_used,
    reason = "test code: an unreadable source tree should panic"
)]

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

/// Each top-level module's floor: values, configuration, rules and wire types, records,
/// mechanisms, the daemon.
const FLOORS: &[(&str, u8)] = &[
    ("names", 0),
    ("hosts", 0),
    ("kinds", 0),
    ("manual", 0),
    ("config", 1),
    ("policy", 2),
    ("api", 2),
    ("audit", 3),
    ("per_core", 3),
    ("limits", 3),
    ("metrics", 3),
    ("store", 3),
    ("creds", 3),
    ("workspace", 3),
    ("dataplane", 4),
    ("dns", 4),
    ("proxy", 4),
    ("runtime", 4),
    ("git_relay", 4),
    ("doctor", 4),
    ("images", 4),
    ("daemon", 5),
];

/// The top-level modules `text` names after `crate::` (in `crate::a::b` and in each item of
/// `crate::{a::b, c}`).
fn imported(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut expect = true;
            let mut chars = group.char_indices();
            while let Some((i, c)) = chars.next() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => expect = true,
                    c if depth == 1 && expect && (c.is_ascii_lowercase() || c == '_') => {
                        let name = ident(&group[i..]);
                        for _ in 1..name.len() {
                            chars.next();
                        }
                        out.insert(name);
                        expect = false;
                    }
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn no_module_imports_from_a_higher_floor() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let floors: BTreeMap<&str, u8> = FLOORS.iter().copied().collect();
    let mut files = Vec::new();
    sources(&src, &mut files);
    let mut unplaced = BTreeSet::new();
    let mut upward = Vec::new();
    let mut edges = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src");
        let first = rel.components().next().expect("a component");
        let top = first
            .as_os_str()
            .to_str()
            .expect("utf-8")
            .trim_end_matches(".rs");
        if top == "lib" || top == "bin" {
            continue;
        }
        let Some(&floor) = floors.get(top) else {
            unplaced.insert(top.to_owned());
            continue;
        };
        let text = std::fs::read_to_string(file).expect("read");
        for target in imported(&text) {
            if target == top {
                continue;
            }
            edges += 1;
            match floors.get(target.as_str()) {
                Some(&f) if f <= floor => {}
                Some(&f) => upward.push(format!(
                    "{} (floor {floor}) imports {target} (floor {f})",
                    rel.display()
                )),
                None => {
                    unplaced.insert(target);
                }
            }
        }
    }
    assert!(
        edges > 100,
        "read only {edges} imports: the reader is broken"
    );
    assert!(
        unplaced.is_empty(),
        "modules with no floor (add them to FLOORS and docs/design.md): {unplaced:?}"
    );
    assert!(
        upward.is_empty(),
        "imports up a floor:\n{}",
        upward.join("\n")
    );
}

#[test]
fn the_reader_sees_plain_and_grouped_imports() {
    let text = "use crate::config::host::X;\nuse crate::{\n    audit::{A, B},\n    policy::{self, mode::M},\n    names,\n};\nlet x = crate::proxy::y();";
    let got: Vec<String> = imported(text).into_iter().collect();
    assert_eq!(got, ["audit", "config", "names", "policy", "proxy"]);
}
