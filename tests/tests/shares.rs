//! Shared directories never carry foreign ids or privilege onto the host: a hostile guest
//! root, in a project directory and in the coding agent's home (both owned by a user, shared
//! live), tries to plant a set-user-ID file of another user, a set-group-ID directory, a setid
//! file made at creation, and device nodes. Checked from the host with `stat`: every file the
//! guest made is the owner's, no setid bit, no device. Ordinary work in the share still works.
//!
//! Real parts: svcd, runc containers with idmapped shares, QEMU microvm guests with
//! virtiofsd shares, the CLI.

use std::{
    os::unix::fs::{FileTypeExt as _, MetadataExt as _},
    path::{Path, PathBuf},
};

use svc_tests::{
    project::{MINIMAL_WORKSPACE, chown_tree, project_at},
    require_root,
    world::{World, microvm_images},
};

/// The owner of the shared directories on the host: a user, not root.
const OWNER: u32 = 1234;

/// The attack, run by the guest's root on each directory named on its command line. Each
/// step prints `DIR STEP ok` or `DIR STEP ERRNO`: the guest may be refused, or may believe
/// it succeeded; what counts is what the host holds.
const ATTACK: &str = r#"
import os, shutil, sys
for d in sys.argv[1:]:
    def step(name, f):
        try:
            f()
            print(d, name, "ok")
        except OSError as e:
            print(d, name, e.errno)
    step("copy", lambda: shutil.copy("/usr/bin/python3", d + "/py"))
    step("chown-foreign", lambda: os.chown(d + "/py", 1, 6))
    step("chmod-setid", lambda: os.chmod(d + "/py", 0o6755))
    step("create-setid", lambda: os.close(os.open(d + "/created", os.O_CREAT | os.O_WRONLY, 0o6755)))
    step("mknod-setid", lambda: os.mknod(d + "/node", 0o100000 | 0o4755))
    step("block-device", lambda: os.mknod(d + "/block", 0o060000 | 0o666, os.makedev(8, 0)))
    step("char-device", lambda: os.mknod(d + "/char", 0o020000 | 0o666, os.makedev(1, 3)))
    step("mkdir", lambda: os.mkdir(d + "/sub", 0o755))
    step("dir-setgid", lambda: os.chmod(d + "/sub", 0o2775))
    step("dir-chown-foreign", lambda: os.chown(d + "/sub", 0, 6))
"#;

/// Ordinary work in directory `$1`: create, edit, `chmod +x`, a fifo, `chown` to the guest's
/// own user, a git commit. Prints `work ok` at the end.
const WORK: &str = "set -e; cd \"$1\"; echo hi > note; echo more >> note; chmod +x note; \
     test -x note; mkfifo fifo; chown root:root note; git init -q repo; cd repo; \
     echo code > main.rs; git add main.rs; \
     git -c user.name=t -c user.email=t@svc.invalid commit -q -m one; \
     git log --oneline | wc -l; echo work ok";

#[test]
fn a_container_guest_plants_no_setid_file_device_or_foreign_id_through_its_shares() {
    require_root();
    the_attack_leaves_nothing_on_the_host("container");
}

/// One VM (TCG is slow): both shares in it.
#[test]
fn a_microvm_guest_plants_no_setid_file_device_or_foreign_id_through_its_shares() {
    require_root();
    microvm_images();
    assert!(
        svc_tests::world::tool("virtiofsd").is_some(),
        "virtiofsd is missing: `cargo xtask setup --tests` installs it into target/tools"
    );
    the_attack_leaves_nothing_on_the_host("microvm");
}

fn the_attack_leaves_nothing_on_the_host(backend: &str) {
    let base = svc_tests::fresh_dir("shr");
    let home = base.join(".claude");
    let project = base.join("project");
    std::fs::create_dir_all(&home).expect("agent home");
    project_at(&project, &[MINIMAL_WORKSPACE]);
    chown_tree(&base, OWNER, OWNER);
    let w = World::start_with_agent_home(&home);
    let ws = project.display().to_string();
    w.svc_ok(&[
        "workspace",
        "up",
        "--trust",
        &ws,
        "--name",
        "sh",
        "--backend",
        backend,
    ]);
    // Both shares, each where the guest sees it (the project at /workspace).
    let view = w.show("sh");
    let guest_path = |host: &Path| -> String {
        let want = format!("{} -> ", host.display());
        view["live_mounts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m.as_str()?.strip_prefix(&want))
            .next()
            .unwrap_or_else(|| panic!("{} is not shared: {view}", host.display()))
            .to_owned()
    };
    let shares = [
        (project.clone(), "/workspace".to_owned()),
        (home.clone(), guest_path(&home)),
    ];

    // A setid program already in the project (the owner's own): rewritten by the guest with
    // its bytes, it keeps no bit (the kernel keeps it only for a writer with CAP_FSETID in the
    // host's user namespace: no container guest; virtiofsd runs without it).
    let setid = project.join("setid-prog");
    std::fs::write(&setid, b"#!/bin/sh\n").expect("setid-prog");
    std::os::unix::fs::chown(&setid, Some(OWNER), Some(OWNER)).expect("chown");
    std::fs::set_permissions(
        &setid,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o6755),
    )
    .expect("chmod");
    let (code, _, err) = w.sh("sh", "cat /bin/sh > /workspace/setid-prog");
    assert_eq!(
        code, 0,
        "rewriting /workspace/setid-prog ({backend}): {err}"
    );
    let m = std::fs::metadata(&setid).expect("setid-prog");
    assert_eq!(
        m.mode() & 0o6000,
        0,
        "a setid program the guest rewrote ({backend}) keeps mode {:o}",
        m.mode()
    );
    assert!(m.len() > 1000, "the guest's bytes landed ({backend})");

    let mut args = vec!["sandbox", "exec", "sh", "--", "python3", "-c", ATTACK];
    args.extend(shares.iter().map(|(_, g)| g.as_str()));
    let out = w.svc(&args);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "the attack script: {said}{}\nsvcd:\n{}",
        String::from_utf8_lossy(&out.stderr),
        w.svcd_log()
    );
    for (host, guest) in &shares {
        assert!(
            said.contains(&format!("{guest} copy ok")),
            "the guest writes into {guest}:\n{said}"
        );
        let bad = offences(host);
        assert!(
            bad.is_empty(),
            "through {guest} ({backend}) the guest left on the host:\n{}\nthe guest saw:\n{said}",
            bad.join("\n")
        );
        // Refused with EPERM, not silently dropped.
        for step in [
            "chmod-setid",
            "create-setid",
            "mknod-setid",
            "block-device",
            "char-device",
            "dir-setgid",
        ] {
            assert!(
                said.contains(&format!("{guest} {step} 1\n")),
                "{step} in {guest} ({backend}) is not EPERM:\n{said}"
            );
        }
    }

    // Ordinary work still works, and lands as the owner's.
    for (host, guest) in &shares {
        let work = host.join("work");
        let (code, out, err) = w.sh(
            "sh",
            &format!("mkdir {guest}/work && sh -c '{WORK}' - {guest}/work"),
        );
        assert_eq!(
            (code, out.as_str()),
            (0, "1\nwork ok\n"),
            "ordinary work in {guest} ({backend}): {err}"
        );
        let note = std::fs::symlink_metadata(work.join("note")).expect("note");
        assert_eq!(
            (note.uid(), note.gid(), note.mode() & 0o7777),
            (OWNER, OWNER, 0o755),
            "chmod +x lands; the note is the owner's"
        );
        assert_eq!(
            std::fs::read_to_string(work.join("note")).expect("note"),
            "hi\nmore\n"
        );
        assert!(
            std::fs::symlink_metadata(work.join("fifo"))
                .expect("fifo")
                .file_type()
                .is_fifo()
        );
        assert!(work.join("repo/.git/HEAD").is_file());
        let bad = offences(host);
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
    w.destroy_checked("sh");
    let _ = std::fs::remove_dir_all(&base);
}

/// Everything under `dir` that is not the owner's, or carries a setid bit, or is a device.
fn offences(dir: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    let mut todo: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            let m = std::fs::symlink_metadata(&p).expect("stat");
            let t = m.file_type();
            if m.uid() != OWNER || m.gid() != OWNER {
                bad.push(format!("{}: owned by {}:{}", p.display(), m.uid(), m.gid()));
            }
            if m.mode() & 0o6000 != 0 {
                bad.push(format!("{}: mode {:o}", p.display(), m.mode()));
            }
            if t.is_block_device() || t.is_char_device() {
                bad.push(format!("{}: a device ({:x})", p.display(), m.rdev()));
            }
            if t.is_dir() {
                todo.push(p);
            }
        }
    }
    bad
}
