//! Guests that stand still, against the real svcd and OCI runtime: a sandbox paused before
//! svcd restarts is adopted paused (its freezer says so), refuses commands until resumed, then
//! gets its init's channel back and runs them, and is destroyed whole, resumed or not; and a
//! guest that stops its own init's server (`SIGSTOP`) gets its owner's next command an error
//! naming that within the init's time limit, while another sandbox's commands and svcd's API
//! go on, and the sandbox's later commands run with the runtime's exec.
//!
//! The same on the microvm backend, against real QEMU: a VM paused before svcd restarts is
//! adopted paused (QEMU's run state says so), refuses commands until resumed, then runs them;
//! a monitor held by another client makes svcd's question fail in bounded time, saying so;
//! VMs whose QEMU is stopped are adopted side by side, so svcd is ready within about one
//! question's limit, not one per VM, each saying why its state is unknown;
//! and a VM stopped behind svcd's back, or whose agent the guest stops, gets its next command
//! an error naming that within the agent's limit, and its later commands run once it can.
//!
//! On both backends, a command refused that way never runs later, when the guest goes on (its
//! init's server or agent continued, its VM resumed): the guest held it unstarted and discards
//! it.

use std::{
    process::{Output, Stdio},
    time::{Duration, Instant},
};

use svc_control::runtime::microvm::{STATUS_LIMIT, qmp::Qmp};
use svc_tests::{
    init_server_pid, output_within, require_root,
    world::{World, microvm_images},
};

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

/// The QMP socket of microvm sandbox `name`'s QEMU.
fn qmp_socket(w: &World, name: &str) -> std::path::PathBuf {
    w.dir.join("state/sandboxes").join(name).join("qmp.sock")
}

/// Run QMP `command` on sandbox `name`'s QEMU behind svcd's back; QEMU's run state after it.
fn qmp(w: &World, name: &str, command: &str) -> String {
    let socket = qmp_socket(w, name);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut qmp = Qmp::connect(&socket, Duration::from_secs(10))
            .await
            .expect("QMP");
        if command != "query-status" {
            qmp.execute(command, None).await.expect(command);
        }
        qmp.status().await.expect("query-status")
    })
}

/// A client that holds sandbox `name`'s QMP monitor (QEMU serves one at a time) and says
/// nothing: others' connections wait unanswered while it is held.
fn hold_qmp(w: &World, name: &str) -> std::os::unix::net::UnixStream {
    let held = std::os::unix::net::UnixStream::connect(qmp_socket(w, name)).expect("QMP");
    let mut greeting = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(&held), &mut greeting)
        .expect("QMP's greeting");
    assert!(greeting.contains("QMP"), "{greeting}");
    held
}

/// Sandbox `name`'s last adoption says its run state is unknown: its QEMU's monitor did not
/// answer within [`STATUS_LIMIT`].
fn adopted_unanswered(w: &World, name: &str) {
    let adopted = w.events("sandbox.adopted", name);
    let unknown = adopted
        .last()
        .and_then(|e| e["detail"]["paused_unknown"].as_str())
        .unwrap_or_default()
        .to_owned();
    let limit = format!("did not answer within {} s", STATUS_LIMIT.as_secs());
    assert!(
        unknown.contains(&format!("reading the run state of the guest of {name}"))
            && unknown.contains(&limit),
        "{adopted:?}"
    );
}

/// `svc sandbox exec NAME -- sh -c SCRIPT`, which must fail within `limit`: what it said.
fn refused_within(w: &World, name: &str, script: &str, limit: Duration) -> String {
    let started = Instant::now();
    let out = svc_within(w, &["sandbox", "exec", name, "--", "sh", "-c", script]);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "the exec ran: {said}");
    assert!(
        started.elapsed() < limit,
        "refused after {:?} (over {limit:?}): {said}",
        started.elapsed()
    );
    said
}

#[test]
fn a_microvm_paused_before_svcd_restarts_is_adopted_paused_and_a_silent_monitor_is_named() {
    require_root();
    microvm_images();
    let mut w = World::start();
    w.svc_ok(&["sandbox", "create", "--backend", "microvm", "vmheld"]);
    assert_eq!(w.sh("vmheld", "echo up").1, "up\n", "{}", w.svcd_log());
    w.svc_ok(&["sandbox", "pause", "vmheld"]);

    // Killed and started again: QEMU says the VM is paused, and so does svcd.
    w.kill_svcd();
    w.start_svcd();
    assert_eq!(w.show("vmheld")["state"], "paused", "{}", w.svcd_log());
    let shown = w.svc_ok(&["sandbox", "show", "vmheld"]);
    assert!(shown.contains("paused"), "{shown}");
    assert_eq!(qmp(&w, "vmheld", "query-status"), "paused");
    let adopted = w.events("sandbox.adopted", "vmheld");
    assert_eq!(
        adopted.last().map(|e| &e["detail"]["paused"]),
        Some(&true.into()),
        "{adopted:?}"
    );
    let said = refused_within(&w, "vmheld", "true", Duration::from_secs(5));
    assert!(
        said.contains("is paused") && said.contains("resume"),
        "{said}"
    );

    // Resumed: its agent's channel is made again and runs its commands.
    w.svc_ok(&["sandbox", "resume", "vmheld"]);
    assert_eq!(w.show("vmheld")["state"], "running");
    assert_eq!(qmp(&w, "vmheld", "query-status"), "running");
    let (code, out, err) = w.sh("vmheld", "echo back; exit 3");
    assert_eq!(
        (code, out.as_str()),
        (3, "back\n"),
        "{err}\n{}",
        w.svcd_log()
    );

    // Paused again, then started while another client holds QEMU's monitor: svcd starts
    // (its question is bounded), says why it cannot tell, and takes the VM as running.
    w.svc_ok(&["sandbox", "pause", "vmheld"]);
    w.kill_svcd();
    let held = hold_qmp(&w, "vmheld");
    let started = Instant::now();
    w.start_svcd();
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    adopted_unanswered(&w, "vmheld");
    assert_eq!(w.show("vmheld")["state"], "running");
    // Its exec fails in bounded time, naming both: no agent, no monitor.
    let said = refused_within(&w, "vmheld", "true", Duration::from_secs(30));
    assert!(
        said.contains("no answer to hello in time")
            && said.contains("its VM's run state is unknown: QEMU's monitor"),
        "{said}"
    );
    // The monitor let go: the exec names the VM's state; resume lets it run again.
    drop(held);
    let said = refused_within(&w, "vmheld", "true", Duration::from_secs(30));
    assert!(
        said.contains("its VM is paused (QEMU's run state: paused)"),
        "{said}"
    );
    w.svc_ok(&["sandbox", "resume", "vmheld"]);
    assert_eq!(
        w.sh("vmheld", "echo again").1,
        "again\n",
        "{}",
        w.svcd_log()
    );
    // Destroyed while paused: thawed to be stopped, nothing left.
    w.svc_ok(&["sandbox", "pause", "vmheld"]);
    w.destroy_checked("vmheld");
}

#[test]
fn microvms_whose_qemu_is_stopped_are_adopted_side_by_side_within_about_one_status_limit() {
    require_root();
    microvm_images();
    let mut w = World::start();
    let names = ["vmstopa", "vmstopb"];
    for name in names {
        w.svc_ok(&["sandbox", "create", "--backend", "microvm", name]);
        assert_eq!(w.sh(name, "echo up").1, "up\n", "{}", w.svcd_log());
    }
    let qemus = names.map(|name| {
        let pid = w.show(name)["pid"].as_u64().expect("pid");
        nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid"))
    });
    // How long svcd takes to start with both VMs answering.
    w.kill_svcd();
    let started = Instant::now();
    w.start_svcd();
    let answered = started.elapsed();

    // Both QEMUs stopped: neither monitor answers; svcd waits for them at once.
    w.kill_svcd();
    for pid in qemus {
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    }
    let started = Instant::now();
    w.start_svcd();
    let took = started.elapsed();
    for pid in qemus {
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    }
    println!("ready after {took:?}, {answered:?} with the monitors answering");
    assert!(
        took < answered + 2 * STATUS_LIMIT,
        "ready after {took:?} ({answered:?} with the monitors answering, each may wait {STATUS_LIMIT:?})"
    );
    for name in names {
        adopted_unanswered(&w, name);
        assert_eq!(w.show(name)["state"], "running");
        // Continued, it runs commands again (its agent's channel made at the first).
        assert_eq!(w.sh(name, "echo back").1, "back\n", "{}", w.svcd_log());
    }
    for name in names {
        w.destroy_checked(name);
    }
}

#[test]
fn a_microvm_stopped_behind_svcd_or_whose_agent_stops_gets_a_bounded_exec_error() {
    require_root();
    microvm_images();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "--backend", "microvm", "vmstuck"]);
    assert_eq!(w.sh("vmstuck", "echo up").1, "up\n", "{}", w.svcd_log());
    let fds = w.svcd_fds();

    // QEMU stopped behind svcd's back: svcd still shows it running; its exec is refused
    // within the agent's limit, naming the VM's state.
    assert_eq!(qmp(&w, "vmstuck", "stop"), "paused");
    assert_eq!(w.show("vmstuck")["state"], "running");
    let said = refused_within(&w, "vmstuck", "echo late", Duration::from_secs(30));
    assert!(
        said.contains("the guest's agent took no command within 10 s")
            && said.contains("its VM is paused (QEMU's run state: paused)")
            && said.contains("given up"),
        "{said}"
    );
    assert_eq!(qmp(&w, "vmstuck", "cont"), "running");
    let (code, out, err) = w.sh("vmstuck", "echo on");
    assert_eq!((code, out.as_str()), (0, "on\n"), "{err}\n{}", w.svcd_log());

    // The guest stops its own agent (continued 40 s later by the same shell).
    svc_tests::vm::stop_agent_for(&w, "vmstuck", 40);
    let said = refused_within(&w, "vmstuck", "echo late", Duration::from_secs(30));
    assert!(
        said.contains("the guest's agent took no command within 10 s")
            && said.contains("its VM runs but its agent does not answer"),
        "{said}"
    );
    // svcd's API goes on meanwhile.
    assert!(svc_within(&w, &["sandbox", "list"]).status.success());

    // Once the agent runs again, the next command connects anew and runs; nothing of the
    // given-up channels is left open in svcd.
    runs_again(&w, "vmstuck");
    let deadline = Instant::now() + Duration::from_secs(10);
    while w.svcd_fds() > fds {
        assert!(
            Instant::now() < deadline,
            "svcd holds {} descriptors, {fds} before",
            w.svcd_fds()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    w.destroy_checked("vmstuck");
}

/// Wait (2 min at most) until microvm sandbox `name` runs a command again: its agent reads
/// again and the next command connects anew.
fn runs_again(w: &World, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (code, out, err) = w.sh(name, "echo back");
        if (code, out.as_str()) == (0, "back\n") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{code} {out} {err}\n{}",
            w.svcd_log()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `svc sandbox exec NAME -- sh -c 'touch MARKER'`, refused within 30 s as the guest's init or
/// agent took no command within 10 s; what it said.
fn marker_refused(w: &World, name: &str, marker: &str) -> String {
    let said = refused_within(w, name, &format!("touch {marker}"), Duration::from_secs(30));
    assert!(said.contains("took no command within 10 s"), "{said}");
    said
}

#[test]
fn a_command_refused_while_the_inits_server_is_stopped_never_runs_once_it_continues() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "late"]);
    assert_eq!(w.sh("late", "echo up").1, "up\n");
    let init = w.init_pid("late");
    let server = init_server_pid(init);
    let pid = nix::unistd::Pid::from_raw(i32::try_from(server).expect("pid"));

    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while state(server) != 'T' {
        assert!(Instant::now() < deadline, "the server did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
    let said = marker_refused(&w, "late", "/tmp/refused");
    assert!(said.contains("is stopped"), "{said}");

    // The server goes on and reads what was queued for it: the command, held, is discarded.
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).expect("SIGCONT");
    std::thread::sleep(Duration::from_secs(4));
    let marker = format!("/proc/{init}/root/tmp/refused");
    assert!(
        !std::path::Path::new(&marker).exists(),
        "the refused command ran once the init's server continued\n{}",
        w.svcd_log()
    );
    // A fresh command runs (with the runtime's exec: the channel was given up), and sees no
    // marker either.
    let (code, out, err) = w.sh("late", "test -e /tmp/refused; echo $?");
    assert_eq!((code, out.as_str()), (0, "1\n"), "{err}\n{}", w.svcd_log());
    w.destroy_checked("late");
}

#[test]
fn a_command_refused_while_a_microvm_or_its_agent_is_stopped_never_runs_once_it_goes_on() {
    require_root();
    microvm_images();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "--backend", "microvm", "vmlate"]);
    assert_eq!(w.sh("vmlate", "echo up").1, "up\n", "{}", w.svcd_log());
    // The next command, after a refusal, runs once the agent reads again (within 2 min);
    // then, a few seconds on, the refused one has still not run.
    let runs_again_without = |marker: &str| {
        runs_again(&w, "vmlate");
        std::thread::sleep(Duration::from_secs(4));
        let (code, out, err) = w.sh("vmlate", &format!("test -e {marker}; echo $?"));
        assert_eq!(
            (code, out.as_str()),
            (0, "1\n"),
            "the refused command ran later: {err}\n{}",
            w.svcd_log()
        );
    };

    // The VM stopped behind svcd's back, then continued.
    assert_eq!(qmp(&w, "vmlate", "stop"), "paused");
    let said = marker_refused(&w, "vmlate", "/tmp/paused");
    assert!(said.contains("its VM is paused"), "{said}");
    assert_eq!(qmp(&w, "vmlate", "cont"), "running");
    runs_again_without("/tmp/paused");

    // The guest stops its own agent, and continues it 20 s later.
    let (code, _, err) = w.sh(
        "vmlate",
        "a=$(grep -l '^svc-microvm-age' /proc/[0-9]*/comm | cut -d/ -f3 | head -n1); \
         [ -n \"$a\" ] || exit 9; \
         setsid sh -c \"sleep 1; kill -STOP $a; sleep 20; kill -CONT $a\" \
           </dev/null >/dev/null 2>&1 &",
    );
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(Duration::from_secs(3));
    let said = marker_refused(&w, "vmlate", "/tmp/stopped");
    assert!(said.contains("its agent does not answer"), "{said}");
    runs_again_without("/tmp/stopped");
    w.destroy_checked("vmlate");
}
