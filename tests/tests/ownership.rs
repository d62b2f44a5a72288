//! API callers are not each other: two real users of the host, both members of svcd's API
//! group (the World's `nogroup`), against the real svcd through the real `svc` binary (run
//! under `setpriv` with each user's ids: the peer credentials svcd reads are theirs).
//!
//! - B cannot show, exec in (plain and upgraded), destroy, pause, resume, fork, change the
//!   allowlist of, or read the workspace log of A's sandbox: each a 403 naming A; B's list,
//!   events and audit reads do not show it. Root acts on both.
//! - B cannot bind A's stored secret into its own sandbox, nor rotate, remove or share it, and
//!   does not see it listed: each answered as for a missing secret, A never named (storing
//!   one under the same name says only that the name is taken); once A shares it with a group
//!   B is in, B can use it (the real value reaches the upstream through B's sandbox) but still
//!   not change it; after unshare, not.
//! - Events: B reads neither root's nor A's project approvals, nor A's secrets' events.
//! - B cannot share a directory owned by A into a sandbox.

use std::os::unix::fs::PermissionsExt as _;

use svc_tests::{
    project::{MINIMAL_WORKSPACE, chown_tree, text},
    require_root,
    users::{API_GID, Group, User},
    world::World,
};

/// Two users A and B in the API group, B also in a group of its own that A may share with.
struct Two {
    a: User,
    b: User,
    // Dropped after the users that are its members.
    group: Group,
}

fn two_users() -> Two {
    // Unique per call: the tests of this file run at once in one process, and each one's users
    // are deleted when it ends.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tag = format!("{}x{n}", std::process::id() % 100_000);
    let group = Group::add(format!("svcown-g{tag}"));
    let a = User::add(format!("svcown-a{tag}"), None);
    let b = User::add(format!("svcown-b{tag}"), Some(&group.0));
    Two { a, b, group }
}

fn ok_as(w: &World, u: &User, args: &[&str]) -> String {
    let out = u.svc(w, args);
    assert!(
        out.status.success(),
        "{} ran svc {args:?}: {}\nsvcd:\n{}",
        u.name,
        text(&out),
        w.svcd_log()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `svc …` as `u` is refused with a message that contains every one of `says`.
fn refused_as(w: &World, u: &User, args: &[&str], says: &[&str]) {
    let out = u.svc(w, args);
    let t = text(&out);
    assert!(!out.status.success(), "{} ran svc {args:?}: {t}", u.name);
    for s in says {
        assert!(
            t.contains(s),
            "{} ran svc {args:?}: expected {s:?} in {t}",
            u.name
        );
    }
}

/// `svc …` as `u` is refused saying `says`, and names nothing of `owner`'s.
fn hidden_from(w: &World, u: &User, owner: &User, args: &[&str], says: &str) {
    let out = u.svc(w, args);
    let t = text(&out);
    assert!(!out.status.success(), "{} ran svc {args:?}: {t}", u.name);
    assert!(
        t.contains(says),
        "{} ran svc {args:?}: expected {says:?} in {t}",
        u.name
    );
    assert!(
        !t.contains(&owner.name) && !t.contains("belongs to"),
        "{} ran svc {args:?}: the answer names the owner: {t}",
        u.name
    );
}

fn names(list_json: &str) -> Vec<String> {
    let v: Vec<serde_json::Value> = serde_json::from_str(list_json).expect("list json");
    v.iter()
        .map(|s| s["name"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[test]
fn members_act_only_on_their_own_sandboxes() {
    require_root();
    let w = World::start();
    let two = two_users();
    let (a, b) = (&two.a, &two.b);
    ok_as(
        &w,
        a,
        &[
            "sandbox",
            "create",
            "--allow-host",
            "allowed.example.test",
            "sa",
        ],
    );
    ok_as(&w, b, &["sandbox", "create", "sb"]);
    // A's guest makes audit records (DNS) and A's sandbox has events.
    let out = ok_as(
        &w,
        a,
        &[
            "sandbox",
            "exec",
            "sa",
            "--",
            "getent",
            "hosts",
            "allowed.example.test",
        ],
    );
    assert!(out.contains("192.0.2."), "{out}");

    let owner = a.named();
    let refusals: &[(&[&str], &str)] = &[
        (
            &["sandbox", "show", "sa"],
            "only its owner or root may show it",
        ),
        (
            &["sandbox", "exec", "sa", "--", "id"],
            "only its owner or root may exec in it",
        ),
        (
            &["sandbox", "exec", "-i", "sa", "--", "id"],
            "only its owner or root may exec in it",
        ),
        (
            &["sandbox", "pause", "sa"],
            "only its owner or root may pause it",
        ),
        (
            &["sandbox", "resume", "sa"],
            "only its owner or root may resume it",
        ),
        (
            &["sandbox", "fork", "sa", "sb2"],
            "only its owner or root may fork it",
        ),
        (
            &[
                "sandbox",
                "allow",
                "sa",
                "--add-host",
                "attacker.example.test",
            ],
            "only its owner or root may change its allowlist",
        ),
        (
            &["workspace", "logs", "sa"],
            "only its owner or root may read its workspace log",
        ),
        (
            &["sandbox", "destroy", "sa"],
            "only its owner or root may destroy it",
        ),
    ];
    for (args, says) in refusals {
        refused_as(
            &w,
            b,
            args,
            &[&format!("sandbox \"sa\" belongs to {owner}"), says],
        );
    }
    assert_eq!(
        w.show("sa")["state"],
        "running",
        "B's attempts changed nothing"
    );
    let hosts = w.show("sa")["allowed_hosts"].to_string();
    assert!(!hosts.contains("attacker"), "{hosts}");

    // Recorded and shown.
    let shown: serde_json::Value =
        serde_json::from_str(&ok_as(&w, a, &["sandbox", "show", "sa", "--json"])).expect("json");
    assert_eq!(shown["owner_uid"], a.uid, "{shown}");
    assert_eq!(shown["owner"], a.name.as_str(), "{shown}");
    assert!(ok_as(&w, a, &["sandbox", "show", "sa"]).contains(&a.name));
    // Lists, events and audit reads: each sees its own, root all.
    assert_eq!(names(&ok_as(&w, b, &["sandbox", "list", "--json"])), ["sb"]);
    assert_eq!(names(&ok_as(&w, a, &["sandbox", "list", "--json"])), ["sa"]);
    assert_eq!(
        names(&w.svc_ok(&["sandbox", "list", "--json"])),
        ["sa", "sb"]
    );
    let b_events = ok_as(&w, b, &["events", "--json"]);
    assert!(
        !b_events.contains("\"sa\""),
        "B reads A's events: {b_events}"
    );
    assert!(
        b_events.contains("\"sb\""),
        "B reads its own events: {b_events}"
    );
    assert!(ok_as(&w, a, &["events", "--json"]).contains("\"sa\""));
    let root_audit = w.svc_ok(&["audit", "--sandbox", "sa", "--json"]);
    assert!(root_audit.contains("allowed.example.test"), "{root_audit}");
    let a_audit = ok_as(&w, a, &["audit", "--sandbox", "sa", "--json"]);
    assert!(a_audit.contains("allowed.example.test"), "{a_audit}");
    let b_audit = ok_as(&w, b, &["audit", "--json"]);
    assert!(
        !b_audit.contains("\"sa\""),
        "B reads A's audit records: {b_audit}"
    );

    // Root acts on both.
    let (code, out, _) = w.sh("sa", "echo root-in-a");
    assert_eq!((code, out.trim()), (0, "root-in-a"));
    let (code, out, _) = w.sh("sb", "echo root-in-b");
    assert_eq!((code, out.trim()), (0, "root-in-b"));
    w.svc_ok(&["sandbox", "destroy", "sb"]);
    // And each owner on its own.
    ok_as(&w, a, &["sandbox", "destroy", "sa"]);
    assert_eq!(w.svc_ok(&["sandbox", "list", "--json"]).trim(), "[]");
}

const VALUE: &str = "a-secret-of-alice-7f3e";

/// What the outside world's allowed host last received as Authorization on `path`.
fn create_with_gh(name: &str) -> Vec<&str> {
    vec![
        "sandbox",
        "create",
        name,
        "--allow-host",
        "allowed.example.test",
        "--secret",
        "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN@store:gh",
    ]
}

#[test]
fn a_stored_secret_is_usable_only_by_its_owner_until_shared_with_a_group() {
    require_root();
    let w = World::start();
    let two = two_users();
    let (a, b) = (&two.a, &two.b);
    // A stores it (the value from a file only A may read).
    let file = w.dir.join("alice-value");
    std::fs::write(&file, VALUE).expect("value");
    std::os::unix::fs::chown(&file, Some(a.uid), None).expect("chown");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let file = file.to_str().expect("utf-8");
    ok_as(&w, a, &["secret", "set", "gh", "--from-file", file]);

    // B: not listed, not usable, not changeable, and answered as if it were not there: neither
    // its owner nor more than that the name is taken (secret names are one namespace).
    let listed = ok_as(&w, b, &["secret", "list", "--json"]);
    assert!(!listed.contains("\"gh\""), "{listed}");
    let absent = "no secret gh in the store";
    hidden_from(&w, b, a, &create_with_gh("b-steals"), absent);
    let attacker = [
        "sandbox",
        "create",
        "b-steals2",
        "--allow-host",
        "attacker.example.test",
        "--secret",
        "SVC_CRED_ATTACKER_EXAMPLE_TEST_TOKEN@store:gh",
    ];
    hidden_from(&w, b, a, &attacker, absent);
    let missing = "no secret named \"gh\" (svc secret list shows them)";
    hidden_from(&w, b, a, &["secret", "rm", "gh"], missing);
    hidden_from(
        &w,
        b,
        a,
        &["secret", "share", "gh", "--group", &two.group.0],
        missing,
    );
    let bobs = w.dir.join("bob-value");
    std::fs::write(&bobs, "bobs-value").expect("value");
    std::os::unix::fs::chown(&bobs, Some(b.uid), None).expect("chown");
    let bobs = bobs.to_str().expect("utf-8");
    hidden_from(
        &w,
        b,
        a,
        &["secret", "rotate", "gh", "--from-file", bobs],
        missing,
    );
    hidden_from(
        &w,
        b,
        a,
        &["secret", "set", "gh", "--from-file", bobs],
        "the secret name \"gh\" is taken",
    );
    // The same answers as for a name nobody holds.
    let nobodys = text(&b.svc(&w, &["secret", "rm", "nosuch"]));
    assert!(
        nobodys.contains("no secret named \"nosuch\" (svc secret list shows them)"),
        "{nobodys}"
    );
    let not_shared = format!("secret \"gh\" belongs to {}", a.named());
    assert_eq!(
        names(&w.svc_ok(&["sandbox", "list", "--json"])),
        Vec::<String>::new()
    );

    let listed: serde_json::Value =
        serde_json::from_str(&ok_as(&w, a, &["secret", "list", "--json"])).expect("json");
    assert_eq!(listed[0]["owner_uid"], a.uid, "{listed}");

    // A shares it with a group B is in: B may use it, and the real value reaches the upstream.
    let shared = ok_as(
        &w,
        a,
        &["secret", "share", "gh", "--group", &two.group.0, "--json"],
    );
    assert!(shared.contains(&two.group.0), "{shared}");
    assert!(ok_as(&w, b, &["secret", "list"]).contains(&two.group.0));
    ok_as(&w, b, &create_with_gh("b-uses"));
    ok_as(
        &w,
        b,
        &[
            "sandbox",
            "exec",
            "b-uses",
            "--",
            "sh",
            "-c",
            "curl -sS --max-time 10 -H \"Authorization: Bearer $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" https://allowed.example.test/b-uses",
        ],
    );
    assert_eq!(w.received_auth("/b-uses"), format!("Bearer {VALUE}"));
    // Still A's: B, who sees it now, may not rotate it and is told whose it is.
    refused_as(
        &w,
        b,
        &["secret", "rotate", "gh", "--from-file", bobs],
        &[&not_shared, "only its owner or root may rotate"],
    );

    // Unshared: B may not use it again (its sandbox keeps the value it was issued).
    ok_as(&w, a, &["secret", "unshare", "gh"]);
    hidden_from(&w, b, a, &create_with_gh("b-again"), absent);
    // Root may use anyone's.
    w.svc_ok(&create_with_gh("root-uses"));
    for n in ["b-uses", "root-uses"] {
        w.svc_ok(&["sandbox", "destroy", n]);
    }
}

/// A project's approval (`svc workspace trust`) is its approver's: another member's event
/// stream does not show which projects root or another member approved, nor their secrets'
/// events; each approver reads its own, root all.
#[test]
fn approvals_and_secret_events_are_their_owners_alone() {
    require_root();
    let w = World::start();
    let two = two_users();
    let (a, b) = (&two.a, &two.b);
    let project = |name: &str, uid: u32| {
        let dir = w.project(
            name,
            &[(
                ".svc/config.yaml",
                "egress:\n  allow: [allowed.example.test]\n",
            )],
        );
        chown_tree(&dir, uid, API_GID);
        dir.to_str().expect("utf-8").to_owned()
    };
    let roots = project("roots-project", 0);
    let alices = project("alices-project", a.uid);
    w.svc_ok(&["workspace", "trust", &roots]);
    ok_as(&w, a, &["workspace", "trust", &alices]);
    let value = w.dir.join("alice-value");
    std::fs::write(&value, VALUE).expect("value");
    std::os::unix::fs::chown(&value, Some(a.uid), None).expect("chown");
    ok_as(
        &w,
        a,
        &[
            "secret",
            "set",
            "gh",
            "--from-file",
            value.to_str().expect("utf-8"),
        ],
    );

    let root_events = w.svc_ok(&["events", "--json"]);
    for want in [roots.as_str(), alices.as_str(), "secret.created"] {
        assert!(
            root_events.contains(want),
            "root reads {want}: {root_events}"
        );
    }
    let a_events = ok_as(&w, a, &["events", "--json"]);
    assert!(
        a_events.contains(&alices),
        "A reads its own approval: {a_events}"
    );
    assert!(a_events.contains("secret.created"), "{a_events}");
    assert!(
        !a_events.contains(&roots),
        "A reads root's approval: {a_events}"
    );
    let b_events = ok_as(&w, b, &["events", "--json"]);
    for theirs in ["project.approved", "secret.created", "\"gh\""] {
        assert!(!b_events.contains(theirs), "B reads {theirs}: {b_events}");
    }
}

#[test]
fn a_member_cannot_share_a_directory_owned_by_another() {
    require_root();
    let w = World::start();
    let two = two_users();
    let (a, b) = (&two.a, &two.b);
    let project = w.project("alice-project", &[MINIMAL_WORKSPACE]);
    for p in [
        &project,
        &project.join(".svc"),
        &project.join(".svc/workspace.json"),
    ] {
        std::os::unix::fs::chown(p, Some(a.uid), Some(API_GID)).expect("chown");
    }
    std::fs::set_permissions(&project, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let dir = project.to_str().expect("utf-8");
    let up = |u: &User, name: &str| u.svc(&w, &World::workspace_up_args(dir, name));
    let out = up(b, "b-in-a");
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!(
            "workspace directory {dir} is owned by uid {}, not by you (uid {})",
            a.uid, b.uid
        )),
        "{}",
        text(&out)
    );
    // Its owner may.
    let out = up(a, "a-in-a");
    assert!(
        out.status.success(),
        "{}\nsvcd:\n{}",
        text(&out),
        w.svcd_log()
    );
    assert_eq!(w.show("a-in-a")["owner_uid"], a.uid);
    ok_as(&w, a, &["workspace", "down", "a-in-a"]);
}

/// The host's own credentials are the operator's: the code-host token `--repo` brokers goes
/// only to root and `credentials.code_host_token_group`; the coding agent's home is shared only
/// into sandboxes of its directory's owner.
#[test]
fn the_hosts_code_token_and_agent_home_are_not_every_members() {
    require_root();
    let two = two_users();
    let (a, b) = (&two.a, &two.b);
    // A's agent home (A's alone, as a home directory's is).
    let home = std::env::temp_dir().join(format!("{}-agent-home", a.name));
    std::fs::create_dir_all(&home).expect("agent home");
    std::os::unix::fs::chown(&home, Some(a.uid), Some(API_GID)).expect("chown");
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let w = World::start_with_credentials(&format!(
        "code_host_token_group = \"{}\"\nagent_home = \"{}\"",
        two.group.0,
        home.display()
    ));
    let repo = |name: &'static str| -> Vec<&'static str> {
        vec![
            "sandbox",
            "create",
            name,
            "--repo",
            "acme/widget",
            "--backend",
            "container",
        ]
    };
    // A is not in the token's group: refused, naming the key and the way out; nothing made.
    refused_as(
        &w,
        a,
        &repo("a-repo"),
        &[
            &format!("uid {} is not in credentials.code_host_token_group", a.uid),
            &two.group.0,
            "--secret CODE_HOST_TOKEN@store:NAME",
        ],
    );
    let list = ok_as(&w, a, &["sandbox", "list", "--json"]);
    assert!(names(&list).is_empty(), "{list}");
    // B is: its sandbox gets the token — and not A's agent home.
    ok_as(&w, b, &repo("b-repo"));
    assert_eq!(
        w.show("b-repo")["live_mounts"],
        serde_json::json!([]),
        "A's agent home went into B's sandbox"
    );
    // A's own sandbox (no --repo) gets A's agent home; root's too.
    ok_as(
        &w,
        a,
        &["sandbox", "create", "a-plain", "--backend", "container"],
    );
    let mounts = w.show("a-plain")["live_mounts"].to_string();
    assert!(
        mounts.contains(&home.display().to_string()),
        "the owner's sandbox lacks its agent home: {mounts}"
    );
    let out = w.svc(&[
        "sandbox",
        "create",
        "root-repo",
        "--repo",
        "acme/widget",
        "--backend",
        "container",
    ]);
    assert!(out.status.success(), "{}", text(&out));
    for (u, name) in [(b, "b-repo"), (a, "a-plain")] {
        ok_as(&w, u, &["sandbox", "destroy", name]);
    }
    let _ = w.svc(&["sandbox", "destroy", "root-repo"]);
    let _ = std::fs::remove_dir_all(&home);
}
