//! Pod containers' root file systems through svcd's API (`POST/DELETE
//! /v1/sandboxes/{name}/roots`, as the containerd shim calls it), with the real runtime.
//!
//! - A pod container that filled its root's writable layer with many small files stalls no
//!   other sandbox's pod containers (container backend, real crun): while the flooding
//!   container's root is detached and its files removed, another sandbox's container root is
//!   attached, an exec runs in it and it is detached, about as fast as with no flood (a bound
//!   relative to a baseline measured in the same test). Its files are gone after, and nothing
//!   of them is left set aside in the sandbox's directory; what an earlier svcd left set aside
//!   (it ended mid-removal) goes at the sandbox's next attach.
//! - The guest's places an image's links keep out of a container's tree (`/dev` a link to
//!   `/`) are named in the attach's answer, its `sandbox.root-attached` event and svcd's log,
//!   on the container backend and on a VM (where the guest's agent binds them and says which
//!   it skipped).

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use svc_tests::{
    require_root,
    world::{World, image_dir, microvm_images},
};

/// Files the flooding container writes in its root.
const FILES: u32 = 200_000;

/// How many times slower than the baseline the other sandbox's round may be during the flood.
const SLOWER: u32 = 8;

/// A layer over the base image: the container's root is `[layer, base]` (top first).
fn layers(w: &World) -> serde_json::Value {
    let top = w.dir.join("flood-layer");
    std::fs::create_dir_all(top.join("etc")).expect("layer");
    std::fs::write(top.join("etc/svc-flood"), "flood\n").expect("layer file");
    let top = std::fs::canonicalize(&top).expect("canonical layer");
    let base = std::fs::canonicalize(image_dir().join("rootfs")).expect("canonical base");
    serde_json::json!([top, base])
}

/// Attach container `id`'s root in `sandbox`, asserting success: the answer.
fn attach(w: &World, sandbox: &str, id: &str, layers: &serde_json::Value) -> serde_json::Value {
    let body = serde_json::json!({"id": id, "layers": layers}).to_string();
    let route = format!("/v1/sandboxes/{sandbox}/roots");
    let (status, said) = w.api(&[], "POST", &route, Some(body.as_bytes()));
    assert_eq!(
        status,
        200,
        "attaching {id} to {sandbox}: {said}\n{}",
        w.svcd_log()
    );
    serde_json::from_str(&said).expect("an attach's answer")
}

/// Detach container `id`'s root from `sandbox`, asserting it was attached.
fn detach(w: &World, sandbox: &str, id: &str) {
    let route = format!("/v1/sandboxes/{sandbox}/roots/{id}");
    let (status, said) = w.api(&[], "DELETE", &route, None);
    assert_eq!(status, 200, "detaching {id} from {sandbox}: {said}");
    assert!(said.contains("\"was_attached\":true"), "{said}");
}

/// Run `script` in container `id`'s root in `sandbox`, asserting it exits 0.
fn run_in(w: &World, sandbox: &str, id: &str, script: &str) {
    let body = serde_json::json!({"argv": ["sh", "-c", script], "root": id});
    let (status, answer) = w.api_exec(sandbox, &body);
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("{\"exit\":0}"), "{script}: {answer}");
}

/// The other sandbox's pod container's whole life: attach, an exec in it, detach.
fn round(w: &World, layers: &serde_json::Value, id: &str) -> Duration {
    let began = Instant::now();
    attach(w, "rootcalm", id, layers);
    run_in(w, "rootcalm", id, "grep -q flood /etc/svc-flood");
    detach(w, "rootcalm", id);
    began.elapsed()
}

/// Entries of `dir` (none when it is missing).
fn entries(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

#[test]
fn a_container_that_filled_its_root_with_files_stalls_no_other_sandboxs_roots() {
    require_root();
    let w = World::start();
    for name in ["rootflood", "rootcalm"] {
        w.svc_ok(&["sandbox", "create", name]);
    }
    let layers = layers(&w);
    attach(&w, "rootflood", "f1", &layers);
    run_in(
        &w,
        "rootflood",
        "f1",
        &format!("mkdir /flood && cd /flood && seq 1 {FILES} | xargs touch"),
    );
    let state = w.dir.join("state/sandboxes/rootflood/ctr");
    assert!(state.join("f1/upper/flood").is_dir(), "the flood's files");

    // The first round warms up what every round reads; the baseline is the median of three.
    round(&w, &layers, "warm");
    let mut rounds: Vec<Duration> = (0..3)
        .map(|i| round(&w, &layers, &format!("base{i}")))
        .collect();
    rounds.sort();
    let baseline = rounds[1];

    // The flooding container's delete: its files removed, however long that takes.
    let flood = std::thread::scope(|s| {
        let removal = s.spawn(|| {
            let began = Instant::now();
            detach(&w, "rootflood", "f1");
            began.elapsed()
        });
        // Its detach has begun (unmounting in the guest takes milliseconds).
        std::thread::sleep(Duration::from_millis(300));
        let during = round(&w, &layers, "during");
        let removal_ended_after = !removal.is_finished();
        (
            during,
            removal.join().expect("removal"),
            removal_ended_after,
        )
    });
    let (during, removal, overlapped) = flood;
    eprintln!("baseline {baseline:?}, during the flood's removal {during:?}, removal {removal:?}");
    assert!(
        removal > baseline * SLOWER * 2,
        "removing {FILES} files took {removal:?}, too little against a round of {baseline:?} \
         to show a stall: the test proves nothing here"
    );
    assert!(
        during <= baseline * SLOWER,
        "the other sandbox's attach, exec and detach took {during:?} during the flood's \
         removal ({removal:?}), {baseline:?} without"
    );
    assert!(
        overlapped,
        "the flood's removal ({removal:?}) ended before the other sandbox's round: no overlap"
    );
    let left = entries(&state);
    assert!(left.is_empty(), "left in {}: {left:?}", state.display());

    // What an svcd that ended mid-removal left set aside goes at the sandbox's next attach.
    let planted = state.join(".gone-1.0-1/upper/flood");
    std::fs::create_dir_all(&planted).expect("a leftover");
    std::fs::write(planted.join("f"), "x").expect("a leftover's file");
    attach(&w, "rootflood", "f2", &layers);
    let left = entries(&state);
    assert_eq!(left, [state.join("f2")], "after the next attach");
    detach(&w, "rootflood", "f2");
    w.destroy_checked("rootflood");
    w.destroy_checked("rootcalm");
}

#[test]
fn the_places_an_images_links_keep_out_of_a_containers_tree_are_named() {
    require_root();
    skipped_named(&World::start(), &["sandbox", "create", "linkroots"]);
}

#[test]
fn the_places_a_vms_agent_skipped_in_a_containers_tree_are_named() {
    require_root();
    microvm_images();
    skipped_named(
        &World::start(),
        &["sandbox", "create", "--backend", "microvm", "linkroots"],
    );
}

/// Sandbox `linkroots` made with `create`; a root whose image has `/dev` a link to `/`:
/// `/dev` named as skipped in the answer, the event and the log, nothing bound through it.
fn skipped_named(w: &World, create: &[&str]) {
    w.svc_ok(create);
    let top = w.dir.join("links-layer");
    std::fs::create_dir_all(top.join("etc")).expect("layer");
    std::os::unix::fs::symlink("/", top.join("dev")).expect("link dev");
    let top = std::fs::canonicalize(&top).expect("canonical layer");
    let base = std::fs::canonicalize(image_dir().join("rootfs")).expect("canonical base");
    let answer = attach(w, "linkroots", "l1", &serde_json::json!([top, base]));
    let skipped: Vec<String> = serde_json::from_value(answer["skipped"].clone())
        .unwrap_or_else(|e| panic!("no skipped places in {answer}: {e}"));
    assert!(
        skipped
            .iter()
            .any(|s| s.starts_with("/dev:") && s.contains("symbolic link")),
        "{skipped:?}"
    );
    assert!(
        skipped.iter().all(|s| s.starts_with("/dev:")),
        "only /dev is skipped: {skipped:?}"
    );
    let events = w.events("sandbox.root-attached", "linkroots");
    assert_eq!(
        events.last().map(|e| e["detail"]["skipped"].clone()),
        Some(answer["skipped"].clone()),
        "{events:?}"
    );
    let log = w.svcd_log();
    assert!(
        log.contains("not bound into a container's root") && log.contains("/dev"),
        "svcd's log does not name the skipped place"
    );
    // Nothing was bound through the link: the guest's /dev is where it was, the tree's /dev
    // the image's link.
    run_in(w, "linkroots", "l1", "[ -L /dev ] && [ -d /proc/self ]");
    detach(w, "linkroots", "l1");
    w.destroy_checked("linkroots");
}
