//! The microvm trees share attacked from inside the VM (real QEMU), as microvm_trees.rs sets
//! it up: svcd makes the VM, the test's own backend takes its agent over to attach a tree.

use std::path::Path;

use svc_control::{
    api::ExecUser,
    runtime::{GuestHandle, Microvm},
};
use svc_tests::{
    require_root,
    vm::{Overlay, hex, mountinfo, mounts_under, output, sh, take_over},
    world::{World, image_dir, microvm_images},
};

use super::setid_or_devices;

/// The mounts made since `before`, leaving out those of the other tests' worlds running in
/// this process beside `ours` (their sandboxes attach trees of their own meanwhile).
fn new_mounts(before: &[(String, String)], ours: &Path) -> Vec<String> {
    let worlds = std::env::temp_dir().join("svw");
    let worlds = worlds.to_string_lossy().into_owned();
    mountinfo("self")
        .into_iter()
        .filter(|m| !before.contains(m))
        .map(|(_, m)| m)
        .filter(|m| !m.starts_with(&worlds) || Path::new(m).starts_with(ours))
        .collect()
}

/// Exec users the guest's ids do not hold, through svcd's API on a microvm: each refused.
fn exec_users_outside_the_guests_ids_are_refused(w: &World, name: &str) {
    let many: Vec<u32> = (1..=65).collect();
    for user in [
        serde_json::json!({"uid": 4_294_967_295u32, "gid": 0}),
        serde_json::json!({"uid": 0, "gid": 4_294_967_295u32}),
        serde_json::json!({"uid": 65536, "gid": 0}),
        serde_json::json!({"uid": 1000, "gid": 1000, "additional_gids": [65536]}),
        serde_json::json!({"uid": 1000, "gid": 1000, "additional_gids": [4_294_967_295u32]}),
        serde_json::json!({"uid": 1000, "gid": 1000, "additional_gids": many}),
        serde_json::json!({"uid": -1, "gid": 0}),
    ] {
        let body = serde_json::json!({"argv": ["id"], "user": user});
        let (status, answer) = w.api_exec(name, &body);
        assert_eq!(status, 400, "{user}: {answer}");
    }
}

/// Names the guest plants at the share's top before the host makes them (a link to the
/// guest's `/`, the host's `/` were it followed there; a link to `/etc`; a directory): each
/// attach there refused, and no mount made on the host.
async fn planted_names_are_refused(vm: &Microvm, guest: &GuestHandle, tree: &Path, world: &Path) {
    let before = mountinfo("self");
    let planted = format!(
        "ln -s / /run/svc/trees/{l} && ln -s /etc /run/svc/trees/{e} && \
         mkdir /run/svc/trees/{d}",
        l = hex("/pod/link"),
        e = hex("/etc"),
        d = hex("/pod/dir"),
    );
    let (code, said) = output(vm, guest, sh(&planted), None).await;
    assert_eq!(code, 0, "{said}");
    for at in ["/pod/link", "/etc", "/pod/dir"] {
        let e = vm.attach_tree(guest, tree, at).await;
        assert!(e.is_err(), "attached at {at} over a planted name");
    }
    let new = new_mounts(&before, world);
    assert!(
        new.is_empty(),
        "a planted name made a mount on the host: {new:?}"
    );
}

/// The guest's root writes setid files and device nodes into the tree at /pod/c1, directly
/// and through the share, rewrites the image's setuid programs there, and fills the share's
/// top; a non-root command chrooted into the tree sees nothing of the share.
async fn write_through_the_tree(vm: &Microvm, guest: &GuestHandle) {
    let attack = "cd /pod/c1; \
        echo x > suid; chmod 4755 suid; chmod u+s suid; \
        cp /bin/true sgid; chmod 2755 sgid; \
        mknod null2 c 1 3; mknod sda2 b 8 0; mkfifo fifo; \
        install -m 6755 /bin/true made-setid; \
        cat /bin/sh > usr/bin/passwd; echo '#' >> usr/bin/newgrp; \
        cd /run/svc/trees/2f706f642f6331 && mknod null3 c 1 3; chmod 4755 suid; \
        dd if=/dev/zero of=/run/svc/trees/fill bs=64k count=64 2>&1; \
        for i in $(seq 1 2000); do touch /run/svc/trees/f$i 2>/dev/null || break; done; \
        true";
    let (code, said) = output(vm, guest, sh(attack), None).await;
    assert_eq!(code, 0, "{said}");
    let mut out = sh("ls /run/svc/trees 2>&1; chroot / true 2>&1; echo done");
    out.user = Some(ExecUser {
        uid: 1000,
        gid: 1000,
        additional_gids: vec![],
    });
    let (_, said) = output(vm, guest, out, Some("/pod/c1")).await;
    assert!(
        !said.contains("2f706f64"),
        "the chrooted user sees the share: {said}"
    );
}

/// The setid files and device nodes under the tree's upper layer `upper` that the guest made:
/// a setid file of the image copied up unchanged is the image's own; any other is the
/// guest's (new, or the image's program with the guest's contents).
fn guest_written_setid(upper: &Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt as _;
    let lower = image_dir().join("rootfs");
    let sh = std::fs::read(lower.join("bin/sh")).ok();
    setid_or_devices(upper)
        .into_iter()
        .filter(|p| {
            let rel = p.strip_prefix(upper).expect("under upper");
            let (Ok(mine), Ok(image)) = (std::fs::read(p), std::fs::read(lower.join(rel))) else {
                return true;
            };
            mine != image
        })
        .map(|p| {
            let m = p.symlink_metadata().expect("stat");
            let same_as_sh = std::fs::read(&p).ok() == sh;
            format!(
                "{} mode {:o} uid {} (the guest's /bin/sh: {same_as_sh})",
                p.display(),
                m.mode(),
                m.uid()
            )
        })
        .collect()
}

#[test]
fn a_vm_guest_gets_nothing_onto_the_host_through_the_trees_share() {
    require_root();
    microvm_images();
    let mut w = World::start();
    w.svc_ok(&["sandbox", "create", "--backend", "microvm", "trees45"]);
    exec_users_outside_the_guests_ids_are_refused(&w, "trees45");
    let share = w.dir.join("state/sandboxes/trees45/trees");
    let overlay = Overlay::mount(&w.dir.join("c1"));
    // A second tree, left attached when the VM is destroyed: its files must outlive it.
    let kept = Overlay::mount(&w.dir.join("c2"));
    std::fs::write(kept.0.join("keep-me"), "the host's\n").expect("keep-me");
    let (vm, guest) = take_over(&mut w, "trees45");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        planted_names_are_refused(&vm, &guest, &overlay.0, &w.dir).await;
        vm.attach_tree(&guest, &overlay.0, "/pod/c1")
            .await
            .expect("attach");
        vm.attach_tree(&guest, &kept.0, "/pod/c2")
            .await
            .expect("attach c2");
        write_through_the_tree(&vm, &guest).await;
        // Detach while the guest races to put a link where the tree's directory was.
        let racer = format!(
            "t=/run/svc/trees/{h}; for i in $(seq 1 3000); do \
               rmdir $t 2>/dev/null && ln -s / $t 2>/dev/null; done &",
            h = hex("/pod/c1")
        );
        let _ = output(&vm, &guest, sh(&racer), None).await;
        let _ = vm.detach_tree(&guest, "/pod/c1").await;
    });
    drop(rt);
    // What the guest wrote at the share's top: regular files' bytes, and entries.
    let entries: Vec<std::fs::Metadata> = std::fs::read_dir(&share)
        .expect("share")
        .flatten()
        .filter_map(|e| e.path().symlink_metadata().ok())
        .collect();
    let top: u64 = entries
        .iter()
        .filter(|m| m.is_file())
        .map(std::fs::Metadata::len)
        .sum();
    let count = entries.len();
    assert!(Path::new("/etc/passwd").exists() && Path::new("/usr/bin").is_dir());
    w.start_svcd();
    w.destroy_checked("trees45");
    assert!(
        mounts_under("self", &share).is_empty(),
        "the share is unmounted with the VM"
    );
    assert!(
        top <= 64 * 1024 && count <= 1024,
        "the guest wrote {top} bytes in {count} entries at the share's top"
    );
    assert_eq!(
        std::fs::read_to_string(kept.0.join("keep-me")).unwrap_or_default(),
        "the host's\n",
        "destroying the VM removed files of a tree still attached"
    );
    assert!(kept.0.join("usr/bin").is_dir());
    let bad = guest_written_setid(&w.dir.join("c1/upper"));
    drop(kept);
    drop(overlay);
    assert!(
        bad.is_empty(),
        "setid files or devices the guest wrote on the host: {bad:?}"
    );
}

/// After the guest filled the share's top and raced a detach (putting a link where the tree's
/// directory was), the host's tree directory is gone and the agent still serves the next
/// tree and commands.
#[test]
fn the_agent_serves_a_tree_after_a_filled_share_and_a_raced_detach() {
    require_root();
    microvm_images();
    let mut w = World::start();
    w.svc_ok(&["sandbox", "create", "--backend", "microvm", "trees46"]);
    let one = Overlay::mount(&w.dir.join("t1"));
    let two = Overlay::mount(&w.dir.join("t2"));
    let (vm, guest) = take_over(&mut w, "trees46");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        vm.attach_tree(&guest, &one.0, "/pod/c1")
            .await
            .expect("attach");
        // The race runs through the detach and stops when told (`[` is the shell's own: no
        // process per look). What is asserted is that the agent serves after it: a guest that
        // goes on loading its own CPU and share only slows its own agent, and a busy host
        // (TCG) once kept the next attach past svcd's 30 s limit while the loop still ran.
        let racer = format!(
            "dd if=/dev/zero of=/run/svc/trees/fill bs=64k count=64 2>/dev/null; \
             for i in $(seq 1 2000); do touch /run/svc/trees/f$i 2>/dev/null || break; done; \
             t=/run/svc/trees/{h}; for i in $(seq 1 3000); do [ -e /tmp/race-over ] && break; \
               rmdir $t 2>/dev/null && ln -s / $t 2>/dev/null; done &",
            h = hex("/pod/c1")
        );
        let _ = output(&vm, &guest, sh(&racer), None).await;
        let _ = vm.detach_tree(&guest, "/pod/c1").await;
        let (code, said) = output(&vm, &guest, sh("touch /tmp/race-over"), None).await;
        assert_eq!(code, 0, "ending the race: {said}");
        vm.attach_tree(&guest, &two.0, "/pod/c2")
            .await
            .expect("attach after the raced detach");
        let (code, said) = output(&vm, &guest, sh("echo alive"), None).await;
        assert_eq!((code, said.as_str()), (0, "alive\n"));
    });
    drop(rt);
    assert!(one.0.join("usr/bin").is_dir() && two.0.join("usr/bin").is_dir());
    w.start_svcd();
    w.destroy_checked("trees46");
    drop(two);
    drop(one);
}
