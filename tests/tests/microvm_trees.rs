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

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use svc_control::{
    api::ExecUser,
    runtime::{Backend as _, GuestCommand, GuestHandle, Microvm, start_time},
};
use svc_tests::{
    require_root,
    world::{World, image_dir, microvm_env, microvm_images},
};
use tokio::io::AsyncReadExt as _;

const PATH: &str = "/usr/bin:/bin:/usr/sbin:/sbin";

/// An overlay of the base image at `dir/merged` (upper and work beside it) with `/marker`.
struct Overlay(PathBuf);

impl Overlay {
    fn mount(dir: &Path) -> Self {
        for d in ["upper", "work", "merged"] {
            std::fs::create_dir_all(dir.join(d)).expect("overlay dirs");
        }
        let lower = image_dir().join("rootfs");
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            dir.join("upper").display(),
            dir.join("work").display()
        );
        let merged = dir.join("merged");
        let ok = Command::new("mount")
            .args(["-t", "overlay", "overlay", "-o", &opts])
            .arg(&merged)
            .status()
            .expect("mount");
        assert!(ok.success(), "mounting the overlay");
        std::fs::write(merged.join("marker"), "the pod container's tree\n").expect("marker");
        // Named without a link, as attach_tree takes it.
        Self(merged.canonicalize().expect("canonical"))
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// What a command said on stdout and its exit code.
async fn output(
    vm: &Microvm,
    guest: &GuestHandle,
    cmd: GuestCommand,
    root: Option<&str>,
) -> (i32, String) {
    let mut h = match root {
        Some(r) => vm.exec_in_root(guest, &cmd, r).await,
        None => vm.exec(guest, &cmd).await,
    }
    .expect("exec");
    let mut out = String::new();
    if let Some(mut s) = h.stdout.take() {
        s.read_to_string(&mut out).await.expect("stdout");
    }
    let mut err = String::new();
    if let Some(mut s) = h.stderr.take() {
        let _ = s.read_to_string(&mut err).await;
    }
    let code = h.wait().await.expect("exit code");
    (code, format!("{out}{err}"))
}

fn sh(script: &str) -> GuestCommand {
    GuestCommand {
        argv: ["sh", "-c", script].map(str::to_owned).to_vec(),
        env: vec![("PATH".into(), PATH.into())],
        ..GuestCommand::default()
    }
}

/// Mount points of process `pid` (its namespace's `mountinfo`) under `path`.
fn mounts_under(pid: &str, path: &Path) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_owned))
        .filter(|m| Path::new(m).starts_with(path))
        .collect()
}

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
    let pid = u32::try_from(w.show("trees")["pid"].as_u64().expect("pid")).expect("pid");
    let vm_dir = w.dir.join("state/sandboxes/trees");
    let share = vm_dir.join("trees");
    // The trees share's virtiofsd (its parent and its sandboxed child).
    let helpers = virtiofsds(&vm_dir);
    assert!(!helpers.is_empty(), "no virtiofsd serves the trees share");
    let overlay = Overlay::mount(&w.dir.join("c1"));
    // The VM outlives svcd; this test's backend takes over its agent.
    w.kill_svcd();

    let host = svc_control::config::loader::load_host_config(Some(&w.config)).expect("config");
    let env = microvm_env();
    let vm = Microvm::new(
        &host.microvm,
        &host.state_dir,
        &host.container.cgroup_parent,
        |k| {
            env.iter()
                .find(|(var, _)| *var == k)
                .map(|(_, p)| p.clone().into_os_string())
        },
    );
    let guest = GuestHandle {
        name: "trees".into(),
        pid,
        start: start_time(pid).expect("QEMU runs"),
    };
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
    let (status, answer) = w.api(
        &[],
        "POST",
        "/v1/sandboxes/vmusers/exec",
        Some(body.to_string().as_bytes()),
    );
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("{\"exit\":0}"), "{answer}");
    let body = serde_json::json!({"argv": ["id"], "user": {"uid": 70000, "gid": 0}});
    let (status, answer) = w.api(
        &[],
        "POST",
        "/v1/sandboxes/vmusers/exec",
        Some(body.to_string().as_bytes()),
    );
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("uid 70000 is outside"), "{answer}");
    w.destroy_checked("vmusers");
}
