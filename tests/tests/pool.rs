//! Warm pools: a real svcd with `[pool] container = 2` makes two container sandboxes ahead;
//! a fitting `svc sandbox create` takes one (a hit in the metrics) and the sandbox works and
//! looks exactly like a fresh one (credential swapped on an allowed host, a denied host
//! refused, its own host name, no trace of the pool in its processes, /tmp, hosts file or
//! environment); the pool refills; a request the pool cannot honour misses with its reason;
//! destroy leaves nothing of the pooled guest; svcd's stop leaves no pooled sandbox.
//!
//! With shared directories (a workspace's project, the coding agent's home) a pooled sandbox
//! is still a hit: the claim moves them into the running guest, which then sees them as a
//! fresh guest does (same mounts, flags, ids; writes land as the owner; `.git/config` and
//! `.git/hooks` read-only); a link planted at a mount point in a pooled guest is refused and
//! that guest removed; destroy leaves no mount on the host.

use std::{os::unix::fs::MetadataExt as _, path::Path, process::Command, time::Duration};

use svc_tests::{
    project::{MINIMAL_WORKSPACE, chown_tree, project_at},
    require_root,
    world::{EXAMPLE_TOKEN, World, cgroup_roots, git},
};

/// svcd.toml's extra lines: a pool of two, refilled quickly.
const POOL: &str = "\n[pool]\ncontainer = 2\nrefill_per_second = 20\n";

/// Wait until the container pool holds `n` sandboxes.
fn wait_pool(w: &World, n: u64) {
    w.wait_pool("container", n, Duration::from_secs(60));
}

/// The containers the runtime knows in this world.
fn runtime_ids(w: &World) -> Vec<String> {
    let out = Command::new(w.oci_runtime())
        .arg("--root")
        .arg(w.dir.join("state/runc"))
        .args(["list", "-q"])
        .output()
        .expect("runc list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What a guest shows of itself: host name, hosts file, /tmp, its processes' names, and its
/// environment (without what differs by design: the sandbox's name and placeholders, which
/// the allow-all sandbox compared has none of; and without the script's own processes).
const LOOK: &str = "hostname; cat /etc/hosts; ls -A /tmp; \
    for p in /proc/[0-9]*; do cat $p/comm 2>/dev/null; done \
      | grep -v -x -e sh -e cat -e sort -e grep | sort; \
    env | sort | grep -v -e '^SVC_' -e '_TOKEN=' -e '^PWD=' -e '^SHLVL=' -e '^_='";

#[test]
fn a_pooled_sandbox_is_a_fresh_one_and_the_pool_leaves_nothing() {
    require_root();
    let mut w = World::start_with(POOL);
    wait_pool(&w, 2);
    let pooled: Vec<String> = runtime_ids(&w);
    assert_eq!(pooled.len(), 2, "{pooled:?}");
    assert!(
        pooled.iter().all(|p| p.starts_with("pool.container.")),
        "{pooled:?}"
    );
    assert!(
        w.svc_ok(&["sandbox", "list", "--json"]).trim() == "[]",
        "pooled sandboxes are nobody's: not listed"
    );
    // Each pooled link is under the table's rules from its making (its element is added
    // then, not at the claim).
    let links = w.sandbox_links();
    assert_eq!(links.len(), 2, "{links:?}");
    assert_eq!(w.nft_link_set(), links, "the pooled links in the link set");

    // A request the pool cannot honour is made cold, its reason counted.
    w.svc_ok(&["sandbox", "create", "--egress", "allow-all", "cold"]);
    assert_eq!(
        w.metric(r#"svc_pool_misses_total{backend="container",reason="allow-all"}"#),
        1
    );
    assert_eq!(runtime_ids(&w).iter().filter(|i| *i == "cold").count(), 1);

    w.sandbox_with_example_secret_ok("warm", "env:EXAMPLE");
    assert_eq!(w.metric(r#"svc_pool_hits_total{backend="container"}"#), 1);
    let warm_pid = w.show("warm")["pid"].as_u64().expect("pid");
    let warm_cgroup = std::fs::read_to_string(format!("/proc/{warm_pid}/cgroup")).expect("cgroup");
    let runtime = pooled
        .iter()
        .find(|p| warm_cgroup.contains(p.as_str()))
        .unwrap_or_else(|| panic!("warm's guest is none of the pooled {pooled:?}: {warm_cgroup}"))
        .clone();

    // It works as a fresh one: the credential swapped on the allowed host, others refused.
    let (code, _, err) = w.sh(
        "warm",
        "curl -sS -o /dev/null --max-time 10 \
         -H \"Authorization: Bearer $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" \
         https://allowed.example.test/pooled",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        w.received_auth("/pooled"),
        format!("Bearer {EXAMPLE_TOKEN}")
    );
    assert_ne!(w.curl_rc("warm", "https://db.example.test/"), 0);

    // It looks as a fresh one: only its name differs.
    let (code, warm, err) = w.sh("warm", LOOK);
    assert_eq!(code, 0, "{err}");
    let (code, cold, err) = w.sh("cold", LOOK);
    assert_eq!(code, 0, "{err}");
    assert!(
        !warm.contains("pool"),
        "a trace of the pool in the guest:\n{warm}"
    );
    assert_eq!(warm.replace("warm", "NAME"), cold.replace("cold", "NAME"));
    let (_, name, _) = w.sh("warm", "printf %s \"$SVC_SANDBOX\"");
    assert_eq!(name, "warm");

    // The pool refills.
    wait_pool(&w, 2);

    // Destroy leaves nothing, the pooled guest's runtime name and cgroup included.
    w.destroy_checked("warm");
    assert!(!runtime_ids(&w).contains(&runtime), "{runtime} is left");
    for root in cgroup_roots() {
        let cg = root.join(&w.cgroup_parent).join(&runtime);
        assert!(!cg.exists(), "{} is left", cg.display());
    }
    w.destroy_checked("cold");

    // svcd's stop removes the pool: no container, link, directory or row is left.
    w.stop_svcd();
    assert!(runtime_ids(&w).is_empty(), "{:?}", runtime_ids(&w));
    assert_eq!(w.sandbox_links(), Vec::<String>::new(), "links are left");
    assert_eq!(
        w.nft_link_set(),
        Vec::<String>::new(),
        "link set elements are left"
    );
    let dirs: Vec<_> = std::fs::read_dir(w.dir.join("state/sandboxes"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(dirs.is_empty(), "sandbox directories are left: {dirs:?}");
    // A restart finds no row to tear down.
    w.start_svcd();
    assert!(!w.svcd_log().contains("found a sandbox a crash interrupted"));
}

/// The owner of the shared directories on the host: a user, not root.
const OWNER: u32 = 1234;

/// What a guest shows of its shared directories: each mount at or under them in mount order
/// (mount point, root in its file system, options, propagation fields, type; not the ids,
/// which differ by guest), and the owners and modes of the shares' roots and a file in each.
const LOOK_SHARES: &str = "awk '{sep=0; for (i=7; i<=NF; i++) if ($i==\"-\") {sep=i; break}; \
      opt=\"\"; for (i=7; i<sep; i++) opt=opt\" \"$i; \
      print $5, $4, $6, \"[\" opt \"]\", $(sep+1)}' /proc/self/mountinfo \
      | grep -E '^(/workspace|/root/\\.claude)( |/)'; \
    stat -c '%n %u:%g %a' /workspace /workspace/.svc/workspace.json /workspace/.git \
      /workspace/.git/config /root/.claude /root/.claude/settings.json";

/// The mounts under `dir` in svcd's (the host's) mount namespace.
fn host_mounts_under(dir: &Path) -> Vec<String> {
    let under = format!("{} ", dir.display());
    let under_slash = format!("{}/", dir.display());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|m| format!("{m} ").starts_with(&under) || m.starts_with(&under_slash))
        })
        .map(str::to_owned)
        .collect()
}

/// The pooled guests' init pids (from their directories' `init.id`).
fn pooled_inits(w: &World) -> Vec<u32> {
    std::fs::read_dir(w.dir.join("state/sandboxes"))
        .expect("sandboxes")
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("pool.container.")
        })
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| std::fs::read_to_string(e.path().join("init.id")).ok())
        .filter_map(|t| t.split_whitespace().next()?.parse().ok())
        .collect()
}

#[test]
fn a_pooled_sandbox_takes_the_project_and_the_agent_home_as_a_fresh_one_has_them() {
    require_root();
    let base = svc_tests::fresh_dir("pmnt");
    let home = base.join(".claude");
    let project = base.join("project");
    std::fs::create_dir_all(&home).expect("agent home");
    std::fs::write(home.join("settings.json"), "{}").expect("settings");
    project_at(&project, &[MINIMAL_WORKSPACE]);
    git(&project, &["init", "-q", "-b", "main"]);
    git(&project, &["add", "-A"]);
    git(
        &project,
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@svc.invalid",
            "commit",
            "-q",
            "-m",
            "first",
        ],
    );
    chown_tree(&base, OWNER, OWNER);
    let config_before = std::fs::read(project.join(".git/config")).expect("config");
    let mut w = World::start_with_agent_home_and(&home, POOL);
    let state = w.dir.join("state");
    wait_pool(&w, 2);
    let pooled = runtime_ids(&w);
    let ws = project.display().to_string();

    // The pooled sandbox takes both shares: a hit, no miss.
    w.svc_ok(&[
        "workspace",
        "up",
        "--trust",
        &ws,
        "--name",
        "warm",
        "--backend",
        "container",
    ]);
    let hits = r#"svc_pool_hits_total{backend="container"}"#;
    assert_eq!(w.metric(hits), 1, "{}", w.svcd_log());
    assert_eq!(
        w.metric(r#"svc_pool_misses_total{backend="container",reason="mounts"}"#),
        0
    );
    let pid = w.show("warm")["pid"].as_u64().expect("pid");
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    assert!(
        pooled.iter().any(|p| cgroup.contains(p.as_str())),
        "warm's guest is none of the pooled {pooled:?}: {cgroup}"
    );
    assert!(
        host_mounts_under(&state).is_empty(),
        "the claim left mounts on the host: {:?}",
        host_mounts_under(&state)
    );

    // A fresh sandbox of the same project (made by an svcd without a pool) sees the same.
    let (code, warm, err) = w.sh("warm", LOOK_SHARES);
    assert_eq!(code, 0, "{err}");
    let cold = {
        let fresh = World::start_with_agent_home(&home);
        fresh.svc_ok(&[
            "workspace",
            "up",
            "--trust",
            &ws,
            "--name",
            "cold",
            "--backend",
            "container",
        ]);
        let (code, cold, err) = fresh.sh("cold", LOOK_SHARES);
        assert_eq!(code, 0, "{err}");
        fresh.destroy_checked("cold");
        cold
    };
    assert_eq!(
        warm, cold,
        "a pooled guest's shares differ from a fresh one's"
    );
    for line in [
        "/workspace 0:0 ",
        "/workspace/.svc/workspace.json 0:0 ",
        "/root/.claude 0:0 ",
        "/root/.claude/settings.json 0:0 ",
    ] {
        assert!(
            warm.contains(line),
            "{line}: the share's owner is the guest's root:\n{warm}"
        );
    }
    for mount in ["/workspace ", "/workspace/.git ", "/root/.claude "] {
        let l = warm
            .lines()
            .find(|l| l.starts_with(mount))
            .unwrap_or_else(|| panic!("no {mount}mount:\n{warm}"));
        assert!(l.contains("rw,nosuid,nodev") && l.contains("[]"), "{l}");
    }
    for mount in ["/workspace/.git/config ", "/workspace/.git/hooks "] {
        let l = warm
            .lines()
            .find(|l| l.starts_with(mount))
            .unwrap_or_else(|| panic!("no {mount}mount:\n{warm}"));
        assert!(l.contains("ro,nosuid,nodev"), "{l}");
    }

    // Writes land as the share's owner.
    let (code, _, err) = w.sh(
        "warm",
        "echo hi > /workspace/from-guest && mkdir /root/.claude/dir && echo hi > /root/.claude/dir/f",
    );
    assert_eq!(code, 0, "{err}");
    for made in [
        project.join("from-guest"),
        home.join("dir"),
        home.join("dir/f"),
    ] {
        let m = std::fs::symlink_metadata(&made).expect("made by the guest");
        assert_eq!((m.uid(), m.gid()), (OWNER, OWNER), "{}", made.display());
    }

    // What host git executes stays read-only, and the mounts stay.
    for (attempt, script) in [
        (
            "append to config",
            "echo '[core]' >> /workspace/.git/config",
        ),
        (
            "add a hook",
            "echo 'touch /tmp/pwned' > /workspace/.git/hooks/post-checkout",
        ),
        ("rename .git", "mv /workspace/.git /workspace/git-moved"),
        ("unmount config", "umount /workspace/.git/config"),
        ("unmount the project", "umount -l /workspace"),
        (
            "remount in a user namespace of its own",
            "unshare -Urm sh -c 'mount -o remount,rw,bind /workspace/.git/config && echo x >> /workspace/.git/config'",
        ),
    ] {
        let (code, out, err) = w.sh("warm", script);
        assert_ne!(code, 0, "{attempt} succeeded: {out}{err}");
    }
    assert_eq!(
        std::fs::read(project.join(".git/config")).expect("config"),
        config_before
    );
    assert!(!project.join(".git/hooks/post-checkout").exists());
    assert!(project.join(".git/config").exists() && !project.join("git-moved").exists());

    // Commands start in the project, as in a fresh workspace sandbox; and a restarted svcd
    // adopts the claimed sandbox with its shares as they were.
    let pwd = || w.svc_ok(&["sandbox", "exec", "warm", "--", "pwd"]);
    assert_eq!(pwd(), "/workspace\n");
    w.kill_svcd();
    w.start_svcd();
    assert_eq!(w.sh("warm", LOOK_SHARES), (0, warm, String::new()));
    assert_eq!(
        w.svc_ok(&["sandbox", "exec", "warm", "--", "pwd"]),
        "/workspace\n"
    );

    // Destroy leaves nothing: no mount, no guest, no directory.
    w.destroy_checked("warm");
    assert!(
        host_mounts_under(&state).is_empty(),
        "{:?}",
        host_mounts_under(&state)
    );

    // A link planted at a mount point (or above it) in a pooled guest is refused, not
    // followed: the claim fails naming it, and that pooled guest goes whole.
    wait_pool(&w, 2);
    let before = runtime_ids(&w);
    let hits_before = w.metric(hits);
    for pid in pooled_inits(&w) {
        let root = format!("/proc/{pid}/root");
        std::os::unix::fs::symlink("/etc", format!("{root}/root/.claude")).expect("plant .claude");
        let _ = std::fs::remove_dir(format!("{root}/workspace"));
        std::os::unix::fs::symlink("/tmp", format!("{root}/workspace")).expect("plant /workspace");
    }
    let out = w.svc(&[
        "workspace",
        "up",
        "--trust",
        &ws,
        "--name",
        "lured",
        "--backend",
        "container",
    ]);
    let said = svc_tests::project::text(&out);
    assert!(
        !out.status.success(),
        "a claim through a planted link succeeded: {said}"
    );
    assert!(
        said.contains("symbolic link"),
        "the refusal names the link: {said}"
    );
    assert_eq!(w.metric(hits), hits_before, "a failed claim is no hit");
    assert!(w.svc_ok(&["sandbox", "list", "--json"]).trim() == "[]");
    let after = runtime_ids(&w);
    let taken: Vec<&String> = before.iter().filter(|p| !after.contains(p)).collect();
    assert_eq!(
        taken.len(),
        1,
        "one pooled guest was taken and removed: {before:?} -> {after:?}"
    );
    for root in cgroup_roots() {
        let cg = root.join(&w.cgroup_parent).join(taken[0]);
        assert!(!cg.exists(), "{} is left", cg.display());
    }
    assert!(
        !state.join("sandboxes/lured").exists(),
        "the sandbox's directory is left"
    );
    assert!(
        !state.join("sandboxes").join(taken[0]).exists(),
        "the pooled directory is left"
    );
    assert!(
        host_mounts_under(&state).is_empty(),
        "{:?}",
        host_mounts_under(&state)
    );
    let _ = std::fs::remove_dir_all(&base);
}
