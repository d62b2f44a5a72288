//! The kubelet path: Debian's containerd, started by the test with its CRI plugin on and the
//! shim registered as runtime handler `svc`, driven through its CRI socket by the tests' CRI
//! client exactly as kubelet drives it. `PullImage` pulls from a registry of the test's on
//! loopback (the CRI plugin's mirror for `svc.test`). A pod is one svc sandbox with the pod's policy (its
//! `svc.dev/*` annotations): its containers run in it, an allowed host is reached with the
//! credential swapped on the wire, another host and an IP literal are refused, exit codes
//! reach `ContainerStatus`, and stopping and removing the pod leaves no sandbox, link, fence
//! entry or mount. A pod annotated `svc.dev/backend=microvm` is the same on a VM (real QEMU,
//! TCG here): its containers run on the VM's kernel, behind the same fence, and removing the
//! pod leaves no QEMU. A pod svcd refuses fails `RunPodSandbox` with svcd's message; a backend
//! svc has no kind of fails it with the shim's, naming the annotation. The pod's namespace and
//! name (as the CRI plugin gives them) are on its audit records and its sandbox's metrics.

use svc_control::{names::SandboxName, policy::pod};
use svc_tests::{
    containerd::{Containerd, IMAGE},
    cri::{Cri, api},
    pods::{
        ALLOWED, Pod, STORED, assert_fenced, assert_no_pods, exec, exited, pod_config, remove_pod,
        run_container, run_fenced_pod, run_pod, shim_sandboxes, start, status, stop_container,
    },
    require_root,
    world::{EXAMPLE_TOKEN, World, microvm_images},
};

/// A pod refused: its name, its annotations, and what svcd's message names.
type Refused<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

/// An image only the test's registry has (every name there is the base image).
const PULLED: &str = "svc.test/pulled:1";

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

/// `PullImage` as kubelet calls it, from the registry (containerd 1.6 always asks it): of the
/// imported image, and of one only the registry has, which the CRI plugin then knows.
fn pull_images(c: &Containerd, cri: &Cri) {
    for name in [IMAGE, PULLED] {
        let pulled = cri
            .call(cri.images().pull_image(api::PullImageRequest {
                image: Some(api::ImageSpec {
                    image: name.into(),
                    ..Default::default()
                }),
                auth: None,
                sandbox_config: None,
            }))
            .unwrap_or_else(|e| {
                panic!(
                    "PullImage {name}: {e:?}
{}",
                    c.log()
                )
            });
        assert!(pulled.image_ref.starts_with("sha256:"), "{pulled:?}");
        let img = cri
            .call(cri.images().image_status(api::ImageStatusRequest {
                image: Some(api::ImageSpec {
                    image: name.into(),
                    ..Default::default()
                }),
                verbose: false,
            }))
            .unwrap_or_else(|e| panic!("ImageStatus {name}: {e:?}"))
            .image
            .unwrap_or_else(|| panic!("the pulled {name} is unknown to the CRI plugin"));
        assert!(img.repo_tags.iter().any(|t| t == name), "{img:?}");
        assert_eq!(img.id, pulled.image_ref, "{img:?}");
    }
    let served = c.registry.as_ref().expect("a registry").served();
    for want in ["/v2/base/manifests/1", "/v2/pulled/manifests/1"] {
        assert!(
            served.iter().any(|r| r.ends_with(want)),
            "PullImage never asked the registry for {want}: {served:?}"
        );
    }
}

#[test]
fn a_pod_through_cri_is_one_fenced_sandbox_and_leaves_nothing() {
    require_root();
    let w = World::start();
    w.store_secret(STORED, EXAMPLE_TOKEN, ALLOWED);
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
    pull_images(&c, &cri);

    let pod = run_fenced_pod(&w, &c, &cri, "agent", &[]);
    assert_eq!(pod.show["backend"], "container", "{}", pod.show);
    let agent = run_containers(&w, &c, &cri, &pod);
    // The pod's namespace and name, as the CRI plugin gives them, are on its audit records.
    let identity = serde_json::json!({"namespace": "default", "name": "agent"});
    assert_eq!(pod.show["pod"], identity, "{}", pod.show);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !w
        .audit()
        .iter()
        .any(|r| r["path"] == "/from-cri" && r["pod"] == identity)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no audit record of the pod's request with its identity"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // And on its sandbox's series in svcd's metrics.
    let metrics = w.metrics();
    let labelled: Vec<&str> = metrics
        .lines()
        .filter(|l| l.contains(&format!("sandbox=\"{}\"", pod.sandbox)))
        .collect();
    assert!(
        !labelled.is_empty(),
        "no series of {}:\n{metrics}",
        pod.sandbox
    );
    assert!(
        labelled
            .iter()
            .all(|l| l.contains("pod_namespace=\"default\",pod_name=\"agent\"")),
        "a series of the pod's sandbox without its identity:\n{metrics}"
    );

    // Stopping the running container ends it (TaskExit reaches the CRI plugin).
    stop_container(&cri, &agent, 10);
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
    w.store_secret(STORED, EXAMPLE_TOKEN, ALLOWED);
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
    w.store_secret(STORED, EXAMPLE_TOKEN, ALLOWED);
    let (c, cri) = start(&w);

    // Annotations svcd's creation rules refuse: the code host's token without a repository,
    // a repository that is none, a host that is none, a branch pattern outside refs/.
    // RunPodSandbox fails with svcd's own message for the request they make.
    let secret = format!("CODE_HOST_TOKEN={STORED}");
    let cases: [Refused; 4] = [
        (
            "no-repo",
            &[(pod::SECRETS, secret.as_str())],
            "CODE_HOST_TOKEN",
        ),
        (
            "bad-repo",
            &[(pod::REPO, "widget"), (pod::SECRETS, secret.as_str())],
            "--repo \"widget\"",
        ),
        (
            "bad-host",
            &[(pod::ALLOW_HOSTS, "bad!host.example")],
            "bad!host.example",
        ),
        (
            "bad-branch",
            &[(pod::BRANCHES, "main")],
            "allowed branch \"main\"",
        ),
    ];
    for (name, annotations, names) in cases {
        let svcd_says = svcd_refuses(&w, name, annotations);
        assert!(svcd_says.contains(names), "{name}: {svcd_says}");
        let e = run_pod(&cri, &pod_config(name, annotations)).expect_err("refused");
        let said = unquoted(e.message());
        assert!(
            said.contains(&svcd_says),
            "{name}: RunPodSandbox's error carries svcd's message {svcd_says:?}: {e:?}"
        );
    }

    // A backend svc has no kind of: refused by the shim, naming the annotation.
    let e = run_pod(&cri, &pod_config("vm", &[(pod::BACKEND, "gvisor")])).expect_err("refused");
    let said = unquoted(e.message());
    assert!(
        said.contains("pod annotation svc.dev/backend: \"gvisor\" is no backend; expected container or microvm"),
        "{e:?}"
    );

    // Nothing is left of either.
    assert_no_pods(&w, &c, &cri);
}

/// The message svcd refuses the creation request of pod `default/name` with `annotations`
/// with (its API, called directly as the shim calls it).
fn svcd_refuses(w: &World, name: &str, annotations: &[(&str, &str)]) -> String {
    let mut req = pod::request_from_annotations(
        SandboxName::new("refused").expect("name"),
        &annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    )
    .expect("a request");
    req.pod = Some(svc_control::api::PodRef {
        namespace: "default".into(),
        name: name.into(),
    });
    let (code, body) = w.api(
        &[],
        "POST",
        "/v1/sandboxes",
        Some(&serde_json::to_vec(&req).expect("json")),
    );
    assert!((400..500).contains(&code), "svcd refuses it: {code} {body}");
    let said: serde_json::Value = serde_json::from_str(&body).expect("error json");
    said["error"].as_str().expect("a message").to_owned()
}

/// containerd's quoting of the shim's error undone (`\"` and `\\` as Go's `%q` writes them).
fn unquoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        match (c, chars.clone().next()) {
            ('\\', Some(next @ ('"' | '\\'))) => {
                out.push(next);
                chars.next();
            }
            _ => out.push(c),
        }
    }
    out
}
