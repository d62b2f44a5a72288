//! svc as a containerd runtime: Debian's containerd, started by the test with its own root,
//! state and socket, runs tasks with `--runtime io.containerd.svc.v1` through the workspace's
//! `containerd-shim-svc-v1` against a real svcd. The image is an OCI archive of the base image
//! imported with `ctr image import`; each task is an svc sandbox on the root file system
//! containerd unpacked: its output and exit code reach `ctr`, `ctr task exec` runs in it, the
//! pod annotation's allowed host is reached with the stored credential swapped in on the wire
//! (the task sees only a placeholder) and another host and an IP literal are refused, `ctr task
//! exec --tty` runs on a terminal, input given to `ctr run` and `ctr task exec` reaches the
//! process, the signal `ctr task kill` names reaches the process, and `ctr task kill` + `delete`
//! leave no sandbox, link, fence entry or mount. A task annotated `svc.dev/backend=microvm` is a VM
//! running its process, fenced the same.

use svc_tests::{
    containerd::{Containerd, IMAGE, RUNTIME},
    require_root,
    world::{EXAMPLE_TOKEN, World, microvm_images},
};

/// The stored secret the fenced task names, and the credential variable it brokers.
const STORED: &str = "example";
const VAR: &str = "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN";

#[test]
fn ctr_runs_tasks_as_fenced_sandboxes_and_leaves_nothing() {
    require_root();
    let w = World::start();
    w.store_secret(STORED, EXAMPLE_TOKEN, &[]);
    let c = Containerd::start_with_base(&w);

    // Output and the exit code come back to ctr.
    let out = c.ctr(&[
        "run",
        "--rm",
        "--runtime",
        RUNTIME,
        IMAGE,
        "hello",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 3",
    ]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{out:?}\ncontainerd log:\n{}",
        c.log()
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("err"),
        "{out:?}"
    );

    // Input given to `ctr run` reaches the task's own process, which reads it to its end.
    let out = c.ctr_with_input(
        &[
            "run",
            "--rm",
            "--runtime",
            RUNTIME,
            IMAGE,
            "input",
            "sh",
            "-c",
            "tr a-z A-Z; exit 7",
        ],
        "to the task\n",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "TO THE TASK\n",
        "{out:?}"
    );
    assert_eq!(out.status.code(), Some(7), "{out:?}");

    // A detached task with its pod's policy: the perimeter holds.
    let secret = format!("svc.dev/secrets={VAR}={STORED}");
    c.run_detached_ok(
        "fenced",
        &["svc.dev/allow-hosts=allowed.example.test", &secret],
        &["sleep", "1000"],
    );
    let sandbox = "ctr-fenced";
    let s = w.show(sandbox);
    let allowed = s["allowed_hosts"].as_array().expect("allowed_hosts");
    assert!(allowed.iter().any(|h| h == "allowed.example.test"), "{s}");
    let curl = |url: &str| c.curl("fenced", url);
    assert_eq!(curl("https://allowed.example.test/from-ctr"), Some(0));
    assert_ne!(curl("https://forbidden.example.test/"), Some(0));
    assert_ne!(curl("http://192.0.2.66/"), Some(0));
    let exec = c.ctr_ok(&[
        "task",
        "exec",
        "--exec-id",
        "cat",
        "fenced",
        "cat",
        "/proc/sys/kernel/hostname",
    ]);
    assert_eq!(exec.trim(), sandbox);
    assert_swapped_on_the_wire(&w, &c, "fenced");
    assert_exec_on_a_terminal(&c, "fenced");
    assert_stdin_reaches_the_process(&c, "fenced");
    assert_signals_reach_the_process(&w, &c);

    // Kill and delete: nothing of the sandbox is left, on the host or in containerd's tree.
    kill_and_delete(&w, &c, "fenced", &s);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains("/fenced/rootfs"),
        "the task's root file system is still mounted"
    );
    let list = w.svc_ok(&["sandbox", "list"]);
    assert!(!list.contains("ctr-"), "{list}");
}

/// Task `task` holds only a placeholder for the stored secret; the allowed host gets the real
/// value, swapped in by the proxy on the wire.
fn assert_swapped_on_the_wire(w: &World, c: &Containerd, task: &str) {
    let seen = c.ctr_ok(&["task", "exec", "--exec-id", "env", task, "printenv", VAR]);
    let seen = seen.trim();
    assert!(
        !seen.is_empty() && !seen.contains(EXAMPLE_TOKEN),
        "the task sees {seen:?}, not a placeholder"
    );
    let header = format!("Authorization: Bearer {seen}");
    c.curl_ok_with_header(
        task,
        "secret",
        &header,
        "https://allowed.example.test/ctr-secret",
    );
    assert_eq!(
        w.received_auth("/ctr-secret"),
        format!("Bearer {EXAMPLE_TOKEN}"),
        "the stored credential, swapped in on the wire"
    );
}

/// `ctr task exec --tty`: the process's standard input and output are a terminal, and its
/// output and exit code reach ctr.
fn assert_exec_on_a_terminal(c: &Containerd, task: &str) {
    let out = c.ctr_on_a_terminal(&[
        "task",
        "exec",
        "--tty",
        "--exec-id",
        "tty",
        task,
        "sh",
        "-c",
        "test -t 0 && test -t 1 && tty && exit 5",
    ]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("/dev/pts/"), "no terminal: {out:?}");
    assert_eq!(out.status.code(), Some(5), "{out:?}");
}

/// `ctr task exec` with input on its standard input: the process reads it to its end (the
/// shim copies containerd's stdin FIFO to it, then ends its input), and what it wrote and its
/// exit code reach ctr.
fn assert_stdin_reaches_the_process(c: &Containerd, task: &str) {
    let out = c.ctr_with_input(
        &[
            "task",
            "exec",
            "--exec-id",
            "stdin",
            task,
            "sh",
            "-c",
            "tr a-z A-Z; exit 6",
        ],
        "fed through stdin\n",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "FED THROUGH STDIN\n",
        "{out:?}"
    );
    assert_eq!(out.status.code(), Some(6), "{out:?}");
}

/// The signal `ctr task kill` names reaches the task's process (its trap's exit code is the
/// task's, in containerd's exit event); the task then leaves nothing.
fn assert_signals_reach_the_process(w: &World, c: &Containerd) {
    c.run_detached_ok(
        "trap",
        &[],
        &[
            "sh",
            "-c",
            "trap 'exit 43' USR1; trap 'exit 44' TERM; touch /tmp/trapped; \
             while :; do sleep 0.1; done",
        ],
    );
    let s = w.show("ctr-trap");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !c
        .ctr(&[
            "task",
            "exec",
            "--exec-id",
            "t",
            "trap",
            "test",
            "-e",
            "/tmp/trapped",
        ])
        .status
        .success()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the trap was never set"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let events = c.events();
    c.ctr_ok(&["task", "kill", "--signal", "SIGUSR1", "trap"]);
    let exit = events.wait_for("/tasks/exit", "trap");
    assert!(
        exit.contains("\"exit_status\":43"),
        "SIGUSR1's trap: {exit}"
    );
    wait_stopped(w, c, "trap");
    c.ctr_ok(&["task", "delete", "trap"]);
    c.ctr_ok(&["container", "delete", "trap"]);
    w.assert_gone_shown(&s);
}

/// Wait until `ctr task ls` shows task `task` stopped.
fn wait_stopped(w: &World, c: &Containerd, task: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let tasks = c.ctr_ok(&["task", "ls"]);
        if tasks
            .lines()
            .any(|l| l.starts_with(task) && l.contains("STOPPED"))
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the killed task {task} did not stop:\n{tasks}\ncontainerd log:\n{}\nsvcd log:\n{}",
            c.log(),
            w.svcd_log()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// `ctr task kill -s SIGKILL` of `task`, then its task and container deleted: nothing of its
/// sandbox (`show`, as `svc sandbox show --json` had it) is left.
fn kill_and_delete(w: &World, c: &Containerd, task: &str, show: &serde_json::Value) {
    c.ctr_ok(&["task", "kill", "--signal", "SIGKILL", task]);
    wait_stopped(w, c, task);
    c.ctr_ok(&["task", "delete", task]);
    c.ctr_ok(&["container", "delete", task]);
    w.assert_gone_shown(show);
}

/// A task of its own annotated `svc.dev/backend=microvm` is a VM of the node's microvm image
/// (real QEMU, TCG here) running the task's process: `ctr task exec` runs on the VM's kernel,
/// behind the same fence, as the user it names, exit codes come back, and kill + delete leave
/// no QEMU.
#[test]
fn ctr_runs_a_microvm_task_as_a_fenced_vm_and_leaves_nothing() {
    require_root();
    microvm_images();
    let w = World::start();
    let c = Containerd::start_with_base(&w);
    let out = c.run_detached(
        "vm",
        &[
            "svc.dev/backend=microvm",
            "svc.dev/allow-hosts=allowed.example.test",
        ],
        &["sleep", "1000"],
    );
    assert!(
        out.status.success(),
        "{out:?}\ncontainerd:\n{}\nsvcd:\n{}",
        c.log(),
        w.svcd_log()
    );
    let s = w.show("ctr-vm");
    assert_eq!(s["backend"], "microvm", "{s}");
    let qemu = std::fs::read_to_string(w.dir.join("state/sandboxes/ctr-vm/qemu.pid"))
        .expect("the VM's qemu.pid");
    let exec = |exec_id: &str, argv: &[&str]| {
        c.ctr(&[&["task", "exec", "--exec-id", exec_id, "vm"][..], argv].concat())
    };
    let kernel = exec("uname", &["uname", "-r"]);
    let host_kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    assert!(kernel.status.success(), "{kernel:?}");
    assert_ne!(
        String::from_utf8_lossy(&kernel.stdout).trim(),
        host_kernel.trim(),
        "the task runs on the host's kernel"
    );
    assert_eq!(exec("code", &["sh", "-c", "exit 3"]).status.code(), Some(3));
    // A process as the user its spec names: the agent sets its ids.
    let user = c.ctr(&[
        "task",
        "exec",
        "--exec-id",
        "user",
        "--user",
        "1000:1000",
        "vm",
        "sh",
        "-c",
        "id -u; id -g",
    ]);
    assert!(user.status.success(), "{user:?}\nsvcd:\n{}", w.svcd_log());
    assert_eq!(String::from_utf8_lossy(&user.stdout), "1000\n1000\n");
    let curl = |id: &str, url: &str| {
        exec(
            id,
            &["curl", "-sS", "-o", "/dev/null", "--max-time", "20", url],
        )
        .status
        .code()
    };
    assert_eq!(
        curl("allowed", "https://allowed.example.test/from-a-vm"),
        Some(0)
    );
    assert_ne!(curl("literal", "http://192.0.2.66/"), Some(0));

    kill_and_delete(&w, &c, "vm", &s);
    let comm = std::fs::read_to_string(format!("/proc/{}/comm", qemu.trim())).unwrap_or_default();
    assert!(
        !comm.starts_with("qemu"),
        "the task's QEMU is still running"
    );
    let list = w.svc_ok(&["sandbox", "list"]);
    assert!(!list.contains("ctr-"), "{list}");
}
