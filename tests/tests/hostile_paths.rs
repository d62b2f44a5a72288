//! Three holes a hostile guest and a second API user found in the perimeter, each kept shut:
//!
//! 1. A container guest's root sets `security.capability` on a file in a share owned by host
//!    root (a root-owned project, or a root-owned `credentials.agent_home`): the kernel would
//!    store it for host root, and any host user running the file would get `cap_setuid`. The
//!    container keeps no `CAP_SETFCAP`: the guest's `setxattr` fails and the file carries no
//!    capability.
//! 2. A container guest makes `.git/FETCH_HEAD` a symbolic link to a file of the owner outside
//!    the project: the owner's next `git fetch` on the host would write through it (remote
//!    branch names into, say, `~/.bashrc`). git never makes a link in `.git`, so
//!    `svc workspace down` names it, with the command that removes it.
//! 3. A second API user swaps its project's `.git` for a link to root's repository while svcd
//!    makes `.git/hooks` for it: svcd (root) must never make or chown a directory elsewhere.
//!    svcd works through a handle on `.git` opened with no link followed, so the race makes
//!    `up` fail, never create `hooks` in root's repository.

use std::{os::unix::fs::MetadataExt as _, process::Command};

use svc_tests::{
    project::{MINIMAL_WORKSPACE, SWAP, project_at},
    require_root,
    users::User,
    world::{World, git},
};

fn run(cmd: &str) -> String {
    let o = Command::new("sh").arg("-c").arg(cmd).output().expect("sh");
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const SETCAP: &str = r#"
import os, struct, shutil, sys
d = sys.argv[1]
shutil.copy("/usr/bin/python3", d + "/py")
os.setxattr(d + "/py", "security.capability", struct.pack("<IIIII", 0x02000001, 0xC0, 0, 0, 0))
print("set")
"#;

#[test]
fn a_guest_gives_no_file_capability_to_a_root_owned_share() {
    require_root();
    let w = World::start();
    let dir = project_at(&svc_tests::fresh_dir("fcap"), &[MINIMAL_WORKSPACE]);
    let ws = dir.to_str().expect("utf-8");
    w.workspace_up_ok(ws, "fcap");
    let out = w.svc(&[
        "sandbox",
        "exec",
        "fcap",
        "--",
        "python3",
        "-c",
        SETCAP,
        "/workspace",
    ]);
    eprintln!(
        "guest: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let py = dir.join("py");
    let proof = dir.join("proof");
    let said = run(&format!(
        "getcap {p}; setpriv --reuid=65534 --regid=65534 --clear-groups {p} -c \
         'import os; os.setuid(0); open(\"{proof}\", \"w\").write(str(os.getuid()))' 2>&1",
        p = py.display(),
        proof = proof.display()
    ));
    w.svc_ok(&["workspace", "down", "fcap"]);
    let escalated = proof.exists();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        !escalated,
        "host user nobody became root through a guest-set file capability:\n{said}"
    );
}

#[test]
fn a_guest_link_in_dot_git_is_named_at_down() {
    require_root();
    let w = World::start();
    let base = svc_tests::fresh_dir("fhs");
    let dir = base.join("proj");
    let up = base.join("up.git");
    project_at(&dir, &[MINIMAL_WORKSPACE]);
    git(
        &base,
        &[
            "init",
            "-q",
            "--bare",
            "-b",
            "main",
            up.to_str().expect("utf-8"),
        ],
    );
    git(&dir, &["init", "-q", "-b", "main"]);
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-q", "-m", "first"]);
    git(
        &dir,
        &["remote", "add", "origin", up.to_str().expect("utf-8")],
    );
    git(&dir, &["push", "-q", "origin", "main"]);
    let pwn = base.join("PWNED");
    // A branch the agent pushed (svc/** is what AllowedBranches lets it push).
    let evil = format!("svc/a';touch${{IFS}}{};'", pwn.display());
    git(
        &dir,
        &["push", "-q", "origin", &format!("HEAD:refs/heads/{evil}")],
    );
    let rc = base.join("victim_rc");
    std::fs::write(&rc, "# the owner's ~/.bashrc\n").expect("rc");
    run(&format!("chown -R 1234:1234 {}", base.display()));
    let ws = dir.to_str().expect("utf-8");
    w.workspace_up_ok(ws, "fhs");
    let (code, o, e) = w.sh(
        "fhs",
        &format!("ln -sf {} /workspace/.git/FETCH_HEAD", rc.display()),
    );
    assert_eq!(code, 0, "{o}{e}");
    // The report is on stderr.
    let out = w.svc(&["workspace", "down", "fhs"]);
    assert!(out.status.success(), "{out:?}");
    let down = String::from_utf8_lossy(&out.stderr).into_owned();
    let _ = std::fs::remove_dir_all(&base);
    assert!(
        down.contains(".git/FETCH_HEAD -> ")
            && down.contains("host git writes through it (remove: rm .git/FETCH_HEAD)"),
        "svc workspace down did not name the guest's link in .git: {down}"
    );
    let _ = pwn;
}

#[test]
fn a_member_cannot_make_svcd_create_a_directory_outside_its_project() {
    require_root();
    let w = World::start();
    let member = User::add(format!("svcatk-{}", std::process::id() % 100_000), None);
    let uid = member.uid;
    let ids = member.ids();
    // Root's repository without a hooks directory.
    let victim = svc_tests::fresh_dir("rr");
    git(&victim, &["init", "-q", "--template=", "-b", "main"]);
    // The member's project: `.git` without hooks, and a link to root's `.git` beside it.
    let proj = project_at(&svc_tests::fresh_dir("mp"), &[MINIMAL_WORKSPACE]);
    git(&proj, &["init", "-q", "--template=", "-b", "main"]);
    std::os::unix::fs::symlink(victim.join(".git"), proj.join("evil")).expect("link");
    run(&format!(
        "chown -R {uid}:65534 {0}; chown -h {uid}:65534 {0}/evil",
        proj.display()
    ));
    let mut swapper = Command::new("setpriv")
        .args(&ids)
        .args(["/usr/bin/python3", "-c", SWAP])
        .arg(proj.join(".git"))
        .arg(proj.join("evil"))
        .arg("240")
        .spawn()
        .expect("swapper");
    let hooks = victim.join(".git/hooks");
    let mut owned = false;
    let mut tries = 0;
    for i in 0..60 {
        tries = i + 1;
        let n = format!("race{i}");
        let _ = member.svc(
            &w,
            &World::workspace_up_args(proj.to_str().expect("utf-8"), &n),
        );
        let _ = w.svc(&["workspace", "down", &n]);
        if let Ok(m) = std::fs::metadata(&hooks) {
            if m.uid() == uid {
                owned = true;
                break;
            }
            let _ = std::fs::remove_dir(&hooks);
        }
        run(&format!(
            "rm -rf {p}/.git/hooks {p}/evil/hooks",
            p = proj.display()
        ));
    }
    let _ = swapper.kill();
    let _ = swapper.wait();
    let mut said = format!(
        "after {tries} tries: {}",
        run(&format!("stat -c '%U %u %a %n' {}", hooks.display()))
    );
    if owned {
        // The member plants a hook; root commits in its own repository.
        let marker = victim.join("ran-as");
        said += &run(&format!(
            "setpriv --reuid={uid} --regid=65534 --clear-groups sh -c 'printf \"#!/bin/sh\\nid -u > {m}\\n\" > {h}/pre-commit && chmod +x {h}/pre-commit'; \
             cd {v} && git -c user.name=r -c user.email=r@x commit -q --allow-empty -m root; echo pre-commit ran as uid $(cat {m})",
            m = marker.display(),
            h = hooks.display(),
            v = victim.display()
        ));
    }
    drop(member);
    let _ = std::fs::remove_dir_all(&victim);
    let _ = std::fs::remove_dir_all(&proj);
    assert!(
        !owned,
        "svcd (root) made a directory outside the member's project, owned by the member: {said}"
    );
}
