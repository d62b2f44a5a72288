//! What a pod container's `securityContext` asks to give up, it has given up, on both backends:
//! `capabilities.drop: [ALL]` and `allowPrivilegeEscalation: false` reach the shim as the OCI
//! process's capability sets and `noNewPrivileges`, svcd grants them (`policy::exec_caps`) and
//! the guest lowers the container's process and its execs to them (`svc_guest::caps`). A
//! container asking nothing keeps what it had.

use svc_control::policy::pod;
use svc_tests::{
    containerd::IMAGE,
    cri::{Cri, api},
    pods::{
        self, ALLOWED, Pod, STORED, exec, remove_container, remove_pod, run_container,
        run_fenced_pod, start,
    },
    require_root,
    world::{EXAMPLE_TOKEN, World, microvm_images},
};

#[test]
fn a_restricted_container_keeps_no_capability_and_gains_no_privilege() {
    require_root();
    restricted_and_default_containers(&[]);
}

#[test]
fn a_restricted_microvm_container_keeps_no_capability_and_gains_no_privilege() {
    require_root();
    microvm_images();
    restricted_and_default_containers(&[(pod::BACKEND, "microvm")]);
}

/// The fields of `/proc/self/status` a test reads, as the container's process wrote them at
/// its start (its status file, in its root).
const STATUS_AT_START: &str = "grep -E '^(CapEff|CapPrm|CapBnd|CapAmb|NoNewPrivs)' /proc/self/status > /status; \
     exec sleep 1000";

/// In a pod with `annotations` (its backend): a container with `drop: [ALL]` and
/// `allowPrivilegeEscalation: false` shows no capability and `NoNewPrivs: 1`, in its process
/// and in an exec, and can neither chown nor mknod; a container asking nothing still chowns.
fn restricted_and_default_containers(annotations: &[(&str, &str)]) {
    let w = World::start();
    w.store_secret(STORED, EXAMPLE_TOKEN, ALLOWED);
    let (c, cri) = start(&w);
    let pod = run_fenced_pod(&w, &c, &cri, "restricted", annotations);
    let mut config = pods::container_config("restricted", IMAGE, &["sh", "-c", STATUS_AT_START]);
    config.linux = Some(api::LinuxContainerConfig {
        security_context: Some(api::LinuxContainerSecurityContext {
            capabilities: Some(api::Capability {
                drop_capabilities: vec!["ALL".into()],
                ..Default::default()
            }),
            no_new_privs: true,
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = pods::create_start(&cri, &pod.id, &pod.config, config)
        .unwrap_or_else(|e| panic!("a restricted container: {e:?}\n{}", w.svcd_log()));
    // The process writes its status as it starts: wait for it.
    let at_start = read_status(
        &cri,
        &id,
        "for i in $(seq 100); do [ -s /status ] && break; sleep 0.1; done; cat /status",
    );
    let in_exec = read_status(&cri, &id, "cat /proc/self/status");
    for (whose, status) in [("its process", &at_start), ("an exec", &in_exec)] {
        for cap in ["CapEff:", "CapPrm:", "CapBnd:", "CapAmb:"] {
            assert_eq!(field(status, cap), 0, "{whose}: {cap} in\n{status}");
        }
        assert_eq!(field(status, "NoNewPrivs:"), 1, "{whose}:\n{status}");
    }
    let (code, _, err) = exec(&cri, &id, &["sh", "-c", "touch /tmp/f && chown 1:1 /tmp/f"]);
    assert_ne!(code, 0, "a container without CAP_CHOWN chowned a file");
    assert!(err.contains("Operation not permitted"), "{err}");
    let (code, _, _) = exec(&cri, &id, &["mknod", "/tmp/null", "c", "1", "3"]);
    assert_ne!(code, 0, "a container without CAP_MKNOD made a device");
    remove_container(&cri, &id);
    assert_default_unchanged(&w, &cri, &pod);
    remove_pod(&w, &c, &cri, &pod);
}

/// A container of `pod` asking nothing of its capabilities keeps the sandbox's (CAP_CHOWN
/// among them) and chowns.
fn assert_default_unchanged(w: &World, cri: &Cri, pod: &Pod) {
    let id = run_container(cri, &pod.id, &pod.config, "default", &["sleep", "1000"]);
    let status = read_status(cri, &id, "cat /proc/self/status");
    assert_ne!(
        field(&status, "CapEff:") & 1,
        0,
        "CAP_CHOWN lost:\n{status}"
    );
    let (code, _, err) = exec(cri, &id, &["sh", "-c", "touch /tmp/f && chown 1:1 /tmp/f"]);
    assert_eq!(
        code,
        0,
        "a default container cannot chown: {err}\n{}",
        w.svcd_log()
    );
    remove_container(cri, &id);
}

/// What `script` prints in container `id` (it must succeed).
fn read_status(cri: &Cri, id: &str, script: &str) -> String {
    let (code, out, err) = exec(cri, id, &["sh", "-c", script]);
    assert_eq!(code, 0, "{script}: {err}");
    out
}

/// The number of `/proc/self/status` field `name` (the capability sets in hexadecimal).
fn field(status: &str, name: &str) -> u64 {
    let value = status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .map(str::trim)
        .unwrap_or_else(|| panic!("{name} in\n{status}"));
    u64::from_str_radix(value, 16).unwrap_or_else(|e| panic!("{name} {value}: {e}"))
}
