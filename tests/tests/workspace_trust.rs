//! A project's perimeter is what its owner approved, and what host git executes is not the
//! guest's to change: against the real svcd, CLI, git and container sandboxes.
//!
//! - a guest's edit of `.svc/config.yaml` is refused at the owner's next `svc workspace up`,
//!   with a diff against the approved perimeter, until the owner approves it again
//!   (`svc workspace trust`); each API user's approval is their own;
//! - inside the sandbox `.git/config` and `.git/hooks` are read-only (not remountable, `.git`
//!   not renamable) while commits, branches and fetches work; a workspace may opt out;
//! - `svc workspace down` reports what changed in what host git executes, including what no
//!   bind can stop (a guest-written `.git/commondir` and the config it points at, a nested
//!   repository added as a gitlink with its own `core.fsmonitor` and hooks), and the next
//!   `svc workspace up` names them on stderr before it creates anything; a linked worktree's
//!   redirections are read-only while commits, branches, checkouts and fetches work.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use svc_tests::{
    project::{path_str as p, text},
    require_root,
    world::{World, git},
};

/// The arguments of `svc workspace up DIR --name NAME --backend container EXTRA…`.
fn up_args<'a>(dir: &'a Path, name: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["workspace", "up", p(dir), "--name", name, "--backend"];
    args.push("container");
    args.extend(extra);
    args
}

const NOBODY: [&str; 3] = ["--reuid=65534", "--regid=65534", "--clear-groups"];

const CONFIG: &str = "egress:\n  policy:\n    allowed.example.test:\n      paths: [\"/v1/**\"]\n";

#[test]
fn a_guest_edit_of_the_perimeter_is_refused_at_the_next_up_until_its_owner_approves_it() {
    require_root();
    let w = World::start();
    let dir = w.project_owned(
        "trusted",
        65534,
        &[
            (".svc/workspace.json", r#"{"version":1}"#),
            (".svc/config.yaml", CONFIG),
        ],
    );
    let up = |name: &str, extra: &[&str]| w.svc_as(&NOBODY, &up_args(&dir, name, extra));
    let none_made = || {
        assert_eq!(
            w.svc_ok(&["sandbox", "list", "--json"]).trim(),
            "[]",
            "nothing was made"
        );
    };

    // Never approved: shown and refused (no terminal here), naming the approving command.
    let out = up("t1", &[]);
    let said = text(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{said}\nsvcd:\n{}",
        w.svcd_log()
    );
    assert!(said.contains("not approved by you (uid 65534)"), "{said}");
    assert!(
        said.contains("allowed.example.test"),
        "the content is shown:\n{said}"
    );
    assert!(
        said.contains(&format!("svc workspace trust {}", p(&dir))),
        "{said}"
    );
    none_made();
    let check = w.svc_as(&NOBODY, &["config", "check", p(&dir)]);
    assert!(
        text(&check).contains("approval      not approved by uid 65534"),
        "{}",
        text(&check)
    );

    // Approved: recorded in svcd's state, not in the project; up goes ahead.
    let trust = w.svc_as(&NOBODY, &["workspace", "trust", p(&dir)]);
    assert!(trust.status.success(), "{}", text(&trust));
    assert!(
        text(&trust).contains("approved for uid 65534"),
        "{}",
        text(&trust)
    );
    let records: Vec<_> = std::fs::read_dir(w.dir.join("state/trust/65534"))
        .expect("the approval is in svcd's state directory")
        .collect();
    assert_eq!(records.len(), 1, "one approval for one project");
    let check = w.svc_as(&NOBODY, &["config", "check", p(&dir)]);
    assert!(
        text(&check).contains("approval      approved by uid 65534"),
        "{}",
        text(&check)
    );
    let out = up("t1", &[]);
    assert!(
        out.status.success(),
        "{}\nsvcd:\n{}",
        text(&out),
        w.svcd_log()
    );

    // The guest rewrites its own next perimeter.
    let (code, _, err) = w.sh(
        "t1",
        "printf 'egress:\\n  allow: [evil.example.test]\\n  policy:\\n    allowed.example.test:\\n      paths: [\"/**\"]\\n' > /workspace/.svc/config.yaml",
    );
    assert_eq!(code, 0, "{err}");
    w.svc_ok(&["workspace", "down", "t1"]);

    // The owner's next up refuses it, with the change as a diff.
    let out = up("t2", &[]);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("changed since you (uid 65534) approved it"),
        "{said}"
    );
    for line in [
        "+   allow:",
        "+   - evil.example.test",
        "-       - /v1/**",
        "+       - /**",
    ] {
        assert!(said.contains(line), "{line:?} not in the diff:\n{said}");
    }
    none_made();
    let check = w.svc_as(&NOBODY, &["config", "check", p(&dir)]);
    assert!(
        text(&check).contains("approval      CHANGED"),
        "{}",
        text(&check)
    );

    // Another API user's approval is their own: root never approved this project.
    let out = w.svc(&up_args(&dir, "t3", &[]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("not approved by you (uid 0)"),
        "{}",
        text(&out)
    );
    // Root approves it (with --trust, as a script that reviewed it would)…
    let out = w.svc(&up_args(&dir, "t3", &["--trust"]));
    assert!(out.status.success(), "{}", text(&out));
    w.svc_ok(&["workspace", "down", "t3"]);
    // … which changes nothing for uid 65534.
    let out = up("t4", &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("changed since you (uid 65534)"),
        "{}",
        text(&out)
    );
    none_made();

    // `sandbox create --workspace` is held to the same approval.
    let out = w.svc_as(
        &NOBODY,
        &["sandbox", "create", "--workspace", p(&dir), "t5"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("changed since you"), "{}", text(&out));
    none_made();

    // svcd is the gate, not only the CLI: a request claiming the approved perimeter while its
    // workspace carries another egress section is refused.
    let req = serde_json::json!({
        "name": "t6",
        "backend": "container",
        "workspace": {"root": p(&dir), "egress": {"allow": ["evil.example.test"]}},
        "project": {"root": p(&dir), "perimeter": {}},
    });
    let out = Command::new("curl")
        .args(["-sS", "--unix-socket", p(&w.socket), "-X", "POST"])
        .args(["-d", &req.to_string(), "http://svcd/v1/sandboxes"])
        .output()
        .expect("curl");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("is not the perimeter's"),
        "{}",
        text(&out)
    );
    none_made();

    // Approved again by its owner: up goes ahead with the new perimeter.
    let trust = w.svc_as(&NOBODY, &["workspace", "trust", p(&dir)]);
    assert!(trust.status.success(), "{}", text(&trust));
    let out = up("t7", &[]);
    assert!(out.status.success(), "{}", text(&out));
    w.svc_ok(&["workspace", "down", "t7"]);
}

/// A project that is a git repository with one commit, owned by root.
fn repo_project(w: &World, name: &str, workspace_json: &str) -> PathBuf {
    let dir = w.project(name, &[(".svc/workspace.json", workspace_json)]);
    git(&dir, &["init", "-q", "-b", "main"]);
    git(&dir, &["add", "-A"]);
    git(&dir, &["commit", "-q", "-m", "first"]);
    dir
}

#[test]
fn git_config_and_hooks_are_read_only_in_a_container_sandbox_while_commits_still_work() {
    require_root();
    let w = World::start();
    let dir = repo_project(&w, "gitro", r#"{"version":1}"#);
    let config_before = std::fs::read(dir.join(".git/config")).expect("config");
    up(&w, &dir, "gitro");

    // What host git executes cannot be changed, nor the mounts undone.
    for (attempt, script) in [
        (
            "append to config",
            "echo '[core]' >> /workspace/.git/config",
        ),
        (
            "git config",
            "git -C /workspace config core.fsmonitor /workspace/evil",
        ),
        (
            "add a hook",
            "echo 'touch /tmp/pwned' > /workspace/.git/hooks/post-checkout",
        ),
        ("rename .git", "mv /workspace/.git /workspace/git-moved"),
        (
            "rename hooks",
            "mv /workspace/.git/hooks /workspace/.git/hooks-moved",
        ),
        (
            "replace config",
            "mv /workspace/.git/config /workspace/.git/config-moved",
        ),
        (
            "remount config",
            "mount -o remount,rw,bind /workspace/.git/config",
        ),
        (
            "remount hooks",
            "mount -o remount,rw,bind /workspace/.git/hooks",
        ),
        ("unmount config", "umount /workspace/.git/config"),
        ("unmount hooks", "umount -l /workspace/.git/hooks"),
        (
            "remount in a user namespace of its own",
            "unshare -Urm sh -c 'mount -o remount,rw,bind /workspace/.git/config && echo x >> /workspace/.git/config'",
        ),
        (
            "unmount in a user namespace of its own",
            "unshare -Urm sh -c 'umount /workspace/.git/hooks && touch /workspace/.git/hooks/pre-commit'",
        ),
    ] {
        let (code, out, err) = w.sh("gitro", script);
        assert_ne!(code, 0, "{attempt} succeeded: {out}{err}");
    }
    assert_eq!(
        std::fs::read(dir.join(".git/config")).expect("config"),
        config_before,
        "the host's .git/config is unchanged"
    );
    assert!(!dir.join(".git/hooks/post-checkout").exists());
    assert!(!dir.join(".git/hooks/pre-commit").exists());
    assert!(dir.join(".git/config").exists() && !dir.join("git-moved").exists());

    // Commits, branches and fetches still work.
    let (code, out, err) = w.sh(
        "gitro",
        "set -e; cd /workspace; git config --global user.name g; git config --global user.email g@x; \
         git config --global --add safe.directory '*'; \
         echo a > a.txt; git add a.txt; git commit -q -m from-guest; git branch topic; \
         git init -q -b main /tmp/other; cd /tmp/other; echo b > b; git add b; git commit -q -m other; \
         cd /workspace; git fetch -q /tmp/other main:refs/remotes/other/main; git log --oneline -1",
    );
    assert_eq!(code, 0, "git in the guest: {out}{err}");
    assert!(git(&dir, &["log", "--oneline", "-1"]).contains("from-guest"));
    assert!(git(&dir, &["branch", "--list", "topic"]).contains("topic"));
    assert!(git(&dir, &["rev-parse", "refs/remotes/other/main"]).len() >= 40);

    // Nothing changed in what host git executes: down reports nothing.
    let down = w.svc(&["workspace", "down", "gitro"]);
    assert!(down.status.success(), "{}", text(&down));
    assert!(
        !text(&down).contains("what git runs as you"),
        "{}",
        text(&down)
    );
}

#[test]
fn workspace_down_reports_executable_git_changes_when_the_workspace_opted_out() {
    require_root();
    let w = World::start();
    let dir = repo_project(
        &w,
        "gitrw",
        r#"{"version":1,"auth":{"defaults":{"gitConfigWritable":true}}}"#,
    );
    up(&w, &dir, "gitrw");
    // Opted out: the guest may write them (the risk the docs name).
    let (code, out, err) = w.sh(
        "gitrw",
        "set -e; git config --global --add safe.directory '*'; \
         git -C /workspace config core.fsmonitor /workspace/evil; \
         git -C /workspace config alias.st '!sh -c id'; \
         printf '#!/bin/sh\\n' > /workspace/.git/hooks/post-checkout; \
         chmod +x /workspace/.git/hooks/post-checkout; \
         git -C /workspace config user.name harmless",
    );
    assert_eq!(code, 0, "{out}{err}");
    let down = w.svc(&["workspace", "down", "gitrw"]);
    let said = text(&down);
    assert!(down.status.success(), "{said}");
    assert!(said.contains("what git runs as you in"), "{said}");
    for change in [
        "config core.fsmonitor = \"/workspace/evil\" (new)",
        "config alias.st = \"!sh -c id\" (new)",
        "hook post-checkout (new)",
    ] {
        assert!(said.contains(change), "{change:?} not reported:\n{said}");
    }
    assert!(!said.contains("user.name"), "only executable keys: {said}");
}

/// `svc workspace up DIR` for a project (approved before), container backend.
fn up(w: &World, dir: &Path, name: &str) -> Output {
    let up = w.svc(&up_args(dir, name, &["--trust"]));
    assert!(
        up.status.success(),
        "{}\nsvcd:\n{}",
        text(&up),
        w.svcd_log()
    );
    up
}

/// The guest's git may work on /workspace (owned by the host's root, the guest's own root).
const GUEST_GIT: &str = "set -e; git config --global user.name g; git config --global user.email g@x; \
                         git config --global --add safe.directory '*'";

#[test]
fn a_commondir_written_by_the_guest_is_reported_at_down_and_at_the_next_up() {
    require_root();
    let w = World::start();
    let dir = repo_project(&w, "gitcd", r#"{"version":1}"#);
    // The owner has a linked worktree outside the project: .git/worktrees exists.
    let outside = w.dir.join("gitcd-topic");
    git(&dir, &["worktree", "add", "-q", p(&outside), "-b", "topic"]);
    up(&w, &dir, "gitcd");

    // The linked worktree's redirections are read-only; commits, branches, checkouts and
    // fetches still work beside them.
    let (code, out, err) = w.sh(
        "gitcd",
        "echo /tmp/evil > /workspace/.git/worktrees/gitcd-topic/commondir",
    );
    assert_ne!(
        code, 0,
        "the guest rewrote a worktree's commondir: {out}{err}"
    );
    let (code, out, err) = w.sh(
        "gitcd",
        &format!(
            "{GUEST_GIT}; cd /workspace; echo a > a.txt; git add a.txt; git commit -q -m g; \
             git branch side; git checkout -q side; git checkout -q main; \
             git init -q -b main /tmp/o; cd /tmp/o; git commit -q --allow-empty -m o; \
             cd /workspace; git fetch -q /tmp/o main:refs/remotes/o/main"
        ),
    );
    assert_eq!(code, 0, "git in the guest: {out}{err}");

    // The hole: .git stays writable, so the guest can point the common directory at a config
    // of its own (git would take core.fsmonitor from there at the owner's next git status).
    let (code, out, err) = w.sh(
        "gitcd",
        "set -e; mkdir -p /workspace/evil/hooks; \
         printf '[core]\\n\\trepositoryformatversion = 0\\n\\tfsmonitor = /workspace/evil/run\\n' \
           > /workspace/evil/config; \
         echo ../evil > /workspace/.git/commondir",
    );
    assert_eq!(code, 0, "{out}{err}");
    let down = w.svc(&["workspace", "down", "gitcd"]);
    let said = text(&down);
    assert!(down.status.success(), "{said}");
    for names in [
        "what git runs as you in",
        ".git/commondir = \"../evil\": git takes config and hooks from there (remove: rm .git/commondir) (new)",
        "evil/config: core.fsmonitor = \"/workspace/evil/run\" (remove: git config --file evil/config --unset-all core.fsmonitor) (new)",
    ] {
        assert!(
            said.contains(names),
            "{names:?} not reported at down:\n{said}"
        );
    }

    // The next up says so (on stderr, before it asks svcd for anything) and still comes up:
    // the owner decides.
    let again = up(&w, &dir, "gitcd");
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(
        said.contains("git on this host would run code"),
        "no warning at up:\n{said}"
    );
    for names in [
        ".git/commondir = \"../evil\"",
        "evil/config: core.fsmonitor",
    ] {
        assert!(
            said.contains(names),
            "{names:?} not reported at up:\n{said}"
        );
    }
    let down = w.svc(&["workspace", "down", "gitcd"]);
    assert!(down.status.success(), "{}", text(&down));
}

#[test]
fn a_gitlinked_nested_repository_is_reported_at_down() {
    require_root();
    let w = World::start();
    let dir = repo_project(&w, "gitnest", r#"{"version":1}"#);
    up(&w, &dir, "gitnest");
    // A nested repository with an executable config, added to the index as a gitlink: the
    // owner's next git status runs `git status` inside it, with its core.fsmonitor.
    let (code, out, err) = w.sh(
        "gitnest",
        &format!(
            "{GUEST_GIT}; cd /workspace; git init -q -b main sub; cd sub; \
             git commit -q --allow-empty -m s; git config core.fsmonitor /workspace/sub/run; \
             printf '#!/bin/sh\\n' > .git/hooks/post-checkout; cd ..; git add sub 2>/dev/null; \
             git ls-files -s sub"
        ),
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.starts_with("160000 "), "no gitlink: {out}");
    let down = w.svc(&["workspace", "down", "gitnest"]);
    let said = text(&down);
    assert!(down.status.success(), "{said}");
    for names in [
        "what git runs as you in",
        "gitlink sub (dir): host git looks into it",
        "sub/.git/config: core.fsmonitor = \"/workspace/sub/run\"",
        "hook sub/.git/hooks/post-checkout",
    ] {
        assert!(
            said.contains(names),
            "{names:?} not reported at down:\n{said}"
        );
    }
}
