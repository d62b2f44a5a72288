//! What the CRI tests share: containerd with its CRI plugin and the base image imported, pods
//! of the `svc` handler in the node's network namespace, containers made and started as kubelet
//! does, `ExecSync`, and the checks that a pod's container is inside its sandbox's perimeter.

use std::time::{Duration, Instant};

use svc_control::policy::pod;

pub use crate::cri::{pod_config, pod_config_in, run_pod, shim_sandboxes, start};
use crate::{
    containerd::{Containerd, IMAGE},
    cri::{Cri, api},
    world::{EXAMPLE_TOKEN, World},
};

/// The secret-store entry the pods' credential refers to, allowed for the namespace of the
/// tests' pods ([`pod_config`]'s `default`).
pub const STORED: &str = "example";
/// The namespaces [`STORED`] is allowed for.
pub const ALLOWED: &[&str] = &["default"];

/// Create and start container `name` running `command` in pod `pod_id`: its id.
pub fn run_container(
    cri: &Cri,
    pod_id: &str,
    config: &api::PodSandboxConfig,
    name: &str,
    command: &[&str],
) -> String {
    try_run_container(cri, pod_id, config, name, IMAGE, command)
        .unwrap_or_else(|e| panic!("CreateContainer/StartContainer {name}: {e:?}"))
}

/// Create and start container `name` of `image` running `command` in pod `pod_id`: its id,
/// or the CRI's refusal.
pub fn try_run_container(
    cri: &Cri,
    pod_id: &str,
    config: &api::PodSandboxConfig,
    name: &str,
    image: &str,
    command: &[&str],
) -> Result<String, tonic::Status> {
    create_start(cri, pod_id, config, container_config(name, image, command))
}

/// A container named `name` of `image` running `command`, as kubelet asks for it.
pub fn container_config(name: &str, image: &str, command: &[&str]) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    }
}

/// `CreateContainer` of `container` in pod `pod_id` (made of `config`) and `StartContainer`:
/// its id, or the CRI's refusal.
pub fn create_start(
    cri: &Cri,
    pod_id: &str,
    config: &api::PodSandboxConfig,
    container: api::ContainerConfig,
) -> Result<String, tonic::Status> {
    let id = cri
        .call(cri.runtime().create_container(api::CreateContainerRequest {
            pod_sandbox_id: pod_id.into(),
            config: Some(container),
            sandbox_config: Some(config.clone()),
        }))?
        .container_id;
    cri.call(cri.runtime().start_container(api::StartContainerRequest {
        container_id: id.clone(),
    }))?;
    Ok(id)
}

/// `StopContainer` of container `id`, given `timeout` seconds before it is killed.
pub fn stop_container(cri: &Cri, id: &str, timeout: i64) {
    cri.call(cri.runtime().stop_container(api::StopContainerRequest {
        container_id: id.into(),
        timeout,
    }))
    .unwrap_or_else(|e| panic!("StopContainer {id}: {e:?}"));
}

/// Stop and remove container `id` through the CRI.
pub fn remove_container(cri: &Cri, id: &str) {
    stop_container(cri, id, 5);
    cri.call(cri.runtime().remove_container(api::RemoveContainerRequest {
        container_id: id.into(),
    }))
    .unwrap_or_else(|e| panic!("RemoveContainer {id}: {e:?}"));
}

pub fn status(cri: &Cri, id: &str) -> api::ContainerStatus {
    cri.call(cri.runtime().container_status(api::ContainerStatusRequest {
        container_id: id.into(),
        verbose: false,
    }))
    .unwrap_or_else(|e| panic!("ContainerStatus {id}: {e:?}"))
    .status
    .expect("a status")
}

/// `ExecSync` of `cmd` in container `id`: (exit code, stdout, stderr).
pub fn exec(cri: &Cri, id: &str, cmd: &[&str]) -> (i32, String, String) {
    try_exec(cri, id, cmd).unwrap_or_else(|e| panic!("ExecSync {cmd:?}: {e:?}"))
}

/// `ExecSync` of `cmd` in container `id`: (exit code, stdout, stderr), or the CRI's refusal.
pub fn try_exec(cri: &Cri, id: &str, cmd: &[&str]) -> Result<(i32, String, String), tonic::Status> {
    let r = cri.call(cri.runtime().exec_sync(api::ExecSyncRequest {
        container_id: id.into(),
        cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
        timeout: 60,
    }))?;
    Ok((
        r.exit_code,
        String::from_utf8_lossy(&r.stdout).into_owned(),
        String::from_utf8_lossy(&r.stderr).into_owned(),
    ))
}

/// Wait until container `id` has exited: its status.
pub fn exited(cri: &Cri, c: &Containerd, id: &str) -> api::ContainerStatus {
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
/// host is reached, with the stored credential swapped in on the wire (the container holds only
/// a placeholder); a denied host and an IP literal are refused.
pub fn assert_fenced(w: &World, cri: &Cri, agent: &str, sandbox: &str) {
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
    let (code, seen, err) = exec(
        cri,
        agent,
        &["printenv", "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN"],
    );
    assert!(
        code == 0 && !seen.trim().is_empty() && !seen.contains(EXAMPLE_TOKEN),
        "the container sees {seen:?}, not a placeholder: {err}"
    );
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

/// A pod of the `svc` handler and its svc sandbox.
pub struct Pod {
    pub id: String,
    pub config: api::PodSandboxConfig,
    /// Its svc sandbox's name and `svc sandbox show --json`.
    pub sandbox: String,
    pub show: serde_json::Value,
}

/// `RunPodSandbox` of pod `name` allowing allowed.example.test with the stored credential
/// for it, plus `extra` annotations: one svc sandbox, with that policy.
pub fn run_fenced_pod(
    w: &World,
    c: &Containerd,
    cri: &Cri,
    name: &str,
    extra: &[(&str, &str)],
) -> Pod {
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

/// `StopPodSandbox` and `RemovePodSandbox`: nothing of its sandbox is left (no sandbox, link,
/// fence entry, init or VM monitor, mount), and the CRI plugin has no pod.
pub fn remove_pod(w: &World, c: &Containerd, cri: &Cri, pod: &Pod) {
    stop_remove_pod(c, cri, &pod.id);
    w.assert_gone_shown(&pod.show);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !mounts.contains(&pod.id),
        "a mount of the pod is left:\n{mounts}"
    );
    assert_no_pods(w, c, cri);
}

/// `StopPodSandbox` and `RemovePodSandbox` of pod `id` (containerd's log in a failure).
pub fn stop_remove_pod(c: &Containerd, cri: &Cri, id: &str) {
    cri.call(cri.runtime().stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: id.into(),
    }))
    .unwrap_or_else(|e| panic!("StopPodSandbox: {e:?}\n{}", c.log()));
    cri.call(
        cri.runtime()
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: id.into(),
            }),
    )
    .unwrap_or_else(|e| panic!("RemovePodSandbox: {e:?}\n{}", c.log()));
}

/// Nothing is left of the pods: no svc sandbox of the shim's, no pod in the CRI plugin.
pub fn assert_no_pods(w: &World, c: &Containerd, cri: &Cri) {
    assert_eq!(shim_sandboxes(w), Vec::<String>::new());
    let left = cri
        .call(
            cri.runtime()
                .list_pod_sandbox(api::ListPodSandboxRequest::default()),
        )
        .unwrap_or_else(|e| panic!("ListPodSandbox: {e:?}"));
    assert!(left.items.is_empty(), "{:?}\n{}", left.items, c.log());
}
