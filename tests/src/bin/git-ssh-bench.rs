//! `cargo xtask bench git-ssh`: what the git SSH relay costs. A `git clone` over SSH from inside
//! a container sandbox (git → the `svc-git-ssh` shim → the sandbox's relay socket → svcd's
//! relay → the host's `ssh` with the host's agent → sshd in the outside world), beside, in the
//! same run and interleaved, the same clone by the host's own git and ssh straight to the same
//! server with the same agent. Two repositories: a small one (one commit: the session's fixed
//! cost) and one with 16 MiB of incompressible content (throughput). Each figure is timed
//! where git runs (inside the sandbox: `date` around the clone, so `svc sandbox exec` is not
//! in it); median and range over the rounds.

use std::time::Duration;

use svc_tests::world::{CODE_SSH_ADDR, World, bare_repo, git};

const ROUNDS: usize = 7;
const BIG_MIB: usize = 16;

/// `acme/big`: one commit holding BIG_MIB of random bytes.
fn big_repo(root: &std::path::Path) {
    bare_repo(root, "acme", "big");
    let work = root.join(".work-big");
    std::fs::create_dir_all(&work).expect("work");
    git(&work, &["init", "-q", "-b", "main"]);
    let mut blob = vec![0u8; BIG_MIB << 20];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").expect("urandom"),
        &mut blob,
    )
    .expect("random");
    std::fs::write(work.join("blob"), blob).expect("blob");
    git(&work, &["add", "blob"]);
    git(&work, &["commit", "-q", "-m", "big"]);
    let bare = root.join("acme/big.git");
    git(
        &work,
        &["push", "-q", "-f", bare.to_str().expect("utf-8"), "main"],
    );
    let _ = std::fs::remove_dir_all(&work);
}

fn stats(v: &mut [Duration]) -> String {
    v.sort();
    format!(
        "median {:>7.1} ms  (range {:.1}–{:.1})",
        v[v.len() / 2].as_secs_f64() * 1000.0,
        v[0].as_secs_f64() * 1000.0,
        v[v.len() - 1].as_secs_f64() * 1000.0
    )
}

/// Nanoseconds a script printed as its last line.
fn nanos(out: &str) -> Duration {
    Duration::from_nanos(
        out.lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("no timing in {out:?}")),
    )
}

fn main() {
    let w = World::start_with_git_ssh("");
    let ssh = w.ssh.as_ref().expect("ssh host");
    big_repo(&ssh.root);
    let project = w.dir.join("project");
    std::fs::create_dir_all(project.join(".svc")).expect("project");
    std::fs::write(
        project.join(".svc/config.yaml"),
        format!("egress:\n  policy:\n    {CODE_SSH_ADDR}:\n      repos: [acme/widget, acme/big]\n"),
    )
    .expect("config");
    w.svc_ok(&[
        "sandbox",
        "create",
        "bench",
        "--backend",
        "container",
        "--workspace",
        project.to_str().expect("utf-8"),
        "--trust",
    ]);
    let host_dir = w.dir.join("host-clones");
    std::fs::create_dir_all(&host_dir).expect("dir");
    let host_ssh = format!(
        "ssh -F /dev/null -T -x -a -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile={}",
        ssh.known_hosts.display()
    );
    println!(
        "git clone over SSH, {ROUNDS} rounds interleaved: through the relay from a container sandbox vs the host's own ssh"
    );
    for repo in ["acme/widget", "acme/big"] {
        let (mut relayed, mut direct) = (Vec::new(), Vec::new());
        for i in 0..=ROUNDS {
            let url = format!("root@{CODE_SSH_ADDR}:{repo}.git");
            let (code, out, err) = w.sh(
                "bench",
                &format!(
                    "rm -rf /tmp/c{i}; a=$(date +%s%N); git clone -q {url} /tmp/c{i} && b=$(date +%s%N) && rm -rf /tmp/c{i} && echo $((b-a))"
                ),
            );
            assert_eq!(code, 0, "relayed clone: {out}{err}");
            let script = format!(
                "a=$(date +%s%N); git clone -q {url} {dir}/c{i} && b=$(date +%s%N) && rm -rf {dir}/c{i} && echo $((b-a))",
                dir = host_dir.display()
            );
            let o = w.host.exec(
                "env",
                &[
                    &format!("GIT_SSH_COMMAND={host_ssh}"),
                    &format!("SSH_AUTH_SOCK={}", ssh.agent_sock.display()),
                    &format!("HOME={}", host_dir.display()),
                    "sh",
                    "-c",
                    &script,
                ],
            );
            assert!(
                o.status.success(),
                "direct clone: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            // Round 0 warms both paths up.
            if i > 0 {
                relayed.push(nanos(&out));
                direct.push(nanos(&String::from_utf8_lossy(&o.stdout)));
            }
        }
        let ratio = {
            let (mut r, mut d) = (relayed.clone(), direct.clone());
            r.sort();
            d.sort();
            r[r.len() / 2].as_secs_f64() / d[d.len() / 2].as_secs_f64()
        };
        println!("  {repo:<12} relayed  {}", stats(&mut relayed));
        println!("  {repo:<12} direct   {}", stats(&mut direct));
        println!("  {repo:<12} relayed / direct (medians): {ratio:.2}×");
    }
    w.svc_ok(&["sandbox", "destroy", "bench"]);
}
