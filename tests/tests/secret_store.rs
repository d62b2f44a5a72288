//! The named secret store (`svc secret`) with the real svcd, proxy and sandboxes: a stored
//! value reaches the upstream through a sandbox's placeholder; after a rotation a new sandbox's
//! requests carry the new value while the running one keeps the value it was issued (through
//! an svcd restart too); the real values appear nowhere in the guests, svcd's log, the audit,
//! the listing, or svcd's state on disk (sealed with the host key).

use svc_tests::{require_root, world::World};

const FIRST: &str = "store-value-one-5b2e";
const SECOND: &str = "store-value-two-9c4d";

/// What the outside world's allowed host last received as Authorization on `path`.
fn request(w: &World, sandbox: &str, path: &str) {
    let (code, out, err) = w.sh(
        sandbox,
        &format!(
            "curl -sS --max-time 10 -H \"Authorization: Bearer $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" https://allowed.example.test{path}"
        ),
    );
    assert_eq!(code, 0, "{out}{err}");
}

fn create(w: &World, name: &str) {
    w.sandbox_with_example_secret_ok(name, "store:example");
}

#[test]
fn stored_secrets_are_brokered_rotated_and_never_shown() {
    require_root();
    let mut w = World::start();
    let out = w.svc_stdin(&["secret", "set", "example", "--json"], FIRST);
    assert!(out.status.success(), "{out:?}");
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(info["version"], 1, "{info}");
    // Taken again: refused, pointing at rotate.
    let out = w.svc_stdin(&["secret", "set", "example"], FIRST);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("rotate"),
        "{out:?}"
    );

    create(&w, "old");
    request(&w, "old", "/first");
    assert_eq!(w.received_auth("/first"), format!("Bearer {FIRST}"));
    let show = w.show("old");
    assert!(
        show["secrets"].to_string().contains("store:example@v1"),
        "{show}"
    );

    // Rotation: new sandboxes get the new value; the running one keeps its own.
    let out = w.svc_stdin(&["secret", "rotate", "example", "--json"], SECOND);
    assert!(out.status.success(), "{out:?}");
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(info["version"], 2, "{info}");
    create(&w, "new");
    request(&w, "new", "/new");
    assert_eq!(w.received_auth("/new"), format!("Bearer {SECOND}"));
    request(&w, "old", "/old-after-rotate");
    assert_eq!(
        w.received_auth("/old-after-rotate"),
        format!("Bearer {FIRST}")
    );
    // Through an svcd restart too (re-adopted with the value it was issued).
    w.kill_svcd();
    w.start_svcd();
    request(&w, "old", "/old-after-restart");
    assert_eq!(
        w.received_auth("/old-after-restart"),
        format!("Bearer {FIRST}")
    );

    // Never shown: the listing, the guests, svcd's log, the audit, its state on disk.
    let list = w.svc_ok(&["secret", "list", "--json"]);
    assert!(
        list.contains("\"example\"") && list.contains("\"version\": 2"),
        "{list}"
    );
    let mut seen = list.clone();
    for s in ["old", "new"] {
        let (_, env, _) = w.sh(s, "env; cat /proc/1/environ 2>/dev/null");
        seen.push_str(&env);
    }
    seen.push_str(&w.svcd_log());
    seen.push_str(&std::fs::read_to_string(w.audit_path()).unwrap_or_default());
    for entry in walkdir(&w.dir.join("state")) {
        seen.push_str(&String::from_utf8_lossy(
            &std::fs::read(entry).unwrap_or_default(),
        ));
    }
    for v in [FIRST, SECOND] {
        assert!(!seen.contains(v), "{v} was found in plain text");
    }

    // A missing secret is refused at creation, by name; removal leaves running sandboxes be.
    let out = w.sandbox_with_example_secret("missing", "store:nope");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no secret nope in the store"),
        "{out:?}"
    );
    w.svc_ok(&["secret", "rm", "example"]);
    assert!(w.svc_ok(&["secret", "list"]).contains("no secrets"));
    request(&w, "new", "/new-after-rm");
    assert_eq!(w.received_auth("/new-after-rm"), format!("Bearer {SECOND}"));
    // A value is never taken from a terminal or the command line.
    let out = w.svc(&["secret", "set", "argv", "value-on-the-command-line"]);
    assert!(!out.status.success(), "a value was taken from argv");
    w.destroy_checked("old");
    w.destroy_checked("new");
}

/// svcd's own files in its state directory (its database and journal), not the sandboxes'
/// trees.
fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .collect()
}

fn wait_until(what: &str, w: &World, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(40);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} did not happen within 40 s\n{}",
            w.svcd_log()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

const ENDPOINT: &str = "https://console.agent.test/v1/oauth/token";

#[test]
fn oauth_secrets_are_refreshed_on_the_host_and_an_expired_one_is_refused_by_name() {
    require_root();
    let w = World::start_with_credentials("refresh_poll_secs = 1");
    // A refresh token the endpoint does not take, or an endpoint that is not HTTPS: nothing
    // is stored.
    let out = w.svc_stdin(
        &["secret", "set", "bad", "--oauth-token-endpoint", ENDPOINT],
        "rt-wrong",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "secret bad: the refresh token was not accepted: token endpoint {ENDPOINT} answered 400: invalid_grant"
        )),
        "{err}"
    );
    let out = w.svc_stdin(
        &[
            "secret",
            "set",
            "bad",
            "--oauth-token-endpoint",
            "http://console.agent.test/t",
        ],
        "rt-0",
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("expected an https:// URL with a host"),
        "{out:?}"
    );
    // Tokens of 20 seconds: refreshed after 10.
    let out = w.svc_stdin(
        &[
            "secret",
            "set",
            "mcp",
            "--oauth-token-endpoint",
            ENDPOINT,
            "--oauth-client-id",
            "short-lived",
            "--json",
        ],
        "rt-0",
    );
    assert!(out.status.success(), "{out:?}");
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        (&info["kind"], &info["token_endpoint"]),
        (&"oauth".into(), &ENDPOINT.into()),
        "{info}"
    );
    let list = w.svc_ok(&["secret", "list", "--json"]);
    assert!(!list.contains("\"bad\""), "{list}");
    assert_eq!(w.token_grants(), (1, 1));

    w.sandbox_with_example_secret_ok("o1", "store:mcp");
    let (_, placeholder, _) = w.sh("o1", "printf %s \"$SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\"");
    assert_eq!(placeholder.len(), 64, "{placeholder}");
    request(&w, "o1", "/oauth-1");
    assert_eq!(w.received_auth("/oauth-1"), "Bearer access-1");

    // svcd refreshes on the host: the same placeholder now carries the new token.
    wait_until("a refresh by svcd", &w, || w.token_grants().0 >= 2);
    request(&w, "o1", "/oauth-2");
    assert_eq!(w.received_auth("/oauth-2"), "Bearer access-2");
    let (_, again, _) = w.sh("o1", "printf %s \"$SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\"");
    assert_eq!(
        again, placeholder,
        "placeholders stay stable across refreshes"
    );
    let refreshed = w
        .audit()
        .into_iter()
        .find(|r| r["layer"] == "credential" && r["outcome"] == "refreshed")
        .expect("the refresh is audited");
    assert_eq!(refreshed["credential"], "store:mcp@v1");

    // Someone else uses the refresh token svcd holds (rt-2): svcd's next refresh fails, is
    // audited, and the token in hand serves until it expires.
    let out = w.host.exec(
        "curl",
        &[
            "-sS",
            "--resolve",
            "console.agent.test:443:192.0.2.11",
            "--cacert",
            w.dir.join("outside/ca.pem").to_str().expect("utf-8"),
            "-d",
            "grant_type=refresh_token",
            "-d",
            "refresh_token=rt-2",
            ENDPOINT,
        ],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("access-3"),
        "{out:?}"
    );
    let failed = || {
        w.audit()
            .into_iter()
            .find(|r| r["layer"] == "credential" && r["outcome"] == "failed")
    };
    wait_until("a failed refresh", &w, || failed().is_some());
    let record = failed().expect("audited");
    assert_eq!(
        record["reason"],
        format!(
            "token endpoint {ENDPOINT} answered 400: invalid_grant (refresh token used or unknown)"
        )
    );
    let expires = record["expires_at"].as_str().expect("expiry").to_owned();
    request(&w, "o1", "/oauth-3");
    let still = w.received_auth("/oauth-3");
    // Sent before the token expired (10 s of life were left at the failure).
    assert_eq!(
        still, "Bearer access-2",
        "the old token serves until {expires}"
    );

    // Past its expiry: a 502 naming the credential, and nothing sent upstream.
    wait_until("the token's expiry", &w, || {
        let (_, out, _) = w.sh(
            "o1",
            "curl -sS --max-time 10 -H \"Authorization: Bearer $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" https://allowed.example.test/oauth-wait",
        );
        out.contains("\"status\":502")
    });
    let (_, body, _) = w.sh(
        "o1",
        "curl -sS --max-time 10 -H \"Authorization: Bearer $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" https://allowed.example.test/oauth-4",
    );
    assert!(
        body.contains(&format!(
            "credential store:mcp@v1 expired at {expires} and could not be refreshed: token endpoint {ENDPOINT} answered 400: invalid_grant"
        )),
        "{body}"
    );
    assert!(
        !w.received()
            .iter()
            .any(|r| r["kind"] == "http" && r["path"] == "/oauth-4"),
        "an expired token is never sent on"
    );
    // No token in the guest, svcd's log or the audit.
    let (_, env, _) = w.sh("o1", "env; cat /proc/1/environ | tr '\\0' '\\n'");
    let log = w.svcd_log();
    let audit = std::fs::read_to_string(w.audit_path()).expect("audit");
    for token in ["access-1", "access-2", "rt-0", "rt-1", "rt-2"] {
        assert!(!env.contains(token), "{token} in the guest");
        assert!(!log.contains(token), "{token} in svcd's log");
        assert!(!audit.contains(token), "{token} in the audit");
    }
    w.destroy_checked("o1");
}
