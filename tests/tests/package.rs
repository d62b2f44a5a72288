//! The Debian package, installed for real: `dpkg` in a fresh Debian root made by mmdebstrap
//! from this machine's apt sources (a chroot runs maintainer scripts as a host would, without
//! systemd). Install makes the accounts and free id ranges (svc-sandbox's sized for a slice per
//! sandbox); an upgrade to a newer build keeps the operator's configuration and the ranges;
//! remove keeps configuration and data; purge leaves no file, account or range behind.
//!
//! The package is `target/package/svc_*_amd64.deb`, built by `cargo xtask package --debug`
//! (`cargo xtask test` builds it before the tests).

use std::{collections::BTreeSet, path::Path, process::Command};

#[path = "package/root.rs"]
mod root;

use root::{Root, deb, field, rebuilt_as, sh, target};

impl Root {
    /// Whether `sh -c SCRIPT` inside the root succeeds.
    fn ok(&self, script: &str) -> bool {
        self.command(script)
            .output()
            .is_ok_and(|o| o.status.success())
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

#[test]
fn install_upgrade_remove_and_purge_in_a_fresh_debian_root() {
    let deb = deb();
    let root = Root::fresh(&deb);
    // A person with their own id range: the package's ranges must avoid it.
    root.run("useradd --create-home alice && grep -q '^alice:' /etc/subuid");
    // A host's bpffs mount point (pins go under it).
    root.run("mkdir -p /sys/fs/bpf");
    let before = root.files();
    let subuid_before = root.read("/etc/subuid");
    let subgid_before = root.read("/etc/subgid");

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
            // svc-vm: a uid per sandbox; svc-sandbox (`container.id_ranges = "per-sandbox"`,
            // the default): a slice of 65536 per sandbox the default /16 pool allows, and
            // slice 0, above SUB_UID_MAX (600100000 in Debian's /etc/login.defs).
            let want = if user == "svc-vm" {
                65_536
            } else {
                16_385 * 65_536
            };
            assert_eq!(count, want, "{user} in {file}");
            assert!(
                user == "svc-vm" || start > 600_100_000,
                "{user} in {file}: {start}"
            );
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
    // What a running svcd leaves: state, the images, an audit log, the host key, the API
    // socket's directory, pinned eBPF objects (a plain directory in the root) and the
    // nftables table (in the root's own network namespace).
    root.run(
        "mkdir -p /var/lib/svc/sandboxes /var/lib/svc/images/base /var/log/svc /run/svc \
           /sys/fs/bpf/svc/links \
         && echo x > /var/lib/svc/sandboxes/data && echo x > /var/lib/svc/images/base/stamp \
         && echo '{}' > /var/log/svc/audit.jsonl && head -c 32 /dev/urandom > /etc/svc/secrets.key \
         && touch /run/svc/svcd.sock /sys/fs/bpf/svc/SVC_ALLOW4 /sys/fs/bpf/svc/links/svc1_ingress \
         && nft add table inet svc",
    );
    let out = root.run("dpkg -r svc 2>&1");
    assert!(
        out.contains("svcd stop-sandboxes: no sandboxes' state in /var/lib/svc: nothing to stop"),
        "prerm stops the sandboxes (none here): {out}"
    );
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
    assert_eq!(
        root.read("/etc/subgid"),
        subgid_before,
        "purge removes the group ranges, keeps alice's"
    );
    assert!(
        !root.ok("nft list table inet svc"),
        "purge deletes the nftables table"
    );
    let after = root.files();
    let left: Vec<_> = after.difference(&before).collect();
    let gone: Vec<_> = before.difference(&after).collect();
    assert!(
        left.is_empty() && gone.is_empty(),
        "purge left {left:?} and took {gone:?}"
    );
}
