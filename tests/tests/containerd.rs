//! svc as a containerd runtime: Debian's containerd, started by the test with its own root,
//! state and socket, runs tasks with `--runtime io.containerd.svc.v1` through the workspace's
//! `containerd-shim-svc-v1` against a real svcd. The image is an OCI archive of the base image
//! imported with `ctr image import`; each task is an svc sandbox on the root file system
//! containerd unpacked: its output and exit code reach `ctr`, `ctr task exec` runs in it, the
//! pod annotation's allowed host is reached and another host and an IP literal are refused,
//! and `ctr task kill` + `delete` leave no sandbox, link, fence entry or mount. A task
//! annotated `svc.dev/backend=microvm` is a VM running its process, fenced the same.

use svc_tests::{
    containerd::{Containerd, IMAGE, RUNTIME},
    require_root,
    world::{World, microvm_images},
};

#[test]
fn ctr_runs_tasks_as_fenced_sandboxes_and_leaves_nothing() {
    require_root();
    let w = World::start();
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

    // A detached task with its pod's policy: the perimeter holds.
    c.ctr_ok(&[
        "run",
        "-d",
        "--runtime",
        RUNTIME,
        "--annotation",
        "svc.dev/allow-hosts=allowed.example.test",
        IMAGE,
        "fenced",
        "sleep",
        "1000",
    ]);
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

/// `ctr task kill -s SIGKILL` of `task`, then its task and container deleted: nothing of its
/// sandbox (`show`, as `svc sandbox show --json` had it) is left.
fn kill_and_delete(w: &World, c: &Containerd, task: &str, show: &serde_json::Value) {
    c.ctr_ok(&["task", "kill", "--signal", "SIGKILL", task]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !c
        .ctr_ok(&["task", "ls"])
        .lines()
        .any(|l| l.starts_with(task) && l.contains("STOPPED"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the killed task {task} did not stop"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
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
    let out = c.ctr(&[
        "run",
        "-d",
        "--runtime",
        RUNTIME,
        "--annotation",
        "svc.dev/backend=microvm",
        "--annotation",
        "svc.dev/allow-hosts=allowed.example.test",
        IMAGE,
        "vm",
        "sleep",
        "1000",
    ]);
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
