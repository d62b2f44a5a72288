//! Escapes from inside a sandbox: each is tried as the guest's root with the tools a hostile
//! agent would use, must fail with a clear error, and is checked from the host afterwards (host
//! files, svcd's files and socket, the fence's maps and pins, the link, other sandboxes). The
//! real svcd, runc, kernel and fence (see `svc_tests::world`). The checks live in
//! `svc_tests::escapes`: `cri_escapes.rs` runs the same ones inside pod containers.

use svc_tests::{
    escapes::{InSandbox, container, limits, microvm},
    require_root,
    world::World,
};

#[test]
fn no_escape_from_a_container_sandbox_reaches_the_host_the_fence_or_svcd() {
    require_root();
    let w = World::start();
    w.sandbox_allowing("jail", &["allowed.example.test"]);
    container::no_escape_reaches_the_host_the_fence_or_svcd(
        &w,
        &InSandbox::new(&w, "jail"),
        "jail",
        &[],
    );
}

#[test]
fn a_sandbox_cannot_reach_another_sandboxs_files_or_processes() {
    require_root();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "left"]);
    w.svc_ok(&["sandbox", "create", "right"]);
    limits::a_guest_cannot_reach_another_sandboxs_files_or_processes(
        &InSandbox::new(&w, "left"),
        &InSandbox::new(&w, "right"),
    );
}

#[test]
fn a_fork_bomb_and_a_memory_hog_are_contained_by_the_cgroup() {
    require_root();
    let w = World::start_with("memory_mib = 128\npids_max = 64\n");
    w.svc_ok(&["sandbox", "create", "bomb"]);
    w.svc_ok(&["sandbox", "create", "bystander"]);
    limits::a_fork_bomb_and_a_memory_hog_are_contained_by_the_cgroup(
        &w,
        &InSandbox::new(&w, "bomb"),
        "bomb",
        &InSandbox::new(&w, "bystander"),
    );
    // And the bomb goes with its sandbox.
    w.destroy_checked("bomb");
}

/// In a microVM the guest is root of its own kernel; none of what it does there reaches the
/// host (`svc_tests::escapes::microvm`).
#[test]
fn no_escape_from_a_microvm_sandbox_reaches_the_host_the_fence_or_svcd() {
    require_root();
    let image_before = microvm::image_mtime();
    let w = World::start();
    w.svc_ok(&[
        "sandbox",
        "create",
        "--backend",
        "microvm",
        "--allow-host",
        "allowed.example.test",
        "vmjail",
    ]);
    // A neighbour whose address the guest will try to take.
    w.svc_ok(&["sandbox", "create", "neighbour"]);
    microvm::no_escape_reaches_the_host_the_fence_or_svcd(
        &w,
        &InSandbox::new(&w, "vmjail"),
        "vmjail",
        "neighbour",
        image_before,
        &[],
    );
    w.destroy_checked("vmjail");
    w.destroy_checked("neighbour");
}
