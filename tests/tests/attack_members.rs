//! A second API user against the first, through the real `svc` (under `setpriv` with each
//! user's ids) and the real svcd: B reads A's audit records by every filter, and takes over A's
//! sandbox's name the moment A destroys it, then reads "its" records; and B's new sandbox gets
//! A's id and name while a request of A's is still waiting on its upstream, whose record is
//! written after B's sandbox was made; and A's open proxy connections, held on a slow
//! upstream when A is destroyed, are cut within the teardown's bound and count nothing against
//! B's sandbox given A's id.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use svc_tests::{
    require_root,
    users::{User, within},
    world::World,
};

fn ok(u: &User, w: &World, args: &[&str]) -> String {
    u.svc_ok(w, args)
}

fn users() -> (User, User) {
    svc_tests::users::pair("svcatk")
}

/// B asks for A's records by name, by id, by layer and verdict; and B takes A's sandbox's name
/// the moment A destroys it: none of A's records, made just before, is B's to read.
#[test]
fn a_member_reads_none_of_anothers_audit_records() {
    require_root();
    let w = World::start();
    let (a, b) = users();
    ok(
        &a,
        &w,
        &[
            "sandbox",
            "create",
            "--allow-host",
            "allowed.example.test",
            "reused",
        ],
    );
    let id = w.show("reused")["id"].to_string();
    ok(&b, &w, &["sandbox", "create", "mine"]);
    // A's guest: a request whose path is A's business.
    let a_secret_path = "/a-private-path-5d1e";
    let (code, _, err) = w.sh(
        "reused",
        &format!("curl -sS --max-time 10 https://allowed.example.test{a_secret_path}"),
    );
    assert_eq!(code, 0, "{err}");
    for args in [
        vec!["audit", "--json"],
        vec!["audit", "--sandbox", "reused", "--json"],
        vec!["audit", "--sandbox", &id, "--json"],
        vec!["audit", "--layer", "http", "--verdict", "allow", "--json"],
    ] {
        let seen = ok(&b, &w, &args);
        assert!(
            !seen.contains(a_secret_path) && !seen.contains("\"reused\""),
            "B read A's records with {args:?}: {seen}"
        );
    }
    // A's guest keeps making records up to the moment A destroys it; B takes the name at once.
    let mut busy = Command::new(svc_tests::world::workspace_bin("svc"))
        .env("SVC_SOCKET", &w.socket)
        .args(["sandbox", "exec", "reused", "--", "sh", "-c"])
        .arg(format!(
            "while :; do curl -s -o /dev/null --max-time 2 https://allowed.example.test{a_secret_path}-late; done"
        ))
        .spawn()
        .expect("svc exec");
    std::thread::sleep(Duration::from_secs(2));
    ok(&a, &w, &["sandbox", "destroy", "reused"]);
    let taken = b.svc(&w, &["sandbox", "create", "reused"]);
    let _ = busy.kill();
    let _ = busy.wait();
    assert!(
        taken.status.success(),
        "B could not take the name: {taken:?}"
    );
    let seen = ok(&b, &w, &["audit", "--sandbox", "reused", "--json"]);
    let leaked: Vec<&str> = seen.lines().filter(|l| l.contains(a_secret_path)).collect();
    assert!(
        leaked.is_empty(),
        "B reads A's records through the reused name ({} of them): {leaked:#?}",
        leaked.len()
    );
    w.svc_ok(&["sandbox", "destroy", "reused"]);
    w.svc_ok(&["sandbox", "destroy", "mine"]);
}

/// The HTTP records (root's view, the file) whose path is `path`.
fn records_of(w: &World, path: &str) -> Vec<serde_json::Value> {
    w.audit()
        .into_iter()
        .filter(|r| r["layer"] == "http" && r["path"] == path)
        .collect()
}

/// A's guest has two questions in flight when A destroys its sandbox: a request its upstream
/// answers 5 s late, and a name whose DNS answer comes 1.5 s late. B at once makes a sandbox of
/// the same name (with no hosts) and gets the same id; the DNS answer's record is written after
/// that. Both records are A's (its incarnation), the late answer opens nothing on B's link, and
/// B reads neither by any filter, in any form (`svc audit`, `--json`, the API route), while it
/// reads its own.
#[test]
fn a_late_record_of_a_destroyed_sandbox_is_not_the_next_sandboxs() {
    require_root();
    let w = World::start();
    let (a, b) = users();
    let hosts = [
        "--allow-host",
        "allowed.example.test",
        "--allow-host",
        "slow-allowed.example.test",
    ];
    ok(
        &a,
        &w,
        &[&["sandbox", "create"][..], &hosts, &["late"]].concat(),
    );
    let id = w.show("late")["id"].clone();
    let get = |url: &str| format!("curl -sS -o /dev/null --max-time 30 {url}");
    let (code, _, err) = w.sh("late", &get("https://allowed.example.test/a-before-7c31"));
    assert_eq!(code, 0, "{err}");
    let a_incarnation = records_of(&w, "/a-before-7c31")[0]["incarnation"].clone();
    assert!(a_incarnation.is_string(), "A's record has an incarnation");
    let late_path = "/slow/5/a-late-7c31";
    let both = format!(
        "{} & {} & wait",
        get(&format!("https://allowed.example.test{late_path}")),
        get("https://slow-allowed.example.test/a-dns-7c31")
    );
    let mut waiting = w
        .svc_command(&["sandbox", "exec", "late", "--", "sh", "-c", &both])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("svc exec");
    let asked = |r: &serde_json::Value| {
        r["path"] == late_path || r["kind"] == "dns" && r["name"] == "slow-allowed.example.test"
    };
    assert!(
        within(10, || w.received().iter().filter(|r| asked(r)).count() >= 2),
        "the slow request and question never reached the outside world"
    );
    ok(&a, &w, &["sandbox", "destroy", "late"]);
    ok(&b, &w, &["sandbox", "create", "late"]);
    let _ = waiting.kill();
    let _ = waiting.wait();
    let b_sandbox = w.show("late");
    assert_eq!(b_sandbox["id"], id, "B's sandbox has A's id");
    let dns_of_a = || {
        w.audit()
            .into_iter()
            .filter(|r| r["layer"] == "dns" && r["name"] == "slow-allowed.example.test.")
            .collect::<Vec<_>>()
    };
    assert!(
        within(20, || !dns_of_a().is_empty()
            && !records_of(&w, late_path).is_empty()),
        "the late records were never written:\n{}",
        w.svcd_log()
    );
    let late_answer = dns_of_a().remove(0);
    let b_created = b_sandbox["created_at"].as_str().expect("created_at");
    assert!(
        late_answer["time"].as_str() > Some(b_created),
        "the answer's record was written after B's sandbox was made: {late_answer}, {b_created}"
    );
    let late_request = records_of(&w, late_path).remove(0);
    for late in [&late_answer, &late_request] {
        assert_eq!(
            late["incarnation"], a_incarnation,
            "root reads it as A's: {late}"
        );
    }
    let (_, reached, _) = w.sh(
        "late",
        "curl -s -o /dev/null -w '%{http_code}' --connect-timeout 3 http://192.0.2.20/",
    );
    assert_eq!(
        reached.trim(),
        "000",
        "A's late answer opened its address on B's link"
    );
    let _ = w.sh("late", &get("https://b-own-7c31.example.test/"));
    let ids = b.ids();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let (status, route) = w.api(&ids, "GET", "/v1/audit?sandbox=late", None);
    assert_eq!(status, 200, "{route}");
    let views = [
        (
            "svc audit --sandbox late",
            ok(&b, &w, &["audit", "--sandbox", "late"]),
        ),
        (
            "--json",
            ok(&b, &w, &["audit", "--sandbox", "late", "--json"]),
        ),
        ("svc audit --json", ok(&b, &w, &["audit", "--json"])),
        ("the API route", route),
    ];
    for (how, seen) in &views {
        for of_a in ["a-late-7c31", "slow-allowed", "a-before-7c31"] {
            assert!(
                !seen.contains(of_a),
                "B reads A's {of_a} record by {how}: {seen}"
            );
        }
        assert!(
            seen.contains("b-own-7c31"),
            "B reads its own record by {how}: {seen}"
        );
    }
    w.svc_ok(&["sandbox", "destroy", "late"]);
}

/// The proxy connections any sandbox of the held-connections test may hold at once.
const HELD_CAP: usize = 4;

/// Connections established to port 443 in the outside world (the upstream's side).
fn upstream_connections(w: &World) -> usize {
    let out = w
        .outside
        .exec("ss", &["-Htn", "state", "established", "( sport = :443 )"]);
    assert!(out.status.success(), "ss: {out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

/// `n` HTTPS requests at once from `sandbox`'s guest, one connection each (HTTP/1.1), to
/// `allowed.example.test/slow/SECS/{tag}-I`: each prints its status.
fn at_once(w: &World, sandbox: &str, n: usize, secs: u32, tag: &str) -> Command {
    let one = |i: usize| {
        format!(
            "curl -s -o /dev/null -w '%{{http_code}}\\n' --http1.1 --max-time 40 \
             https://allowed.example.test/slow/{secs}/{tag}-{i} &"
        )
    };
    let all: String = (0..n).map(one).collect::<Vec<_>>().join(" ");
    w.svc_command(&[
        "sandbox",
        "exec",
        sandbox,
        "--",
        "sh",
        "-c",
        &format!("{all} wait"),
    ])
}

/// A's guest holds its whole share of proxy connections on an upstream that answers 30 s
/// late when A is destroyed. The upstream sees them closed within the teardown's bound (2 s,
/// and slack); B, made at once with A's name (and so its id), opens its own whole share at
/// once; the records of A's cut connections are A's (its incarnation), B's are B's.
#[test]
fn a_destroyed_sandboxs_open_connections_are_cut_and_count_nothing_against_the_next() {
    require_root();
    let w = World::start_with(&format!("\n[limits]\nproxy_connections = {HELD_CAP}\n"));
    w.svc_ok(&[
        "sandbox",
        "create",
        "--allow-host",
        "allowed.example.test",
        "held",
    ]);
    let id = w.show("held")["id"].clone();
    let (code, _, err) = w.sh(
        "held",
        "curl -sS -o /dev/null --max-time 20 https://allowed.example.test/a-first-91d0",
    );
    assert_eq!(code, 0, "{err}");
    let a_incarnation = records_of(&w, "/a-first-91d0")[0]["incarnation"].clone();
    assert!(a_incarnation.is_string(), "A's record has an incarnation");
    let before = upstream_connections(&w);
    let mut a = at_once(&w, "held", HELD_CAP, 30, "a-held-91d0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("svc exec");
    let a_paths = |r: &serde_json::Value| {
        r["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/slow/30/a-held-91d0"))
    };
    assert!(
        within(20, || w.received().iter().filter(|r| a_paths(r)).count()
            >= HELD_CAP),
        "A's requests never reached the upstream:\n{}",
        w.svcd_log()
    );
    let held = upstream_connections(&w);
    assert!(
        held >= before + HELD_CAP,
        "the upstream holds A's connections: {before} then {held}"
    );
    let destroying = Instant::now();
    w.svc_ok(&["sandbox", "destroy", "held"]);
    w.svc_ok(&[
        "sandbox",
        "create",
        "--allow-host",
        "allowed.example.test",
        "held",
    ]);
    let _ = a.kill();
    let _ = a.wait();
    assert_eq!(w.show("held")["id"], id, "B's sandbox has A's id");
    // Before any of B's own: B's connections would stay in the proxy's upstream pool.
    let closed = within(3, || upstream_connections(&w) <= before);
    assert!(
        closed,
        "the upstream still holds A's connections {:?} after A was destroyed ({} held)",
        destroying.elapsed(),
        upstream_connections(&w)
    );
    // B's whole share at once (each answered 1 s late, so all are open together).
    let b = at_once(&w, "held", HELD_CAP, 1, "b-own-91d0")
        .output()
        .expect("svc exec");
    let statuses = String::from_utf8_lossy(&b.stdout).into_owned();
    assert_eq!(
        statuses.lines().filter(|l| *l == "200").count(),
        HELD_CAP,
        "B could not open its whole share of proxy connections at once: {statuses:?}\n{}",
        w.svcd_log()
    );
    // A's records, written as its connections were cut, are A's.
    let of_a: Vec<serde_json::Value> = w
        .audit()
        .into_iter()
        .filter(|r| r["layer"] == "http" && r["sandbox"] == id)
        .filter(|r| a_paths(r) || r["rule"] == "sandbox-ended")
        .collect();
    assert!(
        of_a.iter().filter(|r| r["rule"] == "sandbox-ended").count() >= HELD_CAP,
        "each of A's cut connections is recorded: {of_a:#?}"
    );
    for r in &of_a {
        assert_eq!(
            r["incarnation"], a_incarnation,
            "A's late record is A's: {r}"
        );
    }
    let b_incarnation = w.show("held")["incarnation"].clone();
    for r in w
        .audit()
        .iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.contains("b-own-91d0")))
    {
        assert_ne!(
            r["incarnation"], a_incarnation,
            "B's record is not A's: {r}"
        );
        if b_incarnation.is_string() {
            assert_eq!(r["incarnation"], b_incarnation, "B's record is B's: {r}");
        }
    }
    w.svc_ok(&["sandbox", "destroy", "held"]);
}
