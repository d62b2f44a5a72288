//! The Debian package, installed for real: `dpkg` in a fresh Debian root made by mmdebstrap
//! from this machine's apt sources (a chroot runs maintainer scripts as a host would, without
//! systemd). Install makes the accounts and free id ranges; an upgrade to a newer build keeps
//! the operator's configuration and the ranges; remove keeps configuration and data; purge
//! leaves no file, account or range behind.
//!
//! The package is `target/package/svc_*_amd64.deb`, built by `cargo xtask package --debug`
//! (`cargo xtask test` builds it before the tests).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

fn target() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target")
}

/// The newest package `cargo xtask package` left.
fn deb() -> PathBuf {
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
    debs.pop().unwrap_or_else(|| {
        panic!(
            "no .deb in {}: run `cargo xtask package --debug` first",
            dir.display()
        )
    })
}

fn sh(cmd: &mut Command) -> String {
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
fn field(deb: &Path, name: &str) -> String {
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
struct Root {
    dir: PathBuf,
}

impl Root {
    fn fresh(deb: &Path) -> Self {
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
        Self { dir }
    }

    /// `sh -c SCRIPT` inside the root.
    fn run(&self, script: &str) -> String {
        sh(Command::new("chroot")
            .arg(&self.dir)
            .args(["sh", "-c", script]))
    }

    /// Whether `sh -c SCRIPT` inside the root succeeds.
    fn ok(&self, script: &str) -> bool {
        Command::new("chroot")
            .arg(&self.dir)
            .args(["sh", "-c", script])
            .output()
            .is_ok_and(|o| o.status.success())
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.join(p.trim_start_matches('/'))
    }

    fn read(&self, p: &str) -> String {
        std::fs::read_to_string(self.path(p)).unwrap_or_default()
    }

    /// Put a package into the root's /tmp.
    fn put(&self, deb: &Path, name: &str) -> String {
        std::fs::copy(deb, self.path("/tmp").join(name)).expect("copy deb");
        format!("/tmp/{name}")
    }

    /// Every path in the root but the package system's own records and logs.
    fn files(&self) -> BTreeSet<String> {
        let listing =
            sh(Command::new("find")
                .arg(&self.dir)
                .args(["-mindepth", "1", "-printf", "/%P\\n"]));
        listing
            .lines()
            .filter(|p| {
                ![
                    "/var/lib/dpkg", "/var/log/dpkg.log", "/var/log/alternatives.log", "/var/cache/debconf", "/tmp/",
                ]
                .iter()
                .any(|skip| p.starts_with(skip))
                    // shadow's backups of the account files it edited
                    && !["/etc/passwd-", "/etc/group-", "/etc/shadow-", "/etc/gshadow-", "/etc/subuid-", "/etc/subgid-"]
                        .contains(p)
            })
            .map(str::to_owned)
            .collect()
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

/// `name:start:count` lines of a subordinate-id file, by name.
fn ranges(text: &str) -> Vec<(String, u64, u64)> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            Some((
                f.first()?.to_string(),
                f.get(1)?.parse().ok()?,
                f.get(2)?.parse().ok()?,
            ))
        })
        .collect()
}

/// The same package with another version (a newer build of this tree, for the upgrade).
fn rebuilt_as(deb: &Path, version: &str, dir: &Path) -> PathBuf {
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

#[test]
fn install_upgrade_remove_and_purge_in_a_fresh_debian_root() {
    let deb = deb();
    let root = Root::fresh(&deb);
    // A person with their own id range: the package's ranges must avoid it.
    root.run("useradd --create-home alice && grep -q '^alice:' /etc/subuid");
    let before = root.files();
    let subuid_before = root.read("/etc/subuid");

    // Install.
    let first = root.put(&deb, "svc.deb");
    let out = root.run(&format!("dpkg -i {first} 2>&1"));
    assert!(out.contains("svcd setup-host: group svc: created"), "{out}");
    for account in ["passwd svc-sandbox", "passwd svc-vm", "group svc"] {
        assert!(
            root.ok(&format!("getent {account}")),
            "{account} after install:\n{out}"
        );
    }
    for file in ["/etc/subuid", "/etc/subgid"] {
        let lines = ranges(&root.read(file));
        let alice = lines
            .iter()
            .find(|(n, ..)| n == "alice")
            .expect("alice's range")
            .clone();
        for user in ["svc-sandbox", "svc-vm"] {
            let (_, start, count) = lines
                .iter()
                .find(|(n, ..)| n == user)
                .unwrap_or_else(|| panic!("{user} has no line in {file}: {lines:?}"))
                .clone();
            assert_eq!(count, 65_536, "{user} in {file}");
            for (other, s, c) in lines.iter().filter(|(n, ..)| n != user) {
                assert!(
                    start + count <= *s || s + c <= start,
                    "{user} overlaps {other} in {file}: {lines:?}"
                );
            }
            assert!(
                start >= alice.1 + alice.2 || start + count <= alice.1,
                "{user} vs alice"
            );
        }
    }
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/svcd.toml"),
    )
    .expect("packaging/svcd.toml");
    assert_eq!(
        root.read("/etc/svc/svcd.toml"),
        shipped,
        "the default configuration is installed"
    );
    assert!(
        root.path("/etc/systemd/system/multi-user.target.wants/svcd.service")
            .is_symlink(),
        "the unit is enabled"
    );
    assert!(root.path("/lib/systemd/system/svcd.service").exists());
    let unit = root.read("/lib/systemd/system/svcd.service");
    assert!(unit.contains("ExecStart=/usr/sbin/svcd run"), "{unit}");
    assert!(
        root.run("svc --version").starts_with("svc "),
        "svc runs in the root"
    );
    let subuid = root.read("/etc/subuid");
    let again = root.run("svcd setup-host");
    assert!(
        again.contains("user svc-sandbox: subordinate ids present"),
        "{again}"
    );
    assert_eq!(
        root.read("/etc/subuid"),
        subuid,
        "setup-host again changes nothing"
    );

    // The operator edits the configuration; a newer build keeps the edit and the ranges.
    let edited = format!("{shipped}\n[limits]\nexec_streams = 8\n");
    std::fs::write(root.path("/etc/svc/svcd.toml"), &edited).expect("edit config");
    let work = target().join("tmp").join(svc_tests::unique("deb"));
    std::fs::create_dir_all(&work).expect("work");
    let version = format!("{}+upgrade1", field(&deb, "Version"));
    let newer = root.put(&rebuilt_as(&deb, &version, &work), "svc-newer.deb");
    let out = root.run(&format!("dpkg -i {newer} 2>&1"));
    assert_eq!(
        root.run("dpkg-query -W -f='${Version}' svc"),
        version,
        "{out}"
    );
    assert_eq!(
        root.read("/etc/svc/svcd.toml"),
        edited,
        "the operator's configuration is kept"
    );
    assert_eq!(root.read("/etc/subuid"), subuid, "the ranges are kept");
    let _ = std::fs::remove_dir_all(&work);

    // Remove: the binaries go; configuration, data and accounts stay for purge.
    root.run("mkdir -p /var/lib/svc/sandboxes && echo x > /var/lib/svc/sandboxes/data && mkdir -p /var/log/svc && echo '{}' > /var/log/svc/audit.jsonl && head -c 32 /dev/urandom > /etc/svc/secrets.key");
    root.run("dpkg -r svc");
    assert!(!root.path("/usr/sbin/svcd").exists(), "svcd removed");
    assert_eq!(
        root.run("dpkg-query -W -f='${Status}' svc"),
        "deinstall ok config-files"
    );
    assert_eq!(
        root.read("/etc/svc/svcd.toml"),
        edited,
        "remove keeps the configuration"
    );
    assert!(
        root.path("/var/lib/svc/sandboxes/data").exists(),
        "remove keeps the data"
    );
    assert!(
        root.ok("getent passwd svc-sandbox"),
        "remove keeps the accounts"
    );

    // Purge: nothing left.
    root.run("dpkg -P svc");
    for account in [
        "passwd svc-sandbox",
        "passwd svc-vm",
        "group svc",
        "group svc-sandbox",
        "group svc-vm",
    ] {
        assert!(
            !root.ok(&format!("getent {account}")),
            "{account} after purge"
        );
    }
    assert_eq!(
        root.read("/etc/subuid"),
        subuid_before,
        "purge removes the ranges, keeps alice's"
    );
    let after = root.files();
    let left: Vec<_> = after.difference(&before).collect();
    let gone: Vec<_> = before.difference(&after).collect();
    assert!(
        left.is_empty() && gone.is_empty(),
        "purge left {left:?} and took {gone:?}"
    );
}
