//! Attacks on per-sandbox incarnations (audit identity across reused names and ids), through
//! the real `svc` (under `setpriv` with each user's ids), the real svcd, sandboxes, proxy and
//! DNS guard: a followed audit read held open by one user across another's destroy and its own
//! new sandbox of that name; one user reusing their own name; a destroy that lands while its
//! sandbox is still being made (fresh, or claimed from a warm pool), and the next sandbox given
//! that id.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
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
    svc_tests::users::pair("svcinc")
}

/// A GET of `path` at allowed.example.test from sandbox `name`'s guest, which must succeed.
fn get(w: &World, name: &str, path: &str) {
    let (code, _, err) = w.sh(
        name,
        &format!("curl -sS -o /dev/null --max-time 10 https://allowed.example.test{path}"),
    );
    assert_eq!(
        code,
        0,
        "GET {path} from {name}: {err}\nsvcd:\n{}",
        w.svcd_log()
    );
}

/// The incarnation root reads on the HTTP record of `path`.
fn incarnation_of(w: &World, path: &str) -> String {
    let mut found = String::new();
    assert!(
        within(10, || {
            found = w
                .audit()
                .iter()
                .find(|r| r["layer"] == "http" && r["path"] == path)
                .and_then(|r| r["incarnation"].as_str())
                .unwrap_or_default()
                .to_owned();
            !found.is_empty()
        }),
        "no record of {path} with an incarnation"
    );
    found
}

/// `svc audit --follow --json` run by `u`, its output going to `file`.
fn follow(u: &User, w: &World, file: &std::path::Path) -> Child {
    // `svc_as` puts a copy of svc where any user may run it.
    ok(u, w, &["sandbox", "list"]);
    let out = std::fs::File::create(file).expect("follow output");
    Command::new("setpriv")
        .args(u.ids())
        .arg(w.dir.join("bin/svc"))
        .args(["audit", "--follow", "--json"])
        .env("SVC_SOCKET", &w.socket)
        .stdout(out)
        .stderr(Stdio::null())
        .spawn()
        .expect("svc audit --follow")
}

/// B follows the audit log (`svc audit --follow`) from before A's sandbox made a record until
/// after B took A's sandbox's name (and id) and made records of its own there: B's stream
/// never carries A's records, and carries every record of B's, the new sandbox's included.
/// A, meanwhile, reuses its own name: what A reads of it is the new sandbox's only.
#[test]
fn a_followed_audit_read_is_its_readers_across_reused_names() {
    require_root();
    let w = World::start();
    let (a, b) = users();
    let allow = ["sandbox", "create", "--allow-host", "allowed.example.test"];
    ok(&a, &w, &[&allow[..], &["shared"]].concat());
    ok(&b, &w, &[&allow[..], &["bown"]].concat());
    let id = w.show("shared")["id"].clone();
    let file = w.dir.join("b-follow.jsonl");
    let mut followed = follow(&b, &w, &file);
    // The follower is reading (its first look at the file) before anything is made.
    std::thread::sleep(Duration::from_secs(1));
    get(&w, "shared", "/a-first-9e2f");
    get(&w, "bown", "/b-first-9e2f");
    ok(&a, &w, &["sandbox", "destroy", "shared"]);
    ok(&b, &w, &[&allow[..], &["shared"]].concat());
    assert_eq!(w.show("shared")["id"], id, "B's sandbox has A's id");
    get(&w, "shared", "/b-second-9e2f");
    // A reuses its own name.
    ok(&a, &w, &[&allow[..], &["amine"]].concat());
    get(&w, "amine", "/a-old-9e2f");
    ok(&a, &w, &["sandbox", "destroy", "amine"]);
    ok(&a, &w, &[&allow[..], &["amine"]].concat());
    get(&w, "amine", "/a-new-9e2f");
    let new = incarnation_of(&w, "/a-new-9e2f");
    assert_ne!(new, incarnation_of(&w, "/a-old-9e2f"), "two incarnations");
    let seen = ok(&a, &w, &["audit", "--sandbox", "amine", "--json"]);
    for line in seen.lines() {
        let r: serde_json::Value = serde_json::from_str(line).expect("an audit line");
        assert_eq!(
            r["incarnation"], new,
            "A reads a record of its earlier `amine` as the new one's: {line}"
        );
    }
    assert!(seen.contains("/a-new-9e2f"), "A reads its own: {seen}");
    let streamed = || std::fs::read_to_string(&file).unwrap_or_default();
    let all_of_b = within(10, || {
        let s = streamed();
        s.contains("/b-first-9e2f") && s.contains("/b-second-9e2f")
    });
    let _ = followed.kill();
    let _ = followed.wait();
    let s = streamed();
    for of_a in ["/a-first-9e2f", "/a-old-9e2f", "/a-new-9e2f"] {
        assert!(!s.contains(of_a), "B's follow carried A's {of_a}: {s}");
    }
    assert!(
        all_of_b,
        "B's follow lost records of its own (those of the sandbox it made after it began \
         reading): {s}"
    );
    for name in ["shared", "bown", "amine"] {
        w.svc_ok(&["sandbox", "destroy", name]);
    }
    late_request_in_metrics(&w, &a, &b);
}

/// The sum of svcd's `svc_proxy_requests_total` series of sandbox `name`.
fn proxy_requests_of(w: &World, name: &str) -> f64 {
    let head = format!("svc_proxy_requests_total{{sandbox=\"{name}\",");
    w.metrics()
        .lines()
        .filter(|l| l.starts_with(&head))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A's request answered 3 s late, its sandbox destroyed meanwhile and its name taken by B:
/// svcd's per-sandbox metrics of B's sandbox count B's request only, never A's late one.
fn late_request_in_metrics(w: &World, a: &User, b: &User) {
    let allow = ["sandbox", "create", "--allow-host", "allowed.example.test"];
    ok(a, w, &[&allow[..], &["metr"]].concat());
    let late = "/slow/3/a-metr-9e2f";
    let mut waiting = w
        .sh_command(
            "metr",
            &format!("curl -sS -o /dev/null --max-time 30 https://allowed.example.test{late}"),
        )
        .spawn()
        .expect("svc exec");
    assert!(
        within(10, || w.received().iter().any(|r| r["path"] == late)),
        "the slow request never reached the outside world"
    );
    ok(a, w, &["sandbox", "destroy", "metr"]);
    let _ = waiting.kill();
    let _ = waiting.wait();
    ok(b, w, &[&allow[..], &["metr"]].concat());
    get(w, "metr", "/b-metr-9e2f");
    assert!(
        within(10, || w.audit().iter().any(|r| r["path"] == late)),
        "the late request's record was never written"
    );
    let counted = proxy_requests_of(w, "metr");
    assert!(
        (counted - 1.0).abs() < f64::EPSILON,
        "B's sandbox metr made one request, but its metrics count {counted}:\n{}",
        w.metrics()
    );
    w.svc_ok(&["sandbox", "destroy", "metr"]);
}

/// `svc sandbox create ARGS` run by `u`, not waited for.
fn spawn_create(u: &User, w: &World, args: &[&str]) -> Child {
    ok(u, w, &["sandbox", "list"]);
    Command::new("setpriv")
        .args(u.ids())
        .arg(w.dir.join("bin/svc"))
        .args(["sandbox", "create"])
        .args(args)
        .env("SVC_SOCKET", &w.socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("svc sandbox create")
}

/// `u`'s `DELETE /v1/sandboxes/NAME`, sent back to back from `after` on while `creating`
/// runs: whether one was answered 200 before the creation answered.
fn destroy_while(u: &User, w: &World, name: &str, creating: &mut Child, after: Duration) -> bool {
    std::thread::sleep(after);
    let ids = u.ids();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let route = format!("/v1/sandboxes/{name}");
    while creating.try_wait().expect("the create").is_none() {
        let (status, _) = w.api(&ids, "DELETE", &route, None);
        if status == 200 {
            return creating.try_wait().expect("the create").is_none();
        }
    }
    false
}

/// Sandbox names svcd lists, and their ids.
fn listed(w: &World) -> Vec<(String, u64)> {
    let list: serde_json::Value =
        serde_json::from_str(&w.svc_ok(&["sandbox", "list", "--json"])).expect("list json");
    list.as_array()
        .expect("a list")
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or_default().to_owned(),
                s["id"].as_u64().unwrap_or_default(),
            )
        })
        .collect()
}

/// The host's sandbox links (`svcN`) by number.
fn links(w: &World) -> Vec<u64> {
    let out = w.host.exec("ip", &["-o", "link", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .filter_map(|n| n.split('@').next())
        .filter_map(|n| n.strip_prefix("svc"))
        .filter_map(|n| n.parse().ok())
        .collect()
}

/// The containers the runtime knows in this world.
fn containers(w: &World) -> Vec<String> {
    let out = Command::new(w.oci_runtime())
        .arg("--root")
        .arg(w.dir.join("state/runc"))
        .args(["list", "-q"])
        .output()
        .expect("runtime list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// One round of A's race: A's create of `racing`, A's destroys sent back to back from
/// `after_ms` on; when one lands during the creation, B makes `victim{round}` at once and its
/// guest reaches its allowed host, then and a second later. Whether a destroy landed, and
/// what A's creation answered.
fn race(w: &World, (a, b): (&User, &User), round: usize, after_ms: u64) -> (bool, String) {
    let allow = ["--allow-host", "allowed.example.test"];
    let mut creating = spawn_create(a, w, &[&allow[..], &["racing"]].concat());
    let landed = destroy_while(
        a,
        w,
        "racing",
        &mut creating,
        Duration::from_millis(after_ms),
    );
    let victim = format!("victim{round}");
    if landed {
        ok(
            b,
            w,
            &[&["sandbox", "create"][..], &allow, &[&victim]].concat(),
        );
    }
    let answered = creating.wait_with_output().expect("the create");
    // Whatever A's creation said, A's own destroy has the last word.
    let _ = a.svc(w, &["sandbox", "destroy", "racing"]);
    if landed {
        get(w, &victim, &format!("/victim-{round}"));
        std::thread::sleep(Duration::from_secs(1));
        get(w, &victim, &format!("/victim-{round}-later"));
    }
    (landed, format!("{answered:?}"))
}

/// A destroys its sandbox while svcd is still making it (the destroy sent back to back from
/// several points of the creation on); B makes a sandbox at once, which may get the id A's
/// creation still holds. Whatever A's creation answers: nothing of it is left that no listed
/// sandbox accounts for (no container, no link), and B's sandbox works, then and a while
/// later (a late clean-up of A's creation must not take B's link, fence entry or registry
/// entry).
#[test]
fn a_destroy_during_creation_leaves_nothing_and_spares_the_next_sandbox() {
    require_root();
    let w = World::start();
    let (a, b) = users();
    for (round, after_ms) in [0u64, 30, 60, 90, 120, 150].into_iter().enumerate() {
        let (landed, answered) = race(&w, (&a, &b), round, after_ms);
        let victim = format!("victim{round}");
        let sandboxes = listed(&w);
        let strays: Vec<u64> = links(&w)
            .into_iter()
            .filter(|n| !sandboxes.iter().any(|(_, id)| id == n))
            .collect();
        let orphans: Vec<String> = containers(&w)
            .into_iter()
            .filter(|c| !sandboxes.iter().any(|(name, _)| name == c))
            .collect();
        assert!(
            strays.is_empty() && orphans.is_empty(),
            "round {round} (destroy from {after_ms} ms, landed during the creation: {landed}; \
             the creation answered {answered:?}): links {strays:?} and containers {orphans:?} \
             belong to no listed sandbox ({sandboxes:?})\nsvcd:\n{}",
            w.svcd_log()
        );
        if landed {
            ok(&b, &w, &["sandbox", "destroy", &victim]);
        }
    }
}

/// svcd.toml's extra lines: a warm pool of one, refilled quickly.
const POOL: &str = "\n[pool]\ncontainer = 1\nrefill_per_second = 20\n";

/// The container pool's size now (`svc_pool_size`).
fn pool_size(w: &World) -> u64 {
    w.metrics()
        .lines()
        .find_map(|l| l.strip_prefix(r#"svc_pool_size{backend="container"} "#))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Wait until the container pool is full again (one sandbox).
fn pool_full(w: &World) {
    assert!(
        within(60, || pool_size(w) == 1),
        "the pool did not refill within 60 s:\n{}",
        w.svcd_log()
    );
}

/// Through a warm pool of one: A's sandbox (a claim) has a request in flight, answered 8 s
/// late, and a file and a process of its own when A destroys it; the pool's next sandbox is
/// made on A's freed id, and B takes it (its second claim). The late record is A's (its
/// incarnation); B reads none of A's records; B's guest shows nothing of A's. Then A races
/// destroys against its own claims, B claiming at once: nothing is left over (every container
/// and link is a listed sandbox's or the pool's one), and B's sandboxes work.
#[test]
fn a_pool_claim_on_a_destroyed_sandboxs_id_is_nothing_of_it() {
    require_root();
    let w = World::start_with(POOL);
    let (a, b) = users();
    let allow = ["sandbox", "create", "--allow-host", "allowed.example.test"];
    pool_full(&w);
    ok(&a, &w, &[&allow[..], &["pa"]].concat());
    let a_id = w.show("pa")["id"].clone();
    get(&w, "pa", "/a-pooled-before-41c8");
    let a_incarnation = incarnation_of(&w, "/a-pooled-before-41c8");
    let late = "/slow/8/a-pooled-late-41c8";
    let mut waiting = w
        .sh_command(
            "pa",
            &format!(
                "echo a-was-here > /tmp/a-41c8; sleep 1000 >/dev/null 2>&1 </dev/null & \
                 curl -sS -o /dev/null --max-time 30 https://allowed.example.test{late}"
            ),
        )
        .spawn()
        .expect("svc exec");
    assert!(
        within(10, || w.received().iter().any(|r| r["path"] == late)),
        "the slow request never reached the outside world"
    );
    pool_full(&w);
    ok(&a, &w, &["sandbox", "destroy", "pa"]);
    let _ = waiting.kill();
    let _ = waiting.wait();
    ok(&b, &w, &[&allow[..], &["pb0"]].concat());
    pool_full(&w);
    ok(&b, &w, &[&allow[..], &["pb"]].concat());
    assert_eq!(w.show("pb")["id"], a_id, "B's claim is on A's freed id");
    get(&w, "pb", "/b-pooled-41c8");
    assert!(
        within(20, || w.audit().iter().any(
            |r| r["path"] == late && r["incarnation"] == a_incarnation.as_str()
        )),
        "the late record is not A's:\n{:#?}",
        w.audit()
            .iter()
            .filter(|r| r["path"] == late)
            .collect::<Vec<_>>()
    );
    let (_, seen_in_guest, _) = w.sh(
        "pb",
        "cat /tmp/a-41c8 2>/dev/null; \
         for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
    );
    assert!(
        !seen_in_guest.contains("a-was-here") && !seen_in_guest.contains("sleep 1000"),
        "B's guest holds A's leftovers: {seen_in_guest}"
    );
    for args in [
        vec!["audit", "--json"],
        vec!["audit", "--sandbox", "pb", "--json"],
        vec!["audit", "--sandbox", &a_incarnation, "--json"],
    ] {
        let seen = ok(&b, &w, &args);
        assert!(
            !seen.contains("a-pooled"),
            "B reads A's records with {args:?}: {seen}"
        );
    }
    assert!(
        ok(&b, &w, &["audit", "--sandbox", "pb", "--json"]).contains("/b-pooled-41c8"),
        "B reads its own"
    );
    ok(&b, &w, &["sandbox", "destroy", "pb"]);
    ok(&b, &w, &["sandbox", "destroy", "pb0"]);
}

/// git over SSH from `name`'s guest through its relay: `git ls-remote` of acme/widget; (exit
/// code, stderr).
fn ls_remote(w: &World, name: &str) -> (i32, String) {
    let (code, _, err) = w.sh(
        name,
        &format!(
            "timeout 20 git ls-remote root@{}:acme/widget.git",
            svc_tests::world::CODE_SSH_ADDR
        ),
    );
    (code, err)
}

/// A's guest holds every git SSH session its limit allows open (upload-pack waiting for what
/// it wants) when A's sandbox is destroyed; the next sandbox, on the same project, gets its
/// id. Its first session is not refused for A's, and the held sessions' records are A's (its
/// incarnation), whenever they are written.
#[test]
fn a_relay_session_outliving_its_sandbox_is_not_the_next_sandboxs() {
    require_root();
    let w = World::start_with_git_ssh("\n[limits]\ngit_ssh_sessions = 2\n");
    let project = w.ssh_project();
    w.sandbox_in_project("held", "container", &project, &[]);
    let id = w.show("held")["id"].clone();
    let (code, err) = ls_remote(&w, "held");
    assert_eq!(
        code,
        0,
        "a session through the relay: {err}\n{}",
        w.svcd_log()
    );
    let a_incarnation = w
        .audit_record(|r| r["layer"] == "ssh")
        .and_then(|r| r["incarnation"].as_str().map(str::to_owned))
        .expect("the session's record has an incarnation");
    let hold = format!(
        "for i in 1 2; do (sleep 600 | svc-git-ssh root@{} \"git-upload-pack 'acme/widget.git'\") \
         >/dev/null 2>&1 </dev/null & done; sleep 3",
        svc_tests::world::CODE_SSH_ADDR
    );
    let (code, _, err) = w.sh("held", &hold);
    assert_eq!(code, 0, "{err}");
    let (code, err) = ls_remote(&w, "held");
    assert!(
        code != 0 && err.contains("svc: refused"),
        "the two held sessions are the sandbox's whole allowance: a third is refused \
         ({code}): {err}"
    );
    w.svc_ok(&["sandbox", "destroy", "held"]);
    w.sandbox_in_project("next", "container", &project, &[]);
    assert_eq!(
        w.show("next")["id"],
        id,
        "the next sandbox has the held one's id"
    );
    let (code, err) = ls_remote(&w, "next");
    assert_eq!(
        code, 0,
        "the next sandbox's first git session is refused for the destroyed one's: {err}"
    );
    let next_incarnation = w
        .audit_record(|r| r["layer"] == "ssh" && r["sandbox_name"] == "next")
        .and_then(|r| r["incarnation"].as_str().map(str::to_owned))
        .expect("a record of the next sandbox's session");
    assert_ne!(next_incarnation, a_incarnation);
    std::thread::sleep(Duration::from_secs(2));
    let held: Vec<serde_json::Value> = w
        .audit()
        .into_iter()
        .filter(|r| r["layer"] == "ssh" && r["sandbox_name"] == "held")
        .collect();
    for r in &held {
        assert_eq!(r["incarnation"], a_incarnation.as_str(), "{r}");
    }
    let of_next = w
        .audit()
        .into_iter()
        .filter(|r| r["layer"] == "ssh" && r["incarnation"] == next_incarnation.as_str())
        .count();
    assert_eq!(of_next, 1, "only the next sandbox's own session is its");
    w.svc_ok(&["sandbox", "destroy", "next"]);
}

/// A races destroys against its own claims from a warm pool of one (the claim's row is
/// `creating` until it is published), B making a sandbox at once when one lands: nothing is
/// left over (every container and link is a listed sandbox's or the pool's one), no listed
/// sandbox is without its guest, and B's sandboxes work.
#[test]
fn a_destroy_during_a_pool_claim_leaves_nothing() {
    require_root();
    let w = World::start_with(POOL);
    let (a, b) = users();
    for (round, after_ms) in [0u64, 10, 20, 40].into_iter().enumerate() {
        pool_full(&w);
        let (landed, answered) = race(&w, (&a, &b), round, after_ms);
        if landed {
            ok(&b, &w, &["sandbox", "destroy", &format!("victim{round}")]);
        }
        pool_full(&w);
        let sandboxes = listed(&w);
        let (c, l) = (containers(&w), links(&w));
        assert!(
            c.len() == sandboxes.len() + 1 && l.len() == sandboxes.len() + 1,
            "round {round} (destroy from {after_ms} ms, landed during the claim: {landed}; \
             the creation answered {answered:?}): sandboxes {sandboxes:?} and the pool's one, \
             but containers {c:?} and links {l:?}\nsvcd:\n{}",
            w.svcd_log()
        );
    }
}
