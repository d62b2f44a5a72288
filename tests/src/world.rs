//! A whole svc installation in network namespaces, for the end-to-end tests: svcd (the real
//! binary) runs in a `host` namespace as it would on a host, and an `outside` namespace plays
//! the internet: an authoritative DNS server, HTTPS servers for the agent host, the code-host
//! family (with a real `git http-backend`), an extra allowed host and a host that must stay
//! unreachable. Nothing leaves the namespaces.
//!
//! ```text
//!  sandbox (netns, made by svcd)     host (ns): svcd            outside (ns)
//!  eth0 10.203.N.2/30  <->  svcN 10.203.N.1/30   ho 192.0.2.1/24 <-> oh 192.0.2.x/24
//! ```

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{NetNs, PinDir};

/// The `svc` command line against this world's svcd.
mod cli;
pub use cli::offline_microvm_doctor;
/// svcd's metrics, the sandbox links on the host and svcd's nftables link set.
mod observe;
/// Building a world: namespaces, the outside world, svcd.
mod start;

/// The names the outside world serves, and their addresses.
pub const NAMES: &[(&str, &str)] = &[
    ("api.agent.test", "192.0.2.10"),
    ("console.agent.test", "192.0.2.11"),
    ("code.test", "192.0.2.12"),
    ("api.code.test", "192.0.2.13"),
    ("uploads.code.test", "192.0.2.14"),
    ("archive.code.test", "192.0.2.15"),
    ("allowed.example.test", "192.0.2.20"),
    ("forbidden.example.test", "192.0.2.66"),
];
/// Names the outside world's DNS answers with another name's address (no servers of their
/// own): db.example.test shares allowed.example.test's, as names behind one load balancer do.
pub const SHARED_NAMES: &[(&str, &str)] = &[("db.example.test", "192.0.2.20")];
/// The operator's forward proxy in a world started with it.
pub const FORWARD_PROXY: &str = "192.0.2.80";

/// Where the code host serves git over SSH in a world started with it (code.test's address).
pub const CODE_SSH_ADDR: &str = "192.0.2.12";
/// The outside world's DNS server.
pub const DNS: &str = "192.0.2.53";
/// The real code-host token the outside world accepts.
pub const CODE_TOKEN: &str = "real-code-host-token-4f1c";
/// Where svcd serves /metrics inside the world's host namespace.
pub const METRICS_PORT: u16 = 9464;

/// The longest one `svc` command in a test may run (a microvm create under TCG takes well under
/// a minute here): past it the command is killed and its test fails with svcd's log.
pub const CLI_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);
/// The real token of allowed.example.test.
pub const EXAMPLE_TOKEN: &str = "real-example-token-77aa";

/// Path of a workspace binary next to the test executable.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // Tests live in target/<profile>/deps, binaries (like the demo) in target/<profile>.
    let here = exe.parent().expect("exe dir");
    let dir = if here.ends_with("deps") {
        here.parent().expect("target dir")
    } else {
        here
    };
    let bin = dir.join(name);
    assert!(
        bin.exists(),
        "{} is missing: `cargo test --workspace` builds it (or `cargo build --bins`)",
        bin.display()
    );
    crate::stale::warn_if_stale(&bin);
    bin
}

/// The sandboxes' base image, built by `cargo xtask images` (which `cargo xtask test` runs):
/// `target/images/base`, or `SVC_TEST_IMAGE`.
pub fn image_dir() -> PathBuf {
    let dir = std::env::var_os("SVC_TEST_IMAGE").map_or_else(
        || {
            let bin = workspace_bin("svc");
            let target = bin
                .parent()
                .and_then(Path::parent)
                .expect("target directory");
            target.join("images/base")
        },
        PathBuf::from,
    );
    assert!(
        dir.join("stamp").exists(),
        "the sandboxes' base image {} is missing: build it with `cargo xtask images` (`cargo \
         xtask test` does)",
        dir.display()
    );
    if let Some(target) = dir.parent().and_then(Path::parent) {
        crate::stale::warn_if_image_stale(&dir, target);
    }
    dir
}

/// The installation.
#[derive(Debug)]
pub struct World {
    pub host: NetNs,
    pub outside: NetNs,
    pub pins: PinDir,
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub config: PathBuf,
    /// The cgroup svcd makes the sandboxes' cgroups under (unique to this world).
    pub cgroup_parent: String,
    /// The code host's SSH server (192.0.2.12 port 22 in the outside world) when the world
    /// was started with it; svcd's relay uses its known_hosts and agent.
    pub ssh: Option<crate::ssh_host::SshHost>,
    /// The svcd binary [`World::start_svcd`] runs: the workspace's, or an installed one
    /// ([`World::start_installed`]).
    pub svcd_exe: PathBuf,
    /// tinyproxy, in a world started with the operator's forward proxy.
    forward_proxy: Option<Child>,
    svcd: Option<Child>,
    outside_world: Child,
}

/// `git ARGS…` in `dir` (its own `HOME`, no system config, the tests' author), which must
/// succeed; its standard output.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .env("GIT_AUTHOR_NAME", "svc test")
        .env("GIT_AUTHOR_EMAIL", "test@svc.invalid")
        .env("GIT_COMMITTER_NAME", "svc test")
        .env("GIT_COMMITTER_EMAIL", "test@svc.invalid")
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A bare repository `owner/repo.git` under `root` with one commit on main, accepting pushes.
pub fn bare_repo(root: &Path, owner: &str, repo: &str) {
    let bare = root.join(owner).join(format!("{repo}.git"));
    std::fs::create_dir_all(&bare).expect("repo dir");
    git(&bare, &["init", "--bare", "-q", "-b", "main"]);
    git(&bare, &["config", "http.receivepack", "true"]);
    git(&bare, &["config", "receive.advertisePushOptions", "true"]);
    let work = root.join(format!(".work-{owner}-{repo}"));
    std::fs::create_dir_all(&work).expect("work dir");
    git(&work, &["init", "-q", "-b", "main"]);
    std::fs::write(work.join("README"), format!("{owner}/{repo}\n")).expect("write");
    git(&work, &["add", "README"]);
    git(&work, &["commit", "-q", "-m", "first"]);
    git(
        &work,
        &["push", "-q", bare.to_str().expect("utf-8"), "main"],
    );
    let _ = std::fs::remove_dir_all(&work);
}

impl World {
    /// Start (or restart) svcd in the host namespace and wait for its socket.
    pub fn start_svcd(&mut self) {
        self.start_svcd_with_env(&[]);
    }

    /// `svcd --config <this world's> run` in the world's host namespace (nsenter --net, not
    /// `ip netns exec`: the latter remounts /sys, hiding bpffs pins).
    pub fn svcd_command(&self) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.host.name))
            .arg(&self.svcd_exe)
            .arg("--config")
            .arg(&self.config)
            .arg("run");
        cmd
    }

    /// [`World::start_svcd`] with environment changes (`None`: removed).
    pub fn start_svcd_with_env(&mut self, env: &[(&str, Option<&str>)]) {
        let _ = std::fs::remove_file(self.dir.join("svcd.ready"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("svcd.log"))
            .expect("svcd.log");
        let mut child = self.svcd_command();
        child
            .env(
                "RUST_LOG",
                std::env::var("SVC_TEST_SVCD_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("NO_COLOR", "1")
            // The code-host CLI's login svcd may fall back to: this world's own (empty unless
            // a test logs in), never the machine's.
            .env("GH_CONFIG_DIR", self.dir.join("gh"))
            .envs(microvm_env())
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in env {
            match v {
                Some(v) => child.env(k, v),
                None => child.env_remove(k),
            };
        }
        let child = child.spawn().expect("svcd");
        self.svcd = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let up = self.svc(&["sandbox", "list", "--json"]);
            if up.status.success() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "svcd did not answer within 20 s; its log:\n{}",
                self.svcd_log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL svcd (no clean-up of any kind).
    pub fn kill_svcd(&mut self) {
        if let Some(mut c) = self.svcd.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn svcd_pid(&self) -> Option<u32> {
        self.svcd.as_ref().map(Child::id)
    }

    pub fn svcd_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("svcd.log")).unwrap_or_default()
    }

    /// SIGTERM to svcd (its graceful stop), and wait until it has ended (90 s at most).
    pub fn stop_svcd(&self) {
        let pid = self.svcd_pid().expect("svcd runs");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).expect("pid")),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
        while std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| !s.contains(") Z "))
        {
            assert!(std::time::Instant::now() < deadline, "svcd did not stop");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// What reached the outside world (DNS questions and HTTP requests), one JSON object each.
    pub fn received(&self) -> Vec<serde_json::Value> {
        read_jsonl(&self.dir.join("outside/received.jsonl"))
    }

    /// The outside world's token endpoint so far: (refreshes granted, requests refused).
    pub fn token_grants(&self) -> (usize, usize) {
        let tokens: Vec<_> = self
            .received()
            .into_iter()
            .filter(|r| r["kind"] == "token")
            .collect();
        let granted = tokens.iter().filter(|r| r["granted"] == true).count();
        (granted, tokens.len() - granted)
    }

    /// The `Authorization` the outside world last received with a request for `path` (empty
    /// when none came, or came without one).
    pub fn received_auth(&self, path: &str) -> String {
        self.received()
            .iter()
            .rev()
            .find(|r| r["kind"] == "http" && r["path"] == path)
            .map(|r| r["authorization"].as_str().unwrap_or("").to_owned())
            .unwrap_or_default()
    }

    /// svcd's audit records. Every line must be one JSON object with unique keys that fits
    /// `schema/audit.v1.json`; a line that does not fails the test that reads it.
    pub fn audit(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(self.audit_path()).unwrap_or_default();
        let schema = svc_control::audit::schema();
        let validator = jsonschema::validator_for(&schema).expect("the audit schema compiles");
        text.lines()
            .map(|line| {
                let v = svc_control::audit::parse_strict(line)
                    .unwrap_or_else(|e| panic!("audit line is not strict JSON ({e}): {line}"));
                if let Err(e) = validator.validate(&v) {
                    panic!("audit line does not fit schema/audit.v1.json ({e}): {line}");
                }
                v
            })
            .collect()
    }

    pub fn audit_path(&self) -> PathBuf {
        self.dir.join("audit/audit.jsonl")
    }

    /// `svc sandbox destroy NAME`, then [`World::assert_gone`] for everything it had.
    pub fn destroy_checked(&self, name: &str) {
        let s = self.show(name);
        self.svc_ok(&["sandbox", "destroy", name]);
        self.assert_gone_shown(&s);
    }

    /// [`World::assert_gone`] for the sandbox `shown` (as `svc sandbox show --json` had it).
    pub fn assert_gone_shown(&self, shown: &serde_json::Value) {
        let name = shown["name"]
            .as_str()
            .unwrap_or_else(|| panic!("a sandbox without a name: {shown}"));
        let num = |k: &str| {
            shown[k]
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .unwrap_or_else(|| panic!("{name} has no {k}: {shown}"))
        };
        let link = shown["link"].as_str().unwrap_or_default();
        self.assert_gone(num("id"), link, num("pid"), name);
    }

    /// Everything svcd made for sandbox `id` (link `link`, init `pid`) is gone.
    pub fn assert_gone(&self, id: u32, link: &str, pid: u32, name: &str) {
        self.assert_host_clean(link, pid, name);
        self.assert_fence_clean(id, link);
        self.assert_state_clean(name);
    }

    /// The host keeps nothing of sandbox `name`: its link, its init, its mounts, its cgroups,
    /// its container.
    fn assert_host_clean(&self, link: &str, pid: u32, name: &str) {
        let w = self;
        let links = w.host.exec("ip", &["-o", "link", "show"]);
        let links = String::from_utf8_lossy(&links.stdout);
        assert!(
            !links.contains(&format!(" {link}:")) && !links.contains(&format!(" {link}@")),
            "link {link} is left:\n{links}"
        );
        let mine = w.dir.display().to_string();
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                    .map(|c| !c.contains("tini") && !c.contains(&mine))
                    .unwrap_or(true),
            "the sandbox's init or VM monitor (pid {pid}) is still running"
        );
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let sandbox_dir = w.dir.join("state/sandboxes").join(name);
        assert!(
            !mounts.contains(&sandbox_dir.display().to_string()),
            "a mount under {} is left",
            sandbox_dir.display()
        );
        for root in cgroup_roots() {
            let cg = root.join(&w.cgroup_parent).join(name);
            assert!(
                !cg.exists(),
                "the sandbox's cgroup {} is left",
                cg.display()
            );
        }
        let runc = Command::new(w.oci_runtime())
            .arg("--root")
            .arg(w.dir.join("state/runc"))
            .args(["list", "-q"])
            .output()
            .expect("the runtime's list");
        assert!(
            !String::from_utf8_lossy(&runc.stdout)
                .lines()
                .any(|l| l == name),
            "the runtime still knows container {name}"
        );
    }

    /// The OCI runtime svcd runs: svcd.toml's `container.runtime`, else the default (the crun
    /// on PATH when 1.21 or later, else runc), as svcd chooses it.
    pub fn oci_runtime(&self) -> PathBuf {
        let configured = svc_control::config::loader::load_host_config(Some(&self.config))
            .ok()
            .and_then(|c| c.container.runtime);
        svc_control::runtime::container::binary::choose(configured.as_deref())
            .expect("svcd's OCI runtime")
            .path
    }

    /// The fence keeps nothing of sandbox `id` on link `link`: no pins, entries or set element.
    fn assert_fence_clean(&self, id: u32, link: &str) {
        let w = self;
        let pinned: Vec<String> = std::fs::read_dir(w.pins.path.join("links"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        assert!(
            !pinned.iter().any(|p| p.starts_with(&format!("{link}_"))),
            "pinned fence links of {link} are left: {pinned:?}"
        );
        let fence =
            svc_control::dataplane::Fence::load(&w.pins.path).expect("load the pinned fence");
        assert!(
            fence.allow_entries(id).is_empty(),
            "allow-map entries of sandbox {id} are left"
        );
        let set = w.nft_link_set();
        assert!(
            !set.iter().any(|l| l == link),
            "{link} is left in the nftables link set: {set:?}"
        );
    }

    /// svcd's state keeps nothing of sandbox `name`: no files, loop devices or row.
    fn assert_state_clean(&self, name: &str) {
        let w = self;
        let sandbox_dir = w.dir.join("state/sandboxes").join(name);
        assert!(
            !w.dir.join("state/sandboxes").join(name).exists(),
            "the sandbox's files are left"
        );
        let bound = crate::loop_devices_under(&sandbox_dir);
        assert!(
            bound.is_empty(),
            "loop devices bound to the sandbox's disk are left: {bound:?}"
        );
        let list: Vec<serde_json::Value> =
            serde_json::from_str(&w.svc_ok(&["sandbox", "list", "--json"])).expect("list");
        assert!(
            !list.iter().any(|s| s["name"] == name),
            "the state row of {name} is left"
        );
    }
}

/// A helper `cargo xtask setup --tests` builds into `target/tools/bin` (virtiofsd,
/// vhost-device-vsock), if it is there.
pub fn tool(name: &str) -> Option<PathBuf> {
    let target = image_dir().parent()?.parent()?.to_path_buf();
    Some(target.join("tools/bin").join(name)).filter(|p| p.exists())
}

/// The microvm images `cargo xtask images` builds next to the base image.
pub fn microvm_dir() -> PathBuf {
    image_dir()
        .parent()
        .expect("images directory")
        .join("microvm")
}

/// svcd's environment for the microvm backend: the images, when they are built (every
/// microvm test checks they are, and says how to build them).
pub fn microvm_env() -> Vec<(&'static str, PathBuf)> {
    let dir = microvm_dir();
    [
        ("SVC_MICROVM_KERNEL", "vmlinuz"),
        ("SVC_MICROVM_INITRD", "initrd.img"),
        ("SVC_MICROVM_ROOTFS", "rootfs.ext4"),
    ]
    .into_iter()
    .map(|(var, file)| (var, dir.join(file)))
    .filter(|(_, p)| p.exists())
    .collect()
}

/// The microvm images, asserted to be there.
pub fn microvm_images() -> PathBuf {
    let dir = microvm_dir();
    for f in ["vmlinuz", "initrd.img", "rootfs.ext4"] {
        assert!(
            dir.join(f).exists(),
            "{} is missing: build the images with `cargo xtask images` (`cargo xtask test` does)",
            dir.join(f).display()
        );
    }
    if let Some(target) = dir.parent().and_then(Path::parent) {
        crate::stale::warn_if_image_stale(&dir, target);
    }
    dir
}

/// The cgroup hierarchies a sandbox's cgroup may be made in (v2, or each v1 controller).
pub fn cgroup_roots() -> Vec<PathBuf> {
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        return vec![root.to_path_buf()];
    }
    std::fs::read_dir(root)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.join("cgroup.procs").exists())
                .collect()
        })
        .unwrap_or_default()
}

/// Remove `parent` (and its empty parents up to the root) from every hierarchy.
fn remove_cgroups(parent: &str) {
    for root in cgroup_roots() {
        let mut p = root.join(parent);
        while p != root {
            if std::fs::remove_dir(&p).is_err() {
                break;
            }
            if !p.pop() {
                break;
            }
        }
    }
}

fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn wait_for(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{what} did not start within 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Drop for World {
    fn drop(&mut self) {
        if std::env::var_os("SVC_TEST_KEEP_WORLD").is_some() {
            eprintln!(
                "SVC_TEST_KEEP_WORLD: leaving {} and svcd running",
                self.dir.display()
            );
            return;
        }
        // Destroy what the test left (through svcd, as a user would), then stop everything.
        if self.svcd.is_some() {
            let list = self.svc(&["sandbox", "list", "--json"]);
            if let Ok(all) = serde_json::from_slice::<Vec<serde_json::Value>>(&list.stdout) {
                for s in all {
                    if let Some(name) = s["name"].as_str() {
                        let _ = self.svc(&["sandbox", "destroy", name]);
                    }
                }
            }
        }
        if let Some(mut c) = self.svcd.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = c.wait();
        }
        // Whatever svcd could not destroy (a test that killed it): VM monitors run in their own
        // process group and name this world's directory on their command line.
        let mine = self.dir.display().to_string();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&mine)
                && let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>()
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let _ = self.outside_world.kill();
        let _ = self.outside_world.wait();
        if let Some(mut c) = self.forward_proxy.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(PathBuf::from("/etc/netns").join(&self.outside.name));
        remove_cgroups(&self.cgroup_parent);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
