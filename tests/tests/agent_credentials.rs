//! The coding agent's credential: its home shared live into container sandboxes
//! (an idmapped bind: the owner's files are guest root's), and the guardian that keeps its
//! OAuth token fresh on the host — racing guardian processes refresh once per expiry window,
//! svcd's per-sandbox guardians too, and a hostile guest's planted symlink is refused.
//!
//! Real parts: `svcd guardian` processes, svcd, runc containers, and the outside world's
//! HTTPS token endpoint (rotating refresh tokens: a second refresh with the same token fails).

use std::{
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use svc_tests::{require_root, world::World};

const HOUR_MS: u64 = 3600 * 1000;
const MIN_MS: u64 = 60 * 1000;
/// The token endpoint's lifetime (outside-world: 8 hours).
const LIFETIME_MS: u64 = 8 * HOUR_MS;
/// The owner of the agent's home on the host: a user, not root.
const OWNER: u32 = 1234;

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_millis(),
    )
    .expect("ms")
}

/// An agent home holding a credentials file that expires at `expires_at` (ms), owned by
/// [`OWNER`] with mode 0600, with fields the guardian does not own.
fn agent_home(expires_at: u64) -> (PathBuf, PathBuf) {
    let base = svc_tests::fresh_dir("agc");
    let home = base.join(".claude");
    std::fs::create_dir_all(&home).expect("home");
    let file = home.join(".credentials.json");
    std::fs::write(
        &file,
        format!(
            r#"{{"claudeAiOauth":{{"accessToken":"access-0","refreshToken":"rt-0","expiresAt":{expires_at},"scopes":["user:inference"],"subscriptionType":"max"}},"mcpOAuth":{{"kept":"as is"}}}}"#
        ),
    )
    .expect("credentials");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).expect("mode");
    for p in [&home, &file] {
        std::os::unix::fs::chown(p, Some(OWNER), Some(OWNER)).expect("chown");
    }
    (base, home)
}

fn lines(home: &Path, poll: u64) -> String {
    format!(
        "agent_home = \"{}\"\nagent_token_endpoint = \"https://console.agent.test/v1/oauth/token\"\nagent_client_id = \"svc-test-client\"\nrefresh_poll_secs = {poll}\n",
        home.display()
    )
}

fn credentials(home: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(home.join(".credentials.json")).expect("read"))
        .expect("the credentials file is whole JSON")
}

/// `n` `svcd guardian --now NOW` processes started together; their outcomes.
fn race(w: &World, n: usize, now: u64) -> Vec<serde_json::Value> {
    let children: Vec<_> = (0..n)
        .map(|_| {
            Command::new("ip")
                .args(["netns", "exec", &w.host.name])
                .arg(svc_tests::world::workspace_bin("svcd"))
                .arg("--config")
                .arg(&w.config)
                .args(["guardian", "--now", &now.to_string()])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("svcd guardian")
        })
        .collect();
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().expect("wait");
            assert!(
                out.status.success(),
                "a guardian failed: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice(&out.stdout).expect("one JSON outcome")
        })
        .collect()
}

fn count(outcomes: &[serde_json::Value], which: &str) -> usize {
    outcomes.iter().filter(|o| o["outcome"] == which).count()
}

#[test]
fn racing_guardian_processes_refresh_once_per_expiry_window() {
    require_root();
    let t0: u64 = 1_900_000_000_000;
    let (base, home) = agent_home(t0 + 10 * MIN_MS);
    let w = World::start_with_credentials(&lines(&home, 60));

    // 40 minutes before expiry: nothing to do, nobody asks the endpoint.
    let early = race(&w, 4, t0 - 30 * MIN_MS);
    assert_eq!(count(&early, "fresh"), 4, "{early:?}");
    assert_eq!(w.token_grants(), (0, 0));

    // Window one: 10 minutes before expiry, six guardians at once.
    let first = race(&w, 6, t0);
    assert_eq!(count(&first, "refreshed"), 1, "{first:?}");
    assert_eq!(count(&first, "refreshed_by_another"), 5, "{first:?}");
    let want = t0 + LIFETIME_MS;
    assert!(
        first.iter().all(|o| o["expires_at_ms"] == want),
        "every guardian ends with the new token's expiry: {first:?}"
    );
    assert_eq!(
        w.token_grants(),
        (1, 0),
        "one refresh, and no guardian tried the used refresh token"
    );
    let doc = credentials(&home);
    assert_eq!(doc["claudeAiOauth"]["accessToken"], "access-1");
    assert_eq!(doc["claudeAiOauth"]["refreshToken"], "rt-1");
    assert_eq!(doc["claudeAiOauth"]["expiresAt"], want);
    assert_eq!(doc["claudeAiOauth"]["scopes"][0], "user:inference");
    assert_eq!(doc["claudeAiOauth"]["subscriptionType"], "max");
    assert_eq!(doc["mcpOAuth"]["kept"], "as is");
    let meta = std::fs::metadata(home.join(".credentials.json")).expect("meta");
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (OWNER, OWNER, 0o600),
        "owner and mode kept"
    );
    let sent = w
        .received()
        .into_iter()
        .find(|r| r["kind"] == "token")
        .expect("the grant");
    assert_eq!(sent["client_id"], "svc-test-client");

    // Window two: 20 minutes before the new token's expiry.
    let second = race(&w, 6, want - 20 * MIN_MS);
    assert_eq!(count(&second, "refreshed"), 1, "{second:?}");
    assert_eq!(count(&second, "refreshed_by_another"), 5, "{second:?}");
    assert_eq!(w.token_grants(), (2, 0));
    assert_eq!(
        credentials(&home)["claudeAiOauth"]["accessToken"],
        "access-2"
    );
    let strays: Vec<_> = std::fs::read_dir(&home)
        .expect("home")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".svc-"))
        .collect();
    assert!(strays.is_empty(), "temporary files left behind: {strays:?}");

    // A refresh the endpoint refuses leaves the file as it was and says why.
    let mut doc = credentials(&home);
    doc["claudeAiOauth"]["refreshToken"] = "rt-stolen".into();
    std::fs::write(home.join(".credentials.json"), doc.to_string()).expect("write");
    let out = Command::new("ip")
        .args(["netns", "exec", &w.host.name])
        .arg(svc_tests::world::workspace_bin("svcd"))
        .arg("--config")
        .arg(&w.config)
        .args(["guardian", "--now", &(want + LIFETIME_MS).to_string()])
        .output()
        .expect("svcd guardian");
    assert_eq!(out.status.code(), Some(1));
    let o: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(o["outcome"], "failed");
    assert_eq!(
        o["reason"],
        "token endpoint https://console.agent.test/v1/oauth/token answered 400: invalid_grant (refresh token used or unknown)"
    );
    let doc = credentials(&home);
    assert_eq!(
        (
            &doc["claudeAiOauth"]["refreshToken"],
            &doc["claudeAiOauth"]["accessToken"]
        ),
        (&"rt-stolen".into(), &"access-2".into()),
        "a failed refresh changes nothing"
    );
    assert_eq!(w.token_grants(), (2, 1));
    drop(w);
    let _ = std::fs::remove_dir_all(base);
}

#[test]
fn container_sandboxes_share_the_agent_home_and_svcd_keeps_its_token_fresh() {
    require_root();
    // Due now: within the 30-minute lead time.
    let (base, home) = agent_home(now_ms() + 5 * MIN_MS);
    std::fs::write(home.join("someone-elses"), "root's\n").expect("file");
    let w = World::start_with_credentials(&lines(&home, 1));
    // Two running sandboxes: two guardians in svcd racing on the same file.
    for name in ["agent-a", "agent-b"] {
        w.svc_ok(&["sandbox", "create", "--backend", "container", name]);
        let view = w.show(name);
        assert_eq!(
            view["live_mounts"][0],
            format!("{} -> /root/.claude", home.display()),
            "{view}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while credentials(&home)["claudeAiOauth"]["accessToken"] != "access-1" {
        assert!(
            Instant::now() < deadline,
            "svcd's guardian did not refresh within 30 s\n{}",
            w.svcd_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Several more polls of both guardians: still one grant.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(w.token_grants(), (1, 0), "{}", w.svcd_log());
    let metrics = w.metrics();
    assert!(
        metrics.contains(
            r#"svc_credential_refreshes_total{credential="agent",outcome="refreshed"} 1"#
        ),
        "{metrics}"
    );

    // The guest's root sees the owner's files as its own and the refreshed token at once.
    let (code, out, err) = w.sh(
        "agent-a",
        "grep -o access-1 /root/.claude/.credentials.json; stat -c %u /root/.claude/.credentials.json; \
         stat -c %u /root/.claude/someone-elses; echo from-guest > /root/.claude/written-in-guest",
    );
    assert_eq!(code, 0, "{err}\n{}", w.svcd_log());
    assert_eq!(
        out, "access-1\n0\n65534\n",
        "owner's files are root's; others' are nobody's"
    );
    let meta = std::fs::metadata(home.join("written-in-guest")).expect("written on the host");
    assert_eq!(
        (meta.uid(), meta.gid()),
        (OWNER, OWNER),
        "the guest's root writes as the home's owner, not as a host id of its own"
    );
    let (code, out, _) = w.sh("agent-b", "cat /root/.claude/written-in-guest");
    assert_eq!(
        (code, out.as_str()),
        (0, "from-guest\n"),
        "one live directory"
    );
    // Not the owner's: the guest cannot change it.
    let (code, _, _) = w.sh("agent-a", "echo x >> /root/.claude/someone-elses");
    assert_ne!(code, 0);
    assert_eq!(
        std::fs::read_to_string(home.join("someone-elses")).expect("read"),
        "root's\n"
    );
    // Set-id bits and devices have no effect through the mount.
    let (_, out, _) = w.sh("agent-a", "grep ' /root/.claude ' /proc/self/mounts");
    assert!(
        out.contains("nosuid") && out.contains("nodev") && out.contains(" rw"),
        "{out}"
    );

    // The shared directory is no way out: no device nodes, no hard links to the guest's own
    // files, no unmounting or bind-mounting over it.
    for (attempt, script) in [
        ("mknod", "mknod /root/.claude/mem c 1 1"),
        ("hard link", "ln /etc/passwd /root/.claude/passwd-link"),
        ("umount", "umount /root/.claude"),
        (
            "bind mount",
            "mkdir -p /root/.claude/b && mount --bind / /root/.claude/b",
        ),
    ] {
        let (code, _, _) = w.sh("agent-a", script);
        assert_ne!(code, 0, "{attempt} through the shared home succeeded");
    }
    assert!(!home.join("mem").exists() && !home.join("passwd-link").exists());
    let (_, out, _) = w.sh("agent-a", "grep -c ' /root/.claude ' /proc/self/mounts");
    assert_eq!(out, "1\n", "the live mount is still the one svcd made");

    // A hostile guest plants a symlink to a host file: the guardian refuses it, reads nothing
    // through it, and writes nothing.
    let target = base.join("host-secret");
    std::fs::write(&target, "host secret\n").expect("target");
    let (code, _, err) = w.sh(
        "agent-a",
        &format!(
            "ln -sfn {} /root/.claude/.credentials.json",
            target.display()
        ),
    );
    assert_eq!(code, 0, "{err}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while !w
        .svcd_log()
        .contains(".credentials.json is a symbolic link: refused")
    {
        assert!(
            Instant::now() < deadline,
            "the guardian did not refuse the symlink\n{}",
            w.svcd_log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        std::fs::read_to_string(&target).expect("read"),
        "host secret\n"
    );
    assert_eq!(w.token_grants(), (1, 0));

    // Destroying the sandboxes stops their guardians and leaves no mount behind.
    w.destroy_checked("agent-a");
    w.destroy_checked("agent-b");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&w.dir.join("state").display().to_string()),
        "a mount under the state dir is left:\n{mounts}"
    );
    drop(w);
    let _ = std::fs::remove_dir_all(base);
}

/// Mounts are fixed at creation. A sandbox made before svcd.toml named the agent's home
/// keeps running without it; `supervisor-upgrade --force` says it cannot add it; a new sandbox
/// gets it.
#[test]
fn a_sandbox_made_without_the_live_mount_must_be_recreated_to_get_it() {
    require_root();
    let (base, home) = agent_home(now_ms() + 10 * HOUR_MS);
    let mut w = World::start();
    w.svc_ok(&["sandbox", "create", "--backend", "container", "before"]);
    assert_eq!(w.show("before")["live_mounts"], serde_json::json!([]));
    // The operator sets agent_home and restarts svcd.
    let config = std::fs::read_to_string(&w.config).expect("svcd.toml");
    std::fs::write(
        &w.config,
        config.replacen(
            "[credentials]\n",
            &format!("[credentials]\nagent_home = \"{}\"\n", home.display()),
            1,
        ),
    )
    .expect("svcd.toml");
    w.kill_svcd();
    w.start_svcd();
    assert_eq!(
        w.show("before")["live_mounts"],
        serde_json::json!([]),
        "re-adopted with the mounts it was made with"
    );
    let (code, _, _) = w.sh("before", "test -e /root/.claude/.credentials.json");
    assert_ne!(code, 0, "no live mount appeared in a running sandbox");
    let out = w.svc(&["supervisor-upgrade", "--force"]);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "note: sandbox before was created without the coding agent's live mount; \
             supervisor-upgrade cannot add it to a running sandbox: recreate \
             it to get the mount"
        ),
        "{err}"
    );
    w.svc_ok(&["sandbox", "create", "--backend", "container", "after"]);
    let (code, out, err) = w.sh("after", "grep -o access-0 /root/.claude/.credentials.json");
    assert_eq!((code, out.as_str()), (0, "access-0\n"), "{err}");
    w.destroy_checked("after");
    w.destroy_checked("before");
    drop(w);
    let _ = std::fs::remove_dir_all(base);
}
