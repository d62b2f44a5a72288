//! A host id range per container sandbox (`[container] id_ranges = "per-sandbox"`, the
//! default), against the real svcd, runc and kernel: two sandboxes' guest roots are different
//! host users, what a guest writes is owned by its own slice, a process running as one guest's
//! root (the same in-guest uid, 0, as the other's) can neither signal the other's processes nor
//! read its files, and destroy frees the slice for the next sandbox and leaves nothing owned by
//! it. And the setting's other value, `"shared"`: every guest root the one host user of the
//! first range, the image shifted into it once.
//!
//! Needs `svc-sandbox` to own a range of more than one slice (`svcd setup-host`, or
//! `cargo xtask setup`).

use std::{os::unix::fs::MetadataExt as _, path::Path, process::Command};

use svc_control::runtime::ids::{ID_COUNT, SliceRange};
use svc_tests::{require_root, world::World};

/// svc-sandbox's range cut into slices, as svcd reads it.
fn slices() -> SliceRange {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    SliceRange::from_texts(&read("/etc/subuid"), &read("/etc/subgid"), "svc-sandbox")
        .filter(|r| r.slices > 3)
        .expect(
            "svc-sandbox owns no range of several slices of 65536 ids: run `svcd setup-host` \
             with [container] id_ranges = \"per-sandbox\" in its svcd.toml",
        )
}

/// Sandbox `name`'s id and its guest init's host pid.
fn id_and_pid(w: &World, name: &str) -> (u32, u32) {
    let s = w.show(name);
    let num = |k: &str| {
        s[k].as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or_else(|| panic!("{name}: no {k} in {s}"))
    };
    (num("id"), num("pid"))
}

/// Run `script` on the host as `uid`:`gid` with no other groups (as an escaped guest's root
/// would be); its exit code and output.
fn as_host_ids(uid: u32, gid: u32, script: &str) -> (i32, String) {
    let out = Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={gid}"),
            "--clear-groups",
            "--",
            "sh",
            "-c",
            script,
        ])
        .output()
        .expect("setpriv");
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Paths under `root` (not following links, not into other file systems) owned by a uid or
/// gid of `[first, first + ID_COUNT)`.
fn owned_by_slice(root: &Path, first: u32) -> Vec<String> {
    let range = u64::from(first)..u64::from(first) + u64::from(ID_COUNT);
    let dev = std::fs::symlink_metadata(root).map(|m| m.dev()).ok();
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if Some(m.dev()) != dev {
            continue;
        }
        if range.contains(&u64::from(m.uid())) || range.contains(&u64::from(m.gid())) {
            found.push(format!("{} ({}:{})", p.display(), m.uid(), m.gid()));
        }
        if m.is_dir() {
            stack.extend(
                std::fs::read_dir(&p)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path()),
            );
        }
    }
    found
}

#[test]
fn per_sandbox_ranges_keep_two_guests_apart_even_as_the_same_in_guest_uid() {
    require_root();
    let range = slices();
    // disk_mib = 0: the writable layers are directories of the state, visible from the host.
    // No id_ranges line: per-sandbox is the default.
    let w = World::start_with("disk_mib = 0");
    for name in ["alpha", "beta"] {
        w.svc_ok(&["sandbox", "create", name, "--backend", "container"]);
    }
    let (id_a, pid_a) = id_and_pid(&w, "alpha");
    let (id_b, pid_b) = id_and_pid(&w, "beta");
    let slice_a = range.slice(id_a).expect("alpha's slice");
    let slice_b = range.slice(id_b).expect("beta's slice");

    // Each guest root is its own slice's first uid and gid.
    for (name, pid, slice) in [("alpha", pid_a, slice_a), ("beta", pid_b, slice_b)] {
        let m = std::fs::metadata(format!("/proc/{pid}")).expect("the guest's init");
        assert_eq!(
            (m.uid(), m.gid()),
            (slice.uid, slice.gid),
            "{name} (id {})'s guest root on the host",
            if name == "alpha" { id_a } else { id_b }
        );
        assert_eq!(w.sh(name, "id -u").1.trim(), "0", "root inside {name}");
    }
    assert_ne!(
        slice_a.uid, slice_b.uid,
        "two guests' roots are one host uid"
    );

    // What guest root makes is owned by its slice on disk; the base image still shows as the
    // guest's own root (idmapped), and the image itself is not copied per range.
    let (code, out, err) = w.sh(
        "alpha",
        "echo mine > /made-by-alpha && stat -c '%u:%g' /made-by-alpha /etc/passwd /usr/bin",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["0:0"; 3],
        "in-guest owners: {out}"
    );
    let upper = w.dir.join("state/sandboxes/alpha/upper/made-by-alpha");
    let m = std::fs::metadata(&upper).expect("the file in alpha's writable layer");
    assert_eq!(
        (m.uid(), m.gid()),
        (slice_a.uid, slice_a.gid),
        "{} on the host",
        upper.display()
    );
    let image = svc_tests::world::image_dir();
    let copies: Vec<_> = std::fs::read_dir(&image)
        .expect("the image directory")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(&format!("uid{}", slice_a.uid)))
        .collect();
    assert!(
        copies.is_empty(),
        "a per-range copy of the image: {copies:?}"
    );

    // A process running as alpha's guest root (uid 0 inside, like beta's) reaches nothing of
    // beta's: no signal to its processes, no read of its files in its writable layer, no
    // step into its sandbox directory.
    let (code, out, err) = w.sh(
        "beta",
        "echo hush-k2 > /beta-secret && chmod 600 /beta-secret && echo ok",
    );
    assert_eq!((code, out.trim()), (0, "ok"), "{err}");
    let beta_upper = w.dir.join("state/sandboxes/beta/upper/beta-secret");
    assert!(beta_upper.exists(), "beta's file in its layer");
    let attempts = [
        ("signal beta's init", format!("kill -0 {pid_b}")),
        (
            "read beta's writable layer",
            format!("cat {}", beta_upper.display()),
        ),
        (
            "reach into beta's sandbox directory",
            format!(
                "stat {}",
                w.dir.join("state/sandboxes/beta/upper").display()
            ),
        ),
    ];
    for (what, script) in &attempts {
        let (code, out) = as_host_ids(slice_a.uid, slice_a.gid, script);
        assert_ne!(code, 0, "alpha's guest root could {what}: {out}");
        assert!(!out.contains("hush-k2"), "{what}: {out}");
    }
    // The same reach alpha's own (so the refusals above are the ranges' doing).
    let own = format!("kill -0 {pid_a} && cat {}", upper.display());
    let (code, out) = as_host_ids(slice_a.uid, slice_a.gid, &own);
    assert_eq!(
        (code, out.as_str()),
        (0, "mine\n"),
        "alpha's root reaches its own"
    );

    // Destroy frees the slice: nothing on disk stays owned by it, and the next sandbox gets
    // the same id and slice.
    w.destroy_checked("alpha");
    let left = owned_by_slice(&w.dir, slice_a.uid);
    assert!(left.is_empty(), "alpha's slice still owns: {left:?}");
    w.svc_ok(&["sandbox", "create", "gamma", "--backend", "container"]);
    let (id_c, pid_c) = id_and_pid(&w, "gamma");
    assert_eq!(id_c, id_a, "the freed id is reused");
    let m = std::fs::metadata(format!("/proc/{pid_c}")).expect("gamma's init");
    assert_eq!(m.uid(), slice_a.uid, "gamma runs in the freed slice");
    let (code, out, _) = w.sh("gamma", "ls /made-by-alpha 2>&1; echo done");
    assert_eq!(code, 0);
    assert!(
        out.contains("No such file"),
        "alpha's file reached gamma: {out}"
    );
    for name in ["beta", "gamma"] {
        w.destroy_checked(name);
    }
}

#[test]
fn shared_ranges_map_every_guest_root_to_the_one_range_over_a_shifted_image() {
    require_root();
    let first = |file: &str| {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        svc_control::runtime::ids::subordinate_range(&text, "svc-sandbox")
            .unwrap_or_else(|| panic!("svc-sandbox's range in {file} (`svcd setup-host`)"))
    };
    let (first, first_gid) = (first("/etc/subuid"), first("/etc/subgid"));
    let w = World::start_with("id_ranges = \"shared\"\ndisk_mib = 0");
    for name in ["one", "two"] {
        w.svc_ok(&["sandbox", "create", name, "--backend", "container"]);
        let (_, pid) = id_and_pid(&w, name);
        let m = std::fs::metadata(format!("/proc/{pid}")).expect("the guest's init");
        assert_eq!(
            (m.uid(), m.gid()),
            (first, first_gid),
            "{name}'s guest root: the shared range's first ids"
        );
        let (code, out, err) = w.sh(name, "echo x > /made && stat -c '%u' /made /etc/passwd");
        assert_eq!((code, out.as_str()), (0, "0\n0\n"), "{err}");
        let made = w.dir.join(format!("state/sandboxes/{name}/upper/made"));
        let m = std::fs::metadata(&made).expect("the file in the writable layer");
        assert_eq!(m.uid(), first, "{} on the host", made.display());
    }
    let shifted = std::fs::read_dir(svc_tests::world::image_dir())
        .expect("the image directory")
        .flatten()
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .ends_with(&format!(".uid{first}-gid{first_gid}"))
                && e.path().join(".svc-shifted").exists()
        });
    assert!(shifted, "no copy of the image shifted into {first}");
    for name in ["one", "two"] {
        w.destroy_checked(name);
    }
}
