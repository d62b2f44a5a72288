//! Sandboxes on the microvm backend, end to end: svcd boots a real QEMU `-M microvm` guest
//! (TCG here, KVM where the host can), its tap carries the same fence as the container
//! backend's veth, and `svc sandbox exec` runs commands through the in-guest agent.

use std::time::Duration;

use serde_json::Value;
use svc_tests::{
    require_root,
    world::{EXAMPLE_TOKEN, World, microvm_images},
};

/// A world with a microvm sandbox `name` (Curated, allowed.example.test added, its token
/// brokered).
fn world_with_vm(name: &str) -> World {
    require_root();
    microvm_images();
    let w = World::start();
    let token = w.dir.join("example-token");
    std::fs::write(&token, EXAMPLE_TOKEN).expect("token file");
    let out = w.svc(&[
        "sandbox",
        "create",
        "--backend",
        "microvm",
        "--allow-host",
        "allowed.example.test",
        "--secret",
        &format!(
            "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN@file:{}",
            token.display()
        ),
        name,
    ]);
    assert!(
        out.status.success(),
        "create --backend microvm failed: {}\nsvcd:\n{}",
        String::from_utf8_lossy(&out.stderr),
        w.svcd_log()
    );
    w
}

#[test]
fn a_microvm_sandbox_runs_commands_behind_the_same_fence() {
    let w = world_with_vm("vm");
    let show = w.show("vm");
    assert_eq!(show["backend"], "microvm", "{show}");
    assert_eq!(show["state"], "running", "{show}");
    // The accelerator and why: TCG on a machine without vmx/svm, KVM where it can.
    let accel = show["accel"].as_str().unwrap_or_default();
    assert!(
        accel.starts_with("tcg (") || accel.starts_with("kvm ("),
        "{show}"
    );
    let human = w.svc_ok(&["sandbox", "show", "vm"]);
    assert!(human.contains("accelerator:"), "{human}");

    // Its own kernel: not the host's.
    let (code, out, err) = w.sh("vm", "uname -r; cat /proc/1/comm; hostname");
    assert_eq!(code, 0, "{out}\n{err}\n{}", w.svcd_log());
    let host_kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let mut lines = out.lines();
    assert_ne!(
        lines.next(),
        Some(host_kernel.trim()),
        "the guest runs the host's kernel"
    );
    assert_eq!(lines.next(), Some("tini"), "{out}");
    assert_eq!(lines.next(), Some("vm"), "the host name is the sandbox's");

    // The guest's files came from the host: its only resolver is the gateway.
    let (_, resolv, _) = w.sh("vm", "cat /etc/resolv.conf");
    let gateway = show["gateway_v4"].as_str().unwrap_or_default().to_owned();
    assert!(
        resolv.contains(&format!("nameserver {gateway}")),
        "{resolv} (gateway {gateway})"
    );

    // Allowed HTTPS through the proxy, with the placeholder swapped on the host.
    let (code, out, err) = w.sh(
        "vm",
        "curl -sS --max-time 20 -H \"Authorization: Bearer $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" \
         https://allowed.example.test/v1/from-a-vm",
    );
    assert_eq!(code, 0, "allowed request failed: {err}\n{}", w.svcd_log());
    let answer: Value = serde_json::from_str(out.trim()).expect("json answer");
    assert_eq!(answer["credential_received"], "real", "{answer}");

    // A host off the list: no answer at DNS; its address dialled directly: dropped.
    let (code, _, _) = w.sh("vm", "getent hosts forbidden.example.test");
    assert_ne!(code, 0, "forbidden.example.test resolved");
    let (code, _, _) = w.sh("vm", "curl -sS --connect-timeout 3 -k https://192.0.2.66/");
    assert_ne!(code, 0, "the IP literal connected");
    assert!(
        !w.received()
            .iter()
            .any(|r| r["host"] == "forbidden.example.test" || r["name"] == "forbidden.example.test"),
        "the forbidden host saw something"
    );

    // Streams, exit codes and stdin through the agent.
    let out = w.svc_env(
        &[
            "sandbox",
            "exec",
            "-i",
            "vm",
            "--",
            "sh",
            "-c",
            "wc -c; exit 7",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(7), "{out:?}");
    // A command the agent cannot start: 127 not found, 126 not runnable, as the container's.
    for (argv, code) in [(&["no-such-program"][..], 127), (&["/etc/passwd"], 126)] {
        let out = w.svc(&[&["sandbox", "exec", "vm"][..], argv].concat());
        assert_eq!(out.status.code(), Some(code), "{argv:?}: {out:?}");
    }

    w.destroy_checked("vm");
}

#[test]
fn pause_and_resume_freeze_the_guest() {
    let w = world_with_vm("frozen");
    let qmp_status = |w: &World| w.show("frozen")["state"].as_str().unwrap_or("").to_owned();
    w.svc_ok(&["sandbox", "pause", "frozen"]);
    let out = w.svc(&["sandbox", "exec", "frozen", "--", "true"]);
    assert!(!out.status.success(), "exec in a paused sandbox ran");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is paused"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    w.svc_ok(&["sandbox", "resume", "frozen"]);
    let (code, out, _) = w.sh("frozen", "echo thawed");
    assert_eq!((code, out.trim()), (0, "thawed"));
    assert_eq!(qmp_status(&w), "running");
    w.destroy_checked("frozen");
}

#[test]
fn a_guest_that_panics_is_reaped() {
    let w = world_with_vm("doomed");
    let pid = w.show("doomed")["pid"].as_u64().expect("pid");
    // The guest's own kernel panics; QEMU exits (-no-reboot) and svcd sees the sandbox dead.
    let _ = w.svc(&[
        "sandbox",
        "exec",
        "doomed",
        "--",
        "sh",
        "-c",
        "echo c > /proc/sysrq-trigger",
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let state = w.show("doomed")["state"].as_str().unwrap_or("").to_owned();
        if state != "running" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the panicked guest still shows running"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.contains(") Z ")),
        "QEMU (pid {pid}) still runs"
    );
    w.destroy_checked("doomed");
}

#[test]
fn without_images_the_microvm_backend_is_refused_by_name() {
    require_root();
    let mut w = World::start();
    // Restart svcd without SVC_MICROVM_ROOTFS.
    w.kill_svcd();
    w.start_svcd_with_env(&[("SVC_MICROVM_ROOTFS", None)]);
    let out = w.svc(&["sandbox", "create", "--backend", "microvm", "novm"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "the microvm backend needs SVC_MICROVM_ROOTFS (the path to the microvm rootfs image (ext4)) in svcd's environment"
        ),
        "{err}"
    );
    assert!(err.contains("it offers: container"), "{err}");
}

/// The value of `var` in the sandbox's environment.
fn guest_var(w: &World, name: &str, var: &str) -> String {
    let (code, out, err) = w.sh(name, &format!("printf %s \"${var}\""));
    assert_eq!(code, 0, "{err}");
    out
}

#[test]
fn a_fork_starts_clones_with_their_own_network_and_credentials() {
    let w = world_with_vm("src");
    let (code, _, err) = w.sh("src", "echo from-src > /root/marker && sync");
    assert_eq!(code, 0, "{err}");
    let src = w.show("src");
    let src_placeholder = guest_var(&w, "src", "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN");

    let out = w.svc(&["sandbox", "fork", "src", "c1", "c2", "--json"]);
    assert!(
        out.status.success(),
        "fork failed: {}\nsvcd:\n{}",
        String::from_utf8_lossy(&out.stderr),
        w.svcd_log()
    );
    let forked: Value = serde_json::from_slice(&out.stdout).expect("fork json");
    assert_eq!(
        forked["clones"].as_array().map(Vec::len),
        Some(2),
        "{forked}"
    );
    // The source was running: it runs again.
    assert_eq!(w.show("src")["state"], "running");
    let (code, out, _) = w.sh("src", "hostname");
    assert_eq!((code, out.trim()), (0, "src"));

    let mut seen = vec![src["guest_v4"].clone()];
    for clone in ["c1", "c2"] {
        let view = w.show(clone);
        assert_eq!(view["backend"], "microvm");
        assert!(
            !seen.contains(&view["guest_v4"]),
            "{clone} shares an address: {view}"
        );
        seen.push(view["guest_v4"].clone());
        assert_ne!(view["link"], src["link"]);
        // The source's disk and memory, its own identity and network.
        let (code, out, err) = w.sh(
            clone,
            "cat /root/marker; hostname; ip -4 -o addr show dev eth0 | awk '{print $4}'",
        );
        assert_eq!(code, 0, "{err}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.first(), Some(&"from-src"), "{out}");
        assert_eq!(lines.get(1), Some(&clone), "{out}");
        assert_eq!(
            lines.get(2).copied(),
            Some(format!("{}/30", view["guest_v4"].as_str().unwrap_or("")).as_str()),
            "{out}"
        );
        // Fresh placeholders, bound on the host to the same real credential.
        let placeholder = guest_var(&w, clone, "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN");
        assert_eq!(placeholder.len(), 64);
        assert_ne!(
            placeholder, src_placeholder,
            "{clone} shares its source's placeholder"
        );
        let (code, out, err) = w.sh(
            clone,
            "curl -sS --max-time 20 -H \"Authorization: Bearer $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" \
             https://allowed.example.test/v1/from-a-clone",
        );
        assert_eq!(code, 0, "{clone}: {err}\n{}", w.svcd_log());
        let answer: Value = serde_json::from_str(out.trim()).expect("json");
        assert_eq!(answer["credential_received"], "real", "{answer}");
        // The source's placeholder means nothing in the clone: it is not swapped there.
        let (_, out, _) = w.sh(
            clone,
            &format!(
                "curl -sS --max-time 20 -H 'Authorization: Bearer {src_placeholder}' \
                 https://allowed.example.test/v1/old-placeholder"
            ),
        );
        assert!(!out.contains("\"credential_received\":\"real\""), "{out}");
    }
    // Each VM's QEMU runs as ids of its own (svc-vm's range start + the sandbox id), and its
    // disk is its own: a QEMU a guest broke out of shares no id with another VM's.
    let subuid = std::fs::read_to_string("/etc/subuid").expect("/etc/subuid");
    let range = svc_control::runtime::ids::subordinate_range(&subuid, "svc-vm")
        .expect("svc-vm's range (cargo xtask setup --tests makes it)");
    let container = svc_control::runtime::ids::subordinate_range(&subuid, "svc-sandbox")
        .expect("svc-sandbox's range");
    let mut uids = Vec::new();
    for name in ["src", "c1", "c2"] {
        let vm = w.dir.join("state/sandboxes").join(name);
        let pid = std::fs::read_to_string(vm.join("qemu.pid")).expect("qemu.pid");
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).expect("QEMU's status");
        let ids = |key: &str| -> Vec<u32> {
            let line = status.lines().find(|l| l.starts_with(key)).expect(key);
            line.split_whitespace()
                .skip(1)
                .map(|n| n.parse().expect("id"))
                .collect()
        };
        let id = u32::try_from(w.show(name)["id"].as_u64().expect("id")).expect("u32");
        let own = range + id;
        assert_eq!(ids("Uid:"), [own; 4], "{name}'s QEMU uids");
        assert_eq!(ids("Gid:"), [own; 4], "{name}'s QEMU gids");
        assert!(
            !(container..container + 65536).contains(&own),
            "{name}'s QEMU runs in the container guests' range"
        );
        let disk = std::fs::metadata(vm.join("disk.qcow2")).expect("disk");
        assert_eq!(
            (
                std::os::unix::fs::MetadataExt::uid(&disk),
                std::os::unix::fs::MetadataExt::mode(&disk) & 0o777
            ),
            (own, 0o600),
            "{name}'s disk"
        );
        uids.push(own);
    }
    uids.sort_unstable();
    uids.dedup();
    assert_eq!(uids.len(), 3, "the VMs share a uid: {uids:?}");

    // A container cannot be forked, and says so.
    w.svc_ok(&["sandbox", "create", "box"]);
    let out = w.svc(&["sandbox", "fork", "box", "box2"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("use --backend microvm"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["c1", "c2", "src", "box"] {
        w.destroy_checked(name);
    }
    assert!(
        std::fs::read_dir(w.dir.join("state/snapshots"))
            .map(|d| d.count() == 0)
            .unwrap_or(true),
        "a snapshot was left behind"
    );
}

#[test]
fn a_vm_outlives_an_svcd_restart_and_exec_reconnects() {
    let mut w = world_with_vm("kept");
    let pid = w.show("kept")["pid"].as_u64().expect("pid");
    w.kill_svcd();
    w.start_svcd();
    assert_eq!(w.show("kept")["pid"].as_u64(), Some(pid), "the same QEMU");
    let (code, out, err) = w.sh("kept", "echo still-here");
    assert_eq!(
        (code, out.trim()),
        (0, "still-here"),
        "{err}\n{}",
        w.svcd_log()
    );
    w.destroy_checked("kept");
}

#[test]
fn the_lifecycle_canary_runs_create_pause_fork_resume_destroy() {
    require_root();
    microvm_images();
    let w = World::start();
    let out = w.svc(&["canary", "--json"]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "canary said no JSON ({e}): {}\n{}\nsvcd:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            w.svcd_log()
        )
    });
    assert!(out.status.success(), "{report:#}\nsvcd:\n{}", w.svcd_log());
    assert_eq!(report["passed"], true);
    let steps: Vec<&str> = report["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .filter_map(|s| s["step"].as_str())
        .collect();
    assert_eq!(steps, ["create", "pause", "fork", "resume", "destroy"]);
    for s in report["steps"].as_array().expect("steps") {
        assert!(s["ms"].as_f64().is_some_and(|ms| ms > 0.0), "{s}");
    }
    // Nothing of it is left.
    let list: Vec<Value> =
        serde_json::from_str(&w.svc_ok(&["sandbox", "list", "--json"])).expect("list");
    assert!(list.is_empty(), "{list:?}");

    // A canary that cannot pass says which step failed, and still cleans up: here the
    // container backend, which cannot fork.
    let out = w.svc(&["canary", "--backend", "container", "--name", "cbox"]);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("canary FAILED: fork:"), "{said}");
    let list: Vec<Value> =
        serde_json::from_str(&w.svc_ok(&["sandbox", "list", "--json"])).expect("list");
    assert!(list.is_empty(), "the failed canary left {list:?}");
}

#[test]
fn a_workspace_that_requires_microvm_gets_one_and_says_why() {
    require_root();
    microvm_images();
    let mut w = World::start();
    let ws = w.dir.join("project");
    std::fs::create_dir_all(ws.join(".svc")).expect("mkdir");
    std::fs::write(
        ws.join(".svc/workspace.json"),
        r#"{"version": 1, "runtime": {"required": ["microvm"], "selection": "prefer-first"}}"#,
    )
    .expect("workspace.json");
    let ws_arg = ws.display().to_string();
    let out = w.svc_ok(&[
        "sandbox",
        "create",
        "--workspace",
        &ws_arg,
        "--trust",
        "wsvm",
    ]);
    assert!(
        out.contains("backend:           microvm (runtime.required lists microvm first"),
        "{out}"
    );
    assert_eq!(w.show("wsvm")["backend"], "microvm");
    w.destroy_checked("wsvm");
    // The same workspace where svcd has no microvm images: refused, naming why.
    w.kill_svcd();
    w.start_svcd_with_env(&[("SVC_MICROVM_KERNEL", None)]);
    let out = w.svc(&[
        "sandbox",
        "create",
        "--workspace",
        &ws_arg,
        "--trust",
        "wsvm2",
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the workspace's runtime.required cannot be met here: microvm is not offered: the microvm backend needs SVC_MICROVM_KERNEL"),
        "{err}"
    );
}

#[test]
fn the_coding_agents_home_is_shared_live_and_read_write() {
    require_root();
    microvm_images();
    assert!(
        svc_tests::world::tool("virtiofsd").is_some(),
        "virtiofsd is missing: `cargo xtask setup --tests` installs it into target/tools"
    );
    let base = svc_tests::fresh_dir("agh");
    let home = base.join(".claude");
    std::fs::create_dir_all(&home).expect("agent home");
    std::fs::write(home.join(".credentials.json"), r#"{"token":"host-1"}"#).expect("creds");
    // A user's directory: not root's.
    for p in [&home, &home.join(".credentials.json")] {
        std::os::unix::fs::chown(p, Some(1234), Some(1234)).expect("chown");
    }
    let w = World::start_with_agent_home(&home);
    w.svc_ok(&["sandbox", "create", "--backend", "microvm", "agent"]);
    let view = w.show("agent");
    assert_eq!(
        view["live_mounts"][0],
        format!("{} -> /root/.claude", home.display()),
        "{view}"
    );
    let (code, out, err) = w.sh(
        "agent",
        "cat /root/.claude/.credentials.json; echo; stat -c %u /root/.claude/.credentials.json; \
         echo from-guest > /root/.claude/written-in-guest",
    );
    assert_eq!(code, 0, "{err}\n{}", w.svcd_log());
    assert_eq!(
        out, "{\"token\":\"host-1\"}\n0\n",
        "the guest's root sees the owner's files as its own"
    );
    let written = home.join("written-in-guest");
    assert_eq!(
        std::fs::read_to_string(&written).expect("on the host"),
        "from-guest\n"
    );
    let meta = std::fs::metadata(&written).expect("meta");
    assert_eq!(
        (
            std::os::unix::fs::MetadataExt::uid(&meta),
            std::os::unix::fs::MetadataExt::gid(&meta)
        ),
        (1234, 1234),
        "the guest's root wrote as the directory's owner, not as the host's root"
    );
    // The host refreshes the token: the guest sees it at once (live, not a copy).
    std::fs::write(home.join(".credentials.json"), r#"{"token":"host-2"}"#).expect("refresh");
    let (_, out, _) = w.sh("agent", "cat /root/.claude/.credentials.json");
    assert_eq!(out, r#"{"token":"host-2"}"#);
    // The sandbox's other paths stay its own.
    let (code, _, _) = w.sh(
        "agent",
        "test -e /root/.claude/../.claude/.credentials.json",
    );
    assert_eq!(code, 0);
    assert!(!base.join("written-elsewhere").exists());

    // A clone keeps the mount (its own virtiofsd on the same directory).
    let out = w.svc(&["sandbox", "fork", "agent", "agent2"]);
    assert!(
        out.status.success(),
        "fork with a live mount: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        w.svcd_log()
    );
    let (code, out, err) = w.sh(
        "agent2",
        "cat /root/.claude/written-in-guest && echo clone > /root/.claude/from-clone",
    );
    assert_eq!((code, out.as_str()), (0, "from-guest\n"), "{err}");
    assert_eq!(
        std::fs::read_to_string(home.join("from-clone")).expect("clone wrote"),
        "clone\n"
    );
    w.destroy_checked("agent2");
    w.destroy_checked("agent");
    let left = std::process::Command::new("pgrep")
        .args(["-f", &format!("virtiofsd.*{}", w.dir.display())])
        .output()
        .expect("pgrep");
    assert!(
        left.stdout.is_empty(),
        "virtiofsd left running: {}",
        String::from_utf8_lossy(&left.stdout)
    );
    let _ = std::fs::remove_dir_all(&base);
}

#[test]
fn the_vsock_channel_serves_exec_and_refuses_fork() {
    require_root();
    microvm_images();
    assert!(
        svc_tests::world::tool("vhost-device-vsock").is_some(),
        "vhost-device-vsock is missing: `cargo xtask setup --tests` installs it into target/tools"
    );
    let w = World::start_with_microvm("channel = \"vsock\"");
    let out = w.svc(&["sandbox", "create", "--backend", "microvm", "vs"]);
    assert!(
        out.status.success(),
        "{}\nsvcd:\n{}",
        String::from_utf8_lossy(&out.stderr),
        w.svcd_log()
    );
    // No virtio-serial port in this guest: the agent answers on vsock.
    let (code, out, err) = w.sh(
        "vs",
        "ls /sys/class/virtio-ports 2>/dev/null | wc -l; test -e /dev/vsock && echo vsock; hostname",
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "0\nvsock\nvs\n");
    let out = w.svc_env(&["sandbox", "exec", "-i", "vs", "--", "wc", "-c"], &[]);
    assert_eq!(out.status.code(), Some(0));
    let out = w.svc(&["sandbox", "fork", "vs", "vs2"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("channel is vsock"), "{err}");
    // The source still runs after the refused fork.
    let (code, out, _) = w.sh("vs", "echo alive");
    assert_eq!((code, out.as_str()), (0, "alive\n"));
    w.destroy_checked("vs");
    assert!(
        std::process::Command::new("pgrep")
            .args([
                "-f",
                &format!(
                    "{}.*vhost-device-vsock|vhost-device-vsock.*{}",
                    w.dir.display(),
                    w.dir.display()
                )
            ])
            .output()
            .expect("pgrep")
            .stdout
            .is_empty(),
        "vhost-device-vsock left running"
    );
}

#[test]
fn a_workspace_on_the_microvm_backend_runs_hooks_services_and_forwards_and_its_clones_start_again()
{
    require_root();
    microvm_images();
    let w = World::start();
    let dir = w.dir.join("vmproj");
    std::fs::create_dir_all(dir.join(".svc")).expect("project");
    std::fs::write(
        dir.join(".svc/workspace.json"),
        r#"{"version":1,
            "lifecycle":{"onSetup":["echo setup > /workspace/setup-ran"],
                         "onStart":["echo \"$(cat /proc/sys/kernel/hostname)\" >> /workspace/starts"]},
            "services":{"definitions":{"web":{"command":"cd /workspace && exec python3 -m http.server 8000 --bind 127.0.0.1",
                         "healthCheck":{"command":"curl -sf -o /dev/null http://127.0.0.1:8000/","intervalMs":200}}}},
            "spotlight":{"defaults":[{"service":"web","remotePort":8000,"localPort":18100}]}}"#,
    )
    .expect("workspace.json");
    let up = w.svc(&[
        "workspace",
        "up",
        "--trust",
        dir.to_str().expect("utf-8"),
        "--name",
        "wvm",
        "--backend",
        "microvm",
    ]);
    let out = format!(
        "{}{}",
        String::from_utf8_lossy(&up.stdout),
        String::from_utf8_lossy(&up.stderr)
    );
    assert!(up.status.success(), "{out}\nsvcd:\n{}", w.svcd_log());
    assert!(
        out.contains("✓ service web healthy")
            && out.contains("forward: 127.0.0.1:18100 -> web:8000"),
        "{out}"
    );
    // The project over virtio-fs, written as its owner (root here).
    assert_eq!(
        std::fs::read_to_string(dir.join("setup-ran")).expect("setup-ran"),
        "setup\n"
    );
    // The forward reaches the VM's own loopback through its agent.
    let get = w.host.exec(
        "curl",
        &[
            "-sS",
            "--max-time",
            "20",
            "http://127.0.0.1:18100/setup-ran",
        ],
    );
    assert_eq!(String::from_utf8_lossy(&get.stdout), "setup\n", "{get:?}");

    // A clone is a new start: onStart again (not onSetup), its own supervisor and web.
    w.svc_ok(&["sandbox", "fork", "wvm", "wvm-c"]);
    let mut ready = Vec::new();
    for _ in 0..300 {
        ready = w
            .svc_ok(&["events", "--json"])
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["kind"] == "workspace.ready" && e["sandbox"] == "wvm-c")
            .collect();
        if !ready.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        ready.len(),
        1,
        "the clone is ready once; its log:\n{}",
        w.svc_ok(&["workspace", "logs", "wvm-c"])
    );
    let starts = std::fs::read_to_string(dir.join("starts")).expect("starts");
    assert_eq!(
        starts.lines().count(),
        2,
        "onStart in the source and the clone: {starts}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("setup-ran")).expect("setup-ran"),
        "setup\n",
        "onSetup ran once"
    );
    let (rc, code, _) = w.sh(
        "wvm-c",
        "curl -sf -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/",
    );
    assert_eq!((rc, code.as_str()), (0, "200"), "the clone's web answers");
    let (_, sups, _) = w.sh("wvm-c", "pgrep -c -x svc-supervise");
    assert_eq!(sups.trim(), "1", "one supervisor in the clone");
    w.svc_ok(&["workspace", "down", "wvm-c"]);
    w.svc_ok(&["workspace", "down", "wvm"]);
}
