//! `cargo xtask package`: `svc_<version>_amd64.deb`, staged here and built with `dpkg-deb`
//! (no cargo-deb: the package holds binaries of two crates, the statically linked guest
//! binaries, generated man pages and completions, and hand-written maintainer scripts; a
//! staging tree says exactly what is in it, and `dpkg-shlibdeps`/`lintian` check it as they
//! check any Debian package). packaging/debian/ holds the control template, the maintainer
//! scripts, copyright and lintian's overrides (each with its reason).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::ui;

/// What `cargo xtask package` builds.
pub struct Options {
    /// The package's version (default: the workspace's).
    pub version: Option<String>,
    /// Package the debug build (tests: fast) instead of the release build.
    pub debug: bool,
    /// Where the .deb goes.
    pub out: PathBuf,
    /// Run lintian on it (failing on errors).
    pub lint: bool,
}

/// The guest binaries the images carry, and where the package puts them.
pub(crate) const GUEST_BINS: [&str; 4] = [
    "svc-microvm-agent",
    "svc-git-ssh",
    "svc-supervise",
    "svc-init",
];
pub(crate) const GUEST_DIR: &str = "usr/lib/svc/guest";

pub fn run(o: &Options) -> anyhow::Result<PathBuf> {
    ui::heading("package: svc as a Debian package");
    let version = match &o.version {
        Some(v) => v.clone(),
        None => workspace_version()?,
    };
    let profile = if o.debug { "debug" } else { "release" };
    build(o.debug)?;
    crate::images::guest_bins()?;
    std::fs::create_dir_all(&o.out)?;
    let stage = std::path::absolute(&o.out)?.join(format!("svc_{version}_amd64"));
    if stage.exists() {
        std::fs::remove_dir_all(&stage)?;
    }
    let bins = Path::new("target").join(profile);
    install(&bins.join("svcd"), &stage.join("usr/sbin/svcd"), 0o755)?;
    install(&bins.join("svc"), &stage.join("usr/bin/svc"), 0o755)?;
    for name in GUEST_BINS {
        install(
            &Path::new(crate::images::GUEST_DIR).join(name),
            &stage.join(GUEST_DIR).join(name),
            0o755,
        )?;
    }
    crun(&stage)?;
    strip(&stage)?;
    docs(&stage, &bins.join("svc"), &version)?;
    unit_and_config(&stage)?;
    control(&stage, &version)?;
    let deb = o.out.join(format!("svc_{version}_amd64.deb"));
    ui::run(
        Command::new("dpkg-deb")
            .args(["--root-owner-group", "-Zxz", "--build"])
            .arg(&stage)
            .arg(&deb),
    )?;
    ui::ok(&format!("{} ({})", deb.display(), size(&deb)));
    if o.lint {
        lint(&deb)?;
    }
    Ok(deb)
}

pub(crate) fn workspace_version() -> anyhow::Result<String> {
    let text = std::fs::read_to_string("Cargo.toml").context("reading Cargo.toml")?;
    text.lines()
        .find_map(|l| l.strip_prefix("version = "))
        .map(|v| v.trim_matches('"').to_owned())
        .context("Cargo.toml has no workspace version")
}

pub(crate) fn build(debug: bool) -> anyhow::Result<()> {
    let mut cmd = Command::new("cargo");
    cmd.args(["build", "--quiet", "-p", "svc-control", "--bin", "svcd"])
        .args(["-p", "svc-cli", "--bin", "svc"]);
    if !debug {
        cmd.arg("--release");
    }
    ui::run(&mut cmd)
}

fn install(from: &Path, to: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = to.parent().context("path")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::copy(from, to)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn write(to: &Path, text: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = to.parent().context("path")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(to, text).with_context(|| format!("writing {}", to.display()))?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// Debug information out, as dh_strip does.
fn strip(stage: &Path) -> anyhow::Result<()> {
    let mut files = vec![
        stage.join("usr/sbin/svcd"),
        stage.join("usr/bin/svc"),
        stage.join(CRUN),
    ];
    files.extend(GUEST_BINS.iter().map(|n| stage.join(GUEST_DIR).join(n)));
    ui::run(
        Command::new("strip")
            .args([
                "--strip-unneeded",
                "--remove-section=.comment",
                "--remove-section=.note",
            ])
            .args(&files),
    )
}

fn gzip(paths: &[PathBuf]) -> anyhow::Result<()> {
    ui::run(Command::new("gzip").args(["-9nf"]).args(paths))
}

/// Man pages (svc's, svcd's, svcd.toml's) and completions from the built binaries, the
/// copyright, the changelog and
/// lintian's overrides.
fn docs(stage: &Path, svc: &Path, version: &str) -> anyhow::Result<()> {
    let man = stage.join("usr/share/man");
    ui::run(Command::new(svc).arg("man").arg(man.join("man1")))?;
    // svcd(8), its subcommands' pages and svcd.toml(5).
    ui::run(
        Command::new(svc.with_file_name("svcd"))
            .arg("man")
            .arg(&man),
    )?;
    let mut pages = Vec::new();
    for section in ["man1", "man5", "man8"] {
        for entry in std::fs::read_dir(man.join(section))? {
            pages.push(entry?.path());
        }
    }
    gzip(&pages)?;
    for (shell, path) in [
        ("bash", "usr/share/bash-completion/completions/svc"),
        ("zsh", "usr/share/zsh/vendor-completions/_svc"),
        ("fish", "usr/share/fish/vendor_completions.d/svc.fish"),
    ] {
        let script = ui::output(Command::new(svc).args(["completions", shell]))?;
        write(&stage.join(path), script.as_bytes(), 0o644)?;
    }
    let doc = stage.join("usr/share/doc/svc");
    install(
        Path::new("packaging/debian/copyright"),
        &doc.join("copyright"),
        0o644,
    )?;
    write(
        &doc.join("changelog"),
        changelog(version)?.as_bytes(),
        0o644,
    )?;
    gzip(&[doc.join("changelog")])?;
    install(
        Path::new("packaging/debian/lintian-overrides"),
        &stage.join("usr/share/lintian/overrides/svc"),
        0o644,
    )
}

/// A native package's changelog: one entry for this build, dated by the commit.
fn changelog(version: &str) -> anyhow::Result<String> {
    let commit = ui::output(Command::new("git").args(["log", "-1", "--format=%h %cD"]))?;
    let (hash, date) = commit.trim().split_once(' ').context("git log")?;
    Ok(format!(
        "svc ({version}) unstable; urgency=medium\n\n  * Built from commit {hash}.\n\n -- svc \
         maintainers <svc@example.org>  {date}\n"
    ))
}

/// svc's crun build as `/usr/lib/svc/crun` (svcd's default when PATH holds no crun 1.21 or
/// later), with its
/// corresponding source (crun is GPL-2.0-or-later): the upstream tarball and svc's patches in
/// `/usr/share/doc/svc/crun/`.
fn crun(stage: &Path) -> anyhow::Result<()> {
    let (bin, tarball) = crate::crun::for_package()?;
    install(&bin, &stage.join(CRUN), 0o755)?;
    let doc = stage.join("usr/share/doc/svc/crun");
    let name = tarball.file_name().context("the crun tarball's name")?;
    install(&tarball, &doc.join(name), 0o644)?;
    for entry in std::fs::read_dir("packaging/crun/patches")? {
        let path = entry?.path();
        let name = path.file_name().context("a patch's name")?;
        install(&path, &doc.join("patches").join(name), 0o644)?;
    }
    Ok(())
}

/// Where the package puts svc's crun.
const CRUN: &str = "usr/lib/svc/crun";

/// The unit (svcd at its packaged path) and the default configuration (a conffile).
fn unit_and_config(stage: &Path) -> anyhow::Result<()> {
    let unit = std::fs::read_to_string("packaging/svcd.service")?;
    let unit = unit.replace("/usr/local/bin/svcd", "/usr/sbin/svcd");
    if !unit.contains("ExecStart=/usr/sbin/svcd") {
        bail!("packaging/svcd.service: no ExecStart=/usr/local/bin/svcd to point at /usr/sbin");
    }
    write(
        &stage.join("lib/systemd/system/svcd.service"),
        unit.as_bytes(),
        0o644,
    )?;
    install(
        Path::new("packaging/svcd.toml"),
        &stage.join("etc/svc/svcd.toml"),
        0o644,
    )
}

/// DEBIAN/: control (with the libraries' dependencies from dpkg-shlibdeps and the installed
/// size), conffiles, maintainer scripts, md5sums.
fn control(stage: &Path, version: &str) -> anyhow::Result<()> {
    let debian = stage.join("DEBIAN");
    for script in ["postinst", "prerm", "postrm"] {
        install(
            &Path::new("packaging/debian").join(script),
            &debian.join(script),
            0o755,
        )?;
    }
    write(&debian.join("conffiles"), b"/etc/svc/svcd.toml\n", 0o644)?;
    let template = std::fs::read_to_string("packaging/debian/control.in")?;
    let text = template
        .replace("@VERSION@", version)
        .replace("@INSTALLED_SIZE@", &installed_kib(stage)?.to_string())
        .replace("@SHLIBS@", &shlibs(stage)?);
    write(&debian.join("control"), text.as_bytes(), 0o644)?;
    let sums = ui::output(
        Command::new("sh")
            .arg("-c")
            .arg("find . -type f ! -path './DEBIAN/*' -printf '%P\\0' | sort -z | xargs -0 md5sum")
            .current_dir(stage),
    )?;
    write(&debian.join("md5sums"), sums.as_bytes(), 0o644)
}

fn installed_kib(stage: &Path) -> anyhow::Result<u64> {
    let out = ui::output(
        Command::new("du")
            .args(["-sk", "--exclude=DEBIAN"])
            .arg(stage),
    )?;
    out.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .context("du")
}

/// `libc6 (>= …), …` for the three dynamically linked binaries (svcd, svc, crun), as dpkg-shlibdeps reads them
/// (it wants a `debian/control` beside it).
fn shlibs(stage: &Path) -> anyhow::Result<String> {
    let work = stage.with_extension("shlibs");
    write(
        &work.join("debian/control"),
        b"Source: svc\n\nPackage: svc\nArchitecture: amd64\n",
        0o644,
    )?;
    let out = ui::output(
        Command::new("dpkg-shlibdeps")
            .arg("-O")
            .arg(stage.join("usr/sbin/svcd"))
            .arg(stage.join("usr/bin/svc"))
            .arg(stage.join(CRUN))
            .current_dir(&work),
    );
    std::fs::remove_dir_all(&work)?;
    out?.lines()
        .find_map(|l| l.strip_prefix("shlibs:Depends="))
        .map(str::to_owned)
        .context("dpkg-shlibdeps printed no shlibs:Depends")
}

fn size(path: &Path) -> String {
    std::fs::metadata(path).map_or_else(
        |_| "?".into(),
        |m| format!("{:.1} MiB", m.len() as f64 / 1_048_576.0),
    )
}

/// lintian, failing on errors; its warnings are printed (packaging/debian/lintian-overrides
/// says why each overridden tag is right for svc).
fn lint(deb: &Path) -> anyhow::Result<()> {
    let out = Command::new("lintian")
        .args(["--fail-on", "error", "--display-info"])
        .arg(deb)
        .output()
        .context("running lintian (cargo xtask setup --tests installs it)")?;
    let text = String::from_utf8_lossy(&out.stdout);
    for line in text.lines() {
        ui::info(line);
    }
    if !out.status.success() {
        bail!(
            "lintian found errors in {} ({}): {}",
            deb.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    ui::ok(&format!(
        "lintian: no errors ({} other tags)",
        text.lines().count()
    ));
    Ok(())
}
