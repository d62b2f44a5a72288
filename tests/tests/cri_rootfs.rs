//! Each container of a pod runs on its own image's root file system (container backend), as
//! containerd unpacked it, inside its pod's one svc sandbox: kubelet's path through
//! containerd's CRI, with two images that differ by a file. Each container sees its own
//! image's file and not the other's, writes only its own tree, and is inside the same
//! perimeter (the allowed host reached with the credential swapped on the wire, a denied host
//! and an IP literal refused); removing a container leaves no mount in the guest or on the
//! host, and no layer of it in the sandbox's directory.
//!
//! The attacks: an image whose tree holds links where svcd binds the guest's files (`/dev` →
//! `/`, `/.svc` → `/`, `/etc/hosts` → `/etc/shadow`) gets nothing placed through them; the
//! guest (the pod sandbox's root) cannot unmount, move, replace or add to the containers'
//! mount points; a `/.svc` the guest made a link before the first container is refused,
//! nothing attached; an exec naming a root that is not attached is refused; another API user
//! cannot attach to the pod's sandbox.
//!
//! On a VM (`svc.dev/backend=microvm`): the two images' containers the same, an image's links
//! get nothing, a container's writes end at its sandbox's containers' disk (ENOSPC in the
//! guest), and an attached root outlives an svcd restart.

use svc_control::policy::pod;
use svc_tests::{
    containerd::{Containerd, oci_archive_of},
    cri::Cri,
    pods::{
        ALLOWED, Pod, STORED, assert_fenced, exec, remove_container, remove_pod, run_fenced_pod,
        start, try_run_container,
    },
    require_root,
    users::User,
    world::{EXAMPLE_TOKEN, World, microvm_images},
};

const IMAGE_A: &str = "svc.test/image-a:1";
const IMAGE_B: &str = "svc.test/image-b:1";
const IMAGE_LINKS: &str = "svc.test/image-links:1";

/// Image `name` (`stem` for its files): the base image plus a layer `build` fills.
fn import(c: &Containerd, w: &World, name: &str, stem: &str, build: impl FnOnce(&std::path::Path)) {
    let extra = w.dir.join(format!("extra-{stem}"));
    std::fs::create_dir_all(extra.join("etc")).expect("extra layer");
    build(&extra);
    c.import(&oci_archive_of(&w.dir, name, stem, Some(&extra)));
    let _ = std::fs::remove_dir_all(&extra);
}

/// The two images that differ by a file, and the one whose tree holds links.
fn import_images(c: &Containerd, w: &World) {
    import(c, w, IMAGE_A, "image-a", |d| {
        std::fs::write(d.join("etc/svc-image-a"), "a\n").expect("file a");
    });
    import(c, w, IMAGE_B, "image-b", |d| {
        std::fs::write(d.join("etc/svc-image-b"), "b\n").expect("file b");
    });
    import(c, w, IMAGE_LINKS, "image-links", |d| {
        std::fs::write(d.join("etc/svc-image-links"), "links\n").expect("file");
        std::os::unix::fs::symlink("/", d.join(".svc")).expect("link .svc");
        std::os::unix::fs::symlink("/", d.join("dev")).expect("link dev");
        std::os::unix::fs::symlink("/etc/shadow", d.join("etc/hosts")).expect("link hosts");
    });
}

/// Create and start container `name` of `image` in `pod`, running `sleep`: its id, or the
/// CRI's refusal.
fn container(cri: &Cri, pod: &Pod, name: &str, image: &str) -> Result<String, tonic::Status> {
    try_run_container(cri, &pod.id, &pod.config, name, image, &["sleep", "1000"])
}

/// The mount points of the pod sandbox's guest (its root's view).
fn guest_mounts(w: &World, sandbox: &str) -> Vec<String> {
    let (code, out, err) = w.sh(sandbox, "cut -d' ' -f5 /proc/self/mountinfo");
    assert_eq!(code, 0, "{err}");
    out.lines().map(str::to_owned).collect()
}

/// Container `links` of the links image in `pod` (on a VM when `microvm`): its tree attached
/// at its mount point and nothing outside it (on a VM, the guest kernel's own mount of the
/// tree in the trees share aside, and the guest's `/proc` bound in it); nothing bound through
/// the image's links (`/dev` → `/`, `/etc/hosts` → `/etc/shadow`); its own file read; the
/// guest's own `/etc` and `/dev` as they were. Its id.
fn links_place_nothing(w: &World, cri: &Cri, pod: &Pod, microvm: bool) -> String {
    let before = guest_mounts(w, &pod.sandbox);
    let links = container(cri, pod, "links", IMAGE_LINKS)
        .unwrap_or_else(|e| panic!("container links: {e:?}\n{}", w.svcd_log()));
    let after = guest_mounts(w, &pod.sandbox);
    let inside = format!("/.svc/ctr/{links}");
    let added: Vec<&String> = after.iter().filter(|m| !before.contains(m)).collect();
    assert!(added.contains(&&inside), "its tree is attached: {added:?}");
    let share = format!("{}/", svc_guest::proto::TREES_DIR);
    assert!(
        added
            .iter()
            .all(|m| m.starts_with(&inside) || (microvm && m.starts_with(&share))),
        "a mount outside {inside}: {added:?}"
    );
    for skipped in ["dev", "etc/hosts"] {
        let at = format!("{inside}/{skipped}");
        assert!(
            !added.contains(&&at),
            "bound through the image's link: {at}"
        );
    }
    if microvm {
        assert!(
            added.contains(&&format!("{inside}/proc")),
            "the guest's /proc is bound in the container: {added:?}"
        );
    }
    assert_eq!(
        read(cri, &links, "/etc/svc-image-links").as_deref(),
        Some("links")
    );
    let (code, out, _) = w.sh(
        &pod.sandbox,
        "cat /etc/shadow >/dev/null && ls /dev | head -3",
    );
    assert_eq!(
        code, 0,
        "the guest's own /etc and /dev are as they were: {out}"
    );
    links
}

/// `cat FILE` in container `id`: its text, or none when it has no such file.
fn read(cri: &Cri, id: &str, file: &str) -> Option<String> {
    let (code, out, _) = exec(cri, id, &["cat", file]);
    (code == 0).then(|| out.trim().to_owned())
}

#[test]
fn each_pod_container_runs_on_its_own_images_root_file_system() {
    require_root();
    two_images(&World::start(), &[]);
}

/// The same on a VM (`svc.dev/backend=microvm`, real QEMU): each container's tree is an
/// overlay on the host put into the guest through the trees share.
#[test]
fn each_microvm_pod_container_runs_on_its_own_images_root_file_system() {
    require_root();
    microvm_images();
    two_images(&World::start(), &[(pod::BACKEND, "microvm")]);
}

/// The two images' containers in one pod of the `extra` annotations (the backend).
fn two_images(w: &World, extra: &[(&str, &str)]) {
    let microvm = !extra.is_empty();
    w.store_secret(STORED, EXAMPLE_TOKEN, ALLOWED);
    let (c, cri) = start(w);
    import_images(&c, w);
    let pod = run_fenced_pod(w, &c, &cri, "images", extra);
    let a = container(&cri, &pod, "a", IMAGE_A)
        .unwrap_or_else(|e| panic!("container a: {e:?}\n{}", w.svcd_log()));
    let b = container(&cri, &pod, "b", IMAGE_B)
        .unwrap_or_else(|e| panic!("container b: {e:?}\n{}", w.svcd_log()));

    assert_eq!(read(&cri, &a, "/etc/svc-image-a").as_deref(), Some("a"));
    assert_eq!(read(&cri, &a, "/etc/svc-image-b"), None, "b's file in a");
    assert_eq!(read(&cri, &b, "/etc/svc-image-b").as_deref(), Some("b"));
    assert_eq!(read(&cri, &b, "/etc/svc-image-a"), None, "a's file in b");
    let (code, _, _) = w.sh(
        &pod.sandbox,
        "test -e /etc/svc-image-a || test -e /etc/svc-image-b",
    );
    assert_ne!(
        code, 0,
        "the pod sandbox's own root has neither image's file"
    );
    // Each writes its own tree.
    let (code, _, err) = exec(&cri, &a, &["sh", "-c", "echo mine > /etc/written-by-a"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(read(&cri, &a, "/etc/written-by-a").as_deref(), Some("mine"));
    assert_eq!(read(&cri, &b, "/etc/written-by-a"), None, "a's write in b");

    // The same perimeter for both.
    assert_fenced(w, &cri, &a, &pod.sandbox);
    assert_fenced(w, &cri, &b, &pod.sandbox);

    let mounts = guest_mounts(w, &pod.sandbox);
    for id in [&a, &b] {
        let at = format!("/.svc/ctr/{id}");
        assert!(mounts.contains(&at), "{at} in the guest: {mounts:?}");
    }

    // Removing a container takes its tree out of the guest and its layers off the host.
    remove_container(&cri, &a);
    let mounts = guest_mounts(w, &pod.sandbox);
    assert!(
        !mounts.iter().any(|m| m.contains(&a)),
        "a mount of the removed container is left in the guest: {mounts:?}"
    );
    let dir = w.dir.join("state/sandboxes").join(&pod.sandbox);
    for left in [dir.join("ctr").join(&a), dir.join("ctr-disk/fs").join(&a)] {
        assert!(!left.exists(), "{} is left", left.display());
    }
    let host = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !host.contains(&a),
        "a mount of the container is left on the host:\n{host}"
    );
    if microvm {
        // One tree left in the VM's trees share: b's.
        let trees: Vec<_> = std::fs::read_dir(dir.join("trees"))
            .expect("the VM's trees share")
            .map(|e| e.expect("entry").file_name())
            .collect();
        let host = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let shared: Vec<&str> = host.lines().filter(|l| l.contains("/trees")).collect();
        assert_eq!(
            trees.len(),
            1,
            "the trees share holds b's tree alone: {trees:?} {shared:#?} {}",
            w.svcd_log()
        );
    }
    assert_eq!(
        read(&cri, &b, "/etc/svc-image-b").as_deref(),
        Some("b"),
        "b runs on"
    );

    remove_pod(w, &c, &cri, &pod);
    let host = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    assert!(
        !host.contains(&b) && !host.contains(&dir.display().to_string()),
        "a mount of the container or its sandbox is left on the host:\n{host}"
    );
}

/// On a VM: an image whose `/dev` is a link to `/` and `/etc/hosts` to `/etc/shadow` gets
/// nothing placed through them; a container that writes until refused gets ENOSPC in the
/// guest, from its sandbox's containers' disk (`disk_mib`), and the host's disk holds no more
/// than that disk's size. A root attached through svcd's API outlives an svcd restart.
#[test]
fn a_microvm_pod_containers_links_place_nothing_its_writes_are_bounded_and_it_outlives_svcd() {
    require_root();
    microvm_images();
    let mut w = World::start_with("disk_mib = 64");
    w.store_secret(STORED, EXAMPLE_TOKEN, ALLOWED);
    let (c, cri) = start(&w);
    import_images(&c, &w);
    let pod = run_fenced_pod(&w, &c, &cri, "vm-links", &[(pod::BACKEND, "microvm")]);
    let links = links_place_nothing(&w, &cri, &pod, true);

    // A flood (its image's /dev is no device directory: `yes`, not /dev/zero): refused in
    // the guest once the containers' disk is full.
    let (code, out, err) = exec(
        &cri,
        &links,
        &["sh", "-c", "yes 0123456789abcdef 2>&1 >/flood"],
    );
    assert_ne!(code, 0, "the flood was never refused: {out}");
    assert!(
        out.contains("No space left on device"),
        "not ENOSPC: {out} {err}"
    );
    let dir = w.dir.join("state/sandboxes").join(&pod.sandbox);
    let image = std::fs::metadata(dir.join("ctr-disk/disk.img")).expect("the containers' disk");
    let on_host = std::os::unix::fs::MetadataExt::blocks(&image) * 512;
    assert!(
        on_host <= 64 << 20,
        "the containers' disk holds {on_host} bytes on the host"
    );
    let (code, _, err) = w.sh(&pod.sandbox, "echo ok > /root/after-flood");
    assert_eq!(code, 0, "the sandbox's own disk is another: {err}");
    remove_container(&cri, &links);
    assert!(
        !dir.join("ctr-disk").exists(),
        "the containers' disk is left"
    );

    // A root attached through svcd's API outlives an svcd restart and is found again.
    let top = w.dir.join("restart-layer");
    std::fs::create_dir_all(top.join("etc")).expect("layer");
    std::fs::write(top.join("etc/svc-restart"), "found-again\n").expect("marker");
    let base = svc_tests::world::image_dir().join("rootfs");
    let body = serde_json::json!({"id": "r1", "layers": [top, base]}).to_string();
    let roots = format!("/v1/sandboxes/{}/roots", pod.sandbox);
    let (status, said) = w.api(&[], "POST", &roots, Some(body.as_bytes()));
    assert_eq!(status, 200, "{said}");
    w.kill_svcd();
    w.start_svcd();
    let body = serde_json::json!({"argv": ["cat", "/etc/svc-restart"], "root": "r1"}).to_string();
    let route = format!("/v1/sandboxes/{}/exec", pod.sandbox);
    let (status, said) = w.api(&[], "POST", &route, Some(body.as_bytes()));
    // base64 of "found-again\n", the exec's standard output.
    assert!(
        status == 200 && said.contains("Zm91bmQtYWdhaW4K"),
        "{status} {said}"
    );
    let (status, said) = w.api(&[], "DELETE", &format!("{roots}/r1"), None);
    assert_eq!(status, 200, "{said}");
    assert!(said.contains("\"was_attached\":true"), "{said}");
    for left in [dir.join("ctr"), dir.join("ctr-disk")] {
        assert!(!left.exists(), "{} is left", left.display());
    }
    remove_pod(&w, &c, &cri, &pod);
}

#[test]
fn no_tree_places_a_root_outside_its_own_and_the_guest_cannot_replace_one() {
    require_root();
    let w = World::start();
    w.store_secret(STORED, EXAMPLE_TOKEN, ALLOWED);
    let (c, cri) = start(&w);
    import_images(&c, &w);
    let pod = run_fenced_pod(&w, &c, &cri, "links", &[]);
    let a = container(&cri, &pod, "a", IMAGE_A)
        .unwrap_or_else(|e| panic!("container a: {e:?}\n{}", w.svcd_log()));

    // Links in a container's tree are never followed: nothing lands outside its mount point.
    links_place_nothing(&w, &cri, &pod, false);

    // The guest's root cannot unmount, move, replace or add to the mount points.
    for (what, script) in [
        ("unmount a's tree", format!("umount -l /.svc/ctr/{a}")),
        ("move /.svc", "mv /.svc /.svc-moved".to_owned()),
        ("remove a's mount point", format!("rmdir /.svc/ctr/{a}")),
        ("add a mount point", "mkdir /.svc/ctr/planted".to_owned()),
        (
            "replace /.svc/ctr",
            "mv /.svc/ctr /.svc/ctr-moved".to_owned(),
        ),
    ] {
        let (code, _, _) = w.sh(&pod.sandbox, &script);
        assert_ne!(code, 0, "the guest could {what}");
    }
    assert_eq!(
        read(&cri, &a, "/etc/svc-image-a").as_deref(),
        Some("a"),
        "a's own tree"
    );

    // An exec naming a root that is not attached is refused, naming it.
    let body = serde_json::json!({"argv": ["true"], "root": "planted"}).to_string();
    let route = format!("/v1/sandboxes/{}/exec", pod.sandbox);
    let (status, said) = w.api(&[], "POST", &route, Some(body.as_bytes()));
    assert_eq!(status, 400, "{said}");
    assert!(
        said.contains("planted") && said.contains("is attached"),
        "{said}"
    );

    // Another API user may not attach to the pod's sandbox.
    let u = User::add(svc_tests::unique("rootfs"), None);
    let ids = u.ids();
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let body = serde_json::json!({"id": "x", "layers": ["/tmp"]}).to_string();
    let route = format!("/v1/sandboxes/{}/roots", pod.sandbox);
    let (status, said) = w.api(&ids, "POST", &route, Some(body.as_bytes()));
    assert_eq!(status, 403, "{said}");
    assert!(
        said.contains("attach a container's root file system"),
        "{said}"
    );
    remove_pod(&w, &c, &cri, &pod);

    // A `/.svc` the guest made a link before its pod's first container: refused, nothing
    // attached, nothing left.
    let pod = run_fenced_pod(&w, &c, &cri, "planted", &[]);
    let (code, _, err) = w.sh(&pod.sandbox, "ln -s / /.svc");
    assert_eq!(code, 0, "{err}");
    let before = guest_mounts(&w, &pod.sandbox);
    let refused = container(&cri, &pod, "a", IMAGE_A).expect_err("attached through a link");
    assert!(refused.message().contains("symbolic link"), "{refused:?}");
    assert_eq!(
        guest_mounts(&w, &pod.sandbox),
        before,
        "nothing mounted in the guest"
    );
    let layers = w.dir.join("state/sandboxes").join(&pod.sandbox).join("ctr");
    let left = std::fs::read_dir(&layers).map_or(0, Iterator::count);
    assert_eq!(left, 0, "layers left in {}", layers.display());
    remove_pod(&w, &c, &cri, &pod);
}
