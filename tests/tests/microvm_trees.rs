//! Trees put into a running microvm guest (real QEMU, TCG here): the backend's `attach_tree`
//! binds a host directory (here an overlay of the base image with a marker in its upper layer,
//! as a pod container's root file system is) into the VM's trees share and the agent binds it
//! at a guest path; an exec chrooted there sees the marker and the image's files, as the user
//! it names; a link the guest put on the way to the guest path is refused, not followed;
//! `detach_tree` leaves no mount on the host nor in the share's virtiofsd, and no new
//! virtiofsd ever ran. Commands as another user through svcd's API, too.
//!
//! svcd makes the VM; the test's own backend then takes over its agent's channel (as svcd
//! does after a restart: svcd is stopped first) and svcd, started again, destroys it.

use std::path::Path;

use svc_control::api::ExecUser;
use svc_tests::{
    require_root,
    vm::{Overlay, mounts_under, output, sh, take_over},
    world::{World, microvm_images},
};

/// The trees mounted in the share as virtiofsd `pid` sees it (its root is the share: a tree
/// is `/<hex of its guest path>`).
fn tree_mounts(pid: &str) -> Vec<String> {
    mounts_under(pid, Path::new("/"))
        .into_iter()
        .filter(|m| m.starts_with("/2f"))
        .collect()
}

/// The pids of the virtiofsd processes serving the VM in `vm_dir`.
fn virtiofsds(vm_dir: &Path) -> Vec<String> {
    let needle = vm_dir.display().to_string();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        .filter(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd);
            cmd.contains("virtiofsd") && cmd.contains(&needle)
        })
        .collect()
}

#[test]
fn a_tree_attached_to_a_running_vm_is_its_execs_root_and_detaching_leaves_nothing() {
    require_root();
    microvm_images();
    let mut w = World::start();
    w.svc_ok(&["sandbox", "create", "--backend", "microvm", "trees"]);
    let vm_dir = w.dir.join("state/sandboxes/trees");
    let share = vm_dir.join("trees");
    // The trees share's virtiofsd (its parent and its sandboxed child).
    let helpers = virtiofsds(&vm_dir);
    assert!(!helpers.is_empty(), "no virtiofsd serves the trees share");
    let overlay = Overlay::mount(&w.dir.join("c1"));
    std::fs::write(overlay.0.join("marker"), "the pod container's tree\n").expect("marker");
    // The VM outlives svcd; this test's backend takes over its agent.
    let (vm, guest) = take_over(&mut w, "trees");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        vm.attach_tree(&guest, &overlay.0, "/pod/c1")
            .await
            .expect("attach");
        // The tree reached the share's virtiofsd without a new one (mount propagation).
        assert!(
            helpers
                .iter()
                .any(|p| tree_mounts(p) == ["/2f706f642f6331"]),
            "no virtiofsd sees the tree"
        );
        // Chrooted into the tree: its own marker and the image's `id`, as the user named.
        let mut cat = sh("cat /marker; id -u; id -G; pwd");
        cat.user = Some(ExecUser {
            uid: 1000,
            gid: 1000,
            additional_gids: vec![27, 4],
        });
        cat.cwd = Some("/etc".into());
        let (code, said) = output(&vm, &guest, cat, Some("/pod/c1")).await;
        assert_eq!(
            (code, said.as_str()),
            (0, "the pod container's tree\n1000\n1000 4 27\n/etc\n")
        );
        // The guest writes into it, and the host's upper layer has it.
        let (code, said) = output(
            &vm,
            &guest,
            sh("echo from-the-guest > /written"),
            Some("/pod/c1"),
        )
        .await;
        assert_eq!(code, 0, "{said}");
        let upper = w.dir.join("c1/upper/written");
        assert_eq!(
            std::fs::read_to_string(&upper).unwrap_or_default(),
            "from-the-guest\n"
        );
        let again = vm.attach_tree(&guest, &overlay.0, "/pod/c1").await;
        assert!(
            again
                .as_ref()
                .is_err_and(|e| e.to_string().contains("already attached")),
            "{again:?}"
        );

        // A link the guest put on the way is refused (not followed), and nothing stays.
        let (code, said) = output(
            &vm,
            &guest,
            sh("mkdir -p /victim /pod && ln -s /victim /pod/link && ln -s /victim /pod/last"),
            None,
        )
        .await;
        assert_eq!(code, 0, "{said}");
        for at in ["/pod/link/c2", "/pod/last"] {
            let e = vm
                .attach_tree(&guest, &overlay.0, at)
                .await
                .expect_err("a link on the way")
                .to_string();
            assert!(e.contains("symbolic link"), "{at}: {e}");
        }
        let (code, said) = output(&vm, &guest, sh("ls -A /victim; readlink /pod/last"), None).await;
        assert_eq!(
            (code, said.as_str()),
            (0, "/victim\n"),
            "the link was followed"
        );
        let left: Vec<_> = std::fs::read_dir(&share).expect("share").collect();
        assert_eq!(left.len(), 1, "only /pod/c1's tree in the share: {left:?}");

        vm.detach_tree(&guest, "/pod/c1").await.expect("detach");
        let (code, said) = output(
            &vm,
            &guest,
            sh("ls -A /pod/c1; grep -c ' /pod/c1 ' /proc/mounts"),
            None,
        )
        .await;
        assert_eq!(
            (code, said.as_str()),
            (1, "0\n"),
            "the tree is gone from the guest"
        );
    });
    drop(rt);
    // Nothing on the host: no mount in the share (svcd's view, the share's virtiofsd's), no
    // tree directory, and the one virtiofsd the VM booted with.
    assert_eq!(mounts_under("self", &share), [share.display().to_string()]);
    let after = virtiofsds(&vm_dir);
    assert_eq!(after, helpers, "no virtiofsd came or went");
    for p in &after {
        assert!(tree_mounts(p).is_empty(), "virtiofsd {p} still sees a tree");
    }
    assert_eq!(std::fs::read_dir(&share).expect("share").count(), 0);

    w.start_svcd();
    w.destroy_checked("trees");
    assert!(
        mounts_under("self", &share).is_empty(),
        "the share is unmounted with the VM"
    );
    drop(overlay);
}

/// svcd's exec API runs a microvm command as the user it names, supplementary groups too.
#[test]
fn a_microvm_exec_runs_as_the_user_it_names() {
    require_root();
    microvm_images();
    let w = World::start();
    w.svc_ok(&["sandbox", "create", "--backend", "microvm", "vmusers"]);
    let body = serde_json::json!({
        "argv": ["sh", "-c", "[ \"$(id -u) $(id -G)\" = '1234 1234 4 27' ]"],
        "user": {"uid": 1234, "gid": 1234, "additional_gids": [27, 4]},
    });
    let (status, answer) = w.api_exec("vmusers", &body);
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("{\"exit\":0}"), "{answer}");
    let body = serde_json::json!({"argv": ["id"], "user": {"uid": 70000, "gid": 0}});
    let (status, answer) = w.api_exec("vmusers", &body);
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("uid 70000 is outside"), "{answer}");
    w.destroy_checked("vmusers");
}
