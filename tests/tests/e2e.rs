//! End to end: the real `svc` against the real `svcd`, real container sandboxes, the real fence,
//! DNS guard and proxy, and an outside world of real DNS, HTTPS and `git http-backend` servers
//! in their own namespace (see `svc_tests::world`).

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use svc_tests::{
    require_root,
    world::{CODE_TOKEN, EXAMPLE_TOKEN, World},
};

fn http_records<'a>(audit: &'a [Value], host: &str) -> Vec<&'a Value> {
    audit
        .iter()
        .filter(|r| r["layer"] == "http" && r["host"] == host)
        .collect()
}

#[test]
fn a_sandbox_reaches_exactly_what_it_may_with_credentials_swapped_on_the_wire() {
    require_root();
    let w = World::start();
    let created = w.svc_env(
        &[
            "sandbox",
            "create",
            "--repo",
            "acme/widget",
            "--secret",
            "CODE_HOST_TOKEN@env:CODE",
            "--allow-host",
            "allowed.example.test",
            "--secret",
            "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN@env:EXAMPLE",
            "dev",
        ],
        &[("CODE", CODE_TOKEN), ("EXAMPLE", EXAMPLE_TOKEN)],
    );
    assert!(
        created.status.success(),
        "create: {}{}\n{}",
        String::from_utf8_lossy(&created.stdout),
        String::from_utf8_lossy(&created.stderr),
        w.svcd_log()
    );
    let s = w.show("dev");
    assert_eq!(s["mode"], "curated");
    assert_eq!(s["state"], "running");
    let id = s["id"].as_u64().expect("id") as u32;
    let link = s["link"].as_str().expect("link").to_owned();
    let pid = s["pid"].as_u64().expect("pid") as u32;
    for host in [
        "api.agent.test",
        "code.test",
        "api.code.test",
        "allowed.example.test",
    ] {
        assert!(
            s["allowed_hosts"]
                .as_array()
                .expect("hosts")
                .iter()
                .any(|h| h == host),
            "{host} missing from {s}"
        );
    }

    // The guest's environment: placeholders, never the real tokens.
    let (code, env, _) = w.sh("dev", "env");
    assert_eq!(code, 0);
    assert!(!env.contains(CODE_TOKEN) && !env.contains(EXAMPLE_TOKEN));
    let var = |name: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} not in the guest env:\n{env}"))
            .to_owned()
    };
    let placeholder = var("SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN");
    assert_eq!(placeholder.len(), 64);
    assert_eq!(
        var("SVC_CRED_ALLOWED_EXAMPLE_TEST_EXPIRES_AT"),
        "2099-12-31T23:59:59Z"
    );
    assert_eq!(var("CODE_HOST_TOKEN").len(), 64);
    assert_eq!(var("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt");

    // 1. An allowed host, with the placeholder: the upstream gets the real token.
    let (code, out, err) = w.sh(
        "dev",
        "curl -sS --max-time 10 -H \"Authorization: Bearer $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" \
         https://allowed.example.test/v1/hello",
    );
    assert_eq!(code, 0, "allowed request failed: {err}\n{}", w.svcd_log());
    let answer: Value = serde_json::from_str(out.trim()).expect("json answer");
    assert_eq!(answer["credential_received"], "real", "{answer}");
    let received = w.received();
    let got: Vec<&Value> = received
        .iter()
        .filter(|r| r["kind"] == "http" && r["host"] == "allowed.example.test")
        .collect();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["authorization"], format!("Bearer {EXAMPLE_TOKEN}"));
    assert!(
        !received.iter().any(|r| r["authorization"]
            .as_str()
            .is_some_and(|a| a.contains(&placeholder))),
        "a placeholder reached the outside"
    );

    // 2. A host off the list: refused at DNS, never asked outside.
    let (code, _, _) = w.sh("dev", "getent hosts forbidden.example.test");
    assert_ne!(code, 0, "forbidden.example.test resolved");
    // 3. Its address, dialled directly: dropped by the fence.
    let (code, _, _) = w.sh("dev", "curl -sS --connect-timeout 2 -k https://192.0.2.66/");
    assert_ne!(code, 0, "the IP literal connected");
    let received = w.received();
    assert!(
        !received.iter().any(|r| r["name"] == "forbidden.example.test"
            || r["host"] == "forbidden.example.test"),
        "the forbidden host saw something: {received:?}"
    );

    // 4. The bound repo over smart HTTP: clone and push a branch, with the token swapped.
    let (code, out, err) = w.sh("dev",
        "set -e; cd /tmp && rm -rf widget && \
         git -c http.extraHeader=\"Authorization: Bearer $CODE_HOST_TOKEN\" clone -q https://code.test/acme/widget.git && \
         cd widget && git -c user.name=agent -c user.email=a@svc.invalid commit -q --allow-empty -m work && \
         git -c http.extraHeader=\"Authorization: Bearer $CODE_HOST_TOKEN\" push -q origin HEAD:refs/heads/svc/work && \
         cat README",
    );
    assert_eq!(code, 0, "clone/push of the bound repo failed: {out}{err}");
    assert_eq!(out.trim(), "acme/widget");
    let heads = Command::new("git")
        .args(["--git-dir"])
        .arg(w.dir.join("git/acme/widget.git"))
        .args(["for-each-ref", "--format=%(refname)"])
        .output()
        .expect("git");
    assert!(String::from_utf8_lossy(&heads.stdout).contains("refs/heads/svc/work"));
    let git_requests: Vec<Value> = w
        .received()
        .into_iter()
        .filter(|r| r["kind"] == "http" && r["host"] == "code.test")
        .collect();
    assert!(!git_requests.is_empty());
    assert!(
        git_requests
            .iter()
            .all(|r| r["authorization"] == format!("Bearer {CODE_TOKEN}")),
        "every git request carried the real token: {git_requests:?}"
    );

    // 5. A foreign repo: 403 with the JSON body, never upstream.
    let (code, out, _) = w.sh(
        "dev",
        "curl -sS --max-time 10 -w '\\n%{http_code}' \
         'https://code.test/evil/exfil.git/info/refs?service=git-upload-pack'",
    );
    assert_eq!(code, 0);
    let (body, status) = out.trim().rsplit_once('\n').expect("body and status");
    assert_eq!(status, "403", "{out}");
    let refusal: Value = serde_json::from_str(body).expect("refusal json");
    assert_eq!(refusal["status"], 403);
    assert!(refusal["perimeter"].is_string(), "{refusal}");
    assert!(
        !w.received()
            .iter()
            .any(|r| r["path"].as_str().is_some_and(|p| p.contains("evil"))),
        "the foreign repo request reached the code host"
    );

    // 6. The audit trail has every layer; no token in it.
    std::thread::sleep(Duration::from_millis(300));
    let audit = w.audit();
    let ex = http_records(&audit, "allowed.example.test");
    assert_eq!(ex.len(), 1, "{audit:?}");
    assert_eq!(ex[0]["credential"], "swapped");
    assert_eq!(ex[0]["sandbox"], id);
    assert_eq!(
        ex[0]["sandbox_name"], "dev",
        "svcd names the sandbox in every record"
    );
    let dns = audit
        .iter()
        .find(|r| r["layer"] == "dns")
        .expect("a DNS record");
    assert_eq!(
        dns["sandbox_name"], "dev",
        "a DNS record keeps the sandbox's name beside the question's"
    );
    assert!(dns["name"].as_str().is_some_and(|n| n.ends_with('.')));
    assert!(
        http_records(&audit, "code.test")
            .iter()
            .any(|r| r["status"] == 403 && r["decision"] == "deny")
    );
    let dns: Vec<&Value> = audit.iter().filter(|r| r["layer"] == "dns").collect();
    assert!(
        dns.iter()
            .any(|r| r["name"] == "forbidden.example.test." && r["decision"] == "refused"),
        "{dns:?}"
    );
    assert!(
        audit
            .iter()
            .any(|r| r["layer"] == "packet" && r["dst"] == "192.0.2.66")
    );
    let raw = std::fs::read_to_string(w.audit_path()).expect("audit");
    assert!(
        !raw.contains(CODE_TOKEN) && !raw.contains(EXAMPLE_TOKEN) && !raw.contains(&placeholder)
    );

    // 7. Events, and destroy leaves nothing.
    let events = w.svc_ok(&["events", "--json"]);
    assert!(events.contains("\"sandbox.created\"") && events.contains("\"workspace.ready\""));
    w.svc_ok(&["sandbox", "destroy", "dev"]);
    w.assert_gone(id, &link, pid, "dev");
    assert!(
        w.svc_ok(&["events", "--json"])
            .contains("\"sandbox.destroyed\"")
    );
}

/// The code-host rules through the live perimeter: svcd, the fence, the guard, the proxy, and the code-host
/// family of the outside world. Each case: the request from inside the sandbox (always with the
/// CODE_HOST_TOKEN placeholder), the status the sandbox sees, and what the upstream received:
/// `Some("real")` swapped, `Some("none")` stripped, `None` never reached.
#[test]
fn every_code_host_rule_holds_through_the_live_perimeter() {
    require_root();
    let w = World::start();
    // --repo alone: svcd brokers the host's own code-host token (credentials.code_host_token_file).
    let created = w.svc(&["sandbox", "create", "--repo", "acme/widget", "ch"]);
    assert!(created.status.success(), "{}", w.svcd_log());
    let s = w.show("ch");
    assert!(
        s["secrets"].as_array().is_some_and(|a| a.iter().any(|x| x
            .as_str()
            .is_some_and(|x| x.starts_with("CODE_HOST_TOKEN@host:")))),
        "{s}"
    );
    let viewer = r#"{"query":"{ viewer { login } }"}"#;
    let more = r#"{"query":"{ viewer { login email } }"}"#;
    let mutation =
        r#"{"query":"mutation { createPullRequest(input: {}) { pullRequest { id } } }"}"#;
    let pulls = r#"{"title":"t","head":"svc/x","base":"main","body":"b"}"#;
    struct Case {
        name: &'static str,
        method: &'static str,
        url: &'static str,
        body: Option<&'static str>,
        status: &'static str,
        upstream: Option<&'static str>,
        /// Send the CODE_HOST_TOKEN placeholder as the bearer.
        auth: bool,
    }
    let cases = [
        // 5.5.2: the token is swapped on every request to the API and uploads hosts.
        Case {
            name: "api_rest_bound_repo",
            method: "GET",
            url: "https://api.code.test/repos/acme/widget",
            body: None,
            status: "200",
            upstream: Some("real"),
            auth: true,
        },
        Case {
            name: "uploads_asset",
            method: "POST",
            url: "https://uploads.code.test/repos/acme/widget/releases/1/assets?name=a.tgz",
            body: Some("x"),
            status: "200",
            upstream: Some("real"),
            auth: true,
        },
        // 5.5.4: archives and release downloads of any repository, token stripped.
        Case {
            name: "archive_any_repo",
            method: "GET",
            url: "https://code.test/other/thing/archive/main.tar.gz",
            body: None,
            status: "200",
            upstream: Some("none"),
            auth: true,
        },
        Case {
            name: "archive_head",
            method: "HEAD",
            url: "https://code.test/other/thing/archive/v1.zip",
            body: None,
            status: "200",
            upstream: Some("none"),
            auth: true,
        },
        Case {
            name: "release_download",
            method: "GET",
            url: "https://code.test/other/thing/releases/download/v1/x.tgz",
            body: None,
            status: "200",
            upstream: Some("none"),
            auth: true,
        },
        // 5.5.5: API root, and GraphQL only for exactly a viewer-login selection.
        Case {
            name: "api_root",
            method: "GET",
            url: "https://api.code.test/",
            body: None,
            status: "200",
            upstream: Some("real"),
            auth: true,
        },
        Case {
            name: "graphql_viewer_login",
            method: "POST",
            url: "https://api.code.test/graphql",
            body: Some(viewer),
            status: "200",
            upstream: Some("real"),
            auth: true,
        },
        Case {
            name: "graphql_selects_more",
            method: "POST",
            url: "https://api.code.test/graphql",
            body: Some(more),
            status: "403",
            upstream: None,
            auth: true,
        },
        Case {
            name: "graphql_mutation_gh_pr_create",
            method: "POST",
            url: "https://api.code.test/graphql",
            body: Some(mutation),
            status: "403",
            upstream: None,
            auth: true,
        },
        Case {
            name: "post_to_archive_path",
            method: "POST",
            url: "https://code.test/acme/widget/archive/main.tar.gz",
            body: Some("x"),
            status: "403",
            upstream: None,
            auth: true,
        },
        Case {
            name: "api_other_repo",
            method: "GET",
            url: "https://api.code.test/repos/evil/exfil",
            body: None,
            status: "403",
            upstream: None,
            auth: true,
        },
        // 5.5.9: pull requests by the REST form.
        Case {
            name: "rest_pull_request",
            method: "POST",
            url: "https://api.code.test/repos/acme/widget/pulls",
            body: Some(pulls),
            status: "200",
            upstream: Some("real"),
            auth: true,
        },
        // 5.5.8: the archive host is open — but the code-host placeholder is not its own:
        // sent there it is a leak attempt, refused (SECURITY-CASES), never swapped.
        Case {
            name: "archive_host",
            method: "GET",
            url: "https://archive.code.test/acme/widget/tar.gz/main",
            body: None,
            status: "200",
            upstream: Some("none"),
            auth: false,
        },
        Case {
            name: "placeholder_to_archive_host",
            method: "GET",
            url: "https://archive.code.test/acme/widget/tar.gz/v2",
            body: None,
            status: "403",
            upstream: None,
            auth: true,
        },
    ];
    let mut failures = Vec::new();
    for c in &cases {
        let data = c
            .body
            .map(|b| format!(" -H 'content-type: application/json' --data-raw '{b}'"))
            .unwrap_or_default();
        let head = if c.method == "HEAD" { " -I" } else { "" };
        let auth = if c.auth {
            " -H \"Authorization: Bearer $CODE_HOST_TOKEN\""
        } else {
            ""
        };
        let script = format!(
            "curl -sS -o /dev/null -w '%{{http_code}}' --max-time 10{head} -X {}{auth}{data} '{}'",
            c.method, c.url
        );
        let before = w.received().len();
        let (_, status, err) = w.sh("ch", &script);
        let path = c.url.split_once(".test").map_or("", |(_, p)| p);
        let path = path.split('?').next().unwrap_or(path);
        let got: Vec<Value> = w.received()[before..]
            .iter()
            .filter(|r| r["kind"] == "http")
            .cloned()
            .collect();
        let upstream = got
            .iter()
            .find(|r| r["path"] == path)
            .map(|r| r["credential"].as_str().unwrap_or("").to_owned());
        if status.trim() != c.status || upstream.as_deref() != c.upstream {
            failures.push(format!(
                "{}: status {} (want {}), upstream {upstream:?} (want {:?}) {err}",
                c.name,
                status.trim(),
                c.status,
                c.upstream
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    // 5.5.1: the code host is in an envelope only through --repo or --allow-host.
    w.svc_ok(&["sandbox", "create", "plain"]);
    let (code, _, _) = w.sh("plain", "getent hosts code.test");
    assert_ne!(code, 0, "code.test resolved for a sandbox without --repo");
}

#[test]
fn the_server_name_must_be_one_the_dialled_address_was_resolved_for() {
    require_root();
    let w = World::start();
    w.sandbox_allowing("sni", &["allowed.example.test"]);
    // Both names resolved through the guard: both addresses are open in the fence.
    let (code, _, _) = w.sh(
        "sni",
        "getent hosts allowed.example.test && getent hosts api.agent.test",
    );
    assert_eq!(code, 0);
    // allowed.example.test's address, presenting api.agent.test (also allowed): refused.
    let (code, _, err) = w.sh("sni",
        "curl -sS --max-time 10 --resolve api.agent.test:443:192.0.2.20 https://api.agent.test/mismatch",
    );
    assert_ne!(code, 0, "a mismatched server name was served");
    assert!(err.contains("curl: (35)") || err.contains("SSL"), "{err}");
    // The same name at its own address: served.
    let (code, out, err) = w.sh("sni", "curl -sS --max-time 10 https://api.agent.test/");
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"served_by\":\"api.agent.test\""), "{out}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        w.audit().iter().any(|r| r["layer"] == "http"
            && r["rule"]
                .as_str()
                .is_some_and(|x| x.contains("does not match the address dialled (192.0.2.20)"))),
        "the refusal is audited"
    );
    assert!(
        !w.received().iter().any(|r| r["path"] == "/mismatch"),
        "the mismatched request never reached the outside"
    );
}

#[test]
fn bad_requests_are_refused_with_clear_errors() {
    require_root();
    let w = World::start();
    let cases: &[(&str, &[&str], &str)] = &[
        ("path_name", &["sandbox", "create", "../x"], "contains '.'"),
        ("upper_name", &["sandbox", "create", "Dev"], "lowercase"),
        (
            "long_name",
            &["sandbox", "create", &"a".repeat(49)],
            "limit is 48",
        ),
        (
            "bad_mode",
            &["sandbox", "create", "--egress", "open", "x"],
            "allowed: curated, allow-all",
        ),
        (
            "bad_host",
            &["sandbox", "create", "--allow-host", "not a host", "x"],
            "--allow-host",
        ),
        (
            "bad_repo",
            &["sandbox", "create", "--repo", "just-a-name", "x"],
            "--repo",
        ),
        (
            "secret_without_repo",
            &[
                "sandbox",
                "create",
                "--secret",
                "CODE_HOST_TOKEN@env:PATH",
                "x",
            ],
            "needs --repo",
        ),
        (
            "secret_store_missing",
            &[
                "sandbox",
                "create",
                "--secret",
                "AGENT_AUTH_TOKEN@store:x",
                "x",
            ],
            "no secret x in the store",
        ),
        (
            "allow_all_with_hosts",
            &[
                "sandbox",
                "create",
                "--egress",
                "allow-all",
                "--allow-host",
                "a.test",
                "x",
            ],
            "curated sandboxes only",
        ),
        ("unknown", &["sandbox", "show", "nope"], "no sandbox named"),
        (
            "backend_unknown",
            &["sandbox", "create", "--backend", "docker", "vm"],
            "invalid value 'docker'",
        ),
        (
            "exec_unknown",
            &["sandbox", "exec", "nope", "--", "true"],
            "no sandbox named",
        ),
    ];
    for (name, args, fragment) in cases {
        let out = w.svc(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: succeeded");
        assert!(
            err.contains(fragment),
            "{name}: expected {fragment:?} in {err}"
        );
    }
    w.svc_ok(&["sandbox", "create", "--backend", "netns", "dup"]);
    assert_eq!(
        w.show("dup")["backend"],
        "container",
        "netns is container's old name"
    );
    let again = w.svc(&["sandbox", "create", "dup"]);
    assert!(String::from_utf8_lossy(&again.stderr).contains("already exists"));
    let fork = w.svc(&["sandbox", "fork", "dup", "dup2"]);
    assert!(String::from_utf8_lossy(&fork.stderr).contains("container backend cannot fork"));
    let fork = w.svc(&["sandbox", "fork", "dup"]);
    assert!(
        String::from_utf8_lossy(&fork.stderr).contains("<CLONES>..."),
        "fork without clone names says what it needs"
    );
    let upgrade = w.svc(&["supervisor-upgrade"]);
    let err = String::from_utf8_lossy(&upgrade.stderr);
    assert!(
        err.contains("mounts or credential model") && err.contains("--force"),
        "{err}"
    );
    assert!(
        w.svc(&["sandbox", "list"]).status.success(),
        "svcd still serves after every refusal"
    );

    // Callers by peer credentials (the World's api_group is `nogroup`, gid 65534).
    use std::os::unix::fs::PermissionsExt as _;
    let as_user = |ids: &[&str]| w.svc_as(ids, &["sandbox", "list", "--json"]);
    // A member of the API group: served.
    let member = as_user(&["--reuid=65534", "--regid=65534", "--clear-groups"]);
    assert!(
        member.status.success(),
        "a member of the API group was refused: {}",
        String::from_utf8_lossy(&member.stderr)
    );
    // Anyone else: the socket's mode (0660, root:nogroup) already keeps them out...
    let outsider = as_user(&["--reuid=1", "--regid=1", "--clear-groups"]);
    assert!(!outsider.status.success(), "uid 1 listed sandboxes");
    // ...and is told which group would let them in, and how.
    assert!(
        String::from_utf8_lossy(&outsider.stderr).contains(
            "permission denied on {}: your user is not in the group 'nogroup' that may use svcd; \
             ask an administrator to run: usermod -aG nogroup $USER"
                .replace("{}", &w.socket.display().to_string())
                .as_str()
        ),
        "{}",
        String::from_utf8_lossy(&outsider.stderr)
    );
    // ...and svcd refuses them itself when the socket is opened up by mistake.
    std::fs::set_permissions(&w.socket, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let outsider = as_user(&["--reuid=1", "--regid=1", "--clear-groups"]);
    std::fs::set_permissions(&w.socket, std::fs::Permissions::from_mode(0o660)).expect("chmod");
    let err = String::from_utf8_lossy(&outsider.stderr);
    assert!(!outsider.status.success(), "uid 1 listed sandboxes");
    assert!(
        err.contains("uid 1 may not use svcd") && err.contains("gid 65534"),
        "{err}"
    );
}

#[test]
fn svcd_killed_mid_traffic_never_opens_the_fence_and_readopts_on_restart() {
    require_root();
    let mut w = World::start();
    w.sandbox_allowing("k", &["allowed.example.test"]);
    let s = w.show("k");
    // Resolved before the crash: the guard commits 192.0.2.20 to the fence.
    let (code, _, _) = w.sh("k", "getent hosts allowed.example.test");
    assert_eq!(code, 0);
    let pid = s["pid"].as_u64().expect("pid").to_string();
    // Traffic from inside the sandbox that does not depend on svcd: nsenter by pid.
    let log = w.dir.join("traffic.log");
    let script = format!(
        "for i in $(seq 1 25); do \
           if curl -s --connect-timeout 0.3 -k https://192.0.2.66/ >/dev/null 2>&1; then echo OPEN-literal; else echo closed-literal; fi; \
           if curl -s --connect-timeout 0.3 --resolve forbidden.example.test:443:192.0.2.66 -k https://forbidden.example.test/ >/dev/null 2>&1; then echo OPEN-name; fi; \
         done > {}",
        log.display()
    );
    let mut traffic = Command::new("nsenter")
        // The network namespace only: the log file is the host's (the sandbox's /tmp is its own).
        .args(["--target", &pid, "--net"])
        .args(["sh", "-c", &script])
        .stdout(Stdio::null())
        .spawn()
        .expect("traffic");
    std::thread::sleep(Duration::from_millis(800));
    w.kill_svcd();
    // While svcd is down: allowed HTTPS fails closed too (no proxy), nothing opens.
    std::thread::sleep(Duration::from_millis(1500));
    let down = Command::new("nsenter")
        .args(["--target", &pid, "--net"])
        .args(["curl", "-s", "--connect-timeout", "1", "--max-time", "2"])
        .arg("--resolve")
        .arg("allowed.example.test:443:192.0.2.20")
        .arg("https://allowed.example.test/")
        .output()
        .expect("curl");
    assert!(!down.status.success(), "HTTPS passed while svcd was down");
    w.start_svcd();
    let deadline = Instant::now() + Duration::from_secs(60);
    while traffic.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "the traffic loop hung");
        std::thread::sleep(Duration::from_millis(100));
    }
    let results = std::fs::read_to_string(&log).expect("traffic log");
    assert!(
        results.lines().count() >= 20,
        "too little traffic: {results}"
    );
    assert!(!results.contains("OPEN"), "the fence opened:\n{results}");

    // Re-adopted: listed as running; the address it resolved before the crash still works
    // without resolving again (the fence's entries and the binding survived), and so does a
    // fresh resolution.
    let s = w.show("k");
    assert_eq!(s["state"], "running");
    let (code, _, err) = w.sh("k",
        "curl -sS --max-time 10 --resolve allowed.example.test:443:192.0.2.20 https://allowed.example.test/kept",
    );
    assert_eq!(
        code,
        0,
        "a pre-restart address stopped working: {err}\n{}",
        w.svcd_log()
    );
    let (code, out, err) = w.sh(
        "k",
        "curl -sS --max-time 10 https://allowed.example.test/after",
    );
    assert_eq!(code, 0, "after restart: {err}\n{}", w.svcd_log());
    assert!(out.contains("allowed.example.test"));
    assert!(
        w.svc_ok(&["events", "--json"])
            .contains("\"sandbox.adopted\"")
    );
}

#[test]
fn fifty_concurrent_sandboxes_are_audited_and_share_nothing() {
    require_root();
    let w = World::start();
    const N: usize = 50;
    let names: Vec<String> = (0..N).map(|i| format!("c{i}")).collect();
    std::thread::scope(|scope| {
        for name in &names {
            let w = &w;
            scope.spawn(move || w.sandbox_with_example_secret(name, "env:EXAMPLE"));
        }
    });
    let list: Vec<Value> =
        serde_json::from_str(&w.svc_ok(&["sandbox", "list", "--json"])).expect("list");
    assert_eq!(list.len(), N, "{}", w.svcd_log());
    let placeholders: Vec<String> = names
        .iter()
        .map(|n| {
            let (_, env, _) = w.sh(n, "echo $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN");
            env.trim().to_owned()
        })
        .collect();
    let unique: std::collections::HashSet<&String> = placeholders.iter().collect();
    assert_eq!(unique.len(), N, "placeholders are per sandbox");

    // Each sandbox: its own placeholder is swapped; its neighbour's is not.
    let results: Vec<(String, String)> = std::thread::scope(|scope| {
        let handles: Vec<_> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let (w, own, other) = (&w, &placeholders[i], &placeholders[(i + 1) % N]);
                scope.spawn(move || {
                    // (60 s: a bound on a hung request, not a speed check; fifty at once on
                    // two busy cores can take a while.)
                    let req = |token: &str, path: &str| {
                        let (code, out, err) = w.sh(
                            n,
                            &format!(
                                "curl -sS --max-time 60 -H 'Authorization: Bearer {token}' \
                                 https://allowed.example.test/{path}"
                            ),
                        );
                        format!("{out} (exit {code}; stderr: {})", err.trim())
                    };
                    (
                        req(own, &format!("own/{n}")),
                        req(other, &format!("other/{n}")),
                    )
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let ids: std::collections::HashMap<String, u64> = list
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap_or("").to_owned(),
                s["id"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    for (i, (own, other)) in results.iter().enumerate() {
        assert!(
            own.contains("\"credential_received\":\"real\""),
            "c{i} own: {own}\nits audit records: {:?}\nsvcd log:\n{}",
            w.audit()
                .into_iter()
                .filter(|r| r["sandbox"] == ids[&format!("c{i}")])
                .collect::<Vec<_>>(),
            w.svcd_log()
        );
        assert!(
            !other.contains("\"real\""),
            "c{i} neighbour's placeholder was swapped: {other}"
        );
    }
    // A record is written as its request ends, which can be just after the client has its
    // answer: wait (30 s at most) until every request has one, then check each is there once.
    let mut audit = w.audit();
    for _ in 0..300 {
        if http_records(&audit, "allowed.example.test").len() >= 2 * N {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        audit = w.audit();
    }
    for n in &names {
        let id = ids[n];
        let mine: Vec<&Value> = http_records(&audit, "allowed.example.test")
            .into_iter()
            .filter(|r| r["sandbox"] == id)
            .collect();
        assert_eq!(
            mine.len(),
            2,
            "{n} (id {id}): every request audited once: {mine:?}"
        );
    }
    std::thread::scope(|scope| {
        for n in &names {
            let w = &w;
            scope.spawn(move || w.svc_ok(&["sandbox", "destroy", n]));
        }
    });
    for s in &list {
        w.assert_gone(
            s["id"].as_u64().expect("id") as u32,
            s["link"].as_str().expect("link"),
            s["pid"].as_u64().expect("pid") as u32,
            s["name"].as_str().expect("name"),
        );
    }
}

#[test]
fn plain_http_to_an_allowed_host_is_served_with_the_same_rules_never_a_silent_close() {
    require_root();
    let w = World::start();
    let created = w.sandbox_with_example_secret("plain", "env:EXAMPLE");
    assert!(created.status.success(), "{created:?}");
    // Served: through the proxy to the upstream's port 80, audited.
    let (code, out, err) = w.sh(
        "plain",
        "curl -sS -w '\\nHTTP %{http_code}\\n' http://allowed.example.test/over-http",
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("\"served_by\":\"allowed.example.test\""),
        "{out}"
    );
    assert!(out.contains("HTTP 200"), "{out}");
    let received = w.received();
    assert!(
        received
            .iter()
            .any(|r| r["scheme"] == "http" && r["path"] == "/over-http"),
        "the upstream did not get it over plain HTTP: {received:?}"
    );
    // A placeholder over plain HTTP is refused as a leak, with a body naming the rule; the
    // upstream never sees it.
    let (_, out, _) = w.sh(
        "plain",
        "curl -sS -w '\\nHTTP %{http_code}\\n' -H \"Authorization: Bearer \
         $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" http://allowed.example.test/leak",
    );
    assert!(out.contains("HTTP 403"), "{out}");
    assert!(
        out.contains("\"rule\""),
        "no JSON body naming the rule: {out}"
    );
    assert!(
        !w.received().iter().any(|r| r["path"] == "/leak"),
        "the placeholder reached the upstream over plain HTTP"
    );
    // Another allowed name on this address's connection: refused (Host bound to the address).
    let (_, out, _) = w.sh(
        "plain",
        "getent hosts api.agent.test >/dev/null; curl -sS -w '\\nHTTP %{http_code}\\n' \
         -H 'Host: api.agent.test' http://allowed.example.test/fronted",
    );
    assert!(out.contains("HTTP 421"), "{out}");
    assert!(!w.received().iter().any(|r| r["path"] == "/fronted"));
    // Every one audited.
    std::thread::sleep(Duration::from_millis(300));
    let audit = w.audit();
    let http: Vec<&Value> = audit
        .iter()
        .filter(|r| r["layer"] == "http" && r["host"] == "allowed.example.test")
        .collect();
    for (path, decision) in [("/over-http", "allow"), ("/leak", "deny")] {
        assert!(
            http.iter()
                .any(|r| r["path"] == path && r["decision"] == decision),
            "{path}: no {decision} record in {http:?}"
        );
    }
    assert!(
        audit
            .iter()
            .any(|r| r["layer"] == "http" && r["rule"] == "address-binding"),
        "the fronting attempt was not audited"
    );
}

#[test]
fn an_idle_sandbox_writes_no_packet_records_of_its_own_ipv6_housekeeping() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "idle"]);
    // A guest link with IPv6 would send router solicitations and MLD reports within seconds of
    // coming up, which the fence audited as drop_spoofed / drop_ip_options.
    std::thread::sleep(Duration::from_secs(6));
    let noise: Vec<Value> = w
        .audit()
        .into_iter()
        .filter(|r| r["layer"] == "packet")
        .collect();
    assert!(
        noise.is_empty(),
        "an idle sandbox filled the audit log: {noise:?}"
    );
    // The guest's link carries no IPv6 at all (IPv4 only on this backend).
    let (_, out, _) = w.sh(
        "idle",
        "cat /proc/sys/net/ipv6/conf/eth0/disable_ipv6; ip -6 addr show dev eth0",
    );
    assert!(out.starts_with('1'), "IPv6 is on for eth0: {out}");
    assert!(!out.contains("inet6"), "eth0 has an IPv6 address: {out}");
}

#[test]
fn svc_audit_reads_filters_and_follows_the_audit_log() {
    require_root();
    let w = World::start();
    w.sandbox_allowing("dev", &["allowed.example.test"]);
    w.svc_ok(&["sandbox", "create", "other"]);
    // A rotated file is read first.
    let rotated = w.audit_path().with_extension("jsonl.1");
    std::fs::write(
        &rotated,
        "{\"time\":\"2026-11-22T00:00:00.000Z\",\"sandbox\":9,\"sandbox_name\":\"old\",\"layer\":\"dns\",\"name\":\"rotated.test.\",\"qtype\":\"A\",\"decision\":\"refused\"}\n",
    )
    .expect("rotated file");
    let _ = w.sh("dev", "getent hosts forbidden.example.test");
    let _ = w.sh("dev", "curl -sS https://allowed.example.test/audited");
    let _ = w.sh("dev", "curl -sS --connect-timeout 1 -k https://192.0.2.66/");
    let _ = w.sh("other", "getent hosts forbidden.example.test");
    std::thread::sleep(Duration::from_millis(500));

    let all = w.svc_ok(&["audit", "--json"]);
    let lines: Vec<Value> = all
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect();
    assert_eq!(
        lines[0]["name"], "rotated.test.",
        "the rotated file comes first"
    );
    assert_eq!(
        lines.len(),
        w.audit().len() + 1,
        "every record of both files, once"
    );
    let denied_dns = w.svc_ok(&[
        "audit",
        "--json",
        "--sandbox",
        "dev",
        "--layer",
        "dns",
        "--verdict",
        "deny",
    ]);
    assert!(!denied_dns.is_empty());
    for l in denied_dns.lines() {
        let v: Value = serde_json::from_str(l).expect("json");
        assert_eq!(v["sandbox_name"], "dev", "{l}");
        assert_eq!(v["layer"], "dns", "{l}");
        assert_ne!(v["decision"], "answered", "{l}");
    }
    let people = w.svc_ok(&["audit", "--sandbox", "dev"]);
    assert!(
        people.lines().any(|l| l.contains("dev")
            && l.contains("http")
            && l.contains("ALLOW")
            && l.contains("allowed.example.test/audited")),
        "{people}"
    );
    assert!(
        people
            .lines()
            .any(|l| l.contains("packet") && l.contains("DENY") && l.contains("192.0.2.66:443")),
        "{people}"
    );
    assert!(
        !people.contains("other "),
        "another sandbox's records: {people}"
    );
    let recent = w.svc_ok(&["audit", "--json", "--since", "10m"]);
    assert!(
        !recent.contains("rotated.test."),
        "--since kept an old record"
    );
    let bad = w.svc(&["audit", "--since", "whenever"]);
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("expected a duration"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );

    // --follow prints what is written after it started.
    let mut follow = std::process::Command::new(svc_tests::world::workspace_bin("svc"))
        .args([
            "audit", "--follow", "--json", "--layer", "http", "--since", "1s",
        ])
        .env("SVC_SOCKET", &w.socket)
        .stdout(Stdio::piped())
        .spawn()
        .expect("svc audit --follow");
    std::thread::sleep(Duration::from_millis(1500));
    let _ = w.sh("dev", "curl -sS https://allowed.example.test/followed");
    let out = std::io::BufReader::new(follow.stdout.take().expect("stdout"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(out).map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(l) if l.contains("/followed") => {
                seen.push(l);
                break;
            }
            Ok(l) => seen.push(l),
            Err(_) => {}
        }
    }
    let _ = follow.kill();
    let _ = follow.wait();
    assert!(
        seen.iter().any(|l| l.contains("/followed")),
        "--follow did not print the new record: {seen:?}"
    );
}

/// The value of one series in a /metrics text (0 when absent).
fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

#[test]
fn metrics_move_when_traffic_flows() {
    require_root();
    let w = World::start();
    let before = w.metrics();
    assert!(
        before.contains("# TYPE svc_fence_packets counter"),
        "{before}"
    );
    w.sandbox_allowing("dev", &["allowed.example.test"]);
    let _ = w.sh("dev", "getent hosts forbidden.example.test");
    let _ = w.sh("dev", "curl -sS https://allowed.example.test/metered");
    let _ = w.sh("dev", "curl -sS --connect-timeout 1 -k https://192.0.2.66/");
    std::thread::sleep(Duration::from_millis(500));
    let after = w.metrics();
    for (series, at_least) in [
        (
            r#"svc_dns_questions_total{sandbox="dev",decision="refused"}"#,
            1.0,
        ),
        (
            r#"svc_dns_questions_total{sandbox="dev",decision="answered"}"#,
            1.0,
        ),
        (
            r#"svc_proxy_requests_total{sandbox="dev",decision="allow",rule="open-host",status="200"}"#,
            1.0,
        ),
        (
            r#"svc_fence_packets_total{reason="drop_tcp_not_allowed"}"#,
            1.0,
        ),
        (
            r#"svc_fence_drops_audited_total{sandbox="dev",reason="drop_tcp_not_allowed"}"#,
            1.0,
        ),
        (r#"svc_sandboxes{state="running"}"#, 1.0),
        ("svc_sandbox_create_seconds_count", 1.0),
        ("svc_proxy_request_seconds_count", 1.0),
    ] {
        assert!(
            metric(&after, series) >= at_least,
            "{series} did not move:\n{after}"
        );
    }
    assert!(
        metric(&after, r#"svc_fence_packets_total{reason="pass_proxy"}"#)
            > metric(&before, r#"svc_fence_packets_total{reason="pass_proxy"}"#),
        "the fence's pass counter did not move"
    );
    assert!(
        !after.contains("allowed.example.test"),
        "a host name became a label"
    );
    // A destroyed sandbox's series go with it.
    w.svc_ok(&["sandbox", "destroy", "dev"]);
    let gone = w.metrics();
    assert!(!gone.contains(r#"sandbox="dev""#), "{gone}");
    assert_eq!(metric(&gone, "svc_sandbox_destroy_seconds_count"), 1.0);
}
