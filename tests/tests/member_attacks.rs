//! Attacks by a second, non-root API user (a member of `api_group`) with the real svcd.
//!
//! - `member_reads_another_members_private_repository_through_the_swap`: svcd checks the
//!   project's `.git` layout and, later, the runtime binds `.git` and what is read-only in it.
//!   The member swaps `.git` for a symbolic link to another member's repository behind a 0700
//!   home the moment svcd has made `.git/hooks`. Before the fix runc followed the link as host
//!   root and the member's guest read the other repository; now every bind inside a shared
//!   directory is opened with no link followed (and bound from that handle), so the swap is
//!   refused, naming the link.
//! - `member_spotlight_binds_a_privileged_host_port`: a member's workspace asks for Spotlight
//!   `localPort` 81. Before the fix svcd (root) listened on 127.0.0.1:81 for the member's
//!   guest; now a member may forward only ports it could bind itself.

use std::{
    os::unix::fs::PermissionsExt as _,
    process::Command,
    time::{Duration, Instant},
};

use svc_tests::{
    project::{MINIMAL_WORKSPACE, chown_tree, text},
    require_root,
    users::{API_GID, User},
    world::{World, git},
};

#[test]
fn member_spotlight_binds_a_privileged_host_port() {
    require_root();
    let w = World::start();
    let tag = format!("{}", std::process::id() % 100_000);
    let b = User::add(format!("svcatk-s{tag}"), None);
    std::fs::set_permissions(&w.dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let proj = w.project(
        "b-spot",
        &[(
            ".svc/workspace.json",
            r#"{"version":1,"services":{"definitions":{"web":{"command":"mkdir -p /srv && echo served-by-member-guest > /srv/index.html && exec python3 -m http.server 8000 -d /srv"}}},"spotlight":{"defaults":[{"service":"web","remotePort":8000,"localPort":81}]}}"#,
        )],
    );
    chown_tree(&proj, b.uid, API_GID);
    let pdir = proj.to_str().expect("utf-8");
    let out = b.svc(&w, &World::workspace_up_args(pdir, "bspot"));
    println!("B's up: {}", text(&out));
    if !out.status.success() {
        assert!(
            text(&out).contains("local port 81 is privileged on this host"),
            "refused for another reason: {}",
            text(&out)
        );
        let ss = w.host.exec("ss", &["-Hltn", "sport = :81"]);
        assert_eq!(
            String::from_utf8_lossy(&ss.stdout).trim(),
            "",
            "nothing listens on :81"
        );
        return;
    }
    let out = b.svc(&w, &[
            "sandbox",
            "exec",
            "bspot",
            "--",
            "sh",
            "-c",
            "mkdir -p /srv && echo served-by-member-guest > /srv/index.html && \
             (setsid nohup python3 -m http.server 8000 -d /srv >/dev/null 2>&1 &); sleep 1; echo up",
        ],
    );
    println!("B's guest: {}", text(&out));
    let got = w
        .host
        .exec("curl", &["-sS", "--max-time", "10", "http://127.0.0.1:81/"]);
    let said = String::from_utf8_lossy(&got.stdout).into_owned();
    println!(
        "host curl 127.0.0.1:81 -> {said:?} {}",
        String::from_utf8_lossy(&got.stderr)
    );
    let ss = w.host.exec("ss", &["-ltnp", "sport = :81"]);
    println!("{}", String::from_utf8_lossy(&ss.stdout));
    assert!(
        !said.contains("served-by-member-guest"),
        "a non-root member's guest serves the host's privileged port 127.0.0.1:81 (bound by svcd as root)"
    );
}

/// The same swap aimed at another member's repository behind a 0700 home: B cannot read it on
/// the host, but runc opens the bind source as host root, so B's guest reads A's git history
/// (everything in it that is "other"-readable, which git's objects are).
#[test]
fn member_reads_another_members_private_repository_through_the_swap() {
    require_root();
    let w = World::start();
    let tag = format!("{}", std::process::id() % 100_000);
    let a = User::add(format!("svcatk-a{tag}"), None);
    let b = User::add(format!("svcatk-c{tag}"), None);
    // A's home, 0700, holding a repository with a secret commit.
    let home = w.dir.join("home-a");
    let repo = home.join("private");
    std::fs::create_dir_all(&repo).expect("repo");
    git(&repo, &["init", "-q", "-b", "main"]);
    std::fs::write(repo.join("secret.txt"), "A-PRIVATE-CONTENT-42\n").expect("secret");
    git(&repo, &["add", "secret.txt"]);
    git(
        &repo,
        &[
            "-c",
            "user.name=a",
            "-c",
            "user.email=a@x",
            "commit",
            "-q",
            "-m",
            "private",
        ],
    );
    chown_tree(&home, a.uid, API_GID);
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::fs::set_permissions(&w.dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    // B cannot read it on the host.
    let direct = Command::new("setpriv")
        .args([
            &format!("--reuid={}", b.uid),
            &format!("--regid={API_GID}"),
            "--clear-groups",
        ])
        .args(["cat", repo.join(".git/HEAD").to_str().expect("utf-8")])
        .output()
        .expect("setpriv");
    println!("B on the host reading A's repo: {}", text(&direct));

    let proj = w.project("c-project", &[MINIMAL_WORKSPACE]);
    git(&proj, &["init", "-q", "-b", "main"]);
    std::fs::remove_file(proj.join(".git/config")).expect("rm config");
    std::fs::remove_dir_all(proj.join(".git/hooks")).expect("rm hooks");
    chown_tree(&proj, b.uid, API_GID);
    let (p2, t2) = (proj.clone(), repo.join(".git"));
    let racer = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(200);
        while Instant::now() < deadline {
            if std::fs::symlink_metadata(p2.join(".git/hooks")).is_ok() {
                std::fs::rename(p2.join(".git"), p2.join(".git-aside")).expect("rename");
                std::os::unix::fs::symlink(&t2, p2.join(".git")).expect("link");
                return true;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        false
    });
    let pdir = proj.to_str().expect("utf-8");
    let out = b.svc(&w, &World::workspace_up_args(pdir, "cws"));
    let swapped = racer.join().expect("racer");
    println!("B's up (swapped: {swapped}): {}", text(&out));
    assert!(swapped, "the racer never saw .git/hooks made");
    if !out.status.success() {
        // Refused: svcd opened what it binds with no link followed and found one.
        assert!(
            text(&out).contains("symbolic link"),
            "B's up failed for another reason: {}",
            text(&out)
        );
        return;
    }
    let out = b.svc(&w, &[
            "sandbox",
            "exec",
            "cws",
            "--",
            "sh",
            "-c",
            "cd /workspace && git --git-dir=/workspace/.git log --oneline 2>&1; \
             git --git-dir=/workspace/.git show HEAD:secret.txt 2>&1; \
             python3 -c \"import zlib,glob; [print(zlib.decompress(open(f,'rb').read())[:120]) for f in glob.glob('/workspace/.git/objects/??/*')]\"",
        ],
    );
    let said = text(&out);
    println!("B's guest: {said}");
    assert!(
        !said.contains("A-PRIVATE-CONTENT-42"),
        "member B read member A's repository behind a 0700 home"
    );
}

/// A member holds idle API connections: before the fix svcd accepted every one (19,995 took
/// its descriptors to the hard limit and every sandbox's HTTPS and DNS failed). Now a non-root
/// caller holds at most 64 at once; the rest are answered 429 and closed, and another
/// sandbox's HTTPS and root's API go on.
#[test]
fn a_members_idle_api_connections_are_held_to_its_cap() {
    require_root();
    const TRIES: usize = 600;
    let w = World::start();
    let tag = format!("{}", std::process::id() % 100_000);
    let b = User::add(format!("svcatk-d{tag}"), None);
    w.svc_ok(&["sandbox", "create", "calm", "--backend", "container"]);
    let pid = w.svcd_pid().expect("svcd");
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count());
    let fds0 = fds();
    let sock = w.socket.to_str().expect("utf-8").to_owned();
    // Each connection sends nothing; after a moment, which were answered (429) and closed.
    let script = format!(
        "import socket, select, time\n\
         held = []\n\
         for i in range({TRIES}):\n    c = socket.socket(socket.AF_UNIX); c.connect('{sock}'); held.append(c)\n\
         time.sleep(2)\n\
         p = select.poll()\n\
         for c in held: p.register(c, select.POLLIN)\n\
         ready = {{fd for fd, _ in p.poll(0)}}\n\
         said = b''\n\
         for c in held:\n    if c.fileno() in ready: said = c.recv(300) or said\n\
         print('held', len(held) - len(ready), 'answered', len(ready), said.split(b'\\r\\n')[0].decode(), flush=True)\n\
         time.sleep(6)\n"
    );
    let mut holder = Command::new("setpriv")
        .args(b.ids())
        .args(["/usr/bin/python3", "-c", &script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("holder");
    let mut line = String::new();
    {
        use std::io::BufRead as _;
        let out = holder.stdout.as_mut().expect("stdout");
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    let fds1 = fds();
    let calm = w.sh(
        "calm",
        "curl -sS -o /dev/null -w '%{http_code}' --max-time 15 https://api.agent.test/",
    );
    let listed = w.svc(&["sandbox", "list"]);
    let _ = holder.kill();
    let _ = holder.wait();
    println!("member: {line}svcd descriptors {fds0} -> {fds1}; calm {calm:?}");
    let numbers: Vec<usize> = line
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    assert_eq!(
        numbers[..2],
        [64, TRIES - 64],
        "the cap's worth held: {line}"
    );
    assert!(
        line.contains("HTTP/1.1 429"),
        "the rest are answered 429: {line}"
    );
    assert!(
        fds1 <= fds0 + 64 + 32,
        "svcd's descriptors went {fds0} -> {fds1}"
    );
    assert_eq!(
        (calm.0, calm.1.as_str()),
        (0, "200"),
        "another sandbox's HTTPS"
    );
    assert!(listed.status.success(), "root's API: {}", text(&listed));
}
