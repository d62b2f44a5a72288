//! The OCI runtime's own escapes: whether the installed runc carries the fixes for the
//! breakouts svc cannot close from outside the runtime (CVE-2025-31133, CVE-2025-52565,
//! CVE-2025-52881: masked-path and `/proc` write-redirect races during create and exec), read
//! from `runc --version`. svcd warns at start and `svc doctor` reports it; what svc closes
//! itself is in docs/isolation.md, "The runtime's own escapes".

use std::path::Path;

/// The advisories whose fixes a runtime must carry.
pub const CVES: [&str; 3] = ["CVE-2025-31133", "CVE-2025-52565", "CVE-2025-52881"];

/// The first release of each line that carries them (every line after 1.3 does too).
const FIXED: [(u32, u32, u32); 2] = [(1, 2, 8), (1, 3, 3)];

/// Distribution builds older than the fixed releases that carry all three fixes, by the
/// `commit:` line of `runc --version`; an entry is added only once its package changelog has
/// been read to name all three. Debian 12's `1.1.5+ds1-1+deb12u1` is not one: its changelog
/// names CVE-2024-21626 as its only backport.
const BACKPORTED: &[&str] = &[];

/// What `runc --version` says about the fixes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The fixes are in (the version, said).
    Fixed(String),
    /// A runtime older than the fixed releases (the warning).
    Vulnerable(String),
    /// The version could not be read (the warning).
    Unreadable(String),
}

impl Verdict {
    /// The warning to give, if any.
    pub fn warning(&self) -> Option<&str> {
        match self {
            Self::Fixed(_) => None,
            Self::Vulnerable(m) | Self::Unreadable(m) => Some(m),
        }
    }
}

/// Run `runtime --version` and judge it.
pub fn check(runtime: &Path) -> Verdict {
    match std::process::Command::new(runtime)
        .arg("--version")
        .output()
    {
        Ok(o) if o.status.success() => assess(&String::from_utf8_lossy(&o.stdout)),
        Ok(o) => Verdict::Unreadable(format!(
            "{} --version failed ({}): cannot tell whether it carries the fixes for {}",
            runtime.display(),
            o.status,
            cves()
        )),
        Err(e) => Verdict::Unreadable(format!("running {} --version: {e}", runtime.display())),
    }
}

/// Judge the output of `runc --version` (`runc version 1.1.5+ds1`, then `commit: …`).
pub fn assess(output: &str) -> Verdict {
    let version = output
        .lines()
        .find_map(|l| l.trim().strip_prefix("runc version "))
        .map(str::trim);
    let commit = output
        .lines()
        .find_map(|l| l.trim().strip_prefix("commit: "))
        .map(str::trim)
        .unwrap_or_default();
    let Some((triple, prerelease)) = version.and_then(parse) else {
        return Verdict::Unreadable(format!(
            "cannot read a runc version in {:?}: cannot tell whether it carries the fixes for {}",
            output.lines().next().unwrap_or_default(),
            cves()
        ));
    };
    let shown = match version {
        Some(v) if !commit.is_empty() && commit != v => format!("runc {v} ({commit})"),
        Some(v) => format!("runc {v}"),
        None => "runc".to_owned(),
    };
    if BACKPORTED.contains(&commit) {
        return Verdict::Fixed(format!("{shown}: its distribution backported {}", cves()));
    }
    if fixed(triple, prerelease) {
        return Verdict::Fixed(format!("{shown} carries the fixes for {}", cves()));
    }
    Verdict::Vulnerable(format!(
        "{shown} predates the fixes for {} (masked-path and /proc write-redirect races during \
         create and exec), made in runc 1.2.8 and 1.3.3: install one of those or later (svc's \
         own guards are in docs/isolation.md, \"The runtime's own escapes\")",
        cves()
    ))
}

fn cves() -> String {
    format!("{}, {} and {}", CVES[0], CVES[1], CVES[2])
}

/// `1.2.8`, `1.1.5+ds1`, `1.4.0-rc.1`: (major, minor, patch) and whether it is a pre-release.
fn parse(version: &str) -> Option<((u32, u32, u32), bool)> {
    let end = version.find(['+', '-', '~']).unwrap_or(version.len());
    let (numbers, rest) = version.split_at(end);
    let mut parts = numbers.split('.').map(str::parse::<u32>);
    let triple = (
        parts.next()?.ok()?,
        parts.next()?.ok()?,
        parts.next()?.ok()?,
    );
    if parts.next().is_some() {
        return None;
    }
    Some((triple, rest.starts_with(['-', '~'])))
}

/// Whether a release carries the fixes: at or past the fixed release of its line, or a line
/// after the last one listed; a pre-release of a line's first fixed release does not count.
fn fixed(v: (u32, u32, u32), prerelease: bool) -> bool {
    let after_last = FIXED.last().is_some_and(|l| (v.0, v.1) > (l.0, l.1));
    if after_last {
        return !(prerelease && v.2 == 0);
    }
    FIXED
        .iter()
        .find(|f| (f.0, f.1) == (v.0, v.1))
        .is_some_and(|f| v.2 > f.2 || (v.2 == f.2 && !prerelease))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(version: &str, commit: &str) -> String {
        format!("runc version {version}\ncommit: {commit}\nspec: 1.0.2-dev\ngo: go1.19.8\n")
    }

    #[test]
    fn releases_before_the_fixes_are_warned_about_naming_the_cves_and_the_fixed_versions() {
        for (version, commit) in [
            ("1.1.5+ds1", "1.1.5+ds1-1+deb12u1"),
            ("1.1.15", "v1.1.15-0-gbc20cb44"),
            ("1.2.7", "v1.2.7"),
            ("1.3.2", "v1.3.2"),
            ("1.2.8-rc.1", "v1.2.8-rc.1"),
            ("1.4.0-rc.1", "v1.4.0-rc.1"),
            ("1.0.0-rc92", "ff819c7e"),
        ] {
            let v = assess(&output(version, commit));
            let Verdict::Vulnerable(m) = &v else {
                panic!("{version}: {v:?}");
            };
            for cve in CVES {
                assert!(m.contains(cve), "{m}");
            }
            assert!(m.contains("runc 1.2.8 and 1.3.3"), "{m}");
            assert!(m.starts_with(&format!("runc {version}")), "{m}");
        }
        let debian = assess(&output("1.1.5+ds1", "1.1.5+ds1-1+deb12u1"));
        assert!(
            debian
                .warning()
                .is_some_and(|m| m.starts_with("runc 1.1.5+ds1 (1.1.5+ds1-1+deb12u1) predates")),
            "{debian:?}"
        );
    }

    #[test]
    fn fixed_releases_and_later_lines_pass() {
        for version in [
            "1.2.8",
            "1.2.9",
            "1.3.3",
            "1.3.4+dfsg",
            "1.4.0",
            "1.4.1-rc.1",
            "2.0.0",
        ] {
            let v = assess(&output(version, "x"));
            assert!(matches!(v, Verdict::Fixed(_)), "{version}: {v:?}");
            assert_eq!(v.warning(), None);
        }
    }

    #[test]
    fn output_without_a_version_is_unreadable_and_warned_about() {
        for text in [
            "",
            "crun version 1.8\n",
            "runc version one.two\n",
            "runc version 1.2\n",
        ] {
            let v = assess(text);
            assert!(matches!(v, Verdict::Unreadable(_)), "{text:?}: {v:?}");
            assert!(v.warning().is_some_and(|m| m.contains("CVE-2025-52881")));
        }
    }
}
