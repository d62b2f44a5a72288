//! Session 46's changes attacked, against the real svcd, QEMU, virtiofsd and the guest's agent.
//!
//! - Microvm pod containers' root file systems (`POST/DELETE /v1/sandboxes/{name}/roots`):
//!   FOUND: one lock over every VM's attaches and detaches. A guest that stops its own agent
//!   (`kill -STOP`, as VM root may) makes the detach of its container's root wait the agent's
//!   whole 30 s limit while holding that lock: every other sandbox's attach (the shim's
//!   `Create` of any other pod's container) waited behind it. Fixed: the lock is per VM.
//!   Another API user may not detach a root from a sandbox that is not theirs (the root stays
//!   attached) nor exec with it. FOUND: the host overlay of a root (`<sandbox>/ctr/<id>/merged`)
//!   was mounted `nodev` but not `nosuid`, under directories every host user may pass
//!   (`StateDirectory=svc` is 0755): any host user read the guest's container files there
//!   and could run an image's setuid-root program set-id on the host. Fixed: `<sandbox>/ctr`
//!   is root's alone (0700) and the overlay is bind-remounted `nosuid,nodev`.
//! - A guest that powers its VM off (`sysrq o`, QEMU exits) with a root attached, once while
//!   svcd runs (then the root is detached, then the sandbox destroyed) and once while svcd is
//!   killed (adopted dead, then destroyed): nothing of the roots is left on the host (no
//!   mount under the sandbox's directory, no loop device over its containers' disk, no
//!   state). FOUND: the detach of a dead VM's root kept its tree's bind in the
//!   trees share, so its overlay, the containers' disk and its loop device stayed until the
//!   destroy. Fixed: the detach releases the host's side of the tree when the VM is gone.
//! - Attaches raced with the sandbox's destroy (four containers' roots at once): whichever
//!   wins, nothing of any root is left on the host once the sandbox is gone.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use svc_tests::{
    loop_devices_under, require_root,
    users::User,
    world::{World, microvm_images},
};

/// A directory to hand as a container's one layer (its canonical path, as the API wants).
fn layer(w: &World, name: &str) -> PathBuf {
    let dir = w.dir.join(name);
    std::fs::create_dir_all(dir.join("etc")).expect("layer");
    std::fs::write(dir.join("etc/svc-layer"), name).expect("layer file");
    std::fs::canonicalize(&dir).expect("canonical")
}

/// `POST /v1/sandboxes/{sandbox}/roots` as root: status, body.
fn attach(w: &World, sandbox: &str, id: &str, layer: &Path) -> (u16, String) {
    let body = serde_json::json!({"id": id, "layers": [layer]}).to_string();
    let route = format!("/v1/sandboxes/{sandbox}/roots");
    w.api(&[], "POST", &route, Some(body.as_bytes()))
}

/// Whether container `id`'s overlay is mounted on the host for `sandbox`.
fn overlay_mounted(w: &World, sandbox: &str, id: &str) -> bool {
    let merged = w
        .dir
        .join("state/sandboxes")
        .join(sandbox)
        .join("ctr")
        .join(id)
        .join("merged");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let shown = merged.display().to_string();
    mounts
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(shown.as_str()))
}

/// Sandbox `name`'s guest powers its VM off in `after` seconds (QEMU exits: `-no-reboot`).
fn power_off_in(w: &World, name: &str, after: u32) {
    let (code, _, err) = w.sh(
        name,
        &format!(
            "echo 1 > /proc/sys/kernel/sysrq; \
             setsid sh -c 'sleep {after}; echo o > /proc/sysrq-trigger' \
               </dev/null >/dev/null 2>&1 &"
        ),
    );
    assert_eq!(code, 0, "{err}");
}

/// Wait until process `pid` is gone (90 s at most).
fn wait_gone(pid: u64) {
    let deadline = Instant::now() + Duration::from_secs(90);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < deadline, "QEMU {pid} did not exit");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_guest_that_powers_off_with_a_root_attached_leaves_nothing_of_it() {
    require_root();
    microvm_images();
    let mut w = World::start_with("disk_mib = 64");
    let sandboxes = w.dir.join("state/sandboxes");
    for (name, kill) in [("vmoff", false), ("vmoffk", true)] {
        w.svc_ok(&["sandbox", "create", "--backend", "microvm", name]);
        let l = layer(&w, &format!("layer-{name}"));
        let (status, said) = attach(&w, name, "c1", &l);
        assert_eq!(status, 200, "{said}\n{}", w.svcd_log());
        let (code, _, err) = w.sh(name, "echo guest > /.svc/ctr/c1/written");
        assert_eq!(code, 0, "{err}");
        assert!(
            !loop_devices_under(&sandboxes.join(name)).is_empty(),
            "no containers' disk"
        );
        let pid = w.show(name)["pid"].as_u64().expect("pid");
        power_off_in(&w, name, if kill { 5 } else { 1 });
        if kill {
            w.kill_svcd();
            wait_gone(pid);
            w.start_svcd();
        } else {
            wait_gone(pid);
            let route = format!("/v1/sandboxes/{name}/roots/c1");
            let (status, said) = w.api(&[], "DELETE", &route, None);
            assert!(
                status < 500 || said.contains("not running"),
                "{status} {said}"
            );
            // The VM is gone: the detach itself released the root's tree bind, overlay,
            // containers' disk and its loop device, not the sandbox's destroy.
            let dir = sandboxes.join(name);
            let deadline = Instant::now() + Duration::from_secs(10);
            while !loop_devices_under(&dir).is_empty() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(200));
            }
            let left = loop_devices_under(&dir);
            assert!(
                left.is_empty(),
                "loop devices left after the detach: {left:?}"
            );
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
            let held: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split(' ').nth(4))
                .filter(|m| {
                    m.starts_with(&format!("{}/ctr", dir.display()))
                        || m.starts_with(&format!("{}/trees/", dir.display()))
                })
                .collect();
            assert!(held.is_empty(), "mounts left after the detach: {held:?}");
            assert!(
                !dir.join("ctr-disk").exists(),
                "the containers' disk is left"
            );
        }
        let s = w.show(name);
        let (id, link) = (
            u32::try_from(s["id"].as_u64().expect("id")).expect("id"),
            s["link"].as_str().unwrap_or_default().to_owned(),
        );
        w.svc_ok(&["sandbox", "destroy", name]);
        w.assert_gone(id, &link, u32::try_from(pid).expect("pid"), name);
        let left = loop_devices_under(&sandboxes.join(name));
        assert!(left.is_empty(), "loop devices left: {left:?}");
        assert!(
            !layer(&w, &format!("layer-{name}")).join("written").exists(),
            "the guest wrote into the layer"
        );
    }
}

#[test]
fn a_guest_that_stops_its_agent_holds_no_other_sandboxs_roots() {
    require_root();
    microvm_images();
    let w = World::start();
    for name in ["vmhog", "vmok"] {
        w.svc_ok(&["sandbox", "create", "--backend", "microvm", name]);
        assert_eq!(w.sh(name, "echo up").1, "up\n", "{}", w.svcd_log());
    }
    let hog = layer(&w, "layer-hog");
    let ok = layer(&w, "layer-ok");
    let (status, said) = attach(&w, "vmhog", "c1", &hog);
    assert_eq!(status, 200, "{said}\n{}", w.svcd_log());

    // Another API user may not detach it.
    let u = User::add(svc_tests::unique("roots46"), None);
    let ids = u.ids();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let (status, said) = w.api(&ids, "DELETE", "/v1/sandboxes/vmhog/roots/c1", None);
    assert!(status == 403 || status == 404, "{status} {said}");
    assert!(
        overlay_mounted(&w, "vmhog", "c1"),
        "detached by another user"
    );
    // Nor exec in its sandbox with that root.
    let body = serde_json::json!({"argv": ["true"], "root": "c1"}).to_string();
    let (status, said) = w.api(
        &ids,
        "POST",
        "/v1/sandboxes/vmhog/exec",
        Some(body.as_bytes()),
    );
    assert!(status == 403 || status == 404, "{status} {said}");
    // Nor any host user reach its files through the overlay svcd mounted in the sandbox's
    // directory; and an image's setid program is never set-id there.
    let merged = w
        .dir
        .join("state/sandboxes/vmhog/ctr/c1/merged/etc/svc-layer");
    let seen = std::process::Command::new("setpriv")
        .args(&ids)
        .args(["--inh-caps=-all", "--", "cat"])
        .arg(&merged)
        .output()
        .expect("setpriv");
    assert!(
        !seen.status.success(),
        "a host user read {}: {}",
        merged.display(),
        String::from_utf8_lossy(&seen.stdout)
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let line = mounts
        .lines()
        .find(|l| l.contains("vmhog/ctr/c1/merged"))
        .unwrap_or_default()
        .to_owned();
    let options = line.split(' ').nth(5).unwrap_or_default();
    assert!(
        options.split(',').any(|o| o == "nosuid"),
        "the overlay is set-id on the host: {line}"
    );

    // vmhog's guest stops its own agent for 60 s.
    svc_tests::vm::stop_agent_for(&w, "vmhog", 60);

    std::thread::scope(|s| {
        // The detach of vmhog's root waits on its stopped agent (the shim removing the
        // container)...
        let stuck = s.spawn(|| w.api(&[], "DELETE", "/v1/sandboxes/vmhog/roots/c1", None));
        std::thread::sleep(Duration::from_secs(2));
        // ... while another sandbox's attach goes on.
        let started = Instant::now();
        let (status, said) = attach(&w, "vmok", "c2", &ok);
        let took = started.elapsed();
        assert_eq!(status, 200, "{said}\n{}", w.svcd_log());
        assert!(
            took < Duration::from_secs(15),
            "vmok's attach waited {took:?} behind vmhog's stopped agent"
        );
        stuck.join().expect("the detach");
    });
    assert!(overlay_mounted(&w, "vmok", "c2"), "vmok's root is attached");
    let (status, said) = w.api(&[], "DELETE", "/v1/sandboxes/vmok/roots/c2", None);
    assert_eq!(status, 200, "{said}");
    w.destroy_checked("vmhog");
    w.destroy_checked("vmok");
}

#[test]
fn roots_attached_while_the_sandbox_is_destroyed_leave_nothing() {
    require_root();
    microvm_images();
    let w = World::start_with("disk_mib = 64");
    for (round, wait_ms) in [(1, 30u64), (2, 90), (3, 160), (4, 250)] {
        let name = format!("vmrace{round}");
        w.svc_ok(&["sandbox", "create", "--backend", "microvm", &name]);
        let s = w.show(&name);
        let (id, pid, link) = (
            u32::try_from(s["id"].as_u64().expect("id")).expect("id"),
            u32::try_from(s["pid"].as_u64().expect("pid")).expect("pid"),
            s["link"].as_str().unwrap_or_default().to_owned(),
        );
        let layers: Vec<PathBuf> = (0..4)
            .map(|i| layer(&w, &format!("layer-{name}-{i}")))
            .collect();
        std::thread::scope(|sc| {
            for (i, l) in layers.iter().enumerate() {
                let name = &name;
                let w = &w;
                sc.spawn(move || {
                    let (status, said) = attach(w, name, &format!("c{i}"), l);
                    eprintln!("{name} c{i}: {status} {said}");
                });
            }
            std::thread::sleep(Duration::from_millis(wait_ms));
            w.svc_ok(&["sandbox", "destroy", &name]);
        });
        // The attaches have all answered: nothing of theirs may be left.
        w.assert_gone(id, &link, pid, &name);
    }
}
