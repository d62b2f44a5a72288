//! A real SSH code host for the git relay's tests: Debian's `sshd` with its own host key and
//! config, serving the bare repositories under a root with git's own commands (a
//! `ForceCommand` wrapper, as code hosts do), and a real `ssh-agent` holding the only client
//! key — the host's agent the relay authenticates with. Stopped on drop.
#![expect(clippy::expect_used, reason = "test helpers")]

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::run_cmd;

/// A running SSH code host.
#[derive(Debug)]
pub struct SshHost {
    /// Keys, config, known_hosts, agent socket.
    pub dir: PathBuf,
    /// The repositories it serves (`<root>/<owner>/<repo>.git`).
    pub root: PathBuf,
    pub addr: String,
    pub port: u16,
    /// A known-hosts file with this server's key (what svcd's `git_ssh.known_hosts` names).
    pub known_hosts: PathBuf,
    /// The agent holding the client key (what `git_ssh.agent_socket` names).
    pub agent_sock: PathBuf,
    /// The client's private key (for signing pushes; never given to a guest).
    pub client_key: PathBuf,
    sshd: Child,
    agent: Child,
}

impl Drop for SshHost {
    fn drop(&mut self) {
        for c in [&mut self.sshd, &mut self.agent] {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
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

impl SshHost {
    /// Serve `root` on `addr:port`, in network namespace `netns` if given (else the test's
    /// own), with its files under `dir`.
    pub fn start(dir: &Path, root: &Path, netns: Option<&str>, addr: &str, port: u16) -> Self {
        std::fs::create_dir_all(dir).expect("dir");
        for key in ["host_key", "client_key"] {
            let _ = std::fs::remove_file(dir.join(key));
            run_cmd(
                Command::new("ssh-keygen")
                    .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                    .arg(dir.join(key)),
            );
        }
        std::fs::copy(dir.join("client_key.pub"), dir.join("authorized_keys")).expect("keys");
        write_sshd_config(dir, root, addr, port);
        std::fs::create_dir_all("/run/sshd").expect("/run/sshd");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "/usr/sbin/sshd"]);
                c
            }
            None => Command::new("/usr/sbin/sshd"),
        };
        let sshd = cmd
            .args(["-D", "-f"])
            .arg(dir.join("sshd_config"))
            // Its log (each refused or probing connection says so) stays with its files.
            .arg("-E")
            .arg(dir.join("sshd.log"))
            .spawn()
            .expect("sshd (openssh-server; cargo xtask setup --tests installs it)");
        let known_hosts = write_known_hosts(dir, addr, port);
        let (agent_sock, agent) = start_agent(dir);
        let host = Self {
            dir: dir.to_owned(),
            root: root.to_owned(),
            addr: addr.to_owned(),
            port,
            known_hosts,
            agent_sock,
            client_key: dir.join("client_key"),
            sshd,
            agent,
        };
        crate::wait_tcp(netns, addr, port, "sshd");
        host
    }

    /// `ssh://root@addr:port/<repo>.git` (the test code host's account is root; its
    /// ForceCommand serves git only).
    pub fn url(&self, repo: &str) -> String {
        format!("ssh://root@{}:{}/{repo}.git", self.addr, self.port)
    }

    /// A server repository's refs (`git for-each-ref`), to check a refusal changed nothing.
    pub fn refs(&self, repo: &str) -> String {
        let out = run_cmd(
            Command::new("git")
                .arg("-C")
                .arg(self.root.join(format!("{repo}.git")))
                .args(["for-each-ref", "--format=%(refname) %(objectname)"]),
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Its objects' count (`git count-objects -v`), to check a refused push stored nothing.
    pub fn objects(&self, repo: &str) -> String {
        let out = run_cmd(
            Command::new("git")
                .arg("-C")
                .arg(self.root.join(format!("{repo}.git")))
                .args(["count-objects", "-v"]),
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.starts_with("count:") || l.starts_with("in-pack:"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The code host's forced command (git's own commands under `root`, whatever path is asked)
/// and its sshd_config, under `dir`.
fn write_sshd_config(dir: &Path, root: &Path, addr: &str, port: u16) {
    // The code host: git's own commands under one root, whatever path is asked.
    let wrapper = dir.join("git-serve");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nset -f\ncmd=${{SSH_ORIGINAL_COMMAND%% *}}\npath=${{SSH_ORIGINAL_COMMAND#* }}\npath=$(printf %s \"$path\" | tr -d \"'\")\ncase \"$cmd\" in git-upload-pack|git-receive-pack) ;; *) echo \"not served: $cmd\" >&2; exit 1;; esac\nexec \"$cmd\" \"{}/${{path#/}}\"\n",
            root.display()
        ),
    )
    .expect("wrapper");
    run_cmd(Command::new("chmod").arg("755").arg(&wrapper));
    std::fs::write(
        dir.join("sshd_config"),
        format!(
            "Port {port}\nListenAddress {addr}\nHostKey {hk}\nAuthorizedKeysFile {ak}\n\
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
}

/// A known_hosts file under `dir` naming the host key for `addr:port`.
fn write_known_hosts(dir: &Path, addr: &str, port: u16) -> PathBuf {
    let host_pub = std::fs::read_to_string(dir.join("host_key.pub")).expect("host pub");
    let mut fields = host_pub.split_whitespace();
    let known_hosts = dir.join("known_hosts");
    let name = if port == 22 {
        addr.to_owned()
    } else {
        format!("[{addr}]:{port}")
    };
    std::fs::write(
        &known_hosts,
        format!(
            "{name} {} {}\n",
            fields.next().expect("type"),
            fields.next().expect("key")
        ),
    )
    .expect("known_hosts");
    known_hosts
}

/// The host's agent holding the client key (its socket under `dir`).
fn start_agent(dir: &Path) -> (PathBuf, Child) {
    // The host's agent: the only place the key is used from.
    let agent_sock = dir.join("agent.sock");
    let _ = std::fs::remove_file(&agent_sock);
    let agent = Command::new("ssh-agent")
        .arg("-D")
        .arg("-a")
        .arg(&agent_sock)
        .stdout(Stdio::null())
        .spawn()
        .expect("ssh-agent");
    wait_for(&agent_sock);
    run_cmd(
        Command::new("ssh-add")
            .env("SSH_AUTH_SOCK", &agent_sock)
            .arg("-q")
            .arg(dir.join("client_key")),
    );
    (agent_sock, agent)
}
