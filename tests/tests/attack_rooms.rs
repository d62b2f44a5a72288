//! Second attack pass on the redesign's other rooms, with the real svcd: creation in one place
//! (`daemon/supervisor/create.rs`) made to fail, or raced; odd request bodies straight to the
//! API socket; API paths a second user bends towards another's sandbox. After each: nothing of
//! a failed creation is left (no row, no link, no fence entry, no process), svcd still answers,
//! and the error names what was wrong.

use std::{
    process::{Command, Output},
    sync::Arc,
};

use svc_tests::{project::SWAP, require_root, users::User, world::World};

/// svcd's view of every sandbox (as root).
fn listed(w: &World) -> Vec<String> {
    let (code, body) = w.api(&[], "GET", "/v1/sandboxes", None);
    assert_eq!(code, 200, "{body}\nsvcd log:\n{}", w.svcd_log());
    let v: serde_json::Value = serde_json::from_str(&body).expect("list json");
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The sandbox links (`svcN`) on svcd's host side.
fn links(w: &World) -> Vec<String> {
    let out = w.host.exec("ip", &["-o", "link", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_owned())
        .filter(|n| n.starts_with("svc") && n[3..].chars().all(|c| c.is_ascii_digit()))
        .collect()
}

/// nftables elements that name a sandbox link, in svcd's namespace.
fn nft_links(w: &World) -> String {
    let out = w.host.exec("nft", &["list", "ruleset"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .filter(|l| l.contains("\"svc") || l.contains(" svc1") || l.contains("elements"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Nothing of any sandbox is left, and svcd answers.
fn nothing_left(w: &World, after: &str) -> Vec<String> {
    let mut wrong = Vec::new();
    let (code, body) = w.api(&[], "GET", "/v1/health", None);
    if code != 200 {
        wrong.push(format!("after {after}: svcd's health is {code} {body}"));
    }
    let names = listed(w);
    if !names.is_empty() {
        wrong.push(format!("after {after}: sandboxes left: {names:?}"));
    }
    let l = links(w);
    if !l.is_empty() {
        wrong.push(format!("after {after}: links left: {l:?}"));
    }
    let sandboxes = w.dir.join("state/sandboxes");
    let dirs: Vec<_> = std::fs::read_dir(&sandboxes)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    if !dirs.is_empty() {
        wrong.push(format!("after {after}: sandbox directories left: {dirs:?}"));
    }
    wrong
}

/// Odd creation bodies, each refused with a 4xx naming what was wrong, none leaving anything.
#[test]
fn odd_creation_requests_are_refused_by_name_and_leave_nothing() {
    require_root();
    let w = World::start();
    let deep = format!(
        "{{\"name\":\"deep\",\"allow_hosts\":{}{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    let huge_name = format!("{{\"name\":\"{}\"}}", "a".repeat(8 << 20));
    let huge_hosts = format!(
        "{{\"name\":\"hosts\",\"allow_hosts\":[{}]}}",
        (0..200_000)
            .map(|i| format!("\"h{i}.example.test\""))
            .collect::<Vec<_>>()
            .join(",")
    );
    let cases: Vec<(&str, String, &str)> = vec![
        ("unicode name", r#"{"name":"ünï"}"#.into(), "name"),
        ("dot-dot name", r#"{"name":".."}"#.into(), "name"),
        ("slash name", r#"{"name":"a/b"}"#.into(), "name"),
        (
            "49 characters",
            format!(r#"{{"name":"{}"}}"#, "a".repeat(49)),
            "48",
        ),
        ("leading dash", r#"{"name":"-a"}"#.into(), "name"),
        ("empty name", r#"{"name":""}"#.into(), "empty"),
        ("nul in name", "{\"name\":\"a\\u0000b\"}".into(), "name"),
        (
            "duplicate name key",
            r#"{"name":"dupa","name":"dupb"}"#.into(),
            "name",
        ),
        (
            "unknown field",
            r#"{"name":"unk","privileged":true}"#.into(),
            "privileged",
        ),
        (
            "unknown backend",
            r#"{"name":"bk","backend":"bogus"}"#.into(),
            "bogus",
        ),
        (
            "empty backend",
            r#"{"name":"bke","backend":""}"#.into(),
            "backend",
        ),
        (
            "backend with spaces",
            r#"{"name":"bks","backend":"container "}"#.into(),
            "backend",
        ),
        (
            "bad host",
            r#"{"name":"bh","allow_hosts":["a b"]}"#.into(),
            "a b",
        ),
        (
            "host with path",
            r#"{"name":"bp","allow_hosts":["x.test/evil"]}"#.into(),
            "x.test",
        ),
        (
            "star host",
            r#"{"name":"bs","allow_hosts":["*"]}"#.into(),
            "*",
        ),
        (
            "secret bad name",
            r#"{"name":"sb","secrets":[{"name":"../../etc","source":"env:X","value":"v"}]}"#.into(),
            "secret",
        ),
        (
            "context path with hosts",
            r#"{"name":"cp","context_path":"/","allow_hosts":["a.example.test"]}"#.into(),
            "allow",
        ),
        (
            "workspace root /etc",
            r#"{"name":"wse","workspace":{"root":"/etc"}}"#.into(),
            "workspace",
        ),
        ("deep nesting", deep, "column"),
        ("8 MiB name", huge_name, ""),
        ("200k hosts", huge_hosts, ""),
        ("not json", "{\"name\":".into(), ""),
    ];
    let mut wrong = Vec::new();
    for (what, body, says) in &cases {
        let (code, answer) = w.api(&[], "POST", "/v1/sandboxes", Some(body.as_bytes()));
        eprintln!(
            "{what:25} {code} {}",
            answer.chars().take(300).collect::<String>()
        );
        if !(400..500).contains(&code) {
            wrong.push(format!("{what}: {code}, not a 4xx refusal: {answer}"));
            continue;
        }
        if !answer.contains(says) {
            wrong.push(format!(
                "{what}: the refusal does not name {says:?}: {answer}"
            ));
        }
    }
    wrong.extend(nothing_left(&w, "the odd bodies"));
    eprintln!("nft: {}", nft_links(&w));
    assert!(
        wrong.is_empty(),
        "{} got through:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// Two creations of one name at once: one sandbox, the other refused naming the name; and a
/// creation racing the destruction of its name: a whole sandbox or a refusal, never a half.
#[test]
fn creations_raced_on_one_name_make_one_whole_sandbox_or_none() {
    require_root();
    let w = Arc::new(World::start());
    let mut wrong = Vec::new();
    for round in 0..3 {
        let name = format!("race{round}");
        let outs: Vec<Output> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let (w, name) = (w.clone(), name.clone());
                    s.spawn(move || w.svc(&["sandbox", "create", &name]))
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        let ok = outs.iter().filter(|o| o.status.success()).count();
        for o in &outs {
            eprintln!(
                "{name}: {} {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        if ok != 1 {
            wrong.push(format!(
                "{name}: {ok} of two simultaneous creations succeeded"
            ));
        }
        if let Some(o) = outs.iter().find(|o| !o.status.success()) {
            let e = String::from_utf8_lossy(&o.stderr);
            if !e.contains(&name) {
                wrong.push(format!(
                    "{name}: the refusal does not name the sandbox: {e}"
                ));
            }
        }
        if ok >= 1 {
            let (code, out, err) = w.sh(&name, "cat /etc/resolv.conf >/dev/null && echo whole");
            if code != 0 || !out.contains("whole") {
                wrong.push(format!("{name}: the sandbox made is not whole: {out}{err}"));
            }
            // Now destroy it while a third creation of the name races the destruction.
            let (d, c) = std::thread::scope(|s| {
                let (w1, n1) = (w.clone(), name.clone());
                let (w2, n2) = (w.clone(), name.clone());
                let d = s.spawn(move || w1.svc(&["sandbox", "destroy", &n1]));
                let c = s.spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(20 * round));
                    w2.svc(&["sandbox", "create", &n2])
                });
                (d.join().expect("destroy"), c.join().expect("create"))
            });
            eprintln!(
                "{name}: destroy {} {}; create {} {}",
                d.status,
                String::from_utf8_lossy(&d.stderr).trim(),
                c.status,
                String::from_utf8_lossy(&c.stderr).trim()
            );
            if c.status.success() {
                let (code, out, err) = w.sh(&name, "cat /etc/resolv.conf >/dev/null && echo whole");
                if code != 0 || !out.contains("whole") {
                    wrong.push(format!(
                        "{name}: created while its name was destroyed, not whole: {out}{err}"
                    ));
                }
                w.destroy_checked(&name);
            } else {
                let e = String::from_utf8_lossy(&c.stderr);
                if !e.contains(&name) {
                    wrong.push(format!(
                        "{name}: the refusal does not name the sandbox: {e}"
                    ));
                }
            }
        }
        wrong.extend(nothing_left(&w, &format!("round {round}")));
    }
    assert!(
        wrong.is_empty(),
        "{} got through:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// A creation that fails after its row was reserved (a workspace whose `.git` is a symbolic
/// link: refused when the guest's mounts are made) leaves nothing, and says why.
#[test]
fn a_creation_failing_mid_build_leaves_nothing() {
    require_root();
    let w = World::start();
    let dir = svc_tests::fresh_dir("midway");
    std::fs::create_dir_all(dir.join(".svc")).expect("dir");
    std::fs::create_dir_all(dir.join("elsewhere")).expect("elsewhere");
    std::fs::write(dir.join(".svc/workspace.json"), r#"{"version":1}"#).expect("ws");
    std::os::unix::fs::symlink("elsewhere", dir.join(".git")).expect("link");
    let out = w.workspace_up(dir.to_str().expect("utf-8"), "midway");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{said}");
    let mut wrong = Vec::new();
    if out.status.success() {
        wrong.push(format!("a workspace whose .git is a link came up: {said}"));
        let _ = w.svc(&["workspace", "down", "midway"]);
    } else if !said.contains(".git") {
        wrong.push(format!("the refusal does not name .git: {said}"));
    }
    wrong.extend(nothing_left(&w, "the failed workspace"));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A second API user bends paths towards root's sandbox: every form is refused or missing,
/// never answered with the sandbox.
#[test]
fn a_second_users_bent_paths_never_reach_anothers_sandbox() {
    require_root();
    let w = World::start();
    w.sandbox_allowing("victim", &["allowed.example.test"]);
    let user = User::add(format!("atk{}", std::process::id() % 100_000), None);
    let ids_owned = user.ids();
    let ids: Vec<&str> = ids_owned.iter().map(String::as_str).collect();
    for p in [&w.dir, &w.socket] {
        let _ = Command::new("chmod").arg("o+x").arg(p).output();
    }
    let explain: &[u8] = br#"{"method":"GET","url":"https://allowed.example.test/x"}"#;
    let exec: &[u8] = br#"{"argv":["id"]}"#;
    let fork: &[u8] = br#"{"name":"mine"}"#;
    let cases: Vec<(&str, &str, Option<&[u8]>)> = vec![
        ("GET", "/v1/sandboxes/victim", None),
        ("POST", "/v1/sandboxes/victim/explain", Some(explain)),
        ("POST", "/v1/sandboxes/victim/explain/", Some(explain)),
        ("POST", "/v1//sandboxes//victim//explain", Some(explain)),
        ("POST", "/v1/sandboxes/victim/./explain", Some(explain)),
        ("POST", "/v1/sandboxes/x/../victim/explain", Some(explain)),
        ("POST", "/v1/sandboxes/%76ictim/explain", Some(explain)),
        ("POST", "/v1/sandboxes/victim%2fexplain", Some(explain)),
        ("POST", "/v1/sandboxes/victim/exec", Some(exec)),
        ("POST", "/v1/sandboxes/victim/exec/", Some(exec)),
        ("GET", "/v1/sandboxes/victim/workspace/log", None),
        ("GET", "/v1/sandboxes/victim/workspace//log", None),
        ("POST", "/v1/sandboxes/victim/fork", Some(fork)),
        ("GET", "/v1/audit?sandbox=victim", None),
        ("GET", "/v1/events", None),
    ];
    let mut wrong = Vec::new();
    for (method, path, body) in &cases {
        let (code, answer) = w.api(&ids, method, path, *body);
        eprintln!(
            "{method} {path}: {code} {}",
            answer.chars().take(200).collect::<String>()
        );
        let leaked = answer.contains("\"link\"")
            || answer.contains("uid=")
            || answer.contains("\"verdict\"")
            || answer.contains("\"decision\"")
            || answer.contains("victim") && code == 200;
        if (200..300).contains(&code) && leaked {
            wrong.push(format!("{method} {path}: {code} {answer}"));
        }
    }
    let (code, backends) = w.api(&ids, "GET", "/v1/backends", None);
    eprintln!("backends as the member: {code} {backends}");
    if backends.contains(&w.dir.display().to_string()) {
        wrong.push(format!(
            "GET /v1/backends shows a member svcd's paths: {backends}"
        ));
    }
    drop(user);
    w.destroy_checked("victim");
    assert!(
        wrong.is_empty(),
        "{} got through:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// A member's project directory itself swapped, while `svc workspace up` runs, with a link to
/// root's 0700 directory: svcd must never share root's directory with the member's guest,
/// and each failed creation (the swap caught at the check or at the mount) leaves nothing.
#[test]
fn a_members_project_swapped_for_a_link_mid_creation_never_shares_roots_directory() {
    require_root();
    let w = World::start();
    let user = User::add(format!("atks{}", std::process::id() % 100_000), None);
    let ids_owned = user.ids();
    let ids: Vec<&str> = ids_owned.iter().map(String::as_str).collect();
    // The member's base (it may rename in it), its project, root's secret beside it.
    let base = svc_tests::fresh_dir("mswap");
    let proj = base.join("proj");
    let secret = base.join("roots");
    std::fs::create_dir_all(proj.join(".svc")).expect("proj");
    std::fs::write(proj.join(".svc/workspace.json"), r#"{"version":1}"#).expect("ws");
    std::fs::write(proj.join("mine"), "the member's").expect("mine");
    std::fs::create_dir_all(secret.join(".svc")).expect("secret");
    std::fs::write(secret.join(".svc/workspace.json"), r#"{"version":1}"#).expect("ws");
    std::fs::write(secret.join("root-only"), "ROOT SECRET").expect("secret file");
    std::os::unix::fs::symlink(&secret, base.join("link")).expect("link");
    let sh = |cmd: String| {
        let _ = Command::new("sh").arg("-c").arg(cmd).output();
    };
    sh(format!(
        "chown -R {uid}:65534 {b}/proj; chown -h {uid}:65534 {b}/link; chown {uid}:65534 {b}; \
         chmod 755 {b}; chmod 700 {b}/roots",
        uid = user.uid,
        b = base.display()
    ));
    let mut swapper = Command::new("setpriv")
        .args(&ids)
        .args(["/usr/bin/python3", "-c", SWAP])
        .arg(&proj)
        .arg(base.join("link"))
        .arg("200")
        .spawn()
        .expect("swapper");
    let mut wrong = Vec::new();
    let (mut up, mut refused) = (0, 0);
    for i in 0..25 {
        let n = format!("mswap{i}");
        let out = w.svc_as(
            &ids,
            &[
                "workspace",
                "up",
                "--trust",
                proj.to_str().expect("utf-8"),
                "--name",
                &n,
                "--backend",
                "container",
                "--detach",
            ],
        );
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            up += 1;
            let seen = w.svc_as(
                &ids,
                &[
                    "sandbox",
                    "exec",
                    &n,
                    "--",
                    "sh",
                    "-c",
                    "cat /workspace/* 2>&1; ls -la /workspace",
                ],
            );
            let seen = String::from_utf8_lossy(&seen.stdout).into_owned();
            if seen.contains("ROOT SECRET") || seen.contains("root-only") {
                wrong.push(format!(
                    "{n}: the member's guest sees root's directory: {seen}"
                ));
            }
            let _ = w.svc(&["sandbox", "destroy", &n]);
        } else {
            refused += 1;
            if i < 3 || refused % 5 == 0 {
                eprintln!("{n}: {}", said.trim());
            }
        }
        wrong.extend(nothing_left(&w, &n));
        if !wrong.is_empty() {
            break;
        }
    }
    let _ = swapper.kill();
    let _ = swapper.wait();
    eprintln!("{up} came up, {refused} refused");
    drop(user);
    let _ = std::fs::remove_dir_all(&base);
    assert!(
        wrong.is_empty(),
        "{} got through:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
