//! Session 45's changes attacked, against the real svcd, crun, containerd's CRI and QEMU.
//!
//! - Warm pools (the pooled link in the nftables link set from its making; the claim writing
//!   the guest files in place): claims and destroys at once, and svcd killed before, during
//!   and after claims, leave the link set holding exactly the links of svcd's sandboxes and
//!   pool, and no link of a sandbox svcd no longer has; each claimed guest trusts only its own
//!   CA (the CA file is its own, the bundle has one svc block, no pool name in its files).
//!   FOUND: after svcd's table was removed (a firewall reload), a claim no longer writes it
//!   again (it skips the nftables step): the claimed link runs without the table's rules until
//!   some later change (the pool's next refill) writes it; a fresh creation writes it at once.
//! - Pod secrets scoped to namespaces: a member cannot allow or disallow pod namespaces for
//!   another's secret (shared with its group or not, CLI or API) nor store one over it.
//!   FOUND: a pod of any namespace that names a repository (`svc.dev/repo`) and no
//!   CODE_HOST_TOKEN secret is given the node's own code-host token (the shim asks as root,
//!   and `policy::ownership::host_code_token` lets root have it): the real token reaches the
//!   code host for the pod's requests.
//! - Microvm trees: a name the guest plants at the share's top (a link to `/`, a directory) is
//!   refused, not followed; the share's top holds at most its tmpfs; a tree left attached at
//!   destroy keeps its files; after a filled share and a raced detach the agent serves the next
//!   tree; exec users the guest's ids do not hold are refused. FOUND: the guest's root
//!   rewrites a setuid-root program of the tree (`cat /bin/sh > usr/bin/passwd`) and the
//!   host's file keeps its setuid bit (the share's virtiofsd writes with CAP_FSETID): a
//!   setuid-root copy of the guest's bytes on the host.

use std::{
    io::Write as _,
    os::unix::fs::{FileTypeExt as _, MetadataExt as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use svc_control::policy::pod;
use svc_tests::{
    cri::{pod_config_in, run_pod, shim_sandboxes, start},
    pods::stop_remove_pod,
    project::text,
    require_root,
    users::{Group, User},
    world::{CODE_TOKEN, World},
};

/// svcd.toml's extra lines: a pool of two, refilled quickly.
const POOL: &str = "\n[pool]\ncontainer = 2\nrefill_per_second = 20\n";

/// Wait until the container pool holds `n` sandboxes.
fn wait_pool(w: &World, n: u64) {
    w.wait_pool("container", n, Duration::from_secs(90));
}

/// The links of svcd's listed sandboxes, sorted.
fn listed_links(w: &World) -> Vec<String> {
    let list: serde_json::Value =
        serde_json::from_str(&w.svc_ok(&["sandbox", "list", "--json"])).expect("list json");
    let mut links: Vec<String> = list
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|s| s["name"].as_str())
        .map(|n| {
            w.show(n)["link"]
                .as_str()
                .unwrap_or_else(|| panic!("{n} has no link"))
                .to_owned()
        })
        .collect();
    links.sort();
    links
}

/// The pool's links: those on the host that no listed sandbox has.
fn check_links(w: &World, pooled: u64) {
    let listed = listed_links(w);
    let on_host = w.sandbox_links();
    let set = w.nft_link_set();
    assert_eq!(
        set, on_host,
        "the link set is not the host's sandbox links (listed: {listed:?})"
    );
    for l in &listed {
        assert!(on_host.contains(l), "{l} listed but not on the host");
    }
    assert_eq!(
        on_host.len() as u64,
        listed.len() as u64 + pooled,
        "links on the host {on_host:?}, listed {listed:?}, pooled {pooled}"
    );
}

#[test]
fn claims_and_destroys_at_once_keep_the_link_set_exact() {
    require_root();
    let w = World::start_with(POOL);
    wait_pool(&w, 2);
    // Four creations at once against a pool of two (two claims, two cold or refill-raced),
    // then all destroyed at once while the pool refills.
    let names = ["race-a", "race-b", "race-c", "race-d"];
    let children: Vec<_> = names
        .iter()
        .map(|n| {
            w.svc_command(&["sandbox", "create", n])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("svc")
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().expect("svc");
        assert!(out.status.success(), "{out:?}\n{}", w.svcd_log());
    }
    wait_pool(&w, 2);
    check_links(&w, 2);
    // Every claimed guest is fenced as a fresh one: nothing reached outside an allowlist.
    for n in names {
        assert_ne!(w.curl_rc(n, "https://db.example.test/"), 0, "{n}");
    }
    let children: Vec<_> = names
        .iter()
        .map(|n| {
            w.svc_command(&["sandbox", "destroy", n])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("svc")
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().expect("svc");
        assert!(out.status.success(), "{out:?}");
    }
    wait_pool(&w, 2);
    check_links(&w, 2);
    assert_eq!(listed_links(&w), Vec::<String>::new());
}

#[test]
fn svcd_killed_during_claims_leaves_no_link_or_element_of_a_gone_sandbox() {
    require_root();
    let mut w = World::start_with(POOL);
    for (round, delay) in [3u64, 10, 13, 16, 19, 22, 25, 60].into_iter().enumerate() {
        wait_pool(&w, 2);
        let name = format!("mid-{round}");
        let child = w
            .svc_command(&["sandbox", "create", &name])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("svc");
        // Into the claim: a few milliseconds in (a claim takes a few).
        std::thread::sleep(Duration::from_millis(delay));
        w.kill_svcd();
        let _ = child.wait_with_output();
        w.start_svcd();
        // Whatever the claim had reached: the listed sandboxes' links and the pool's are the
        // link set and the host's links, nothing else.
        wait_pool(&w, 2);
        check_links(&w, 2);
        // A sandbox that survived works and is fenced; one that did not is gone whole.
        let listed = w.svc_ok(&["sandbox", "list", "--json"]);
        let survived = listed.contains(&format!("\"{name}\""));
        eprintln!("round {round}: {name} survived the kill: {survived}");
        if survived {
            assert_ne!(w.curl_rc(&name, "https://db.example.test/"), 0);
            w.destroy_checked(&name);
        }
    }
    wait_pool(&w, 2);
    check_links(&w, 2);
}

/// Whether `nft list table inet svc` finds svcd's table in the world's host namespace.
fn svc_table_exists(w: &World) -> bool {
    w.host
        .exec("nft", &["list", "table", "inet", "svc"])
        .status
        .success()
}

#[test]
fn a_claim_after_the_table_was_flushed_puts_its_link_under_the_rules() {
    require_root();
    let w = World::start_with(POOL);
    wait_pool(&w, 2);
    // Another tool flushes the host's ruleset (a firewall reload): svcd's table goes.
    let out = w.host.exec("nft", &["delete", "table", "inet", "svc"]);
    assert!(out.status.success(), "{out:?}");
    w.sandbox_with_example_secret_ok("after-flush", "env:EXAMPLE");
    assert_eq!(w.metric(r#"svc_pool_hits_total{backend="container"}"#), 1);
    let link = w.show("after-flush")["link"]
        .as_str()
        .expect("link")
        .to_owned();
    // A fresh creation writes the table again; a claim must leave its link as ruled when it
    // returns (not only once the pool's next refill writes the table: that is later).
    assert!(
        svc_table_exists(&w),
        "a claimed sandbox {link} runs with no svc table on the host"
    );
    assert!(
        w.nft_link_set().contains(&link),
        "{link} not in the link set"
    );
    w.destroy_checked("after-flush");
}

#[test]
fn a_claimed_guest_trusts_only_its_own_ca() {
    require_root();
    let w = World::start_with(POOL);
    wait_pool(&w, 2);
    w.sandbox_with_example_secret_ok("ca-one", "env:EXAMPLE");
    w.sandbox_with_example_secret_ok("ca-two", "env:EXAMPLE");
    assert_eq!(w.metric(r#"svc_pool_hits_total{backend="container"}"#), 2);
    let ca_file = "/usr/local/share/ca-certificates/svc-sandbox-ca.crt";
    let mut seen = Vec::new();
    for name in ["ca-one", "ca-two"] {
        // Only this CA file trusted: the proxy's leaf for this sandbox verifies against it.
        let (code, _, err) = w.sh(
            name,
            &format!(
                "curl -sS -o /dev/null --max-time 10 --cacert {ca_file} \
                 https://allowed.example.test/ca"
            ),
        );
        assert_eq!(code, 0, "{name}: its CA file is not its proxy's CA: {err}");
        let (code, pem, err) = w.sh(name, &format!("cat {ca_file}"));
        assert_eq!(code, 0, "{err}");
        let subject = openssl_subject(&pem);
        assert!(
            subject.contains(&format!("svc sandbox {name} CA")),
            "{name}: {subject}"
        );
        // The bundle has one svc block, its own; no pool name in any guest file.
        let (_, files, _) = w.sh(
            name,
            "cat /etc/ssl/certs/ca-certificates.crt /etc/hosts /etc/resolv.conf",
        );
        assert_eq!(
            files.matches("# svc sandbox CA: begin").count(),
            1,
            "{name}: svc blocks in its bundle"
        );
        assert!(
            files.contains(pem.trim()),
            "{name}: its CA not in its bundle"
        );
        assert!(!files.contains("pool."), "{name}: the pool's name is left");
        seen.push(pem);
    }
    assert_ne!(seen[0], seen[1], "two claimed guests share a CA");
    // The other sandbox's CA does not verify this one's proxy.
    let (code, _, _) = w.sh(
        "ca-one",
        &format!(
            "printf '%s' '{}' > /tmp/other.crt && curl -sS -o /dev/null --max-time 10 \
             --cacert /tmp/other.crt https://allowed.example.test/ca",
            seen[1].trim()
        ),
    );
    assert_ne!(code, 0, "ca-two's CA verifies ca-one's proxy");
    w.destroy_checked("ca-one");
    w.destroy_checked("ca-two");
}

/// `openssl x509 -noout -subject` of `pem`.
fn openssl_subject(pem: &str) -> String {
    let mut c = Command::new("openssl")
        .args(["x509", "-noout", "-subject"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl");
    c.stdin
        .take()
        .expect("stdin")
        .write_all(pem.as_bytes())
        .expect("write");
    let out = c.wait_with_output().expect("openssl");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two members of svcd's API group; B also in a group A may share with.
struct Two {
    a: User,
    b: User,
    group: Group,
}

fn two_users() -> Two {
    let tag = std::process::id() % 100_000;
    let group = Group::add(format!("svc45-g{tag}"));
    let a = User::add(format!("svc45-a{tag}"), None);
    let b = User::add(format!("svc45-b{tag}"), Some(&group.0));
    Two { a, b, group }
}

#[test]
fn a_member_cannot_change_the_pod_namespaces_of_anothers_secret() {
    require_root();
    let w = World::start();
    let two = two_users();
    let (a, b) = (&two.a, &two.b);
    let file = w.dir.join("a-value");
    std::fs::write(&file, "a-secret-value\n").expect("value");
    std::os::unix::fs::chown(&file, Some(a.uid), None).expect("chown");
    let file = file.to_str().expect("utf-8");
    a.svc_ok(
        &w,
        &[
            "secret",
            "set",
            "a-bot",
            "--from-file",
            file,
            "--pod-namespace",
            "team-a",
        ],
    );
    let shown = |w: &World| -> serde_json::Value {
        serde_json::from_str(&w.svc_ok(&["secret", "show", "a-bot", "--json"])).expect("json")
    };
    let before = shown(&w)["pod_namespaces"].clone();
    assert_eq!(before, serde_json::json!(["team-a"]));
    for shared in [false, true] {
        if shared {
            a.svc_ok(&w, &["secret", "share", "a-bot", "--group", &two.group.0]);
        }
        for args in [
            ["secret", "allow", "a-bot", "--pod-namespace", "team-b"],
            ["secret", "allow", "a-bot", "--pod-namespace", "*"],
            ["secret", "disallow", "a-bot", "--pod-namespace", "team-a"],
        ] {
            let out = b.svc(&w, &args);
            eprintln!("B {args:?}: {}", text(&out).trim());
            assert!(
                !out.status.success(),
                "B ran {args:?} (shared: {shared}): {}",
                text(&out)
            );
        }
        // Through the API itself, too (the CLI is not the boundary).
        let body = serde_json::json!({"allow": ["team-b", "*"], "disallow": ["team-a"]});
        let ids = b.ids();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let (status, answer) = w.api(
            &ids,
            "POST",
            "/v1/secrets/a-bot/pod-namespaces",
            Some(body.to_string().as_bytes()),
        );
        eprintln!("B's API call: {status} {}", answer.trim());
        assert!(
            status == 403 || status == 404,
            "B's API call (shared: {shared}): {status} {answer}"
        );
        // Nor stored again over it with B's namespaces.
        let bfile = w.dir.join("b-value");
        std::fs::write(&bfile, "b-value\n").expect("value");
        std::os::unix::fs::chown(&bfile, Some(b.uid), None).expect("chown");
        let out = b.svc(
            &w,
            &[
                "secret",
                "set",
                "a-bot",
                "--from-file",
                bfile.to_str().expect("utf-8"),
                "--pod-namespace",
                "team-b",
            ],
        );
        assert!(!out.status.success(), "{}", text(&out));
        assert_eq!(shown(&w)["pod_namespaces"], before, "shared: {shared}");
    }
}

#[test]
fn a_pod_naming_a_repo_and_no_secret_gets_no_token_of_the_nodes() {
    require_root();
    // The node has a code-host token (`credentials.code_host_token_file`: CODE_TOKEN).
    let w = World::start();
    let (c, cri) = start(&w);
    let config = pod_config_in("team-b", "repo-only", &[(pod::REPO, "acme/widget")]);
    let id = match run_pod(&cri, &config) {
        // Refused: the node's token is not a pod author's.
        Err(e) => {
            assert!(shim_sandboxes(&w).is_empty());
            eprintln!("refused: {}", e.message());
            return;
        }
        Ok(id) => id,
    };
    let names = shim_sandboxes(&w);
    assert_eq!(names.len(), 1, "{names:?}");
    let name = &names[0];
    let show = w.show(name);
    // What the pod's sandbox has, and what its guest can make the code host see.
    let (_, _, _) = w.sh(
        name,
        "cd /tmp && git -c http.extraHeader=\"Authorization: Bearer $CODE_HOST_TOKEN\" \
         clone -q https://code.test/acme/widget.git",
    );
    let reached: Vec<serde_json::Value> = w
        .received()
        .into_iter()
        .filter(|r| r["kind"] == "http" && r["host"] == "code.test")
        .filter(|r| r["authorization"] == format!("Bearer {CODE_TOKEN}"))
        .collect();
    stop_remove_pod(&c, &cri, &id);
    let brokered = show["secrets"].to_string().contains("host:");
    assert!(
        !brokered && reached.is_empty(),
        "a pod of team-b was given the node's code-host token ({}), and {} of its requests \
         reached the code host with the node's real token",
        show["secrets"],
        reached.len()
    );
}

/// Whether any file under `dir` has a setid bit or is a device node: the offenders.
fn setid_or_devices(dir: &Path) -> Vec<PathBuf> {
    let mut bad = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let Ok(m) = e.path().symlink_metadata() else {
                continue;
            };
            let t = m.file_type();
            if t.is_dir() {
                todo.push(e.path());
            } else if m.mode() & 0o6000 != 0 || t.is_block_device() || t.is_char_device() {
                bad.push(e.path());
            }
        }
    }
    bad
}

#[path = "attack_session45/trees.rs"]
mod trees;
