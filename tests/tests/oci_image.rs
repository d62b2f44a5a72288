//! svcd's node image for Kubernetes (`cargo xtask oci-image`), read by tools that are not
//! ours: `sha256sum` for every blob's name, `skopeo` as a registry client reads an OCI layout,
//! `umoci` unpacking it (it checks each blob against its digest), and the unpacked root file
//! system running svcd, svc and the programs svcd runs, each with only the libraries the image
//! carries. A copy with one byte of its layer changed is refused.
//!
//! The layout is `target/oci/svc-node`, written by `cargo xtask oci-image --debug`
//! (`cargo xtask test` writes it before the tests).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

fn layout() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .join("target/oci/svc-node");
    assert!(
        dir.join("index.json").is_file(),
        "{}: no OCI layout: run `cargo xtask oci-image --debug` first",
        dir.display()
    );
    dir
}

/// Run `cmd`; its output, whether it succeeded or not.
fn run(cmd: &mut Command) -> std::process::Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (cargo xtask setup --tests installs it)"))
}

/// Run `cmd`, which must succeed; its standard output.
fn ok(cmd: &mut Command) -> String {
    String::from_utf8_lossy(&svc_tests::run_cmd(cmd).stdout).into_owned()
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The image's one manifest in `index.json`: its digest (hex) and tag.
fn manifest_entry(dir: &Path) -> (String, String) {
    let index = json(&std::fs::read_to_string(dir.join("index.json")).expect("index.json"));
    let manifests = index["manifests"].as_array().expect("manifests");
    assert_eq!(manifests.len(), 1, "{index}");
    let m = &manifests[0];
    assert_eq!(m["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    let digest = m["digest"].as_str().expect("digest");
    let tag = m["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .expect("a tag");
    (
        digest.strip_prefix("sha256:").expect("sha256").to_owned(),
        tag.to_owned(),
    )
}

#[test]
fn the_node_image_is_a_layout_others_read_unpack_and_run() {
    let dir = layout();
    assert_eq!(
        std::fs::read_to_string(dir.join("oci-layout")).expect("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#
    );
    // Every blob is named by its content's SHA-256, as sha256sum computes it.
    let blobs = dir.join("blobs/sha256");
    for entry in std::fs::read_dir(&blobs).expect("blobs") {
        let path = entry.expect("entry").path();
        let sum = ok(Command::new("sha256sum").arg(&path));
        let name = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        assert_eq!(
            sum.split_whitespace().next(),
            Some(name.as_str()),
            "{}",
            path.display()
        );
    }
    let (digest, tag) = manifest_entry(&dir);
    let reference = format!("oci:{}:{tag}", dir.display());
    let raw = ok(Command::new("skopeo").args(["inspect", "--raw", &reference]));
    assert_eq!(
        raw.as_bytes(),
        std::fs::read(blobs.join(&digest)).expect("the manifest blob"),
        "skopeo reads the manifest index.json names"
    );
    let manifest = json(&raw);
    let inspect = json(&ok(Command::new("skopeo").args(["inspect", &reference])));
    assert_eq!(inspect["Digest"], format!("sha256:{digest}"));
    assert_eq!(inspect["Os"], "linux");
    assert_eq!(inspect["Architecture"], "amd64");
    assert_eq!(
        inspect["Layers"],
        serde_json::json!([manifest["layers"][0]["digest"]])
    );
    assert_eq!(
        inspect["Labels"]["org.opencontainers.image.title"],
        "svc-node"
    );

    let work = tempfile_dir("unpack");
    let bundle = work.join("bundle");
    ok(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:{tag}", dir.display()))
        .arg(&bundle));
    let config = json(&std::fs::read_to_string(bundle.join("config.json")).expect("config.json"));
    assert_eq!(
        config["process"]["args"],
        serde_json::json!(["/usr/sbin/svcd", "run"])
    );
    // The image runs: each program with only the libraries in the image, the /dev/null every
    // container runtime gives a container, and the host's account files the DaemonSet mounts
    // (deploy/kubernetes/daemonset.yaml).
    let rootfs = bundle.join("rootfs");
    std::fs::create_dir_all(rootfs.join("dev")).expect("dev");
    ok(Command::new("mknod")
        .arg(rootfs.join("dev/null"))
        .args(["c", "1", "3"]));
    for file in ["passwd", "group"] {
        std::fs::copy(Path::new("/etc").join(file), rootfs.join("etc").join(file)).expect(file);
    }
    // (`cargo xtask setup` installs nftables, iproute2, openssh-client and runc here, so the
    // image has them.)
    for argv in [
        &["/usr/sbin/svcd", "--version"][..],
        &["/usr/bin/svc", "--version"],
        &["/usr/sbin/nft", "--version"],
        &["/usr/sbin/ip", "-V"],
        &["/usr/bin/ssh", "-V"],
        &["/usr/sbin/runc", "--version"],
    ] {
        ok(Command::new("chroot").arg(&rootfs).args(argv));
    }
    for guest in ["svc-microvm-agent", "svc-git-ssh", "svc-supervise"] {
        assert!(
            rootfs.join("usr/lib/svc/guest").join(guest).is_file(),
            "{guest}"
        );
    }
    std::fs::remove_dir_all(&work).expect("clean up");
}

#[test]
fn a_layout_with_a_changed_layer_byte_is_refused() {
    let dir = layout();
    let work = tempfile_dir("corrupt");
    let copy = work.join("svc-node");
    ok(Command::new("cp").arg("-a").arg(&dir).arg(&copy));
    let (digest, tag) = manifest_entry(&copy);
    let manifest =
        json(&std::fs::read_to_string(copy.join("blobs/sha256").join(&digest)).expect("manifest"));
    let layer = manifest["layers"][0]["digest"].as_str().expect("a layer");
    let path = copy
        .join("blobs/sha256")
        .join(layer.strip_prefix("sha256:").expect("sha256"));
    let mut bytes = std::fs::read(&path).expect("the layer");
    // A byte of the gzip trailer's CRC: every tar header still reads, so what refuses it is
    // the check of the bytes themselves (the blob's digest, or gzip's checksum), never a tar
    // parser that happened to meet a broken header first.
    let crc = bytes.len() - 8;
    bytes[crc] ^= 0x01;
    std::fs::write(&path, bytes).expect("write");
    let out = run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:{tag}", copy.display()))
        .arg(work.join("bundle")));
    assert!(!out.status.success(), "umoci unpacked a changed layer");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("digest") || err.contains("checksum") || err.contains("verif"),
        "{err}"
    );
    std::fs::remove_dir_all(&work).expect("clean up");
}

/// A fresh directory under the system's temporary directory.
fn tempfile_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("svc-oci-{what}-{}", std::process::id()));
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("clean up an old one");
    }
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}
