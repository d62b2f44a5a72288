//! The git-over-SSH relay with real parts: a real `sshd` on loopback (its own host key and
//! config) serving bare repositories with git, a real `ssh-agent` holding the only key, the
//! real `ssh` the relay runs, real `git` using the `svc-git-ssh` shim as its ssh, and the
//! relay (`svc_control::git_relay`) serving the shim's socket. Every refusal gives git's stderr
//! the exact line and leaves the server's repository unchanged.
#![expect(clippy::expect_used, reason = "test helpers")]

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{Arc, Mutex},
};

use svc_control::git_relay::{self, RelayPolicy, Session, SshClient};
use svc_tests::{
    require_root, run_cmd,
    ssh_host::SshHost,
    world::{bare_repo, workspace_bin},
};

struct Server {
    dir: PathBuf,
    host: SshHost,
    relay_socket: PathBuf,
    sessions: Arc<Mutex<Vec<Session>>>,
    _rt: tokio::runtime::Runtime,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

impl Server {
    /// The relay with the test's sshd on loopback opened by an operator exception.
    fn start() -> Self {
        Self::start_with(svc_control::policy::destination::HostNetwork {
            allow_cidrs: vec!["127.0.0.0/8".parse().expect("cidr")],
            ..Default::default()
        })
    }

    /// The relay checking every address it dials with `network`.
    fn start_with(network: svc_control::policy::destination::HostNetwork) -> Self {
        let dir = svc_tests::fresh_dir("sgr");
        std::fs::create_dir_all(dir.join("repos")).expect("dir");
        bare_repo(&dir.join("repos"), "acme", "widget");
        bare_repo(&dir.join("repos"), "evil", "exfil");
        bare_repo(&dir.join("repos"), "acme", "big");
        let host = SshHost::start(
            &dir.join("ssh"),
            &dir.join("repos"),
            None,
            "127.0.0.1",
            free_port(),
        );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let relay_socket = dir.join("relay.sock");
        let sessions: Arc<Mutex<Vec<Session>>> = Arc::default();
        let policy = RelayPolicy {
            repos: vec![
                ("127.0.0.1".into(), "acme/widget".into()),
                ("127.0.0.1".into(), "acme/big".into()),
            ],
            branches: vec!["refs/heads/svc/**".into()],
        };
        let client = SshClient {
            binary: "ssh".into(),
            auth_sock: Some(host.agent_sock.clone()),
            known_hosts: host.known_hosts.clone(),
            resolver: git_relay::RelayResolver(Arc::new(svc_control::proxy::SystemResolver)),
            network,
        };
        let listener = {
            let _guard = rt.enter();
            tokio::net::UnixListener::bind(&relay_socket).expect("relay socket")
        };
        rt.spawn({
            let sessions = sessions.clone();
            async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    let (policy, client, sessions) =
                        (policy.clone(), client.clone(), sessions.clone());
                    tokio::spawn(async move {
                        let (r, w) = stream.into_split();
                        if let Ok(s) = git_relay::serve(r, w, &policy, &client).await {
                            sessions.lock().expect("lock").push(s);
                        }
                    });
                }
            }
        });
        Self {
            dir,
            host,
            relay_socket,
            sessions,
            _rt: rt,
        }
    }

    /// git in `cwd` with the shim as its ssh and no key, agent or ssh config of its own.
    fn git(&self, cwd: &Path, args: &[&str]) -> Output {
        // Bounded: a relay that hangs fails the test instead of stalling it.
        Command::new("timeout")
            .arg("20")
            .arg("git")
            .current_dir(cwd)
            .args(args)
            .env("GIT_SSH_COMMAND", workspace_bin("svc-git-ssh"))
            .env("GIT_SSH_VARIANT", "ssh")
            .env("SVC_GIT_SSH_SOCKET", &self.relay_socket)
            .env_remove("SSH_AUTH_SOCK")
            .env("HOME", &self.dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "agent")
            .env("GIT_AUTHOR_EMAIL", "agent@svc.invalid")
            .env("GIT_COMMITTER_NAME", "agent")
            .env("GIT_COMMITTER_EMAIL", "agent@svc.invalid")
            .output()
            .expect("git")
    }

    fn url(&self, repo: &str) -> String {
        self.host.url(repo)
    }

    fn refs(&self, repo: &str) -> String {
        self.host.refs(repo)
    }
}

#[test]
fn git_over_ssh_goes_through_the_relay_with_its_rules() {
    require_root();
    let s = Server::start();
    let work = s.dir.join("work");
    std::fs::create_dir_all(&work).expect("work");

    // Clone (upload-pack) of an allowed repository, then a protocol-v2 fetch.
    let out = s.git(&work, &["clone", "-q", &s.url("acme/widget"), "widget"]);
    assert!(
        out.status.success(),
        "clone: {:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let repo = work.join("widget");
    let out = s.git(
        &repo,
        &["-c", "protocol.version=2", "fetch", "-q", "origin"],
    );
    assert!(
        out.status.success(),
        "v2 fetch: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A repository outside the policy: refused before ssh runs.
    let out = s.git(&work, &["clone", "-q", &s.url("evil/exfil"), "exfil"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("svc: refused by egress policy: 127.0.0.1 evil/exfil not in .svc/config.yaml egress.policy"),
        "{err}"
    );

    // Pushes: an allowed ref passes; main is refused and the server is unchanged.
    let out = s.git(&repo, &["commit", "-q", "--allow-empty", "-m", "work"]);
    assert!(out.status.success());
    let out = s.git(&repo, &["push", "-q", "origin", "HEAD:refs/heads/svc/work"]);
    assert!(
        out.status.success(),
        "allowed push: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(s.refs("acme/widget").contains("refs/heads/svc/work"));

    let before = s.refs("acme/widget");
    let refused: &[(&str, &[&str], &str)] = &[
        (
            "main",
            &["push", "origin", "HEAD:refs/heads/main"],
            "refs/heads/main",
        ),
        (
            "one allowed, one not",
            &[
                "push",
                "origin",
                "HEAD:refs/heads/svc/ok",
                "HEAD:refs/heads/release",
            ],
            "refs/heads/release",
        ),
        (
            "a tag",
            &["push", "origin", "HEAD:refs/tags/v9"],
            "refs/tags/v9",
        ),
        (
            "deleting main",
            &["push", "origin", ":refs/heads/main"],
            "refs/heads/main",
        ),
        (
            "svc itself",
            &["push", "origin", "HEAD:refs/heads/svc"],
            "refs/heads/svc",
        ),
    ];
    for (name, args, refname) in refused {
        let out = s.git(&repo, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}: pushed");
        assert!(
            err.contains(&format!(
                "svc: refused: ref {refname} not in allowed branches"
            )),
            "{name}: {err}"
        );
        assert_eq!(s.refs("acme/widget"), before, "{name}: the server changed");
    }
    // Push options (the server advertises them) and a signed push (an SSH-signed push
    // certificate): read past, and their refs checked like any other.
    let server = s.dir.join("repos/acme/widget.git");
    for (k, v) in [
        ("receive.advertisePushOptions", "true"),
        ("receive.certNonceSeed", "svc-test"),
    ] {
        run_cmd(
            Command::new("git")
                .arg("-C")
                .arg(&server)
                .args(["config", k, v]),
        );
    }
    let out = s.git(
        &repo,
        &[
            "push",
            "-q",
            "-o",
            "ci.skip",
            "origin",
            "HEAD:refs/heads/svc/opts",
        ],
    );
    assert!(
        out.status.success(),
        "push -o: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let signing = s.host.client_key.clone();
    let signing = signing.display().to_string();
    let signed = [
        "-c",
        "gpg.format=ssh",
        "-c",
        &format!("user.signingkey={signing}"),
        "push",
        "--signed=yes",
    ];
    let out = s.git(
        &repo,
        &[&signed[..], &["origin", "HEAD:refs/heads/svc/signed"]].concat(),
    );
    assert!(
        out.status.success(),
        "signed push: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let before = s.refs("acme/widget");
    let out = s.git(
        &repo,
        &[&signed[..], &["origin", "HEAD:refs/heads/main"]].concat(),
    );
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("svc: refused: ref refs/heads/main not in allowed branches"),
        "signed push to main: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = s.git(
        &repo,
        &["push", "-o", "x", "origin", "HEAD:refs/heads/main"],
    );
    assert!(!out.status.success(), "push -o to main went through");
    assert_eq!(
        s.refs("acme/widget"),
        before,
        "a refused signed push changed the server"
    );
    let sessions = s.sessions.lock().expect("lock").clone();
    assert!(
        sessions
            .iter()
            .any(|x| x.refs.iter().any(|r| r.name == "refs/heads/svc/signed")),
        "the signed push's refs were read from its certificate"
    );

    // Many windows' worth both ways (the flow control of the whole path): a push of 3 MiB of
    // incompressible bytes to an svc/ branch, then a clone of it.
    let big = work.join("big");
    let out = s.git(&work, &["clone", "-q", &s.url("acme/big"), "big"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut blob = vec![0u8; 3 << 20];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").expect("urandom"),
        &mut blob,
    )
    .expect("random");
    std::fs::write(big.join("blob"), &blob).expect("blob");
    assert!(s.git(&big, &["add", "blob"]).status.success());
    assert!(s.git(&big, &["commit", "-q", "-m", "big"]).status.success());
    let out = s.git(&big, &["push", "-q", "origin", "HEAD:refs/heads/svc/big"]);
    assert!(
        out.status.success(),
        "big push: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = s.git(
        &work,
        &["clone", "-q", "-b", "svc/big", &s.url("acme/big"), "big2"],
    );
    assert!(
        out.status.success(),
        "big clone: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(work.join("big2/blob")).expect("cloned blob"),
        blob,
        "the clone holds the pushed bytes"
    );

    // Deleting an allowed branch is an allowed update.
    let out = s.git(&repo, &["push", "-q", "origin", ":refs/heads/svc/work"]);
    assert!(
        out.status.success(),
        "delete: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!s.refs("acme/widget").contains("refs/heads/svc/work"));

    let sessions = s.sessions.lock().expect("lock").clone();
    let pushes: Vec<&Session> = sessions
        .iter()
        .filter(|x| x.command == "git-receive-pack")
        .collect();
    assert!(
        pushes.iter().any(
            |p| p.decision == "allow" && p.refs.iter().any(|r| r.name == "refs/heads/svc/work")
        )
    );
    assert!(pushes.iter().any(|p| p.decision == "deny"
        && p.reason.as_deref()
            == Some("svc: refused: ref refs/heads/main not in allowed branches")));
    assert!(
        sessions
            .iter()
            .any(|x| x.repo == "evil/exfil" && x.decision == "deny")
    );
}

/// The relay resolves the code host itself and has ssh dial only an address of a class svc
/// dials: with loopback not opened, a code host on loopback is refused with a line naming the
/// class, and a listener there accepts nothing.
#[test]
fn a_code_host_whose_address_is_a_refused_class_is_never_dialled() {
    require_root();
    let s = Server::start_with(svc_control::policy::destination::HostNetwork::default());
    let planted = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = planted.local_addr().expect("addr").port();
    planted.set_nonblocking(true).expect("nonblocking");
    let work = s.dir.join("work");
    std::fs::create_dir_all(&work).expect("work");
    for url in [
        s.url("acme/widget"),
        format!("ssh://git@127.0.0.1:{port}/acme/widget.git"),
    ] {
        let out = s.git(&work, &["clone", "-q", &url, "widget"]);
        assert!(!out.status.success(), "{url} cloned");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(
                "svc: refused: 127.0.0.1 resolves only to addresses svc never dials for a sandbox"
            ) && err.contains("(loopback)"),
            "{url}: {err}"
        );
    }
    assert!(
        planted.accept().is_err(),
        "the relay's ssh connected to the loopback listener"
    );
    let sessions = s.sessions.lock().expect("lock");
    assert!(
        sessions
            .iter()
            .all(|x| x.decision == "deny"
                && x.reason.as_deref().is_some_and(|r| r.contains("loopback"))),
        "{sessions:?}"
    );
}
