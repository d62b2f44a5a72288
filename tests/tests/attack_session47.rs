//! Issue 32's Kubernetes path attacked as it stands: containerd's CRI (kubelet's calls), the
//! shim `containerd-shim-svc-v1` and a real svcd, from a hostile pod author's side (what the
//! CRI lets a pod's spec ask for) and from inside a pod's containers.
//!
//! - A privileged pod (host PID, IPC and network namespaces, a sysctl) whose container is
//!   privileged, adds `CAP_SYS_ADMIN`, asks seccomp unconfined, binds the node's `/`, the
//!   world's directory (svcd's socket, the secret store) and `/dev/kmsg` in, and annotates
//!   itself `svc.dev/allow-hosts` for a denied host: none of it is granted (no node path in the
//!   container, the sandbox's namespaces, seccomp on, no `CAP_SYS_ADMIN`) and the pod's
//!   perimeter is the pod's annotations' alone.
//! - FOUND: a container asking for a read-only root file system (`readOnlyRootFilesystem`, a
//!   hardening the restricted Pod Security Standard's users rely on) ran on a writable root,
//!   silently. Fixed: refused at `CreateContainer`, naming it (`policy::pod::container_root`).
//! - FOUND: a daemon a pod container left behind (`setsid`, from its process and from an
//!   `ExecSync`) ran on in the pod's sandbox after `RemoveContainer`, on a tree taken away and
//!   out of kubelet's sight. Fixed on both backends: svcd's detach of the container's root
//!   (the container backend), the agent's unbinding of its tree (the microvm backend), kills
//!   every process of the guest rooted on its tree first (`svc_guest::procs`).
//! - A process spec with a NUL in an argument or an environment variable, a 1 MiB variable, a
//!   working directory through `/proc/1/root`: refused or harmless; svcd and the pod live on.
//! - Containers created and started while their pod is stopped: nothing of the pod is left.

use svc_control::policy::pod;
use svc_tests::{
    containerd::{Containerd, IMAGE},
    cri::{Cri, api},
    pods::{
        self, ALLOWED, Pod, STORED, assert_fenced, exec, pod_config, remove_container, remove_pod,
        run_container, run_fenced_pod, run_pod, shim_sandboxes, start,
    },
    require_root,
    world::{EXAMPLE_TOKEN, World, microvm_images},
};

/// containerd with CRI on and a fenced pod (allowed.example.test, its stored credential);
/// `privileged`: the pod asks the node's PID and IPC namespaces, a sysctl and privileges too.
fn fenced_pod(w: &World, privileged: bool) -> (Containerd, Cri, Pod) {
    if !privileged {
        return fenced_pod_with(w, &[]);
    }
    w.store_secret(STORED, EXAMPLE_TOKEN, ALLOWED);
    let (c, cri) = start(w);
    let secret = format!("SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN={STORED}");
    let mut config = pod_config(
        "hostile",
        &[
            (pod::ALLOW_HOSTS, "allowed.example.test"),
            (pod::SECRETS, secret.as_str()),
        ],
    );
    let linux = config.linux.get_or_insert_default();
    linux
        .sysctls
        .insert("net.ipv4.ip_forward".into(), "1".into());
    let sc = linux.security_context.get_or_insert_default();
    sc.privileged = true;
    let ns = sc.namespace_options.get_or_insert_default();
    ns.pid = api::NamespaceMode::Node.into();
    ns.ipc = api::NamespaceMode::Node.into();
    let id = run_pod(&cri, &config)
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e:?}\n{}\n{}", c.log(), w.svcd_log()));
    let names = shim_sandboxes(w);
    assert_eq!(names.len(), 1, "one sandbox for the pod: {names:?}");
    let show = w.show(&names[0]);
    let pod = Pod {
        id,
        config,
        sandbox: names[0].clone(),
        show,
    };
    (c, cri, pod)
}

/// containerd with CRI on and a fenced pod with `annotations` too (the backend it asks for).
fn fenced_pod_with(w: &World, annotations: &[(&str, &str)]) -> (Containerd, Cri, Pod) {
    w.store_secret(STORED, EXAMPLE_TOKEN, ALLOWED);
    let (c, cri) = start(w);
    let pod = run_fenced_pod(w, &c, &cri, "hostile", annotations);
    (c, cri, pod)
}

/// `CreateContainer` and `StartContainer` of `config` in `pod`: its id, or the refusal.
fn create_start(
    cri: &Cri,
    pod: &Pod,
    config: api::ContainerConfig,
) -> Result<String, tonic::Status> {
    pods::create_start(cri, &pod.id, &pod.config, config)
}

/// A container of the base image named `name` running `command`.
fn container(name: &str, command: &[&str]) -> api::ContainerConfig {
    pods::container_config(name, IMAGE, command)
}

/// The namespace link `/proc/self/ns/<kind>` of the test (the node's).
fn node_ns(kind: &str) -> String {
    std::fs::read_link(format!("/proc/self/ns/{kind}"))
        .expect("ns link")
        .display()
        .to_string()
}

#[test]
fn a_privileged_pods_host_mounts_namespaces_devices_and_capabilities_are_not_granted() {
    require_root();
    let w = World::start();
    let marker = w.dir.join("node-marker");
    std::fs::write(&marker, "the node's file").expect("marker");
    let (c, cri, pod) = fenced_pod(&w, true);
    let bind = |container: &str, host: &std::path::Path| api::Mount {
        container_path: container.into(),
        host_path: host.display().to_string(),
        ..Default::default()
    };
    let socket_dir = w.socket.parent().expect("socket dir").to_path_buf();
    let mut config = container("priv", &["sleep", "1000"]);
    config.mounts = vec![
        bind("/node", std::path::Path::new("/")),
        bind("/world", &w.dir),
        bind("/svcd", &socket_dir),
    ];
    config.devices = vec![api::Device {
        container_path: "/dev/node-kmsg".into(),
        host_path: "/dev/kmsg".into(),
        permissions: "rwm".into(),
    }];
    // A container's own svc.dev annotations (containerd passes them: `container_annotations`)
    // are no pod's policy.
    config.annotations = [
        (
            pod::ALLOW_HOSTS.to_owned(),
            "forbidden.example.test".to_owned(),
        ),
        (pod::BACKEND.to_owned(), "microvm".to_owned()),
    ]
    .into();
    config.linux = Some(api::LinuxContainerConfig {
        security_context: Some(api::LinuxContainerSecurityContext {
            privileged: true,
            capabilities: Some(api::Capability {
                add_capabilities: vec!["SYS_ADMIN".into(), "NET_ADMIN".into()],
                ..Default::default()
            }),
            seccomp: Some(api::SecurityProfile {
                profile_type: api::security_profile::ProfileType::Unconfined.into(),
                ..Default::default()
            }),
            namespace_options: Some(api::NamespaceOption {
                network: api::NamespaceMode::Node.into(),
                pid: api::NamespaceMode::Node.into(),
                ipc: api::NamespaceMode::Node.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = match create_start(&cri, &pod, config) {
        // Refused, saying why: nothing ran.
        Err(e) => {
            assert!(
                e.message().contains("privileged"),
                "refused, not saying why: {e:?}"
            );
            remove_pod(&w, &c, &cri, &pod);
            return;
        }
        Ok(id) => id,
    };
    let sh = |script: &str| exec(&cri, &id, &["sh", "-c", script]);
    // No node path is bound in: not the node's root, the world's files, svcd's socket.
    for path in [
        "/node/etc/hostname",
        "/world/node-marker",
        "/svcd",
        "/dev/node-kmsg",
    ] {
        let (code, out, _) = sh(&format!("ls -d {path} 2>/dev/null; cat {path} 2>/dev/null"));
        assert!(
            code != 0 || out.trim().is_empty(),
            "{path} is reachable in the container: {out}"
        );
    }
    let (_, out, _) = sh("grep -r 'the node' /node /world 2>/dev/null | head -1");
    assert!(out.trim().is_empty(), "the node's file, read: {out}");
    // The sandbox's namespaces, not the node's.
    for kind in ["pid", "ipc", "net", "mnt", "uts", "user"] {
        let (code, out, err) = sh(&format!("readlink /proc/self/ns/{kind}"));
        assert_eq!(code, 0, "{err}");
        assert_ne!(out.trim(), node_ns(kind), "the node's {kind} namespace");
    }
    // seccomp is on and CAP_SYS_ADMIN (21) and CAP_NET_ADMIN (12) are not held.
    let (code, status, err) = sh("cat /proc/self/status");
    assert_eq!(code, 0, "{err}");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{name} in {status}"))
            .to_owned()
    };
    assert_eq!(field("Seccomp:"), "2", "seccomp filtering: {status}");
    let eff = u64::from_str_radix(&field("CapEff:"), 16).expect("CapEff");
    assert_eq!(eff & (1 << 21), 0, "CAP_SYS_ADMIN held: {eff:x}");
    assert_eq!(eff & (1 << 12), 0, "CAP_NET_ADMIN held: {eff:x}");
    let (code, _, _) = sh("head -c 1 /dev/kmsg >/dev/null 2>&1");
    assert_ne!(code, 0, "the kernel's log is readable");
    // The pod's perimeter, whatever the container annotated: forbidden.example.test refused.
    assert_fenced(&w, &cri, &id, &pod.sandbox);
    assert_eq!(w.show(&pod.sandbox)["backend"], "container");
    remove_container(&cri, &id);
    remove_pod(&w, &c, &cri, &pod);
}

#[test]
fn a_container_asking_a_read_only_root_never_runs_on_a_writable_one() {
    require_root();
    let w = World::start();
    let (c, cri, pod) = fenced_pod(&w, false);
    let mut config = container("ro", &["sleep", "1000"]);
    config.linux = Some(api::LinuxContainerConfig {
        security_context: Some(api::LinuxContainerSecurityContext {
            readonly_rootfs: true,
            ..Default::default()
        }),
        ..Default::default()
    });
    match create_start(&cri, &pod, config) {
        Err(e) => assert!(
            e.message().contains("read-only root file system"),
            "refused, but not saying why: {e:?}"
        ),
        Ok(id) => {
            let (code, _, _) = exec(&cri, &id, &["sh", "-c", "echo x > /written"]);
            let (_, seen, _) = exec(&cri, &id, &["sh", "-c", "cat /written 2>/dev/null"]);
            assert!(
                code != 0 && seen.trim().is_empty(),
                "readOnlyRootFilesystem asked, and the container wrote its root"
            );
            remove_container(&cri, &id);
        }
    }
    // The pod goes on: a container without it runs.
    let id = run_container(&cri, &pod.id, &pod.config, "rw", &["sleep", "1000"]);
    assert_eq!(exec(&cri, &id, &["sh", "-c", "echo x > /written"]).0, 0);
    remove_container(&cri, &id);
    remove_pod(&w, &c, &cri, &pod);
}

/// Processes in the pod's sandbox (as its guest's root sees them) whose command line holds
/// `needle`. (The loop's status is its last body's: a last process with no command line, a
/// kernel thread or one that just ended, must not fail it.)
fn running(w: &World, sandbox: &str, needle: &str) -> Vec<String> {
    let (code, out, err) = w.sh(
        sandbox,
        "for p in /proc/[0-9]*; do c=$(tr '\\0' ' ' < $p/cmdline 2>/dev/null); \
         if [ -n \"$c\" ]; then echo \"${p#/proc/} $c\"; fi; done",
    );
    assert_eq!(code, 0, "{err}");
    out.lines()
        .filter(|l| l.contains(needle) && !l.contains("/proc/"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_daemon_a_pod_container_leaves_behind_ends_with_its_removal() {
    require_root();
    daemons_end_with_their_container(&[]);
}

#[test]
fn a_daemon_a_microvm_pod_container_leaves_behind_ends_with_its_removal() {
    require_root();
    microvm_images();
    daemons_end_with_their_container(&[(pod::BACKEND, "microvm")]);
}

/// A container of a pod with `annotations` (its backend) whose process and exec each leave a
/// daemon in a session of its own: both end with `RemoveContainer`; another container of the
/// pod (its tree on the same share in a VM) and a process of the host live on, the pod goes on.
fn daemons_end_with_their_container(annotations: &[(&str, &str)]) {
    let w = World::start();
    let (c, cri, pod) = fenced_pod_with(&w, annotations);
    let mut host = std::process::Command::new("sleep")
        .arg("4244")
        .spawn()
        .expect("a host process");
    let stayer = run_container(&cri, &pod.id, &pod.config, "stayer", &["sleep", "4243"]);
    // Its process and an exec each start a daemon in a session of its own.
    let id = run_container(
        &cri,
        &pod.id,
        &pod.config,
        "leaver",
        &[
            "sh",
            "-c",
            "setsid sleep 4241 </dev/null >/dev/null 2>&1 & exec sleep 1000",
        ],
    );
    let (code, _, err) = exec(
        &cri,
        &id,
        &["sh", "-c", "setsid sleep 4242 </dev/null >/dev/null 2>&1 &"],
    );
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(std::time::Duration::from_millis(500));
    for needle in ["sleep 4241", "sleep 4242"] {
        assert!(
            !running(&w, &pod.sandbox, needle).is_empty(),
            "{needle} did not start"
        );
    }
    remove_container(&cri, &id);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let left = loop {
        let left: Vec<String> = ["sleep 4241", "sleep 4242"]
            .iter()
            .flat_map(|n| running(&w, &pod.sandbox, n))
            .collect();
        if left.is_empty() || std::time::Instant::now() > deadline {
            break left;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert!(
        left.is_empty(),
        "the removed container's daemons run on in the pod's sandbox: {left:?}\n{}",
        w.svcd_log()
    );
    assert_eq!(
        running(&w, &pod.sandbox, "sleep 4243").len(),
        1,
        "another container's process ended with the removal\n{}",
        w.svcd_log()
    );
    assert_eq!(exec(&cri, &stayer, &["true"]).0, 0, "the other container");
    let host_alive = host.try_wait().expect("the host process").is_none();
    let _ = host.kill();
    let _ = host.wait();
    assert!(host_alive, "a host process ended with the removal");
    remove_container(&cri, &stayer);
    // The pod goes on: its guest and a new container of it.
    let id = run_container(&cri, &pod.id, &pod.config, "after", &["sleep", "1000"]);
    assert_eq!(exec(&cri, &id, &["true"]).0, 0);
    remove_container(&cri, &id);
    remove_pod(&w, &c, &cri, &pod);
}

/// A pod author's process spec with bytes no process takes (a NUL in an argument, an
/// environment variable's name or value), a working directory that is relative or leaves the
/// tree through `/proc`, a 1 MiB variable: each is refused or runs harmlessly; svcd, the
/// guest's init and the pod live on, and a plain container of the pod still runs fenced.
#[test]
fn a_process_spec_with_bytes_no_process_takes_harms_neither_svcd_nor_the_pod() {
    require_root();
    let w = World::start();
    let (c, cri, pod) = fenced_pod(&w, false);
    let kv = |k: &str, v: &str| api::KeyValue {
        key: k.into(),
        value: v.into(),
    };
    let big = "x".repeat(1 << 20);
    let cases: Vec<(&str, api::ContainerConfig)> = vec![
        ("nul-arg", container("nul-arg", &["sleep", "10\u{0}00"])),
        ("nul-env-value", {
            let mut k = container("nul-env-value", &["sleep", "1000"]);
            k.envs = vec![kv("A", "x\u{0}y")];
            k
        }),
        ("nul-env-name", {
            let mut k = container("nul-env-name", &["sleep", "1000"]);
            k.envs = vec![kv("A\u{0}B", "y")];
            k
        }),
        ("big-env", {
            let mut k = container("big-env", &["sleep", "1000"]);
            k.envs = vec![kv("BIG", &big)];
            k
        }),
        ("proc-cwd", {
            let mut k = container(
                "proc-cwd",
                &["sh", "-c", "ls /etc/svc-guest* >&2; sleep 1000"],
            );
            k.working_dir = "/proc/1/root".into();
            k
        }),
    ];
    for (what, config) in cases {
        let outcome = create_start(&cri, &pod, config);
        eprintln!("{what}: {outcome:?}");
        if what.starts_with("nul-") {
            // A string cut at its NUL would run something else: refused, naming it.
            let refusal = outcome.expect_err("a NUL no process takes is refused");
            assert!(
                refusal.message().contains("NUL byte")
                    || refusal.message().contains("environment variable name"),
                "{what}: {refusal:?}\ncontainerd log:\n{}\nsvcd log:\n{}",
                c.log(),
                w.svcd_log()
            );
        } else if let Ok(id) = &outcome {
            // Its command may have ended already (then containerd stops its execs).
            match pods::try_exec(&cri, id, &["sh", "-c", "cd /proc/1/root 2>&1 && ls"]) {
                Ok((_, root, _)) => eprintln!("{what}: /proc/1/root seen as: {root}"),
                Err(e) => {
                    let state = pods::status(&cri, id).state;
                    assert_eq!(
                        state,
                        i32::from(api::ContainerState::ContainerExited),
                        "{what}: an exec failed in a running container: {e:?}"
                    );
                }
            }
            remove_container(&cri, id);
        }
        w.svc_ok(&["sandbox", "list"]);
        let (code, _, err) = w.sh(&pod.sandbox, "true");
        assert_eq!(
            code,
            0,
            "after {what}: the pod's guest: {err}\n{}",
            w.svcd_log()
        );
    }
    let id = run_container(&cri, &pod.id, &pod.config, "plain", &["sleep", "1000"]);
    assert_fenced(&w, &cri, &id, &pod.sandbox);
    remove_container(&cri, &id);
    remove_pod(&w, &c, &cri, &pod);
}

/// A pod stopped while six of its containers are being created and started (each leaving
/// a daemon): whichever calls win, once the pod is removed nothing of it is left — no
/// sandbox, link, fence entry, init, mount or state of any container's tree.
#[test]
fn containers_created_while_their_pod_stops_leave_nothing() {
    require_root();
    let w = World::start();
    let (c, cri, pod) = fenced_pod(&w, false);
    let outcomes: Vec<String> = std::thread::scope(|s| {
        let made: Vec<_> = (0..6)
            .map(|i| {
                let (cri, pod) = (&cri, &pod);
                s.spawn(move || {
                    let name = format!("racer{i}");
                    let script = "setsid sleep 4343 </dev/null >/dev/null 2>&1 & exec sleep 1000";
                    let config = container(&name, &["sh", "-c", script]);
                    format!("{name}: {:?}", create_start(cri, pod, config).map(drop))
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(60));
        cri.call(cri.runtime().stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        }))
        .unwrap_or_else(|e| panic!("StopPodSandbox: {e:?}\n{}", c.log()));
        made.into_iter()
            .map(|t| t.join().expect("a creating thread"))
            .collect()
    });
    eprintln!("{outcomes:#?}");
    remove_pod(&w, &c, &cri, &pod);
    // (`434[3]`: the pattern does not match this shell's own command line.)
    let left = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "pgrep -af 'sleep 434[3]'; grep -F '{}' /proc/self/mountinfo",
            pod.sandbox
        ))
        .output()
        .expect("sh");
    let left = String::from_utf8_lossy(&left.stdout);
    assert!(left.trim().is_empty(), "left of the pod:\n{left}");
}
