//! `cargo xtask oci-image`: the node image of svcd's Kubernetes DaemonSet
//! (deploy/kubernetes/daemonset.yaml) as an OCI image layout, written here without Docker or a
//! registry: `oci-layout`, `index.json`, and under `blobs/sha256/` the manifest, the config and
//! one gzip layer, each named by its digest.
//!
//! The layer holds what the Debian package installs to run (`/usr/sbin/svcd`, `/usr/bin/svc`,
//! the guest binaries in `/usr/lib/svc/guest`, and the containerd shim `containerd-shim-svc-v1`,
//! built here too) and
//! what svcd runs beside them for the container backend (`nft`, `ip`, `ssh`, the OCI runtime),
//! each with the shared libraries `ldd` says it loads, taken from this machine (Debian's
//! merged /usr: `/lib` and friends are links into `/usr`). The entries are written in order,
//! owned by root, with a fixed time: the same inputs make the same digests.

use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};

use crate::{package, ui};

/// What `cargo xtask oci-image` builds.
pub struct Options {
    /// The image from the debug build (tests: fast) instead of the release build.
    pub debug: bool,
    /// The directory the layout is written to (replaced).
    pub out: PathBuf,
    /// The image's tag in the layout (`index.json`'s `org.opencontainers.image.ref.name`);
    /// default: the workspace's version.
    pub tag: Option<String>,
}

/// The image's name, as the DaemonSet and the docs call it.
pub const NAME: &str = "svc-node";

/// Programs svcd runs for the container backend, looked up on this machine's PATH: the ones
/// missing here are left out, said loudly (svcd names what it misses when it needs it).
const HELPERS: [&str; 5] = ["nft", "ip", "ssh", "runc", "crun"];

/// The time every entry carries and the config's `created`: the epoch, for the same digests
/// from the same inputs.
const EPOCH: &str = "1970-01-01T00:00:00Z";

/// Build the binaries and write the layout; its path.
pub fn run(o: &Options) -> anyhow::Result<PathBuf> {
    ui::heading("oci-image: svcd's node image as an OCI image layout (no Docker)");
    let version = package::workspace_version()?;
    let tag = o.tag.clone().unwrap_or_else(|| version.clone());
    package::build(o.debug)?;
    crate::images::guest_bins()?;
    let mut tree = Tree::default();
    let profile = Path::new("target").join(if o.debug { "debug" } else { "release" });
    tree.file("usr/sbin/svcd", &profile.join("svcd"), 0o755)?;
    tree.file("usr/bin/svc", &profile.join("svc"), 0o755)?;
    // The shim is what containerd on the node runs for `runtimeClassName: svc` (and what the
    // containerd tests register): always built, always in the image.
    let mut shim_build = std::process::Command::new("cargo");
    shim_build.args(["build", "--quiet", "-p", "containerd-shim-svc-v1"]);
    if !o.debug {
        shim_build.arg("--release");
    }
    ui::run(&mut shim_build)?;
    tree.file(
        "usr/bin/containerd-shim-svc-v1",
        &profile.join("containerd-shim-svc-v1"),
        0o755,
    )?;
    for name in package::GUEST_BINS {
        let from = Path::new(crate::images::GUEST_DIR).join(name);
        tree.file(&format!("{}/{name}", package::GUEST_DIR), &from, 0o755)?;
    }
    for helper in HELPERS {
        match which(helper) {
            Some(path) => tree.host_file(&path)?,
            None => ui::warn(&format!("{helper} is not on this machine's PATH: left out")),
        }
    }
    for elf in tree.files() {
        for lib in libraries(&elf)? {
            tree.host_file(&lib)?;
        }
    }
    tree.merged_usr();
    let layout = write_layout(&o.out.join(NAME), &tree, &tag, &version)?;
    ui::ok(&format!("{} (tag {tag})", layout.display()));
    Ok(layout)
}

/// One entry of the layer.
#[derive(Debug, Clone)]
enum Entry {
    Dir,
    File { from: PathBuf, mode: u32 },
    Link { to: String },
}

/// The layer's entries by path (relative, without a leading `/`).
#[derive(Debug, Default)]
struct Tree(BTreeMap<String, Entry>);

impl Tree {
    /// `path` in the image, with `from`'s content.
    fn file(&mut self, path: &str, from: &Path, mode: u32) -> anyhow::Result<()> {
        if !from.is_file() {
            bail!("{} is not built (for {path} in the image)", from.display());
        }
        self.parents(path);
        self.0.insert(
            path.to_owned(),
            Entry::File {
                from: from.to_owned(),
                mode,
            },
        );
        Ok(())
    }

    /// A file of this machine at its own path: its real file, and a link at the path asked
    /// for when that is a link's name (`libnftables.so.1` -> `libnftables.so.1.1.0`).
    fn host_file(&mut self, path: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let real = std::fs::canonicalize(path).with_context(|| format!("{}", path.display()))?;
        let mode = std::fs::metadata(&real)?.permissions().mode() & 0o7777;
        let rel = |p: &Path| p.to_string_lossy().trim_start_matches('/').to_owned();
        self.file(&rel(&real), &real, mode)?;
        let dir = path.parent().context("a file has a directory")?;
        let asked = std::fs::canonicalize(dir)?.join(path.file_name().context("a name")?);
        if asked != real {
            let to = real.file_name().context("a name")?.to_string_lossy();
            let same_dir = real.parent() == asked.parent();
            let to = if same_dir {
                to.into_owned()
            } else {
                real.to_string_lossy().into_owned()
            };
            self.parents(&rel(&asked));
            self.0.insert(rel(&asked), Entry::Link { to });
        }
        Ok(())
    }

    /// Debian's merged /usr: `/bin`, `/sbin`, `/lib`, `/lib64` are links into `/usr`.
    fn merged_usr(&mut self) {
        for dir in ["bin", "sbin", "lib", "lib64"] {
            self.0.insert(
                dir.to_owned(),
                Entry::Link {
                    to: format!("usr/{dir}"),
                },
            );
        }
        for dir in ["tmp", "etc", "run", "var/lib/svc", "var/log/svc"] {
            self.parents(&format!("{dir}/x"));
        }
    }

    fn parents(&mut self, path: &str) {
        let mut at = String::new();
        for part in path
            .split('/')
            .collect::<Vec<_>>()
            .split_last()
            .map_or(&[][..], |(_, p)| p)
        {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            self.0.entry(at.clone()).or_insert(Entry::Dir);
        }
    }

    /// The sources of the regular files, for `ldd`.
    fn files(&self) -> Vec<PathBuf> {
        self.0
            .values()
            .filter_map(|e| match e {
                Entry::File { from, .. } => Some(from.clone()),
                _ => None,
            })
            .collect()
    }
}

/// A program's path on PATH.
fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The shared libraries `ldd` says `elf` loads (none for a static binary).
fn libraries(elf: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(elf)
        .output()
        .with_context(|| format!("running ldd {}", elf.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        // "not a dynamic executable": statically linked, nothing to add.
        return Ok(Vec::new());
    }
    let mut libs = Vec::new();
    for line in text.lines() {
        let path = match line.split_once("=>") {
            Some((_, rest)) => rest.split_whitespace().next(),
            None => line
                .split_whitespace()
                .next()
                .filter(|p| p.starts_with('/')),
        };
        match path {
            Some(p) if p.starts_with('/') => libs.push(PathBuf::from(p)),
            _ if line.contains("not found") => bail!("{}: {}", elf.display(), line.trim()),
            _ => {}
        }
    }
    Ok(libs)
}

/// The layer (tar, gzip), its config, manifest and index under `dir`; `dir`.
fn write_layout(dir: &Path, tree: &Tree, tag: &str, version: &str) -> anyhow::Result<PathBuf> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let tar = layer_tar(tree)?;
    let diff_id = sha256(&tar);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar)?;
    let layer = gz.finish()?;
    let config = serde_json::to_vec(&serde_json::json!({
        "created": EPOCH,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": ["/usr/sbin/svcd"],
            "Cmd": ["run"],
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Labels": labels(version),
        },
        "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{diff_id}")] },
        "history": [{ "created": EPOCH, "created_by": "cargo xtask oci-image" }],
    }))?;
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": blob(&blobs, "application/vnd.oci.image.config.v1+json", &config)?,
        "layers": [blob(&blobs, "application/vnd.oci.image.layer.v1.tar+gzip", &layer)?],
        "annotations": labels(version),
    }))?;
    let mut entry = blob(
        &blobs,
        "application/vnd.oci.image.manifest.v1+json",
        &manifest,
    )?;
    entry["annotations"] = serde_json::json!({ "org.opencontainers.image.ref.name": tag });
    entry["platform"] = serde_json::json!({ "architecture": "amd64", "os": "linux" });
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [entry],
    });
    std::fs::write(dir.join("index.json"), serde_json::to_vec_pretty(&index)?)?;
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#)?;
    Ok(dir.to_owned())
}

fn labels(version: &str) -> serde_json::Value {
    serde_json::json!({
        "org.opencontainers.image.title": NAME,
        "org.opencontainers.image.description": "svcd, the svc host supervisor, for a Kubernetes node",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.licenses": "MIT OR Apache-2.0",
    })
}

/// Write `bytes` as a blob; its descriptor.
fn blob(blobs: &Path, media_type: &str, bytes: &[u8]) -> anyhow::Result<serde_json::Value> {
    let digest = sha256(bytes);
    std::fs::write(blobs.join(&digest), bytes)?;
    Ok(serde_json::json!({
        "mediaType": media_type,
        "digest": format!("sha256:{digest}"),
        "size": bytes.len(),
    }))
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The tree as a tar archive: entries in path order, root's, at the epoch.
fn layer_tar(tree: &Tree) -> anyhow::Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, entry) in &tree.0 {
        let mut h = tar::Header::new_ustar();
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        match entry {
            Entry::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                tar.append_data(&mut h, format!("{path}/"), std::io::empty())?;
            }
            Entry::File { from, mode } => {
                let bytes = std::fs::read(from).with_context(|| format!("{}", from.display()))?;
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(bytes.len() as u64);
                tar.append_data(&mut h, path, bytes.as_slice())?;
            }
            Entry::Link { to } => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                tar.append_link(&mut h, path, to)?;
            }
        }
    }
    Ok(tar.into_inner()?)
}
