//! The kubelet path: Debian's containerd, started by the test with its CRI plugin on and the
//! shim registered as runtime handler `svc`, driven through its CRI socket by the tests' CRI
//! client exactly as kubelet drives it. A pod is one svc sandbox with the pod's policy (its
//! `svc.dev/*` annotations): its containers run in it, an allowed host is reached with the
//! credential swapped on the wire, another host and an IP literal are refused, exit codes
//! reach `ContainerStatus`, and stopping and removing the pod leaves no sandbox, link, fence
//! entry or mount. A pod annotated `svc.dev/backend=microvm` is the same on a VM (real QEMU,
//! TCG here): its containers run on the VM's kernel, behind the same fence, and removing the
//! pod leaves no QEMU. A pod svcd refuses fails `RunPodSandbox` with svcd's message; a backend
//! svc has no kind of fails it with the shim's, naming the annotation.

use std::time::{Duration, Instant};

use svc_control::{names::SandboxName, policy::pod};
use svc_tests::{
    containerd::{Containerd, IMAGE},
    cri::{Cri, api, pod_config, run_pod, shim_sandboxes, start, store_secret},
    require_root,
    world::{EXAMPLE_TOKEN, World, microvm_images},
};

/// The secret-store entry the pod's credential refers to, allowed for the namespace of the
/// tests' pods (`pod_config`'s `default`).
const STORED: &str = "example";
/// The namespaces [`STORED`] is allowed for.
const ALLOWED: &[&str] = &["default"];

/// Create and start container `name` running `command` in pod `pod_id`: its id.
fn run_container(
    cri: &Cri,
    pod_id: &str,
    config: &api::PodSandboxConfig,
    name: &str,
    command: &[&str],
) -> String {
    let id = cri
        .call(cri.runtime().create_container(api::CreateContainerRequest {
            pod_sandbox_id: pod_id.into(),
            config: Some(api::ContainerConfig {
                metadata: Some(api::ContainerMetadata {
                    name: name.into(),
                    attempt: 0,
                }),
                image: Some(image()),
                command: command.iter().map(|s| (*s).to_owned()).collect(),
                ..Default::default()
            }),
            sandbox_config: Some(config.clone()),
        }))
        .unwrap_or_else(|e| panic!("CreateContainer {name}: {e:?}"))
        .container_id;
    cri.call(cri.runtime().start_container(api::StartContainerRequest {
        container_id: id.clone(),
    }))
    .unwrap_or_else(|e| panic!("StartContainer {name}: {e:?}"));
    id
}

fn image() -> api::ImageSpec {
    api::ImageSpec {
        image: IMAGE.into(),
        ..Default::default()
    }
}

fn status(cri: &Cri, id: &str) -> api::ContainerStatus {
    cri.call(cri.runtime().container_status(api::ContainerStatusRequest {
        container_id: id.into(),
        verbose: false,
    }))
    .unwrap_or_else(|e| panic!("ContainerStatus {id}: {e:?}"))
    .status
    .expect("a status")
}

/// `ExecSync` of `cmd` in container `id`: (exit code, stdout, stderr).
fn exec(cri: &Cri, id: &str, cmd: &[&str]) -> (i32, String, String) {
    let r = cri
        .call(cri.runtime().exec_sync(api::ExecSyncRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
            timeout: 60,
        }))
        .unwrap_or_else(|e| panic!("ExecSync {cmd:?}: {e:?}"));
    (
        r.exit_code,
        String::from_utf8_lossy(&r.stdout).into_owned(),
        String::from_utf8_lossy(&r.stderr).into_owned(),
    )
}

/// Wait until container `id` has exited: its status.
fn exited(cri: &Cri, c: &Containerd, id: &str) -> api::ContainerStatus {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = status(cri, id);
        if s.state == i32::from(api::ContainerState::ContainerExited) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "container {id} did not exit: {s:?}\ncontainerd log:\n{}",
            c.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Container `agent` runs in the pod's sandbox `sandbox`, inside its perimeter: the allowed
/// host is reached, with the stored credential swapped in on the wire; a denied host and an
/// IP literal are refused.
fn assert_fenced(w: &World, cri: &Cri, agent: &str, sandbox: &str) {
    let (code, host, err) = exec(cri, agent, &["cat", "/proc/sys/kernel/hostname"]);
    assert_eq!((code, host.trim()), (0, sandbox), "{err}");
    let curl = |url: &str| {
        exec(
            cri,
            agent,
            &["curl", "-sS", "-o", "/dev/null", "--max-time", "20", url],
        )
    };
    let (code, _, err) = curl("https://allowed.example.test/from-cri");
    assert_eq!(code, 0, "the allowed host: {err}");
    assert_ne!(
        curl("https://forbidden.example.test/").0,
        0,
        "a denied host"
    );
    assert_ne!(curl("http://192.0.2.66/").0, 0, "an IP literal");
    let (code, _, err) = exec(
        cri,
        agent,
        &[
            "sh",
            "-c",
            "curl -sS --max-time 20 -o /dev/null -H \"Authorization: Bearer \
             $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" https://allowed.example.test/cri-secret",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        w.received_auth("/cri-secret"),
        format!("Bearer {EXAMPLE_TOKEN}"),
        "the stored credential, swapped in on the wire"
    );
}

/// The shim told containerd each step as a task event (containerd's debug log names each
/// event it forwards): the CRI plugin keeps its state from them.
fn assert_events_forwarded(c: &Containerd) {
    let log = c.log();
    for topic in [
        "create",
        "start",
        "exec-added",
        "exec-started",
        "exit",
        "delete",
    ] {
        let forwarded = format!("msg=\"event forwarded\" ns=k8s.io topic=/tasks/{topic} ");
        assert!(
            log.contains(&forwarded),
            "no /tasks/{topic} event reached containerd:\n{log}"
        );
    }
}

/// A pod of the `svc` handler and its svc sandbox.
struct Pod {
    id: String,
    config: api::PodSandboxConfig,
    /// Its svc sandbox's name and `svc sandbox show --json`.
    sandbox: String,
    show: serde_json::Value,
}

/// `RunPodSandbox` of pod `name` allowing allowed.example.test with the stored credential
/// for it, plus `extra` annotations: one svc sandbox, with that policy.
fn run_fenced_pod(w: &World, c: &Containerd, cri: &Cri, name: &str, extra: &[(&str, &str)]) -> Pod {
    let secret = format!("SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN={STORED}");
    let mut annotations = vec![
        (pod::ALLOW_HOSTS, "allowed.example.test"),
        (pod::SECRETS, secret.as_str()),
    ];
    annotations.extend_from_slice(extra);
    let config = pod_config(name, &annotations);
    let id = run_pod(cri, &config).unwrap_or_else(|e| {
        panic!(
            "RunPodSandbox: {e:?}\ncontainerd:\n{}\nsvcd:\n{}",
            c.log(),
            w.svcd_log()
        )
    });
    let names = shim_sandboxes(w);
    assert_eq!(names.len(), 1, "one sandbox for the pod: {names:?}");
    let sandbox = names[0].clone();
    let show = w.show(&sandbox);
    let allowed = show["allowed_hosts"].as_array().expect("allowed_hosts");
    assert!(
        allowed.iter().any(|h| h == "allowed.example.test"),
        "{show}"
    );
    Pod {
        id,
        config,
        sandbox,
        show,
    }
}

/// The pod's containers run in its sandbox: `agent` keeps running, fenced; `short`'s command
/// exits, and its exit code reaches ContainerStatus. `agent`'s id.
fn run_containers(w: &World, c: &Containerd, cri: &Cri, pod: &Pod) -> String {
    let agent = run_container(cri, &pod.id, &pod.config, "agent", &["sleep", "1000"]);
    let st = status(cri, &agent);
    assert_eq!(
        st.state,
        i32::from(api::ContainerState::ContainerRunning),
        "{st:?}"
    );
    assert_fenced(w, cri, &agent, &pod.sandbox);

    let short = run_container(cri, &pod.id, &pod.config, "short", &["sh", "-c", "exit 7"]);
    let st = exited(cri, c, &short);
    assert_eq!(st.exit_code, 7, "{st:?}");
    assert_eq!(
        shim_sandboxes(w),
        [pod.sandbox.as_str()],
        "still one sandbox"
    );
    agent
}

/// `StopPodSandbox` and `RemovePodSandbox`: nothing of its sandbox is left (no sandbox, link,
/// fence entry, init or VM monitor, mount), and the CRI plugin has no pod.
fn remove_pod(w: &World, c: &Containerd, cri: &Cri, pod: &Pod) {
    let s = &pod.show;
    let num = |k: &str| s[k].as_u64().and_then(|n| u32::try_from(n).ok()).expect(k);
    let (id, pid) = (num("id"), num("pid"));
    let link = s["link"].as_str().unwrap_or_default().to_owned();
    cri.call(cri.runtime().stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: pod.id.clone(),
    }))
    .unwrap_or_else(|e| panic!("StopPodSandbox: {e:?}\n{}", c.log()));
    cri.call(
        cri.runtime()
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: pod.id.clone(),
            }),
    )
    .unwrap_or_else(|e| panic!("RemovePodSandbox: {e:?}\n{}", c.log()));
    w.assert_gone(id, &link, pid, &pod.sandbox);
    assert_eq!(shim_sandboxes(w), Vec::<String>::new());
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&pod.id),
        "a mount of the pod is left:\n{mounts}"
    );
    let left = cri
        .call(
            cri.runtime()
                .list_pod_sandbox(api::ListPodSandboxRequest::default()),
        )
        .unwrap_or_else(|e| panic!("ListPodSandbox: {e:?}"));
    assert!(left.items.is_empty(), "{:?}", left.items);
}

#[test]
fn a_pod_through_cri_is_one_fenced_sandbox_and_leaves_nothing() {
    require_root();
    let w = World::start();
    store_secret(&w, STORED, EXAMPLE_TOKEN, ALLOWED);
    let (c, cri) = start(&w);

    let v = cri
        .call(cri.runtime().version(api::VersionRequest {
            version: "v1".into(),
        }))
        .unwrap_or_else(|e| panic!("Version: {e:?}\n{}", c.log()));
    assert_eq!(
        (v.runtime_name.as_str(), v.runtime_api_version.as_str()),
        ("containerd", "v1"),
        "{v:?}"
    );
    // containerd 1.6's PullImage always resolves the reference at the image's registry, even
    // for an image it has (for this one: `failed to resolve reference "svc.test/base:1"`):
    // offline, the imported image is looked up with ImageStatus instead.
    let img = cri
        .call(cri.images().image_status(api::ImageStatusRequest {
            image: Some(image()),
            verbose: false,
        }))
        .unwrap_or_else(|e| panic!("ImageStatus: {e:?}"));
    let img = img
        .image
        .expect("the imported image is known to the CRI plugin");
    assert!(
        img.repo_tags.iter().any(|t| t == IMAGE),
        "{:?}",
        img.repo_tags
    );

    let pod = run_fenced_pod(&w, &c, &cri, "agent", &[]);
    assert_eq!(pod.show["backend"], "container", "{}", pod.show);
    let agent = run_containers(&w, &c, &cri, &pod);

    // Stopping the running container ends it (TaskExit reaches the CRI plugin).
    cri.call(cri.runtime().stop_container(api::StopContainerRequest {
        container_id: agent.clone(),
        timeout: 10,
    }))
    .unwrap_or_else(|e| panic!("StopContainer: {e:?}"));
    let st = exited(&cri, &c, &agent);
    assert_ne!(st.exit_code, 0, "stopped by a signal: {st:?}");

    remove_pod(&w, &c, &cri, &pod);
    assert_events_forwarded(&c);
}

#[test]
fn a_microvm_pod_through_cri_is_one_fenced_vm_and_leaves_nothing() {
    require_root();
    microvm_images();
    let w = World::start();
    store_secret(&w, STORED, EXAMPLE_TOKEN, ALLOWED);
    let (c, cri) = start(&w);

    let pod = run_fenced_pod(&w, &c, &cri, "vm-agent", &[(pod::BACKEND, "microvm")]);
    assert_eq!(pod.show["backend"], "microvm", "{}", pod.show);
    assert_eq!(pod.show["state"], "running", "{}", pod.show);
    let qemu = std::fs::read_to_string(
        w.dir
            .join("state/sandboxes")
            .join(&pod.sandbox)
            .join("qemu.pid"),
    )
    .expect("the VM's qemu.pid");
    let qemu = qemu.trim().to_owned();

    let agent = run_containers(&w, &c, &cri, &pod);
    // Its containers run on the VM's kernel, not the host's.
    let (code, kernel, err) = exec(&cri, &agent, &["uname", "-r"]);
    assert_eq!(code, 0, "{err}");
    let host_kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    assert_ne!(
        kernel.trim(),
        host_kernel.trim(),
        "the pod runs the host's kernel"
    );

    // The pod goes with its running container: its VM with it.
    remove_pod(&w, &c, &cri, &pod);
    let comm = std::fs::read_to_string(format!("/proc/{qemu}/comm")).unwrap_or_default();
    assert!(
        !comm.starts_with("qemu"),
        "the pod's QEMU (pid {qemu}) is still running"
    );
}

#[test]
fn a_pod_svc_refuses_fails_run_pod_sandbox_with_the_reason() {
    require_root();
    let w = World::start();
    store_secret(&w, STORED, EXAMPLE_TOKEN, ALLOWED);
    let (c, cri) = start(&w);

    // The code host's token without a repository: svcd's creation rules refuse it. The
    // message expected is svcd's own, for the request these annotations make.
    let secret = format!("CODE_HOST_TOKEN={STORED}");
    let annotations = [(pod::SECRETS, secret.as_str())];
    let req = pod::request_from_annotations(
        SandboxName::new("refused").expect("name"),
        &annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
    .expect("a request");
    let (code, body) = w.api(
        &[],
        "POST",
        "/v1/sandboxes",
        Some(&serde_json::to_vec(&req).expect("json")),
    );
    assert!((400..500).contains(&code), "svcd refuses it: {code} {body}");
    let svcd_says: serde_json::Value = serde_json::from_str(&body).expect("error json");
    let svcd_says = svcd_says["error"].as_str().expect("a message").to_owned();
    assert!(svcd_says.contains("CODE_HOST_TOKEN"), "{svcd_says}");
    let e = run_pod(&cri, &pod_config("no-repo", &annotations)).expect_err("refused");
    assert!(
        e.message().contains(&svcd_says),
        "RunPodSandbox's error carries svcd's message {svcd_says:?}: {e:?}"
    );

    // A backend svc has no kind of: refused by the shim, naming the annotation.
    let e = run_pod(&cri, &pod_config("vm", &[(pod::BACKEND, "gvisor")])).expect_err("refused");
    // (containerd quotes the shim's message, escaping its quotes.)
    let said = e.message().replace("\\\"", "\"");
    assert!(
        said.contains("pod annotation svc.dev/backend: \"gvisor\" is no backend; expected container or microvm"),
        "{e:?}"
    );

    // Nothing is left of either.
    assert_eq!(shim_sandboxes(&w), Vec::<String>::new());
    let left = cri
        .call(
            cri.runtime()
                .list_pod_sandbox(api::ListPodSandboxRequest::default()),
        )
        .unwrap_or_else(|e| panic!("ListPodSandbox: {e:?}"));
    assert!(left.items.is_empty(), "{:?}\n{}", left.items, c.log());
}
