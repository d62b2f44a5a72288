//! The package and a fresh Debian root to install it in, for the package tests: the newest
//! `.deb` `cargo xtask package --debug` left, a Debian 12 root made by mmdebstrap from this
//! machine's apt sources (cached as a tarball under target/package/root, unpacked fresh for
//! each test), and the same package rebuilt with another version for upgrades.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// The workspace's target directory.
pub fn target() -> PathBuf {
    // The tests package's parent: the workspace (no `..` in paths, as /proc/PID/exe has none).
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .join("target")
}

/// The newest package `cargo xtask package` left.
pub fn deb() -> PathBuf {
    let dir = target().join("package");
    let mut debs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}: run `cargo xtask package --debug` first",
                dir.display()
            )
        })
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    debs.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    let newest = debs.pop().unwrap_or_else(|| {
        panic!(
            "no .deb in {}: run `cargo xtask package --debug` first",
            dir.display()
        )
    });
    refuse_stale(&newest);
    newest
}

/// A package older than the sources it is built from tests yesterday's code: refuse it, naming
/// the newer source and the command that rebuilds the package. (Sources, not binaries: a test
/// build may relink `svcd` with other features after the package was made.)
fn refuse_stale(deb: &Path) {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let Some(built) = modified(deb) else {
        panic!("{}: cannot read its modification time", deb.display())
    };
    let workspace = target().parent().expect("the workspace").to_path_buf();
    let mut pending: Vec<PathBuf> = [
        "svc-control/src",
        "svc-cli/src",
        "svc-guest/src",
        "packaging",
    ]
    .iter()
    .map(|d| workspace.join(d))
    .collect();
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for path in entries.filter_map(|e| Some(e.ok()?.path())) {
            if path.is_dir() {
                pending.push(path);
            } else if modified(&path).is_some_and(|m| m > built) {
                panic!(
                    "{} is older than {}: run `cargo xtask package --debug` first",
                    deb.display(),
                    path.display()
                );
            }
        }
    }
}

/// Run `cmd`, which must succeed; its standard output.
pub fn sh(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A field of a package's control file.
pub fn field(deb: &Path, name: &str) -> String {
    sh(Command::new("dpkg-deb").arg("-f").arg(deb).arg(name))
        .trim()
        .to_owned()
}

/// The package's `Depends` names, without versions or alternatives past the first.
fn depends(deb: &Path) -> Vec<String> {
    field(deb, "Depends")
        .split(',')
        .filter_map(|d| {
            d.split('|')
                .next()?
                .split_whitespace()
                .next()
                .map(str::to_owned)
        })
        .collect()
}

/// A Debian root with the package's dependencies, made once (a tarball under
/// target/package, remade when the dependencies change) and unpacked fresh for each test.
/// Commands run in it in a network namespace of its own: what the maintainer scripts do to
/// nftables (purge deletes `table inet svc`) never reaches this host's.
pub struct Root {
    /// The root's directory on this host.
    pub dir: PathBuf,
    net: svc_tests::NetNs,
}

impl Root {
    /// A fresh root with `deb`'s dependencies installed.
    pub fn fresh(deb: &Path) -> Self {
        let deps = depends(deb).join(",");
        let cache = target().join("package").join("root");
        std::fs::create_dir_all(&cache).expect("cache dir");
        let tar = cache.join("bookworm.tar");
        let stamp = cache.join("bookworm.deps");
        let _lock = Lock::take(&cache.join("lock"));
        if !tar.exists() || std::fs::read_to_string(&stamp).ok().as_deref() != Some(&deps) {
            let sources = [
                "/etc/apt/sources.list.d/debian.sources",
                "/etc/apt/sources.list",
            ]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("this machine's apt sources");
            let part = cache.join("bookworm.tar.part");
            sh(Command::new("mmdebstrap")
                .args([
                    "--quiet",
                    "--variant=minbase",
                    "--mode=root",
                    "--format=tar",
                ])
                .arg(format!("--include={deps}"))
                .arg("bookworm")
                .arg(&part)
                .arg(sources));
            std::fs::rename(&part, &tar).expect("rename");
            std::fs::write(&stamp, &deps).expect("stamp");
        }
        let dir = target()
            .join("tmp")
            .join(format!("debroot-{}", svc_tests::unique("r")));
        std::fs::create_dir_all(&dir).expect("root dir");
        sh(Command::new("tar")
            .arg("-xpf")
            .arg(&tar)
            .arg("-C")
            .arg(&dir));
        Self {
            dir,
            net: svc_tests::NetNs::new(),
        }
    }

    /// `sh -c SCRIPT` inside the root (chrooted, in its network namespace), not yet run.
    pub fn command(&self, script: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.net.name))
            .arg("chroot")
            .arg(&self.dir)
            .args(["sh", "-c", script]);
        cmd
    }

    /// `sh -c SCRIPT` inside the root, which must succeed; its standard output.
    pub fn run(&self, script: &str) -> String {
        sh(&mut self.command(script))
    }

    /// Where path `p` of the root is on this host.
    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.join(p.trim_start_matches('/'))
    }

    /// The root's file `p` (empty if it is not there).
    pub fn read(&self, p: &str) -> String {
        std::fs::read_to_string(self.path(p)).unwrap_or_default()
    }

    /// Put a package into the root's /tmp.
    pub fn put(&self, deb: &Path, name: &str) -> String {
        std::fs::copy(deb, self.path("/tmp").join(name)).expect("copy deb");
        format!("/tmp/{name}")
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An exclusive flock on a file, for the root's cache (tests of this file may run at once).
struct Lock(#[expect(dead_code, reason = "held for its drop")] nix::fcntl::Flock<std::fs::File>);

impl Lock {
    fn take(path: &Path) -> Self {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .expect("lock file");
        Self(nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).expect("flock"))
    }
}

/// The same package with another version (a newer build of this tree, for the upgrade).
pub fn rebuilt_as(deb: &Path, version: &str, dir: &Path) -> PathBuf {
    let tree = dir.join("tree");
    let _ = std::fs::remove_dir_all(&tree);
    sh(Command::new("dpkg-deb").arg("-R").arg(deb).arg(&tree));
    let control = tree.join("DEBIAN/control");
    let text = std::fs::read_to_string(&control).expect("control");
    let old = field(deb, "Version");
    std::fs::write(
        &control,
        text.replace(
            &format!("Version: {old}\n"),
            &format!("Version: {version}\n"),
        ),
    )
    .expect("control");
    let out = dir.join(format!("svc_{version}_amd64.deb"));
    sh(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-b"])
        .arg(&tree)
        .arg(&out));
    out
}
