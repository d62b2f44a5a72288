//! A microvm of svcd's taken over by the test's own backend (as svcd does after a restart:
//! svcd is killed first, and the VM outlives it), and what the trees tests do with it:
//! commands through the agent, overlays of the base image to attach as trees, the mounts a
//! process sees; and a guest that stops its own agent for a while.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use svc_control::runtime::{Backend as _, GuestCommand, GuestHandle, Microvm, start_time};
use tokio::io::AsyncReadExt as _;

use crate::world::{World, image_dir, microvm_env};

/// The `PATH` of the guest commands [`sh`] makes.
const PATH: &str = "/usr/bin:/bin:/usr/sbin:/sbin";

/// The test's own backend over svcd's VM `name` (svcd killed first: the VM outlives it).
pub fn take_over(w: &mut World, name: &str) -> (Microvm, GuestHandle) {
    let pid = u32::try_from(w.show(name)["pid"].as_u64().expect("pid")).expect("pid");
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
        name: name.into(),
        pid,
        start: start_time(pid).expect("QEMU runs"),
    };
    (vm, guest)
}

/// Microvm sandbox `name`'s guest stops its own agent (`kill -STOP`, as VM root may) a second
/// after this returns from its exec, and continues it `secs` seconds later, from a shell that
/// outlives the exec; back once the agent is stopped (3 s).
pub fn stop_agent_for(w: &World, name: &str, secs: u64) {
    let (code, _, err) = w.sh(
        name,
        &format!(
            "a=$(grep -l '^svc-microvm-age' /proc/[0-9]*/comm | cut -d/ -f3 | head -n1); \
             [ -n \"$a\" ] || exit 9; \
             setsid sh -c \"sleep 1; kill -STOP $a; sleep {secs}; kill -CONT $a\" \
               </dev/null >/dev/null 2>&1 &"
        ),
    );
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(std::time::Duration::from_secs(3));
}

/// `sh -c SCRIPT` in the guest, with a plain `PATH`.
pub fn sh(script: &str) -> GuestCommand {
    GuestCommand {
        argv: ["sh", "-c", script].map(str::to_owned).to_vec(),
        env: vec![("PATH".into(), PATH.into())],
        ..GuestCommand::default()
    }
}

/// Run `cmd` in the guest (chrooted into the attached tree `root` when given): its exit code
/// and what it said, stdout then stderr.
pub async fn output(
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

/// An overlay of the base image mounted at `dir/merged` (upper and work beside it), as a pod
/// container's root file system is; unmounted on drop. Its path is canonical (named without a
/// link, as `attach_tree` takes it).
pub struct Overlay(pub PathBuf);

impl Overlay {
    pub fn mount(dir: &Path) -> Self {
        for d in ["upper", "work", "merged"] {
            std::fs::create_dir_all(dir.join(d)).expect("overlay dirs");
        }
        let opts = format!(
            "lowerdir={},upperdir={},workdir={}",
            image_dir().join("rootfs").display(),
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
        Self(merged.canonicalize().expect("canonical"))
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The mounts of process `pid` (`self`: this one) as (mount id, mount point): the id tells a
/// second mount over the same point (a mount over `/` reads `/` again) from the first.
pub fn mountinfo(pid: &str) -> Vec<(String, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(((*f.first()?).to_owned(), (*f.get(4)?).to_owned()))
        })
        .collect()
}

/// The mount points of process `pid` (`self`: this one) under `path`.
pub fn mounts_under(pid: &str, path: &Path) -> Vec<String> {
    mountinfo(pid)
        .into_iter()
        .map(|(_, m)| m)
        .filter(|m| Path::new(m).starts_with(path))
        .collect()
}

/// A guest path as the trees share names its tree: each byte in two hex digits.
pub fn hex(path: &str) -> String {
    path.bytes().map(|b| format!("{b:02x}")).collect()
}
