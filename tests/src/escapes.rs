//! The sandbox-escape checks, each written once and run in any guest: a sandbox through
//! `svc sandbox exec` ([`InSandbox`]) or a pod's container through containerd's CRI `ExecSync`
//! ([`InPodContainer`], kubelet's path). A check runs its script in the guest as the guest's
//! root (each script checks its own refusals and prints what it saw) and checks from the host
//! afterwards what the script must not have changed. `tests/tests/escapes.rs` and
//! `runtime_escapes.rs` run them in sandboxes, `tests/tests/cri_escapes.rs` in pod containers.

use crate::{cri::Cri, pods, world::World};

/// The container backend's escapes (host paths, namespaces, mounts, filtered calls, sockets,
/// the link and routes, host processes, `/sys`, `/proc/kcore`).
pub mod container;
/// The resource limits and the walls between sandboxes.
pub mod limits;
/// The microvm backend's escapes (the host behind the VM, the tap, the console).
pub mod microvm;

/// A way to run a shell script as a guest's root.
pub trait Guest {
    /// `sh -c script` in the guest: (exit code, stdout, stderr).
    fn sh(&self, script: &str) -> (i32, String, String);
    /// What it is, for messages.
    fn describe(&self) -> String;
}

/// Sandbox `name` of `world`, through `svc sandbox exec`.
pub struct InSandbox<'a> {
    pub world: &'a World,
    pub name: String,
}

impl<'a> InSandbox<'a> {
    pub fn new(world: &'a World, name: &str) -> Self {
        Self {
            world,
            name: name.to_owned(),
        }
    }
}

impl Guest for InSandbox<'_> {
    fn sh(&self, script: &str) -> (i32, String, String) {
        self.world.sh(&self.name, script)
    }

    fn describe(&self) -> String {
        format!("sandbox {}", self.name)
    }
}

/// Container `id` of a pod, through the CRI's `ExecSync` (as `kubectl exec` reaches it).
pub struct InPodContainer<'a> {
    pub cri: &'a Cri,
    pub id: String,
}

impl Guest for InPodContainer<'_> {
    fn sh(&self, script: &str) -> (i32, String, String) {
        pods::exec(self.cri, &self.id, &["sh", "-c", script])
    }

    fn describe(&self) -> String {
        format!("pod container {}", self.id)
    }
}

/// Run `script` in `g`; assert it exits 0 (the script itself checks each refusal and prints
/// what it saw); its stdout.
pub fn guest_checks(g: &dyn Guest, script: &str) -> String {
    let (code, out, err) = g.sh(script);
    assert_eq!(
        code,
        0,
        "a refusal did not hold inside {}:\n--- stdout\n{out}\n--- stderr\n{err}",
        g.describe()
    );
    out
}

/// `paths` for a shell script: each in single quotes, separated by spaces.
pub fn quoted(paths: &[String]) -> String {
    paths
        .iter()
        .map(|p| format!("'{p}'"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What the host's fence holds for sandbox `id`, and the names under the pin directory.
pub fn fence_state(w: &World, id: u32) -> (Vec<String>, Vec<String>) {
    let fence = svc_control::dataplane::Fence::load(&w.pins.path).expect("load the fence");
    let mut entries: Vec<String> = fence
        .allow_entries(id)
        .into_iter()
        .map(|(a, v)| format!("{a} {v:?}"))
        .collect();
    entries.sort();
    let mut pins = Vec::new();
    let mut stack = vec![w.pins.path.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            pins.push(e.path().display().to_string());
            if e.path().is_dir() {
                stack.push(e.path());
            }
        }
    }
    pins.sort();
    (entries, pins)
}

/// The guest's side of the runtime's own escape (`runtime_escapes.rs`): as its root, `g` plants
/// a file, a symlink toward `/proc` and, under `/var/tmp`, a tree deeper (25,000 directories)
/// than a recursive walk on svcd's stack and descriptors survives.
pub fn plant_hostile_layer(g: &dyn Guest) {
    let (code, out, err) = g.sh(
        "echo planted > /etc/planted && ln -s /proc/sys/kernel/core_pattern /etc/null-link && \
         cd /var/tmp && python3 -c '
import os
for _ in range(25000):
    os.mkdir(\"d\")
    os.chdir(\"d\")
print(\"deep\")'",
    );
    assert!(
        code == 0 && out.contains("deep"),
        "planting in {}: {out}{err}",
        g.describe()
    );
}

/// A directory removed with `rm -rf --one-file-system` when dropped (a guest's tree too deep
/// for a recursive walk on the test's stack).
pub struct RemovedAtEnd(pub std::path::PathBuf);

impl Drop for RemovedAtEnd {
    fn drop(&mut self) {
        let _ = std::process::Command::new("rm")
            .args(["-rf", "--one-file-system", "--"])
            .arg(&self.0)
            .status();
    }
}
