//! The escape tests inside pod containers: kubelet's path through containerd's CRI
//! (`RunPodSandbox` with the `svc` handler, `CreateContainer` of the imported image,
//! `ExecSync`), with the very checks `escapes.rs` and `runtime_escapes.rs` run in sandboxes
//! (`svc_tests::escapes`): each script runs as the container's root through `ExecSync`, and the
//! host is checked afterwards. On the container backend a pod container runs on its own
//! image's root file system, chrooted at `/.svc/ctr/<id>` in its pod's sandbox; on a microvm pod
//! (`svc.dev/backend=microvm`) its commands run on the VM's kernel. Besides svcd's paths, the
//! node's containerd (its root, state and socket) must not be visible in a pod container.
//!
//! Not run here, for a reason: `runtime_escapes.rs`'s leftover layer under a later create (a pod
//! container's layer is named by containerd's container id, new at each `CreateContainer`, and
//! svcd refuses to attach a root over a layer already there), and svcd's start-up warning about
//! an old runc (no guest takes part in it).

use std::path::Path;

use svc_control::policy::pod;
use svc_tests::{
    containerd::Containerd,
    cri::{Cri, api},
    escapes::{
        InPodContainer, InSandbox, RemovedAtEnd, container, limits, microvm, plant_hostile_layer,
    },
    pods::{
        ALLOWED, Pod, STORED, pod_config, remove_container, remove_pod, run_container,
        run_fenced_pod, run_pod, shim_sandboxes, start,
    },
    require_root,
    world::{EXAMPLE_TOKEN, World},
};

/// containerd with CRI on, a pod of the `svc` handler (its sandbox's policy allowing
/// allowed.example.test, `extra` annotations) and one container of the base image in it,
/// running `sleep`: the pod and the container's id.
fn pod_with_container(w: &World, extra: &[(&str, &str)]) -> (Containerd, Cri, Pod, String) {
    w.store_secret(STORED, EXAMPLE_TOKEN, ALLOWED);
    let (c, cri) = start(w);
    let pod = run_fenced_pod(w, &c, &cri, "jail", extra);
    let id = run_container(&cri, &pod.id, &pod.config, "agent", &["sleep", "1000"]);
    (c, cri, pod, id)
}

/// The node's containerd: its directory, root, state and socket.
fn containerd_paths(c: &Containerd) -> Vec<String> {
    [
        c.dir.clone(),
        c.dir.join("root"),
        c.dir.join("state"),
        c.socket.clone(),
    ]
    .iter()
    .map(|p| p.display().to_string())
    .collect()
}

#[test]
fn no_escape_from_a_pod_container_reaches_the_host_the_fence_or_svcd() {
    require_root();
    let w = World::start();
    let (c, cri, pod, id) = pod_with_container(&w, &[]);
    assert_eq!(pod.show["backend"], "container", "{}", pod.show);
    let g = InPodContainer { cri: &cri, id };
    container::no_escape_reaches_the_host_the_fence_or_svcd(
        &w,
        &g,
        &pod.sandbox,
        &containerd_paths(&c),
    );
    remove_pod(&w, &c, &cri, &pod);
}

/// Pod containers are as far apart as sandboxes: a pod's container and a sandbox, and the
/// containers of two pods, see none of each other's files or processes, either way.
#[test]
fn a_pod_container_cannot_reach_a_sandboxs_or_another_pods_files_or_processes() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "neighbour"]);
    let (c, cri, pod, id) = pod_with_container(&w, &[]);
    let in_pod = InPodContainer { cri: &cri, id };
    let neighbour = InSandbox::new(&w, "neighbour");
    limits::a_guest_cannot_reach_another_sandboxs_files_or_processes(&in_pod, &neighbour);
    limits::a_guest_cannot_reach_another_sandboxs_files_or_processes(&neighbour, &in_pod);

    let other = pod_config("other", &[]);
    let other_id = run_pod(&cri, &other).unwrap_or_else(|e| panic!("RunPodSandbox other: {e:?}"));
    assert_eq!(shim_sandboxes(&w).len(), 2, "a sandbox for each pod");
    let in_other = InPodContainer {
        cri: &cri,
        id: run_container(&cri, &other_id, &other, "other", &["sleep", "1000"]),
    };
    limits::a_guest_cannot_reach_another_sandboxs_files_or_processes(&in_pod, &in_other);
    limits::a_guest_cannot_reach_another_sandboxs_files_or_processes(&in_other, &in_pod);
    cri.call(cri.runtime().stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: other_id.clone(),
    }))
    .unwrap_or_else(|e| panic!("StopPodSandbox other: {e:?}"));
    cri.call(
        cri.runtime()
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: other_id,
            }),
    )
    .unwrap_or_else(|e| panic!("RemovePodSandbox other: {e:?}"));
    // Checks that nothing of either pod is left.
    remove_pod(&w, &c, &cri, &pod);
    w.destroy_checked("neighbour");
}

#[test]
fn a_fork_bomb_and_a_memory_hog_in_a_pod_container_are_contained_by_the_cgroup() {
    require_root();
    let w = World::start_with("memory_mib = 128\npids_max = 64\n");
    w.svc_ok(&["sandbox", "create", "bystander"]);
    let (c, cri, pod, id) = pod_with_container(&w, &[]);
    limits::a_fork_bomb_and_a_memory_hog_are_contained_by_the_cgroup(
        &w,
        &InPodContainer { cri: &cri, id },
        &pod.sandbox,
        &InSandbox::new(&w, "bystander"),
    );
    // And the bomb goes with its pod.
    remove_pod(&w, &c, &cri, &pod);
}

/// A pod container's writable layer is a directory of the host (under its pod's sandbox):
/// a tree deeper than svcd's stack and descriptors allow a recursive walk, and files and
/// symlinks planted in it, go with the container, and svcd lives on.
#[test]
fn a_pod_containers_hostile_layer_goes_with_it_and_svcd_lives_on() {
    require_root();
    let w = World::start();
    let (c, cri, pod, id) = pod_with_container(&w, &[]);
    plant_hostile_layer(&InPodContainer {
        cri: &cri,
        id: id.clone(),
    });
    let layers = w
        .dir
        .join("state/sandboxes")
        .join(&pod.sandbox)
        .join("ctr")
        .join(&id);
    // Dropped before the world: whatever the tree outlives goes without a recursive walk.
    let _tree = RemovedAtEnd(layers.clone());
    assert!(
        layers.join("upper/var/tmp/d").is_dir(),
        "the container's layer is under {}",
        layers.display()
    );
    remove_container(&cri, &id);
    let pid = w.svcd_pid().expect("svcd was started");
    assert!(
        Path::new(&format!("/proc/{pid}")).exists() && !svc_control::runtime::is_zombie(pid),
        "svcd died removing the container's tree:\n{}",
        w.svcd_log()
    );
    assert!(
        !layers.exists(),
        "{} outlived its container",
        layers.display()
    );
    remove_pod(&w, &c, &cri, &pod);
}

#[test]
fn no_escape_from_a_microvm_pod_container_reaches_the_host_the_fence_or_svcd() {
    require_root();
    let image_before = microvm::image_mtime();
    let w = World::start();
    // A neighbour whose address the guest will try to take.
    w.svc_ok(&["sandbox", "create", "neighbour"]);
    let (c, cri, pod, id) = pod_with_container(&w, &[(pod::BACKEND, "microvm")]);
    assert_eq!(pod.show["backend"], "microvm", "{}", pod.show);
    microvm::no_escape_reaches_the_host_the_fence_or_svcd(
        &w,
        &InPodContainer { cri: &cri, id },
        &pod.sandbox,
        "neighbour",
        image_before,
        &containerd_paths(&c),
    );
    remove_pod(&w, &c, &cri, &pod);
    w.destroy_checked("neighbour");
}
