//! The installed manual as a whole: `svc man` and `svcd man` into one man tree, and every
//! page any of them (or the unit's `Documentation=`) names is one of the pages written.

use std::path::Path;

use svc_tests::world::workspace_bin;

/// Every `NAME.SECTION` file under `dir` (one level of `manN` directories).
fn written(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut all = Vec::new();
    for sub in std::fs::read_dir(dir).expect("man root").flatten() {
        for page in std::fs::read_dir(sub.path())
            .expect("man section")
            .flatten()
        {
            all.push(page.path());
        }
    }
    all
}

#[test]
fn every_page_the_manual_names_is_installed_by_svc_man_or_svcd_man() {
    let root = svc_tests::fresh_dir("svcman");
    let man1 = root.join("man1");
    let svc = std::process::Command::new(workspace_bin("svc"))
        .arg("man")
        .arg(&man1)
        .output()
        .expect("svc man");
    assert!(svc.status.success(), "{svc:?}");
    let svcd = std::process::Command::new(workspace_bin("svcd"))
        .arg("man")
        .arg(&root)
        .output()
        .expect("svcd man");
    assert!(svcd.status.success(), "{svcd:?}");

    let pages = written(&root);
    let names: Vec<String> = pages
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_owned))
        .collect();
    for want in [
        "svc.1",
        "svc-sandbox-exec.1",
        "svcd.8",
        "svcd-run.8",
        "svcd.toml.5",
    ] {
        assert!(names.contains(&want.to_owned()), "{want} not in {names:?}");
    }
    for page in &pages {
        let text = std::fs::read(page).expect("page");
        for r in svc_control::manual::references(&text) {
            let (name, section) = r
                .trim_end_matches(')')
                .split_once('(')
                .expect("NAME(SECTION)");
            assert!(
                names.contains(&format!("{name}.{section}")),
                "{} names {r}, which neither svc man nor svcd man writes",
                page.display()
            );
        }
    }
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/svcd.service"),
    )
    .expect("packaging/svcd.service");
    let docs = unit
        .lines()
        .find_map(|l| l.strip_prefix("Documentation="))
        .expect("the unit names its documentation");
    for page in docs.split_whitespace() {
        let r = page.strip_prefix("man:").expect("a man page");
        let (name, section) = r.trim_end_matches(')').split_once('(').expect("NAME(S)");
        assert!(
            names.contains(&format!("{name}.{section}")),
            "the unit's Documentation= names {r}, which is not written"
        );
    }
    let svcd8 = std::fs::read_to_string(root.join("man8/svcd.8")).expect("svcd.8");
    for s in [
        ".SH \"EXIT STATUS\"",
        ".SH ENVIRONMENT",
        ".SH FILES",
        ".SH \"SEE ALSO\"",
    ] {
        assert!(svcd8.contains(s), "svcd.8 lacks {s}");
    }
    assert!(svcd8.contains("NOTIFY_SOCKET"));
    let _ = std::fs::remove_dir_all(&root);
}
