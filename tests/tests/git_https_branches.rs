//! AllowedBranches over HTTPS, when a sandbox asks (`--https-push-branches`): real git inside
//! a container sandbox pushes through the real svcd's proxy to the outside world's smart-HTTP
//! git server (`git http-backend`). A push to an allowed branch goes through; a push to
//! `main` is refused with the same line the SSH relay gives, on git's stderr, the server's refs
//! unchanged, the audit record naming every ref; an svcd restart keeps the choice. Without the
//! flag a push to `main` goes through, as the default says. A workspace whose
//! `.svc/config.yaml` says `egress.httpsPushBranches: true` gets the same rule.

use std::process::Command;

use svc_control::policy::ssh::ref_refusal;
use svc_tests::{require_root, world::World};

/// The id of `name` in the server's acme/widget (empty when it has none).
fn server_ref(w: &World, name: &str) -> String {
    let out = Command::new("git")
        .arg("--git-dir")
        .arg(w.dir.join("git/acme/widget.git"))
        .args(["rev-parse", "--verify", "-q", name])
        .output()
        .expect("git rev-parse");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

const GIT: &str = "git -c user.name=agent -c user.email=agent@svc.invalid \
                   -c \"http.extraHeader=Authorization: Bearer $CODE_HOST_TOKEN\"";

/// Clone acme/widget into /tmp/widget inside `name` and commit a change there.
fn clone_and_commit(w: &World, name: &str) {
    let (code, out, err) = w.sh(
        name,
        &format!(
            "set -e; cd /tmp && {GIT} clone -q https://code.test/acme/widget.git && cd widget && \
             echo {name} > change && git add change && {GIT} commit -q -m {name}"
        ),
    );
    assert_eq!(code, 0, "clone and commit in {name}: {out}{err}");
}

fn push(w: &World, name: &str, refspec: &str) -> (i32, String, String) {
    w.sh(
        name,
        &format!("cd /tmp/widget && {GIT} push origin {refspec}"),
    )
}

#[test]
fn https_pushes_are_held_to_allowed_branches_when_the_sandbox_asks() {
    require_root();
    let mut w = World::start();
    let v: serde_json::Value = serde_json::from_str(&w.svc_ok(&[
        "sandbox",
        "create",
        "--repo",
        "acme/widget",
        "--backend",
        "container",
        "--https-push-branches",
        "held",
        "--json",
    ]))
    .expect("json");
    assert_eq!(v["https_push_branches"], true, "{v}");
    let main = server_ref(&w, "refs/heads/main");
    assert!(!main.is_empty());
    clone_and_commit(&w, "held");

    // An allowed branch: through, and audited with its ref.
    let (code, out, err) = push(&w, "held", "HEAD:refs/heads/svc/held");
    assert_eq!(code, 0, "push to svc/held: {out}{err}");
    assert!(!server_ref(&w, "refs/heads/svc/held").is_empty());

    // main: refused with the SSH relay's line, on git's stderr; nothing moved.
    let line = ref_refusal("refs/heads/main");
    let (code, out, err) = push(&w, "held", "HEAD:refs/heads/main");
    assert_ne!(code, 0, "push to main went through: {out}{err}");
    assert!(err.contains(&line), "{line:?} not on git's stderr:\n{err}");
    assert_eq!(server_ref(&w, "refs/heads/main"), main, "main moved");
    // Two refs in one push, one of them main: neither moves.
    let (code, _, err) = push(
        &w,
        "held",
        "HEAD:refs/heads/svc/second HEAD:refs/heads/main",
    );
    assert_ne!(code, 0, "{err}");
    assert!(err.contains(&line), "{err}");
    assert!(server_ref(&w, "refs/heads/svc/second").is_empty());

    let audit = w.audit();
    let pushes: Vec<&serde_json::Value> = audit
        .iter()
        .filter(|r| r["layer"] == "http" && r["path"] == "/acme/widget.git/git-receive-pack")
        .collect();
    let names = |r: &serde_json::Value| -> Vec<String> {
        let mut n: Vec<String> = r["refs"]
            .as_array()
            .map(|a| a.iter().map(|u| u["name"].to_string()).collect())
            .unwrap_or_default();
        n.sort();
        n
    };
    assert!(
        pushes
            .iter()
            .any(|r| r["decision"] == "allow" && names(r) == ["\"refs/heads/svc/held\""]),
        "{pushes:#?}"
    );
    assert!(
        pushes.iter().any(|r| r["decision"] == "deny"
            && r["rule"] == "smart-http-push-refused"
            && r["status"] == 403
            && names(r) == ["\"refs/heads/main\"", "\"refs/heads/svc/second\""]),
        "{pushes:#?}"
    );

    // svcd restarts: the re-adopted sandbox keeps its choice.
    w.kill_svcd();
    w.start_svcd();
    let (code, out, err) = push(&w, "held", "HEAD:refs/heads/main");
    assert_ne!(code, 0, "after a restart: {out}{err}");
    assert!(err.contains(&line), "after a restart: {err}");
    assert_eq!(server_ref(&w, "refs/heads/main"), main);
    w.destroy_checked("held");

    // Without the flag: today's behaviour, any ref of the bound repository.
    let v: serde_json::Value = serde_json::from_str(&w.svc_ok(&[
        "sandbox",
        "create",
        "--repo",
        "acme/widget",
        "--backend",
        "container",
        "open",
        "--json",
    ]))
    .expect("json");
    assert_eq!(v["https_push_branches"], false, "{v}");
    clone_and_commit(&w, "open");
    let (code, out, err) = push(&w, "open", "HEAD:refs/heads/main");
    assert_eq!(code, 0, "push to main without the flag: {out}{err}");
    assert_ne!(server_ref(&w, "refs/heads/main"), main);
    w.destroy_checked("open");

    // A workspace asks in its .svc/config.yaml (svcd reads it from the egress section).
    let main = server_ref(&w, "refs/heads/main");
    let project = w.project(
        "held-project",
        &[
            (".svc/workspace.json", r#"{"version":1}"#),
            (".svc/config.yaml", "egress:\n  httpsPushBranches: true\n"),
        ],
    );
    let dir = project.to_str().expect("utf-8");
    let up = w.svc(&[
        "workspace",
        "up",
        dir,
        "--name",
        "ws",
        "--backend",
        "container",
        "--trust",
        "--repo",
        "acme/widget",
    ]);
    assert!(up.status.success(), "{up:?}");
    assert_eq!(w.show("ws")["https_push_branches"], true);
    clone_and_commit(&w, "ws");
    let (code, out, err) = push(&w, "ws", "HEAD:refs/heads/main");
    assert_ne!(code, 0, "push to main from the workspace: {out}{err}");
    assert!(err.contains(&line), "{err}");
    assert_eq!(server_ref(&w, "refs/heads/main"), main);
    w.svc_ok(&["workspace", "down", "ws"]);
}
