//! crun for Debian 12, svcd's default OCI runtime: Debian 12 carries crun 1.8.1 only (it cannot
//! run svcd's bundles), and the newer Debian packages are built against glibc 2.38+. So setup
//! builds crun from the source Debian's archive serves for trixie — the upstream release
//! tarball, checked by the SHA-256 its signed `Sources` index names — with the two later
//! upstream security fixes applied (`packaging/crun/patches/`), against Debian 12's libseccomp
//! and libcap, and installs it as `/usr/local/sbin/crun` (ahead of Debian's `/usr/bin/crun` on
//! root's PATH, where svcd looks for its runtime). The built binary is kept in
//! `/var/cache/svc/` so another clone (CI's) installs it without rebuilding.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::ui;

/// The crun release built.
const VERSION: &str = "1.21";
/// The tarball's name.
const ORIG: &str = "crun_1.21.orig.tar.gz";
/// Its upstream tarball in Debian's archive (the `crun` source of Debian 13, trixie).
const ORIG_URL: &str = "http://deb.debian.org/debian/pool/main/c/crun/crun_1.21.orig.tar.gz";
/// The tarball's SHA-256 as trixie's `Sources` index lists it (`Checksums-Sha256`).
const ORIG_SHA256: &str = "4bfb700e764a4804a4de3ecf07753f4c391005356d60356df65d80ae0914c486";
/// The `commit:` line of svc's build (svcd's start-up check knows it carries both fixes).
const COMMIT: &str = "10269840aa07fb7e6b7e1acff6198692d8ff5c88+svc1";
/// Where it is installed.
pub const INSTALLED: &str = "/usr/local/sbin/crun";
/// The built binary, kept between clones.
const CACHE: &str = "/var/cache/svc/crun-1.21+svc1";
/// What the build needs from Debian 12.
const BUILD_DEPS: &[&str] = &["gcc", "make", "pkgconf", "libseccomp-dev", "libcap-dev"];

/// Install svc's crun unless it is there already; built (about a minute on two cores) only
/// when no cached build is.
pub fn install() -> anyhow::Result<()> {
    if installed_is_ours(Path::new(INSTALLED)) {
        ui::ok(&format!("crun {VERSION} (svc's build) at {INSTALLED}"));
        return Ok(());
    }
    let cached = Path::new(CACHE).join("crun");
    if !installed_is_ours(&cached) {
        build(Path::new(CACHE))?;
    }
    if let Some(dir) = Path::new(INSTALLED).parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Copied beside, then renamed over: a running svcd's crun is never half written.
    let next = Path::new(INSTALLED).with_extension("new");
    std::fs::copy(&cached, &next).with_context(|| format!("copying {}", cached.display()))?;
    std::fs::rename(&next, INSTALLED)?;
    ui::ok(&format!(
        "crun {VERSION} (svc's build) installed at {INSTALLED}"
    ));
    Ok(())
}

/// What the Debian package ships of svc's crun: the binary and its source tarball (built or
/// fetched now when missing).
pub fn for_package() -> anyhow::Result<(PathBuf, PathBuf)> {
    let cache = Path::new(CACHE);
    if !installed_is_ours(&cache.join("crun")) || !cache.join(ORIG).exists() {
        build(cache)?;
    }
    Ok((cache.join("crun"), cache.join(ORIG)))
}

/// Whether `bin` is svc's build of this version.
fn installed_is_ours(bin: &Path) -> bool {
    ui::output(Command::new(bin).arg("--version")).is_ok_and(|v| {
        v.lines().next() == Some(&format!("crun version {VERSION}"))
            && v.lines().any(|l| l == format!("commit: {COMMIT}"))
    })
}

/// Fetch, check, patch and build crun into `cache`/crun.
fn build(cache: &Path) -> anyhow::Result<()> {
    let missing = crate::setup::missing_packages(BUILD_DEPS);
    if !missing.is_empty() {
        ui::info(&format!(
            "crun's build needs {}: installing",
            missing.join(", ")
        ));
        crate::setup::apt_install(&missing)?;
    }
    let work = PathBuf::from(format!("{CACHE}.build"));
    if work.exists() {
        std::fs::remove_dir_all(&work)?;
    }
    std::fs::create_dir_all(&work)?;
    let tarball = work.join("crun.orig.tar.gz");
    ui::info(&format!(
        "fetching crun {VERSION}'s source from Debian's archive"
    ));
    // apt's own downloader, which refuses a file whose SHA-256 differs.
    ui::run(
        Command::new("/usr/lib/apt/apt-helper")
            .arg("download-file")
            .arg(ORIG_URL)
            .arg(&tarball)
            .arg(format!("SHA256:{ORIG_SHA256}")),
    )?;
    ui::run(
        Command::new("tar")
            .arg("xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(&work),
    )?;
    let src = work.join(format!("crun-{VERSION}"));
    patch(&src)?;
    compile(&src)?;
    std::fs::create_dir_all(cache)?;
    std::fs::copy(src.join("crun"), cache.join("crun"))?;
    // Its corresponding source, which the Debian package carries (crun is GPL-2.0-or-later).
    std::fs::copy(&tarball, cache.join(ORIG))?;
    std::fs::remove_dir_all(&work)?;
    if !installed_is_ours(&cache.join("crun")) {
        bail!(
            "the crun built in {} does not report version {VERSION}, commit {COMMIT}",
            cache.display()
        );
    }
    Ok(())
}

/// Apply packaging/crun/patches/ in order, and mark the build's commit line as svc's.
fn patch(src: &Path) -> anyhow::Result<()> {
    let dir = std::path::absolute("packaging/crun/patches")?;
    let mut patches: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| dir.display().to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "patch"))
        .collect();
    patches.sort();
    for p in &patches {
        let file = std::fs::File::open(p)?;
        ui::run(
            Command::new("patch")
                .args(["-p1", "--quiet", "--forward"])
                .current_dir(src)
                .stdin(file),
        )
        .with_context(|| format!("applying {}", p.display()))?;
    }
    std::fs::write(
        src.join(".tarball-git-version.h"),
        format!(
            "/* svc's build */\n#ifndef GIT_VERSION\n# define GIT_VERSION \"{COMMIT}\"\n#endif\n"
        ),
    )?;
    Ok(())
}

/// Configure (no systemd, CRIU or shared library; yajl built in, so the binary links only
/// libseccomp and libcap besides the C library) and make.
fn compile(src: &Path) -> anyhow::Result<()> {
    ui::info(&format!("building crun {VERSION} (about a minute)"));
    let t0 = std::time::Instant::now();
    ui::run(
        Command::new("./configure")
            .args([
                "--quiet",
                "--disable-systemd",
                "--disable-criu",
                "--enable-embedded-yajl",
                "--disable-shared",
            ])
            .current_dir(src),
    )?;
    let jobs = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    // `make` whole: the bundled libocispec and yajl are built by its recursion only.
    ui::run(
        Command::new("make")
            .arg(format!("-j{jobs}"))
            .arg("--quiet")
            .current_dir(src),
    )?;
    ui::info(&format!(
        "crun built in {:.0} s",
        t0.elapsed().as_secs_f64()
    ));
    Ok(())
}
