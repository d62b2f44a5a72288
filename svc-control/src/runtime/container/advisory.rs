//! The OCI runtime's own escapes: whether the installed runtime carries the fixes for the
//! breakouts svc cannot close from outside it, read from `runtime --version`. For runc:
//! CVE-2025-31133, CVE-2025-52565 and CVE-2025-52881 (masked-path and `/proc` write-redirect
//! races during create and exec). For crun: CVE-2026-30892 (`crun exec --user N` ran as uid
//! 0) and CVE-2026-47766 (a `/dev` symlink in the root file system redirected device
//! creation outside it). svcd warns at start and `svc doctor` reports it; what svc closes
//! itself is in docs/isolation.md, "The runtime's own escapes".

use std::path::Path;

/// The advisories whose fixes runc must carry.
pub const CVES: [&str; 3] = ["CVE-2025-31133", "CVE-2025-52565", "CVE-2025-52881"];

/// The first release of each line that carries them (every line after 1.3 does too).
const FIXED: [(u32, u32, u32); 2] = [(1, 2, 8), (1, 3, 3)];

/// Distribution builds older than the fixed releases that carry all three fixes, by the
/// `commit:` line of `runc --version`; an entry is added only once its package changelog has
/// been read to name all three. Debian 12's `1.1.5+ds1-1+deb12u1` is not one: its changelog
/// names CVE-2024-21626 as its only backport.
const BACKPORTED: &[&str] = &[];

/// The advisories whose fixes crun must carry: CVE-2026-30892 (fixed in 1.27) and
/// CVE-2026-47766 (fixed in 1.28).
pub const CRUN_CVES: [&str; 2] = ["CVE-2026-30892", "CVE-2026-47766"];

/// The first crun release that carries both.
const CRUN_FIXED: (u32, u32, u32) = (1, 28, 0);

/// crun builds older than 1.28 that carry both fixes, by the `commit:` line of
/// `crun --version`: svc's own build (`cargo xtask setup`: Debian's crun 1.21 source with the
/// two upstream fixes applied, packaging/crun/).
pub const CRUN_BACKPORTED: &[&str] = &[SVC_CRUN_COMMIT];

/// The `commit:` line of svc's crun build: crun 1.21's commit, marked as svc's.
pub const SVC_CRUN_COMMIT: &str = "10269840aa07fb7e6b7e1acff6198692d8ff5c88+svc1";

/// The oldest crun svcd runs: older ones cannot mount its base image idmapped (per-sandbox id
/// ranges need it), and Debian 12's 1.8.1 failed its exec (`setns`: EPERM) in one bench run.
pub const CRUN_MINIMUM: (u32, u32, u32) = (1, 21, 0);

/// Which OCI runtime a binary is, by its `--version` output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Runc,
    Crun,
}

impl Kind {
    /// The runtime's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::Crun => "crun",
        }
    }
}

/// A runtime's `--version` output, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub kind: Kind,
    /// The version as said (`1.1.5+ds1`, `1.21`).
    pub version: String,
    /// (major, minor, patch): a missing patch is 0.
    pub triple: (u32, u32, u32),
    /// A pre-release (`-rc.1`, `~rc1`).
    pub prerelease: bool,
    /// The `commit:` line, or empty.
    pub commit: String,
}

impl Identity {
    /// `runc 1.1.5+ds1 (1.1.5+ds1-1+deb12u1)`: the name, version and commit when it says more.
    pub fn shown(&self) -> String {
        let (name, v, c) = (self.kind.name(), &self.version, &self.commit);
        if c.is_empty() || c == v {
            format!("{name} {v}")
        } else {
            format!("{name} {v} ({c})")
        }
    }
}

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

/// `runtime --version`'s output, or why it could not be had.
pub fn version_output(runtime: &Path) -> Result<String, String> {
    match std::process::Command::new(runtime)
        .arg("--version")
        .output()
    {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => Err(format!(
            "{} --version failed ({})",
            runtime.display(),
            o.status
        )),
        Err(e) => Err(format!("running {} --version: {e}", runtime.display())),
    }
}

/// Read which runtime and version `output` (of `--version`) names.
pub fn identify(output: &str) -> Option<Identity> {
    let line = |prefix: &str| {
        output
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .map(str::trim)
    };
    let (kind, version) = match (line("runc version "), line("crun version ")) {
        (Some(v), _) => (Kind::Runc, v),
        (None, Some(v)) => (Kind::Crun, v),
        (None, None) => return None,
    };
    let (triple, prerelease) = parse(version, kind == Kind::Crun)?;
    Some(Identity {
        kind,
        version: version.to_owned(),
        triple,
        prerelease,
        commit: line("commit: ").unwrap_or_default().to_owned(),
    })
}

/// Run `runtime --version` and judge it.
pub fn check(runtime: &Path) -> Verdict {
    match version_output(runtime) {
        Ok(out) => assess(&out),
        Err(m) if m.contains("--version failed") => Verdict::Unreadable(format!(
            "{m}: cannot tell whether it carries the fixes for {}",
            cves()
        )),
        Err(m) => Verdict::Unreadable(m),
    }
}

/// Judge the output of `runc --version` (`runc version 1.1.5+ds1`, then `commit: …`) or
/// `crun --version` (`crun version 1.21`, then `commit: …`).
pub fn assess(output: &str) -> Verdict {
    let Some(id) = identify(output) else {
        return Verdict::Unreadable(format!(
            "cannot read a runc or crun version in {:?}: cannot tell whether it carries the \
             fixes for {} (runc) or {} (crun)",
            output.lines().next().unwrap_or_default(),
            cves(),
            crun_cves(&CRUN_CVES)
        ));
    };
    match id.kind {
        Kind::Runc => assess_runc(&id),
        Kind::Crun => assess_crun(&id),
    }
}

fn assess_runc(id: &Identity) -> Verdict {
    let shown = id.shown();
    if BACKPORTED.contains(&id.commit.as_str()) {
        return Verdict::Fixed(format!("{shown}: its distribution backported {}", cves()));
    }
    if fixed(id.triple, id.prerelease) {
        return Verdict::Fixed(format!("{shown} carries the fixes for {}", cves()));
    }
    Verdict::Vulnerable(format!(
        "{shown} predates the fixes for {} (masked-path and /proc write-redirect races during \
         create and exec), made in runc 1.2.8 and 1.3.3: install one of those or later (svc's \
         own guards are in docs/isolation.md, \"The runtime's own escapes\")",
        cves()
    ))
}

fn assess_crun(id: &Identity) -> Verdict {
    let shown = id.shown();
    if CRUN_BACKPORTED.contains(&id.commit.as_str()) {
        return Verdict::Fixed(format!(
            "{shown}: its build backported the fixes for {}",
            crun_cves(&CRUN_CVES)
        ));
    }
    let v = id.triple;
    let before = |fix: (u32, u32, u32)| v < fix || (v == fix && id.prerelease);
    let missing: Vec<&str> = [((1, 27, 0), CRUN_CVES[0]), (CRUN_FIXED, CRUN_CVES[1])]
        .into_iter()
        .filter(|(fix, _)| before(*fix))
        .map(|(_, cve)| cve)
        .collect();
    if missing.is_empty() {
        return Verdict::Fixed(format!(
            "{shown} carries the fixes for {}",
            crun_cves(&CRUN_CVES)
        ));
    }
    Verdict::Vulnerable(format!(
        "{shown} predates the fixes for {} (`crun exec --user N` running as uid 0; a /dev \
         symlink in the root file system redirecting device creation outside it), made in crun \
         1.27 and 1.28: install crun 1.28 or later, or svc's build of crun with both fixes \
         (`cargo xtask setup`; svc's own guards are in docs/isolation.md, \"The runtime's own \
         escapes\")",
        crun_cves(&missing)
    ))
}

fn cves() -> String {
    format!("{}, {} and {}", CVES[0], CVES[1], CVES[2])
}

fn crun_cves(cves: &[&str]) -> String {
    cves.join(" and ")
}

/// `1.2.8`, `1.1.5+ds1`, `1.4.0-rc.1` (and with `two_parts`, `1.21`): (major, minor,
/// patch) and whether it is a pre-release.
fn parse(version: &str, two_parts: bool) -> Option<((u32, u32, u32), bool)> {
    let end = version.find(['+', '-', '~']).unwrap_or(version.len());
    let (numbers, rest) = version.split_at(end);
    let mut parts = numbers.split('.').map(str::parse::<u32>);
    let (major, minor) = (parts.next()?.ok()?, parts.next()?.ok()?);
    let patch = match parts.next() {
        Some(p) => p.ok()?,
        None if two_parts => 0,
        None => return None,
    };
    let triple = (major, minor, patch);
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
            "youki version 0.5.0\n",
            "runc version one.two\n",
            "runc version 1.2\n",
        ] {
            let v = assess(text);
            assert!(matches!(v, Verdict::Unreadable(_)), "{text:?}: {v:?}");
            assert!(v.warning().is_some_and(|m| m.contains("CVE-2025-52881")));
        }
    }

    fn crun(version: &str, commit: &str) -> String {
        format!("crun version {version}\ncommit: {commit}\nrundir: /run/crun\nspec: 1.0.0\n")
    }

    #[test]
    fn crun_before_1_28_is_warned_about_naming_the_fixes_it_lacks() {
        for (version, lacks) in [
            ("1.8.1", &CRUN_CVES[..]),
            ("1.21", &CRUN_CVES[..]),
            ("1.26", &CRUN_CVES[..]),
            ("1.27", &CRUN_CVES[1..]),
            ("1.27.1", &CRUN_CVES[1..]),
            ("1.28-rc1", &CRUN_CVES[1..]),
        ] {
            let v = assess(&crun(version, "f8a096be"));
            let Verdict::Vulnerable(m) = &v else {
                panic!("{version}: {v:?}");
            };
            assert!(
                m.starts_with(&format!(
                    "crun {version} (f8a096be) predates the fixes for {}",
                    lacks.join(" and ")
                )),
                "{m}"
            );
            assert!(m.contains("crun 1.28 or later"), "{m}");
        }
    }

    #[test]
    fn crun_1_28_and_svcs_backported_build_pass() {
        for (version, commit) in [("1.28", "x"), ("1.29.1", "x"), ("1.21", SVC_CRUN_COMMIT)] {
            let v = assess(&crun(version, commit));
            assert!(matches!(v, Verdict::Fixed(_)), "{version}: {v:?}");
            assert!(v.warning().is_none(), "{version} {commit}: {v:?}");
        }
        let ours = assess(&crun("1.21", SVC_CRUN_COMMIT));
        assert_eq!(
            ours,
            Verdict::Fixed(format!(
                "crun 1.21 ({SVC_CRUN_COMMIT}): its build backported the fixes for \
                 CVE-2026-30892 and CVE-2026-47766"
            ))
        );
    }

    #[test]
    fn the_runtime_and_its_version_are_identified() {
        let id = identify(&crun("1.21", "abc")).expect("crun");
        assert_eq!(
            (id.kind, id.triple, id.shown().as_str()),
            (Kind::Crun, (1, 21, 0), "crun 1.21 (abc)")
        );
        let id = identify(&output("1.1.5+ds1", "1.1.5+ds1")).expect("runc");
        assert_eq!(
            (id.kind, id.triple, id.shown().as_str()),
            (Kind::Runc, (1, 1, 5), "runc 1.1.5+ds1")
        );
        assert_eq!(identify("youki version 0.5.0\n"), None);
    }
}
