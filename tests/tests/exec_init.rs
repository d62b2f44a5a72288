//! `svc sandbox exec` over the channel to the container guest's init (`svc-init`), against
//! the real svcd and runc: a command gets exactly what `runc exec` gives it (ids,
//! capabilities, no_new_privs, seccomp, limits, cgroup, environment, session), and the init is
//! the guest's, so hostile: bytes that break the protocol end that sandbox's channel and
//! nothing else, an init that is gone fails exec clearly, an output flood and a thousand execs
//! leave svcd's memory and descriptors bounded. A guest an earlier svcd made gets a new channel
//! through its init's hand-over socket after each restart, or `runc exec` when its init cannot
//! answer in time.

use std::{
    io::{Read as _, Write as _},
    os::fd::AsFd as _,
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use svc_tests::{init_server_pid, require_root, world::World};

/// What a process says of itself: everything `runc exec` sets for it but the environment
/// (svcd adds the sandbox's own to each command's).
const SELF: &str = "grep -E '^(Uid|Gid|Groups|Cap[A-Za-z]+|NoNewPrivs|Seccomp|Seccomp_filters):' \
                    /proc/self/status; cat /proc/self/limits; cat /proc/self/cgroup; umask; \
                    pwd; ps -o sid= -o pgid= -p $$ | awk '$1==$2{print \"leads\"}'";

/// svcd's resident memory (kB) and open descriptors.
fn svcd_use(w: &World) -> (u64, usize) {
    let pid = w.svcd_pid().expect("svcd runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .count();
    (rss, fds)
}

/// The OCI runtime's `exec` of `script` in sandbox `name`'s container, as svcd runs commands
/// of a guest without a channel (`--no-new-privs` too: crun's exec sets it only when told).
fn runc_sh(w: &World, name: &str, script: &str) -> String {
    let root: PathBuf = w.dir.join("state/runc");
    let list = Command::new(w.oci_runtime())
        .arg("--root")
        .arg(&root)
        .args(["list", "-q"])
        .output()
        .expect("runc list");
    let ids = String::from_utf8_lossy(&list.stdout).into_owned();
    let id = ids
        .lines()
        .find(|l| l.contains(name))
        .unwrap_or_else(|| panic!("no container of {name} in {ids}"));
    let out = Command::new(w.oci_runtime())
        .arg("--root")
        .arg(&root)
        .args([
            "exec",
            "--no-new-privs",
            "--cwd",
            "/",
            id,
            "sh",
            "-c",
            script,
        ])
        .stdin(Stdio::null())
        .output()
        .expect("runc exec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_init_runs_commands_as_runc_exec_did_and_a_hostile_one_ends_only_its_own_channel() {
    require_root();
    let mut w = World::start();
    w.svc_ok(&["sandbox", "create", "dev"]);

    same_as_runc_exec(&w);
    an_output_flood_and_a_thousand_execs_stay_bounded(&w);

    // A sandbox an earlier svcd made: its init's server cannot answer (stopped from the host),
    // so the new svcd gives up on a channel within its limit and `runc exec` runs its commands.
    let server = i32::try_from(init_server_pid(w.init_pid("dev"))).expect("pid");
    let server = nix::unistd::Pid::from_raw(server);
    nix::sys::signal::kill(server, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    w.kill_svcd();
    w.start_svcd();
    let (code, parent, err) = w.sh("dev", "echo $PPID");
    assert_eq!((code, parent.as_str()), (0, "0\n"), "{err}");
    // The runtime's exec keeps the guest's no_new_privs (crun's only when svcd says so).
    let (_, status, _) = w.sh("dev", "grep NoNewPrivs /proc/self/status");
    assert_eq!(
        status, "NoNewPrivs:\t1\n",
        "a runtime exec without no_new_privs"
    );
    nix::sys::signal::kill(server, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");

    // The next svcd takes the init's hand-over socket: a new channel, and commands run by the
    // init again (their parent is the server), with their exit codes; and after one more
    // restart still (the hand-over socket stays for every later svcd), exactly as runc exec.
    for _ in 0..2 {
        w.kill_svcd();
        w.start_svcd();
        let (code, parent, err) = w.sh("dev", "echo $PPID; exit 3");
        assert_eq!(code, 3, "{err}");
        assert_ne!(
            parent,
            "0\n",
            "a runtime exec after the restart:\n{}",
            w.svcd_log()
        );
        assert!(
            w.svcd_log()
                .contains("a new channel to the adopted guest's init"),
            "{}",
            w.svcd_log()
        );
    }
    same_as_runc_exec(&w);
    w.svc_ok(&["sandbox", "create", "other"]);
    w.svc_ok(&["sandbox", "create", "third"]);
    assert_eq!(
        w.sh("third", "readlink /proc/$PPID/exe").1,
        "/usr/local/bin/svc-init\n"
    );

    garbage_ends_that_sandboxs_channel_only(&w, "third");
    an_init_that_is_gone_fails_exec_clearly(&w);
}

fn same_as_runc_exec(w: &World) {
    let (code, ours, err) = w.sh("dev", SELF);
    assert_eq!(code, 0, "{err}");
    let theirs = runc_sh(w, "dev", SELF);
    assert_eq!(ours, theirs, "the init's command differs from runc exec's");
    for want in [
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
        "Uid:\t0\t0\t0\t0",
        "CapEff:\t00000000000405fb",
    ] {
        assert!(ours.contains(want), "{want} missing: {ours}");
    }
    assert!(ours.contains("leads"), "a session of its own: {ours}");
    // No signal blocked (svc-init's PID 1 blocks them all; a command that inherited that
    // outlived `timeout`'s SIGTERM to its group).
    let (_, blocked, _) = w.sh("dev", "grep SigBlk /proc/self/status");
    assert_eq!(
        blocked, "SigBlk:\t0000000000000000\n",
        "a command with signals blocked"
    );
    // The container process's environment, the sandbox's and the caller's on top.
    let env = w.svc_ok(&["sandbox", "exec", "-e", "HOME=/y", "dev", "sh", "-c", "env"]);
    let theirs = runc_sh(w, "dev", "env");
    for line in theirs.lines().filter(|l| !l.starts_with("HOME=")) {
        assert!(env.lines().any(|l| l == line), "{line} missing: {env}");
    }
    for want in ["HOME=/y", "SVC_SANDBOX=dev"] {
        assert!(env.lines().any(|l| l == want), "{want} missing: {env}");
    }
    // And it is the init that ran it, not a runtime process.
    let (_, parent, _) = w.sh("dev", "readlink /proc/$PPID/exe");
    assert_eq!(parent, "/usr/local/bin/svc-init\n");
}

fn an_output_flood_and_a_thousand_execs_stay_bounded(w: &World) {
    let (rss0, _) = svcd_use(w);
    // A command writing 200 MB that nobody reads for two seconds: svcd holds a window of it.
    let mut child = w
        .sh_command("dev", "head -c 200000000 /dev/zero")
        .stdin(Stdio::null())
        .spawn()
        .expect("svc");
    std::thread::sleep(Duration::from_secs(2));
    let (rss1, _) = svcd_use(w);
    assert!(
        rss1 < rss0 + 16 * 1024,
        "svcd grew from {rss0} kB to {rss1} kB while the output waited"
    );
    let mut n = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    let mut out = child.stdout.take().expect("stdout");
    loop {
        match out.read(&mut buf).expect("read") {
            0 => break,
            k => n += k as u64,
        }
    }
    assert!(child.wait().expect("svc").success());
    assert_eq!(n, 200_000_000, "the whole output came through");

    // A thousand execs, eight at a time: nothing is left behind in svcd or in the guest.
    let (_, fds0) = svcd_use(w);
    for _ in 0..125 {
        let batch: Vec<_> = (0..8)
            .map(|_| {
                w.svc_command(&["sandbox", "exec", "dev", "true"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("svc")
            })
            .collect();
        for c in batch {
            let out = c.wait_with_output().expect("svc");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let (rss2, fds2) = svcd_use(w);
    assert!(
        fds2 <= fds0 + 4,
        "svcd's descriptors grew from {fds0} to {fds2}"
    );
    assert!(
        rss2 < rss0 + 32 * 1024,
        "svcd grew from {rss0} kB to {rss2} kB over a thousand execs"
    );
    let (_, zombies, _) = w.sh("dev", "ps -eo stat= | grep -c '^Z' || true");
    assert_eq!(zombies.trim(), "0", "the init reaps");
}

fn garbage_ends_that_sandboxs_channel_only(w: &World, name: &str) {
    // The guest's side of the sandbox's channel, taken from its server as a hostile init would use it:
    // a frame of a kind that does not exist.
    let server = i32::try_from(init_server_pid(w.init_pid(name))).expect("pid");
    let server = rustix::process::Pid::from_raw(server).expect("pid");
    let pidfd = rustix::process::pidfd_open(server, rustix::process::PidfdFlags::empty())
        .expect("pidfd_open");
    let end =
        rustix::process::pidfd_getfd(pidfd.as_fd(), 3, rustix::process::PidfdGetfdFlags::empty())
            .expect("pidfd_getfd");
    let mut end = std::os::unix::net::UnixStream::from(end);
    end.write_all(&[0, 0, 0, 9, 0xee, 0, 0, 0, 0])
        .expect("garbage");
    let out = w.svc(&["sandbox", "exec", name, "true"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exec over a broken channel: {said}");
    assert!(
        said.contains("broke the protocol") && said.contains("unknown kind 238"),
        "{said}"
    );
    // The other sandbox and svcd go on.
    assert_eq!(
        w.svc_ok(&["sandbox", "exec", "other", "echo", "ok"]),
        "ok\n"
    );
}

fn an_init_that_is_gone_fails_exec_clearly(w: &World) {
    // The guest ends its init's server: the init ends with it, and so does the guest.
    let _ = w.sh("other", "kill -KILL $PPID");
    let out = w.svc(&["sandbox", "exec", "other", "true"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("not running") || said.contains("the agent's channel closed"),
        "{said}"
    );
    assert!(w.svcd_pid().is_some(), "svcd goes on");
}
