//! Guests that stand still, against the real svcd and OCI runtime: a sandbox paused before
//! svcd restarts is adopted paused (its freezer says so), refuses commands until resumed, then
//! gets its init's channel back and runs them, and is destroyed whole, resumed or not; and a
//! guest that stops its own init's server (`SIGSTOP`) gets its owner's next command an error
//! naming that within the init's time limit, while another sandbox's commands and svcd's API
//! go on, and the sandbox's later commands run with the runtime's exec.

use std::{
    process::{Output, Stdio},
    time::{Duration, Instant},
};

use svc_tests::{init_server_pid, output_within, require_root, world::World};

/// The state letter of process `pid` (`T`: stopped).
fn state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let (_, rest) = stat.rsplit_once(") ").expect("a stat line");
    rest.chars().next().expect("a state")
}

/// `svc ARGS`, which must end within a minute (a hang fails the test rather than stalling it).
fn svc_within(w: &World, args: &[&str]) -> Output {
    output_within(&mut w.svc_command(args), Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("svc {args:?}: {e}"))
}

#[test]
fn a_sandbox_paused_before_svcd_restarts_is_adopted_paused_then_resumes_or_is_destroyed_whole() {
    require_root();
    let mut w = World::start();
    w.svc_ok(&["sandbox", "create", "held"]);
    w.svc_ok(&["sandbox", "create", "kept"]);
    for name in ["held", "kept"] {
        // Its init's channel is in use before the restart.
        assert_eq!(w.sh(name, "echo up").1, "up\n");
        w.svc_ok(&["sandbox", "pause", name]);
        assert_eq!(w.show(name)["state"], "paused");
    }

    w.stop_svcd();
    w.start_svcd();
    for name in ["held", "kept"] {
        assert_eq!(w.show(name)["state"], "paused", "{}", w.svcd_log());
    }
    let shown = w.svc_ok(&["sandbox", "show", "held"]);
    assert!(shown.contains("paused"), "{shown}");
    let out = svc_within(&w, &["sandbox", "exec", "held", "true"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("is paused") && said.contains("resume"),
        "an exec in a paused sandbox: {said}"
    );
    // The restart thawed nothing: the runtime has both still paused.
    for name in ["held", "kept"] {
        let out = std::process::Command::new(w.oci_runtime())
            .arg("--root")
            .arg(w.dir.join("state/runc"))
            .args(["state", name])
            .output()
            .expect("the runtime's state");
        let runtime: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
        assert_eq!(runtime["status"], "paused", "{runtime}");
    }

    // Resumed: the init's new channel (the hand-over was left for the resume, not spent
    // while the guest was frozen) runs its commands, as before the restart.
    w.svc_ok(&["sandbox", "resume", "held"]);
    assert_eq!(w.show("held")["state"], "running");
    let (code, parent, err) = w.sh("held", "readlink /proc/$PPID/exe; exit 4");
    assert_eq!(code, 4, "{err}");
    assert_eq!(
        parent,
        "/usr/local/bin/svc-init\n",
        "not run by the init:\n{}",
        w.svcd_log()
    );
    assert!(
        w.svcd_log()
            .contains("a new channel to the adopted guest's init"),
        "{}",
        w.svcd_log()
    );

    // Destroyed: the resumed one, and the one still paused (thawed so that its processes
    // can die); nothing of either is left.
    w.destroy_checked("held");
    w.destroy_checked("kept");
}

#[test]
fn a_guest_that_stops_its_inits_server_gets_its_owner_an_error_not_a_hang() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "stuck"]);
    w.svc_ok(&["sandbox", "create", "fine"]);
    let init = w.init_pid("stuck");
    let server = init_server_pid(init);

    // A command that runs a while, started over the channel before the guest acts.
    let mut long = w
        .sh_command("stuck", "touch /tmp/long; sleep 60; echo late")
        .stdin(Stdio::null())
        .spawn()
        .expect("svc");
    let started = format!("/proc/{init}/root/tmp/long");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::path::Path::new(&started).exists() {
        assert!(Instant::now() < deadline, "the long command did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The guest, as root in its sandbox, stops its init's server a moment after this
    // command has ended (its oldest child: the first the kernel lists).
    let (code, _, err) = w.sh(
        "stuck",
        "s=$(cut -d' ' -f1 /proc/1/task/1/children); \
         setsid sh -c \"sleep 1; kill -STOP $s\" </dev/null >/dev/null 2>&1 &",
    );
    assert_eq!(code, 0, "{err}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while state(server) != 'T' {
        assert!(
            Instant::now() < deadline,
            "the guest did not stop its server"
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    // While that command's end cannot reach svcd, another sandbox's commands and svcd's API
    // go on.
    let out = svc_within(&w, &["sandbox", "exec", "fine", "echo", "ok"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n", "{out:?}");
    assert!(svc_within(&w, &["sandbox", "list"]).status.success());
    assert!(
        svc_within(&w, &["sandbox", "show", "stuck"])
            .status
            .success()
    );
    assert!(
        long.try_wait().expect("svc").is_none(),
        "the command ended though its init's server is stopped"
    );

    // The owner's next command in it: an error naming the cause, within the init's limit.
    let out = svc_within(&w, &["sandbox", "exec", "stuck", "echo", "hi"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("took no command within 10 s")
            && said.contains(&format!("its server (host pid {server}) is stopped")),
        "{said}"
    );
    // The command that was running over the given-up channel ends too, saying so.
    let deadline = Instant::now() + Duration::from_secs(30);
    while long.try_wait().expect("svc").is_none() {
        if Instant::now() >= deadline {
            let _ = long.kill();
            panic!("the command over the given-up channel did not end");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let long = long.wait_with_output().expect("svc");
    let said = String::from_utf8_lossy(&long.stderr);
    assert!(
        !long.status.success() && said.contains("given up"),
        "{said}"
    );
    // Its later commands run with the runtime's exec (a runtime process is their parent).
    let (code, parent, err) = w.sh("stuck", "echo $PPID");
    assert_eq!((code, parent.as_str()), (0, "0\n"), "{err}");
    let out = svc_within(&w, &["sandbox", "exec", "fine", "echo", "ok"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "ok\n", "{out:?}");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(server).expect("pid")),
        nix::sys::signal::Signal::SIGCONT,
    )
    .expect("SIGCONT");
    w.destroy_checked("stuck");
    w.destroy_checked("fine");
}
