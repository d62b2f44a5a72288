//! One perimeter per project, whichever command makes its sandbox, and `svc egress explain
//! --sandbox` deciding as the running sandbox does: against the real svcd, container
//! sandboxes and the world's HTTPS servers.
//!
//! - A project's `.svc/config.yaml` `allow` host is reachable from a sandbox made by `svc
//!   sandbox create --workspace DIR` and from one made by `svc workspace up DIR`; a host it
//!   does not list is not, from either.
//! - `svc egress explain --sandbox NAME` says ALLOW for the first and refuses the second, as
//!   the sandbox did, naming the sandbox and its allowlist generation; after a live `svc
//!   sandbox allow`, the new generation and the new answer (the project's host still allowed),
//!   and the same after an svcd restart re-adopts the sandbox.
//! - Another API user cannot explain against root's sandbox: refused, naming the owner.
//! - `svc sandbox create --context-path` warns on stderr (not a terminal here) that the
//!   sandbox is allow-all for 72 hours, and until when; explain against it says allow-all.

use std::path::PathBuf;

use svc_tests::{project::text, require_root, world::World};

/// A project under the world's directory: `.svc/workspace.json` (no hooks) and a
/// `.svc/config.yaml` that allows allowed.example.test.
fn project(w: &World) -> PathBuf {
    w.project(
        "proj",
        &[
            (".svc/workspace.json", r#"{"version":1}"#),
            (
                ".svc/config.yaml",
                "egress:\n  allow: [allowed.example.test]\n",
            ),
        ],
    )
}

/// `svc egress explain --sandbox NAME --json GET URL`: its exit code and answer.
fn explain(w: &World, name: &str, url: &str) -> (Option<i32>, serde_json::Value) {
    let out = w.svc(&["egress", "explain", "--sandbox", name, "--json", "GET", url]);
    let doc = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("explain {name} {url}: {e}: {}", text(&out)));
    (out.status.code(), doc)
}

/// The sandbox reaches `allowed.example.test` and not `forbidden.example.test`, and explain
/// against it says the same at allowlist generation `generation`.
fn agrees(w: &World, name: &str, generation: u32) {
    assert_eq!(
        w.curl_rc(name, "https://allowed.example.test/"),
        0,
        "{name}: the project's allow host\nsvcd:\n{}",
        w.svcd_log()
    );
    let (code, doc) = explain(w, name, "https://allowed.example.test/");
    assert_eq!(code, Some(0), "{name}: {doc}");
    assert_eq!(doc["decision"]["verdict"], "allow", "{name}: {doc}");
    assert_eq!(doc["sandbox"]["name"], name, "{doc}");
    assert_eq!(doc["sandbox"]["policyGeneration"], generation, "{doc}");
    assert_eq!(doc["sandbox"]["mode"], "curated", "{doc}");
    assert!(doc.get("read").is_none(), "no files are read: {doc}");
}

#[test]
fn a_projects_allow_host_is_open_whichever_command_made_the_sandbox_and_explain_agrees() {
    require_root();
    let mut w = World::start();
    let dir = project(&w);
    let d = dir.to_str().expect("utf-8");
    w.svc_ok(&[
        "sandbox",
        "create",
        "--workspace",
        d,
        "--trust",
        "--backend",
        "container",
        "made",
    ]);
    w.workspace_up_ok(d, "up");
    for name in ["made", "up"] {
        agrees(&w, name, 0);
        assert_ne!(
            w.curl_rc(name, "https://forbidden.example.test/"),
            0,
            "{name}"
        );
        let (code, doc) = explain(&w, name, "https://forbidden.example.test/");
        assert_eq!(code, Some(1), "{name}: {doc}");
        assert_eq!(doc["decision"]["verdict"], "deny", "{doc}");
        assert_eq!(doc["decision"]["rule"], "host-not-allowed", "{doc}");
    }

    // A live change: explain answers from the new policy, and says its generation.
    w.svc_ok(&[
        "sandbox",
        "allow",
        "made",
        "--add-host",
        "forbidden.example.test",
    ]);
    agrees(&w, "made", 1);
    let (code, doc) = explain(&w, "made", "https://forbidden.example.test/");
    assert_eq!(code, Some(0), "{doc}");
    assert_eq!(w.curl_rc("made", "https://forbidden.example.test/"), 0);
    let human = w.svc_ok(&[
        "egress",
        "explain",
        "--sandbox",
        "made",
        "GET",
        "https://forbidden.example.test/",
    ]);
    assert!(
        human.contains("sandbox: made, allowlist generation 1, Curated mode"),
        "{human}"
    );
    // svcd restarts: the re-adopted sandbox keeps the project's perimeter and its change.
    w.kill_svcd();
    w.start_svcd();
    agrees(&w, "made", 1);

    // Another API user may not explain against root's sandbox.
    let nobody = ["--reuid=65534", "--regid=65534", "--clear-groups"];
    let out = w.svc_as(
        &nobody,
        &[
            "egress",
            "explain",
            "--sandbox",
            "made",
            "GET",
            "https://allowed.example.test/",
        ],
    );
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("belongs to uid 0")
            && t.contains("only its owner or root may explain requests against its policy"),
        "{t}"
    );
}

#[test]
fn a_context_path_sandbox_is_announced_as_allow_all_until_its_window_ends() {
    require_root();
    let w = World::start();
    let dir = project(&w);
    let out = w.svc(&[
        "sandbox",
        "create",
        "--context-path",
        dir.to_str().expect("utf-8"),
        "ctx",
    ]);
    let t = text(&out);
    assert!(out.status.success(), "{t}\nsvcd:\n{}", w.svcd_log());
    let err = String::from_utf8_lossy(&out.stderr);
    let window_ends = w.show("ctx")["window_ends"]
        .as_str()
        .expect("an allow-all window")
        .to_owned();
    assert!(
        err.contains(&format!(
            "warning: sandbox ctx is allow-all for 72 hours (until {window_ends}"
        )),
        "{err}"
    );
    let (code, doc) = explain(&w, "ctx", "https://forbidden.example.test/");
    assert_eq!(code, Some(0), "{doc}");
    assert_eq!(doc["decision"]["rule"], "allow-all", "{doc}");
    assert_eq!(doc["sandbox"]["mode"], "allow-all", "{doc}");
}
