//! A real containerd for the shim's tests: Debian's `containerd` (installed by `cargo xtask
//! setup`) started with its own root, state directory, socket and configuration (CRI off, or
//! on with the shim registered as runtime handler `svc`), the workspace's
//! `containerd-shim-svc-v1` on its `PATH` and a world's svcd as the shim's API (`SVC_SOCKET`);
//! `ctr` against it; and an OCI archive of the base image for `ctr image import`. Stopped (and
//! its mounts undone) on drop.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use crate::{
    registry::Registry,
    world::{World, image_dir, workspace_bin},
};

/// The namespace the tests' containers live in.
pub const NAMESPACE: &str = "svc-test";
/// The namespace containerd's CRI plugin keeps its images and containers in.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// The CRI runtime handler (`RuntimeClass` handler) the shim is registered as.
pub const CRI_HANDLER: &str = "svc";
/// The shim's runtime type (`ctr run --runtime`).
pub const RUNTIME: &str = "io.containerd.svc.v1";
/// The image [`oci_archive`] names.
pub const IMAGE: &str = "svc.test/base:1";

/// A running containerd.
#[derive(Debug)]
pub struct Containerd {
    pub dir: PathBuf,
    pub socket: PathBuf,
    /// The namespace `ctr` works in.
    namespace: &'static str,
    child: Child,
    /// The registry its CRI plugin pulls [`IMAGE`]'s registry's images from, when it has one.
    pub registry: Option<Registry>,
}

impl Containerd {
    /// Start containerd under `dir` for `w`'s svcd, its CRI plugin off; returns once its
    /// socket answers. `ctr` works in [`NAMESPACE`].
    pub fn start(w: &World, dir: &Path) -> Self {
        Self::start_with(
            w,
            dir,
            NAMESPACE,
            "disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n",
        )
    }

    /// Start containerd under `dir` for `w`'s svcd with its CRI plugin on, as a node's
    /// containerd serves kubelet ([`cri_config`]), pulling from `registry`; `ctr` works in
    /// [`CRI_NAMESPACE`].
    pub fn start_cri(w: &World, dir: &Path, registry: Registry) -> Self {
        let mut c = Self::start_with(w, dir, CRI_NAMESPACE, &cri_config(dir, registry.addr));
        c.registry = Some(registry);
        let log = c.log();
        assert!(
            !log.contains("failed to load plugin io.containerd.grpc.v1.cri"),
            "containerd's CRI plugin did not start:\n{log}"
        );
        c
    }

    fn start_with(w: &World, dir: &Path, namespace: &'static str, plugins: &str) -> Self {
        let bin = Path::new("/usr/bin/containerd");
        assert!(
            bin.exists(),
            "containerd is not installed: `cargo xtask setup` installs Debian's"
        );
        std::fs::create_dir_all(dir).expect("containerd dir");
        let socket = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        std::fs::write(
            &config,
            format!(
                "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\n{plugins}\
                 [grpc]\n  address = \"{sock}\"\n",
                root = dir.join("root").display(),
                state = dir.join("state").display(),
                sock = socket.display()
            ),
        )
        .expect("config.toml");
        let path = shim_path();
        let log = std::fs::File::create(dir.join("containerd.log")).expect("log");
        let child = Command::new(bin)
            .arg("--config")
            .arg(&config)
            .env("PATH", path)
            .env("SVC_SOCKET", &w.socket)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("containerd");
        let c = Self {
            dir: dir.to_path_buf(),
            socket,
            namespace,
            child,
            registry: None,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !c.ctr(&["version"]).status.success() {
            assert!(
                Instant::now() < deadline,
                "containerd did not start:\n{}",
                c.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        c
    }

    /// [`Containerd::start`] under `w`'s `containerd/`, with the base image ([`IMAGE`])
    /// imported.
    pub fn start_with_base(w: &World) -> Self {
        let c = Self::start(w, &w.dir.join("containerd"));
        c.import(&oci_archive(&w.dir));
        c
    }

    /// `ctr images import ARCHIVE`, which must succeed; the archive is removed then
    /// (containerd holds its own copy: the disk is the tests' to spare).
    pub fn import(&self, archive: &Path) {
        self.ctr_ok(&["images", "import", archive.to_str().expect("utf-8")]);
        let _ = std::fs::remove_file(archive);
    }

    /// `curl URL` (at most 5 s) in task `task` through `ctr task exec`: its exit code.
    pub fn curl(&self, task: &str, url: &str) -> Option<i32> {
        self.ctr(&curl_exec(
            task,
            &format!("curl{}", url.len()),
            "5",
            &[],
            url,
        ))
        .status
        .code()
    }

    /// `curl -H HEADER URL` (at most 20 s) in task `task` as exec `exec_id`, asserting it
    /// succeeded.
    pub fn curl_ok_with_header(&self, task: &str, exec_id: &str, header: &str, url: &str) {
        self.ctr_ok(&curl_exec(task, exec_id, "20", &["-H", header], url));
    }

    /// `ctr run -d` of task `name` from the base image on the shim's runtime, with each of
    /// `annotations` (`KEY=VALUE`), running `command`: as it went.
    pub fn run_detached(&self, name: &str, annotations: &[&str], command: &[&str]) -> Output {
        self.ctr(&run_detached_args(name, annotations, command))
    }

    /// [`Containerd::run_detached`], asserting success.
    pub fn run_detached_ok(&self, name: &str, annotations: &[&str], command: &[&str]) {
        self.ctr_ok(&run_detached_args(name, annotations, command));
    }

    /// `ctr --address SOCKET --namespace NAMESPACE ARGS`, as it went (at most two minutes).
    pub fn ctr(&self, args: &[&str]) -> Output {
        let mut c = Command::new("ctr");
        c.arg("--address")
            .arg(&self.socket)
            .args(["--namespace", self.namespace])
            .args(args);
        crate::output_within(&mut c, Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("ctr {args:?}: {e}\ncontainerd log:\n{}", self.log()))
    }

    /// `ctr ARGS` with `input` on its standard input (through a shell's pipe, then ended), as
    /// it went.
    pub fn ctr_with_input(&self, args: &[&str], input: &str) -> Output {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            "printf %s \"$0\" | exec \"$@\"",
            input,
            "ctr",
            "--address",
        ])
        .arg(&self.socket)
        .args(["--namespace", self.namespace])
        .args(args);
        crate::output_within(&mut c, Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("ctr {args:?} with input: {e}\n{}", self.log()))
    }

    /// `ctr ARGS` on a terminal (util-linux `script` gives it a pseudo-terminal, as a person's
    /// shell would, so `--tty` has a console to put in raw mode), as it went.
    pub fn ctr_on_a_terminal(&self, args: &[&str]) -> Output {
        let quote = |a: &str| format!("'{}'", a.replace('\'', "'\\''"));
        let mut line = vec![
            "ctr".to_owned(),
            "--address".to_owned(),
            quote(self.socket.to_str().expect("utf-8 socket path")),
            "--namespace".to_owned(),
            self.namespace.to_owned(),
        ];
        line.extend(args.iter().map(|a| quote(a)));
        let mut c = Command::new("script");
        c.args([
            "--quiet",
            "--return",
            "--command",
            &line.join(" "),
            "/dev/null",
        ]);
        crate::output_within(&mut c, Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("ctr {args:?} on a terminal: {e}\n{}", self.log()))
    }

    /// [`Containerd::ctr`], asserting success; its standard output.
    pub fn ctr_ok(&self, args: &[&str]) -> String {
        let out = self.ctr(args);
        assert!(
            out.status.success(),
            "ctr {args:?} failed ({}):\n{}{}\ncontainerd log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// containerd's log so far, without its start's plugin list (a hundred lines before
    /// anything a test did: a failing test's output shows what matters first).
    pub fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default();
        log.lines()
            .filter(|l| !l.contains("loading plugin \\\"") && !l.contains("to load plugin "))
            .fold(String::new(), |mut kept, l| {
                kept.push_str(l);
                kept.push('\n');
                kept
            })
    }

    /// `ctr events` from now on, its lines gathered as they come (`topic` and event JSON
    /// each); ended on drop.
    pub fn events(&self) -> Events {
        let mut child = Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", self.namespace, "events"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ctr events");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("ctr events' output");
        let gathered = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                gathered
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push(line);
            }
        });
        let events = Events { child, lines };
        // Subscribed only once an event comes through: a namespace label's update, made until
        // one is seen (an event sent before that would be missed).
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in 0.. {
            self.ctr_ok(&[
                "namespaces",
                "label",
                self.namespace,
                &format!("svc-test-events={n}"),
            ]);
            std::thread::sleep(Duration::from_millis(100));
            if events
                .seen()
                .iter()
                .any(|l| l.contains("/namespaces/update"))
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "`ctr events` showed no namespace update within 20 s"
            );
        }
        events
    }
}

/// A running `ctr events` ([`Containerd::events`]).
pub struct Events {
    child: Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Events {
    /// The lines so far.
    fn seen(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Wait (at most 30 s) for an event of `topic` naming `container`; its line.
    pub fn wait_for(&self, topic: &str, container: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        let id = format!("\"container_id\":\"{container}\"");
        loop {
            let seen = self.seen();
            if let Some(l) = seen
                .iter()
                .find(|l| l.split_whitespace().any(|w| w == topic) && l.contains(&id))
            {
                return l.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no {topic} event of {container} from `ctr events`; it said:\n{}",
                seen.join("\n")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Containerd {
    /// The shim processes of this containerd (their arguments name its socket).
    fn shims(&self) -> Vec<u32> {
        let socket = self.socket.display().to_string();
        let Ok(procs) = std::fs::read_dir("/proc") else {
            return Vec::new();
        };
        procs
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                args.first()
                    .is_some_and(|a| a.ends_with(b"containerd-shim-svc-v1"))
                    && args.contains(&socket.as_bytes())
            })
            .collect()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .output();
        let _ = self.child.wait();
        // Shims outlive containerd (a test that failed half-way leaves its tasks running):
        // this containerd's, which name its socket, go too.
        for pid in self.shims() {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).output();
        }
        let _ = Command::new("umount")
            .args(["-R", "--lazy"])
            .arg(self.dir.join("root"))
            .output();
    }
}

/// `ctr`'s arguments for [`Containerd::run_detached`].
fn run_detached_args<'a>(
    name: &'a str,
    annotations: &[&'a str],
    command: &[&'a str],
) -> Vec<&'a str> {
    let mut args = vec!["run", "-d", "--runtime", RUNTIME];
    for a in annotations {
        args.extend(["--annotation", a]);
    }
    args.extend([IMAGE, name]);
    args.extend(command);
    args
}

/// `ctr`'s arguments for a quiet `curl` of `url` in task `task` as exec `exec_id`, at most
/// `max_time` seconds, with `extra` curl arguments.
fn curl_exec<'a>(
    task: &'a str,
    exec_id: &'a str,
    max_time: &'a str,
    extra: &[&'a str],
    url: &'a str,
) -> Vec<&'a str> {
    let mut args = vec![
        "task",
        "exec",
        "--exec-id",
        exec_id,
        task,
        "curl",
        "-sS",
        "-o",
        "/dev/null",
        "--max-time",
        max_time,
    ];
    args.extend(extra);
    args.push(url);
    args
}

/// `PATH` with the workspace's `containerd-shim-svc-v1` first, as containerd and `svc doctor`
/// find the shim.
pub fn shim_path() -> String {
    let bin = workspace_bin("containerd-shim-svc-v1");
    let shim_dir = bin.parent().expect("target dir");
    format!(
        "{}:{}",
        shim_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The CRI plugin's part of the configuration of a containerd under `dir`: its root and
/// state are under containerd's (so under `dir`); the sandbox ("pause") image is [`IMAGE`],
/// which the test imports into [`CRI_NAMESPACE`]; `PullImage` of an image of [`IMAGE`]'s
/// registry (`svc.test`) pulls from the test's registry at `registry` (the test is offline);
/// the shim is runtime handler [`CRI_HANDLER`], the only one and so the default, which gets the pod's `svc.dev/*` annotations
/// (`pod_annotations`: the CRI plugin passes a pod's annotations to a runtime only if listed).
/// Pods use the node's network namespace (the tests ask for it), so CNI is never called:
/// its configuration directory is an empty one of the test's. The streaming server listens
/// on a port of the kernel's choosing (tests run side by side); AppArmor is not asked for (the
/// shim runs nothing under a profile: the svc sandbox is the boundary). containerd logs at
/// debug level, so its log shows each event the shim forwards (`/tasks/exit`, …).
pub fn cri_config(dir: &Path, registry: SocketAddr) -> String {
    let cni = dir.join("cni");
    std::fs::create_dir_all(&cni).expect("cni dir");
    format!(
        r#"[debug]
  level = "debug"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "{CRI_HANDLER}"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{CRI_HANDLER}]
      runtime_type = "io.containerd.svc.v1"
      pod_annotations = ["svc.dev/*"]
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."{host}"]
    endpoint = ["http://{registry}"]
"#,
        cni = cni.display(),
        host = IMAGE.split_once('/').map_or(IMAGE, |(h, _)| h),
    )
}

/// An OCI image archive (`ctr image import`'s input) of the base image's root file system,
/// named [`IMAGE`], at `<dir>/base.oci.tar`: one uncompressed layer, its config, manifest,
/// index and `oci-layout`, each blob under its sha256.
pub fn oci_archive(dir: &Path) -> PathBuf {
    oci_archive_of(dir, IMAGE, "base", None)
}

/// An OCI image archive named `name` at `<dir>/<stem>.oci.tar`: the base image's root file
/// system as its first layer and, when given, the tree `extra` as a second layer on top (a
/// file it holds is added, a link replaces what the base has there).
pub fn oci_archive_of(dir: &Path, name: &str, stem: &str, extra: Option<&Path>) -> PathBuf {
    let layout = dir.join(format!("layout-{stem}"));
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("blobs");
    let mut layers = Vec::new();
    for tree in std::iter::once(image_dir().join("rootfs")).chain(extra.map(Path::to_path_buf)) {
        let layer = blobs.join("layer.tmp");
        run(Command::new("tar")
            .arg("--numeric-owner")
            .arg("-C")
            .arg(&tree)
            .arg("-cf")
            .arg(&layer)
            .arg("."));
        layers.push(store(&blobs, &layer));
    }
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": ["/bin/sh"], "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|(d, _)| format!("sha256:{d}")).collect::<Vec<_>>()},
    });
    let (config_digest, config_size) = store_json(&blobs, &config);
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": format!("sha256:{config_digest}"), "size": config_size},
        "layers": layers.iter().map(|(d, size)| serde_json::json!(
            {"mediaType": "application/vnd.oci.image.layer.v1.tar",
             "digest": format!("sha256:{d}"), "size": size})).collect::<Vec<_>>(),
    });
    let (manifest_digest, manifest_size) = store_json(&blobs, &manifest);
    let tag = name.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "digest": format!("sha256:{manifest_digest}"), "size": manifest_size,
                       "platform": {"architecture": "amd64", "os": "linux"},
                       "annotations": {"io.containerd.image.name": name,
                                       "org.opencontainers.image.ref.name": tag}}],
    });
    std::fs::write(layout.join("index.json"), index.to_string()).expect("index.json");
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .expect("oci-layout");
    let archive = dir.join(format!("{stem}.oci.tar"));
    run(Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&archive)
        .args(["oci-layout", "index.json", "blobs"]));
    std::fs::remove_dir_all(&layout).expect("layout");
    archive
}

/// `value` as a blob: its digest and size.
fn store_json(blobs: &Path, value: &serde_json::Value) -> (String, u64) {
    let tmp = blobs.join("json.tmp");
    std::fs::write(&tmp, value.to_string()).expect("blob");
    store(blobs, &tmp)
}

/// The file `tmp` moved to its digest's name: its digest and size.
fn store(blobs: &Path, tmp: &Path) -> (String, u64) {
    let out = run(Command::new("sha256sum").arg(tmp));
    let digest = out.split_whitespace().next().expect("digest").to_owned();
    let size = std::fs::metadata(tmp).expect("blob").len();
    std::fs::rename(tmp, blobs.join(&digest)).expect("blob");
    (digest, size)
}

fn run(c: &mut Command) -> String {
    let out = c.output().expect("run");
    assert!(
        out.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
