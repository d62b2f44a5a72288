//! The git-over-SSH relay with real parts: a real `sshd` on loopback (its own host key and
//! config) serving bare repositories with git, a real `ssh-agent` holding the only key, the
//! real `ssh` the relay runs, real `git` using the `svc-git-ssh` shim as its ssh, and the
//! relay (`svc_control::git_relay`) serving the shim's socket. Every refusal gives git's stderr
//! the exact line and leaves the server's repository unchanged.
#![expect(clippy::expect_used, reason = "test helpers")]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use svc_control::git_relay::{self, RelayPolicy, Session, SshClient};
use svc_tests::{
    require_root, unique,
    world::{bare_repo, workspace_bin},
};

struct Server {
    dir: PathBuf,
    port: u16,
    sshd: Child,
    agent: Child,
    relay_socket: PathBuf,
    sessions: Arc<Mutex<Vec<Session>>>,
    _rt: tokio::runtime::Runtime,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.sshd.kill();
        let _ = self.sshd.wait();
        let _ = self.agent.kill();
        let _ = self.agent.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Server {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(unique("sgr"));
        std::fs::create_dir_all(dir.join("repos")).expect("dir");
        bare_repo(&dir.join("repos"), "acme", "widget");
        bare_repo(&dir.join("repos"), "evil", "exfil");
        for key in ["host_key", "client_key"] {
            run(Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.join(key)));
        }
        std::fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys")).expect("keys");
        // The code host: git's own commands under one root, whatever path is asked.
        let wrapper = dir.join("git-serve");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nset -f\ncmd=${{SSH_ORIGINAL_COMMAND%% *}}\npath=${{SSH_ORIGINAL_COMMAND#* }}\npath=$(printf %s \"$path\" | tr -d \"'\")\ncase \"$cmd\" in git-upload-pack|git-receive-pack) ;; *) echo \"not served: $cmd\" >&2; exit 1;; esac\nexec \"$cmd\" \"{}$path\"\n",
                dir.join("repos").display()
            ),
        )
        .expect("wrapper");
        std::os::unix::fs::PermissionsExt::set_mode(
            &mut std::fs::metadata(&wrapper).expect("meta").permissions(),
            0o755,
        );
        run(Command::new("chmod").arg("755").arg(&wrapper));
        let port = free_port();
        std::fs::write(
            dir.join("sshd_config"),
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {hk}\nAuthorizedKeysFile {ak}\n\
                 PermitRootLogin prohibit-password\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n\
                 PidFile {pid}\nForceCommand {wrapper}\nAcceptEnv GIT_PROTOCOL\nLogLevel ERROR\n",
                hk = dir.join("host_key").display(),
                ak = dir.join("authorized_keys").display(),
                pid = dir.join("sshd.pid").display(),
                wrapper = wrapper.display(),
            ),
        )
        .expect("sshd_config");
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd");
        let sshd = Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(dir.join("sshd_config"))
            .stderr(Stdio::inherit())
            .spawn()
            .expect("sshd (openssh-server; cargo xtask setup installs it)");
        let host_pub = std::fs::read_to_string(dir.join("host_key.pub")).expect("host pub");
        let mut fields = host_pub.split_whitespace();
        std::fs::write(
            dir.join("known_hosts"),
            format!(
                "[127.0.0.1]:{port} {} {}\n",
                fields.next().expect("type"),
                fields.next().expect("key")
            ),
        )
        .expect("known_hosts");
        // The host's agent: the only place the key is used from.
        let agent_sock = dir.join("agent.sock");
        let agent = Command::new("ssh-agent")
            .arg("-D")
            .arg("-a")
            .arg(&agent_sock)
            .stdout(Stdio::null())
            .spawn()
            .expect("ssh-agent");
        wait_for(&agent_sock);
        run(Command::new("ssh-add")
            .env("SSH_AUTH_SOCK", &agent_sock)
            .arg("-q")
            .arg(dir.join("client_key")));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let relay_socket = dir.join("relay.sock");
        let sessions: Arc<Mutex<Vec<Session>>> = Arc::default();
        let policy = RelayPolicy {
            repos: vec![("127.0.0.1".into(), "acme/widget".into())],
            branches: vec!["refs/heads/svc/**".into()],
        };
        let client = SshClient {
            binary: "ssh".into(),
            auth_sock: Some(agent_sock),
            known_hosts: dir.join("known_hosts"),
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
        // sshd is up when it accepts.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "sshd did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            dir,
            port,
            sshd,
            agent,
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
        // The test code host's account is root (sshd's ForceCommand serves git only).
        format!("ssh://root@127.0.0.1:{}/{repo}.git", self.port)
    }

    /// The server repository's refs (`git for-each-ref`), to check a refusal changed nothing.
    fn refs(&self, repo: &str) -> String {
        let out = run(Command::new("git")
            .arg("-C")
            .arg(self.dir.join("repos").join(format!("{repo}.git")))
            .args(["for-each-ref", "--format=%(refname) %(objectname)"]));
        String::from_utf8_lossy(&out.stdout).into_owned()
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
        run(Command::new("git")
            .arg("-C")
            .arg(&server)
            .args(["config", k, v]));
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
    let signing = s.dir.join("client_key");
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
