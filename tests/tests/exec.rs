//! `svc sandbox exec` like `docker exec`, and pause/resume, against the real svcd and runc:
//! the command without `--`, standard input forwarded, exit codes kept (125, 126, 127 when it
//! did not run), --workdir (default /workspace in a workspace's sandbox) and --env, signals
//! passed on, a terminal of the caller's size with Ctrl-C acting inside, and the runtime's
//! freezer.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Command, Stdio},
};

use svc_tests::{
    require_root,
    world::{World, workspace_bin},
};

/// `svc sandbox exec dev -- sh -c SCRIPT` running, with `stdin` and piped output.
fn spawn_sh(w: &World, script: &str, stdin: Stdio) -> std::process::Child {
    w.sh_command("dev", script)
        .stdin(stdin)
        .spawn()
        .expect("svc")
}

#[test]
fn exec_forwards_stdin_keeps_exit_codes_and_takes_workdir_and_env() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "dev"]);

    // A pipe is forwarded, byte for byte, a megabyte of it.
    let data: Vec<u8> = (0..1_048_576u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut child = spawn_sh(&w, "cat; echo end >&2", Stdio::piped());
    let mut stdin = child.stdin.take().expect("stdin");
    let feed = data.clone();
    let writer = std::thread::spawn(move || stdin.write_all(&feed));
    let out = child.wait_with_output().expect("svc exec");
    writer.join().expect("writer").expect("write stdin");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout.len(), data.len(), "stdin came back short");
    assert!(out.stdout == data, "stdin came back changed");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "end\n");

    // `echo hi | svc sandbox exec dev -- cat`
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "echo hi | {} sandbox exec dev -- cat",
            workspace_bin("svc").display()
        ))
        .env("SVC_SOCKET", &w.socket)
        .output()
        .expect("sh");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");

    // Exit codes, the working directory and extra environment.
    let out = w.svc(&["sandbox", "exec", "dev", "--", "sh", "-c", "exit 42"]);
    assert_eq!(out.status.code(), Some(42));
    let out = w.svc_ok(&[
        "sandbox",
        "exec",
        "-w",
        "/tmp",
        "-e",
        "GREETING=hello there",
        "dev",
        "--",
        "sh",
        "-c",
        "pwd; echo \"$GREETING\"",
    ]);
    assert_eq!(out, "/tmp\nhello there\n");
    let bad = w.svc(&["sandbox", "exec", "-e", "=x", "dev", "--", "true"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected KEY=VALUE"));
    // A missing program is the program's error, with the shell's code.
    let out = w.svc(&["sandbox", "exec", "dev", "--", "no-such-program"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such-program"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn exec_reads_like_docker_exec_and_its_status_says_who_failed() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "dev"]);
    // No `--`: everything after the name is the command, its flags included.
    let out = w.svc_ok(&[
        "sandbox",
        "exec",
        "dev",
        "sh",
        "-c",
        "echo $0 $1; pwd",
        "-x",
        "--y",
    ]);
    assert_eq!(out, "-x --y\n/\n");
    assert_eq!(
        w.svc_ok(&["sandbox", "exec", "dev", "--", "ls", "-d", "/tmp"]),
        "/tmp\n"
    );

    // The command's own status, and the codes docker exec reserves for not running it.
    let run = |args: &[&str]| {
        let out = w.svc(args);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (args, code, said) in [
        (&["dev", "sh", "-c", "exit 1"][..], 1, ""),
        (&["dev", "sh", "-c", "exit 255"], 255, ""),
        (&["dev", "no-such-program", "-x"], 127, "no-such-program"),
        (&["dev", "/no/such/file"], 127, "/no/such/file"),
        // runc: "permission denied"; crun: "the path `/etc/passwd` exists but it is not
        // executable". Either names the file.
        (&["dev", "/etc/passwd"], 126, "/etc/passwd"),
        (&["-w", "/no/such/dir", "dev", "true"], 126, "/no/such/dir"),
        (&["nope", "true"], 125, "nope"),
    ] {
        let (got, stderr) = run(&[&["sandbox", "exec"][..], args].concat());
        assert_eq!(got, Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(said), "{args:?}: {stderr}");
        if code == 126 && said == "/etc/passwd" {
            assert!(
                stderr.contains("permission denied") || stderr.contains("not executable"),
                "{args:?}: {stderr}"
            );
        }
    }

    // A workspace's sandbox starts commands in its project, /workspace, unless told otherwise.
    let project = w.project("project", &[(".svc/workspace.json", r#"{"version": 1}"#)]);
    w.workspace_up_ok(project.to_str().expect("utf-8"), "ws");
    assert_eq!(w.svc_ok(&["sandbox", "exec", "ws", "pwd"]), "/workspace\n");
    assert_eq!(
        w.svc_ok(&["sandbox", "exec", "-w", "/tmp", "ws", "pwd"]),
        "/tmp\n"
    );
    assert_eq!(w.svc_ok(&["sandbox", "exec", "dev", "pwd"]), "/\n");
}

#[test]
fn signals_reach_the_command_and_a_terminal_has_the_callers_size() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "dev"]);

    // Without a terminal, SIGINT to svc reaches the command.
    let mut child = spawn_sh(
        &w,
        "trap 'echo got-int; exit 7' INT; echo ready; while :; do sleep 0.1; done",
        Stdio::null(),
    );
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("read");
    assert_eq!(first, "ready\n");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid")),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("kill");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).expect("read");
    let status = child.wait().expect("wait");
    assert_eq!(rest, "got-int\n");
    assert_eq!(status.code(), Some(7), "the trap's exit code");

    // With -t: a terminal of our size (script(1) gives svc a terminal of 33x101).
    let svc = workspace_bin("svc");
    let out = Command::new("script")
        .args(["-q", "-e", "-c"])
        .arg(format!(
            "stty rows 33 cols 101; {} sandbox exec -t dev -- sh -c 'tty; stty size; \
             test -t 0 && echo stdin-is-a-tty'",
            svc.display()
        ))
        .arg("/dev/null")
        .env("SVC_SOCKET", &w.socket)
        .stdin(Stdio::null())
        .output()
        .expect("script");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("/dev/pts/"), "no terminal: {text}");
    assert!(text.contains("33 101"), "the size did not follow: {text}");
    assert!(text.contains("stdin-is-a-tty"), "{text}");

    // Ctrl-C typed on that terminal interrupts the command inside (exit 130).
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "(sleep 2; printf '\\003'; sleep 5) | script -q -e -c '{} sandbox exec -t dev -- sh -c \
             \"echo ready; sleep 30; echo not-interrupted\"' /dev/null",
            svc.display()
        ))
        .env("SVC_SOCKET", &w.socket)
        .output()
        .expect("script");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ready"), "{text}");
    assert!(
        !text.contains("not-interrupted"),
        "Ctrl-C did not interrupt: {text}"
    );
    assert_eq!(out.status.code(), Some(130), "{text}");

    // -t without a terminal is refused with a reason.
    let out = w
        .svc_command(&["sandbox", "exec", "-t", "dev", "--", "true"])
        .stdin(Stdio::null())
        .output()
        .expect("svc");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not one; drop -t"));
}

#[test]
fn pause_freezes_a_sandbox_and_resume_thaws_it() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "dev"]);
    // A counter that ticks while the sandbox runs.
    w.svc_ok(&[
        "sandbox",
        "exec",
        "dev",
        "--",
        "sh",
        "-c",
        "(i=0; while :; do i=$((i+1)); echo $i > /tmp/tick; sleep 0.05; done) \
         </dev/null >/dev/null 2>&1 &",
    ]);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = w.svc_ok(&["sandbox", "pause", "dev"]);
    assert!(out.contains("paused"), "{out}");
    assert_eq!(w.show("dev")["state"], "paused");
    let refused = w.svc(&["sandbox", "exec", "dev", "--", "true"]);
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("is paused"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    // The runtime's freezer holds it.
    let state = Command::new(w.oci_runtime())
        .arg("--root")
        .arg(w.dir.join("state/runc"))
        .args(["state", "dev"])
        .output()
        .expect("the runtime's state");
    let state: serde_json::Value = serde_json::from_slice(&state.stdout).expect("state json");
    assert_eq!(state["status"], "paused");
    std::thread::sleep(std::time::Duration::from_millis(300));
    w.svc_ok(&["sandbox", "resume", "dev"]);
    assert_eq!(w.show("dev")["state"], "running");
    let a: u64 = w.sh("dev", "cat /tmp/tick").1.trim().parse().expect("tick");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let b: u64 = w.sh("dev", "cat /tmp/tick").1.trim().parse().expect("tick");
    assert!(
        b > a,
        "the counter does not tick after resume ({a} then {b})"
    );
    let events = w.svc_ok(&["events", "--json"]);
    assert!(events.contains("sandbox.paused") && events.contains("sandbox.resumed"));

    // A paused sandbox is destroyed whole, frozen processes included.
    w.svc_ok(&["sandbox", "pause", "dev"]);
    w.destroy_checked("dev");
}
