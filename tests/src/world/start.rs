//! Building a world: the namespaces, the outside world's servers (DNS, HTTPS, git, SSH, the
//! operator's forward proxy), svcd's configuration, and svcd itself.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
};

use super::{
    CODE_SSH_ADDR, CODE_TOKEN, DNS, EXAMPLE_TOKEN, FORWARD_PROXY, METRICS_PORT, NAMES,
    SHARED_NAMES, World, bare_repo, image_dir, tool, wait_for, workspace_bin,
};
use crate::{NetNs, PinDir, run, unique_where, veth};

/// What a world is started with besides the defaults.
#[derive(Default, Clone, Copy)]
pub(super) struct Options<'a> {
    /// Extra `[container]` lines.
    container: &'a str,
    /// Extra `[credentials]` lines.
    credentials: &'a str,
    /// Extra `[microvm]` lines.
    microvm: &'a str,
    git_ssh: bool,
    upstream_proxy: bool,
    /// No `credentials.code_host_token_file`: `--repo` must find its token elsewhere.
    no_code_token: bool,
    /// More names the outside world serves (`--serve`, their addresses on its interface).
    served: &'a [(&'a str, &'a str)],
    /// More DNS answers (`--name`; a name given several times is answered with every address).
    names: &'a [(&'a str, &'a str)],
    /// svcd from this binary instead of the workspace's, with svcd.toml starting with
    /// `config_head` (an installed svcd and its packaged configuration).
    svcd: Option<&'a Path>,
    config_head: &'a str,
}

/// Start tinyproxy in the outside world and fence the host's own traffic to it; svcd.toml's
/// `[upstream]` lines.
fn start_forward_proxy(dir: &Path, outside: &NetNs, host: &NetNs) -> (String, Child) {
    let tp = dir.join("tinyproxy");
    std::fs::create_dir_all(&tp).expect("tinyproxy dir");
    // tinyproxy drops to nobody: its log directory must take its writes.
    run("chmod", &["777", tp.to_str().expect("utf-8")]);
    std::fs::write(
        tp.join("tinyproxy.conf"),
        format!(
            "User nobody\nGroup nogroup\nPort 3128\nListen {FORWARD_PROXY}\nTimeout 60\n\
             LogFile \"{log}\"\nLogLevel Info\nPidFile \"{pid}\"\nMaxClients 64\n\
             Allow 192.0.2.0/24\nConnectPort 443\nBasicAuth svc s3cret\nDisableViaHeader Yes\n",
            log = tp.join("tinyproxy.log").display(),
            pid = tp.join("tinyproxy.pid").display(),
        ),
    )
    .expect("tinyproxy.conf");
    // Its names resolve at the outside world's DNS server (`ip netns exec` binds this file).
    let etc = PathBuf::from("/etc/netns").join(&outside.name);
    std::fs::create_dir_all(&etc).expect("/etc/netns");
    std::fs::write(etc.join("resolv.conf"), format!("nameserver {DNS}\n")).expect("resolv.conf");
    let child = Command::new("ip")
        .args(["netns", "exec", &outside.name, "tinyproxy", "-d", "-c"])
        .arg(tp.join("tinyproxy.conf"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("tinyproxy (cargo xtask setup --tests installs it)");
    crate::wait_tcp(Some(&host.name), FORWARD_PROXY, 3128, "tinyproxy");
    // The host reaches the outside world only through the proxy (and its DNS server, and the
    // one no_proxy host); the rule counts anything else it tried.
    let rules = format!(
        "table inet svctest {{\n  chain out {{\n    type filter hook output priority 0;\n    \
         ip daddr 192.0.2.0/24 ip daddr != {{ {DNS}, {FORWARD_PROXY}, 192.0.2.10 }} counter reject\n  }}\n}}\n"
    );
    let file = dir.join("svctest.nft");
    std::fs::write(&file, rules).expect("nft rules");
    let out = host.exec("nft", &["-f", file.to_str().expect("utf-8")]);
    assert!(out.status.success(), "nft: {out:?}");
    let creds = dir.join("upstream-credentials");
    std::fs::write(&creds, "svc:s3cret\n").expect("credentials");
    run("chmod", &["600", creds.to_str().expect("utf-8")]);
    let lines = format!(
        "[upstream]\nproxy = \"http://{FORWARD_PROXY}:3128\"\nproxy_credentials_file = \"{}\"\nno_proxy = [\"api.agent.test\"]\n",
        creds.display()
    );
    (lines, child)
}

impl World {
    /// Build the namespaces, start the outside world and svcd.
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// [`World::start`] with extra lines for svcd.toml's `[container]` table (limits).
    pub fn start_with(container: &str) -> Self {
        Self::start_full(&Options {
            container,
            ..Options::default()
        })
    }

    /// [`World::start`] with the code host serving git over SSH too (its sshd in the outside
    /// world at code.test's address, port 22; the host's agent holding the only key) and
    /// svcd's relay configured for it, plus extra `[microvm]` lines.
    pub fn start_with_git_ssh(microvm: &str) -> Self {
        Self::start_full(&Options {
            microvm,
            git_ssh: true,
            ..Options::default()
        })
    }

    /// [`World::start`] with svcd from `svcd` (the workspace's when `None`) and extra lines for
    /// svcd.toml's `[microvm]` table (a `virtiofsd` line there replaces the tools' one) and for
    /// its `[container]` table (and any after it).
    pub fn start_with_tables(svcd: Option<&Path>, microvm: &str, container: &str) -> Self {
        Self::start_full(&Options {
            svcd,
            microvm,
            container,
            ..Options::default()
        })
    }

    /// [`World::start`] with extra lines for svcd.toml's `[microvm]` table.
    pub fn start_with_microvm(microvm: &str) -> Self {
        Self::start_full(&Options {
            microvm,
            ..Options::default()
        })
    }

    /// [`World::start`] with the coding agent's home `dir` shared live into microvm sandboxes
    /// (`credentials.agent_home`).
    pub fn start_with_agent_home(dir: &Path) -> Self {
        Self::start_full(&Options {
            credentials: &format!("agent_home = \"{}\"", dir.display()),
            ..Options::default()
        })
    }

    /// [`World::start_with_agent_home`] with extra lines after svcd.toml's `[container]` table
    /// (a `[pool]` table, say).
    pub fn start_with_agent_home_and(dir: &Path, container: &str) -> Self {
        Self::start_full(&Options {
            container,
            credentials: &format!("agent_home = \"{}\"", dir.display()),
            ..Options::default()
        })
    }

    /// [`World::start`] with extra `[credentials]` lines in svcd.toml.
    pub fn start_with_credentials(lines: &str) -> Self {
        Self::start_full(&Options {
            credentials: lines,
            ..Options::default()
        })
    }

    /// [`World::start`] with the operator's forward proxy between svcd and the outside world:
    /// tinyproxy at [`FORWARD_PROXY`] (port 3128, Basic credentials `svc:s3cret` from a root-only
    /// file), svcd's `[upstream]` pointing at it with `no_proxy = ["api.agent.test"]`, and the
    /// host's own connections to the outside world refused except to the DNS server, the proxy
    /// and api.agent.test (an nftables table `inet svctest` whose rule counts what it refused).
    /// [`World::start`] without the host's code-host token file, and with svcd's code-host CLI
    /// login (`gh`) kept in `DIR/gh` (`GH_CONFIG_DIR`; empty: not logged in).
    pub fn start_without_code_token() -> Self {
        Self::start_full(&Options {
            no_code_token: true,
            ..Options::default()
        })
    }

    /// [`World::start`] with more names served in the outside world (`served`: a server on
    /// each address, ports 80 and 443) and more DNS answers (`names`, added to those of the
    /// same name): a hostile resolver's answers, for instance.
    pub fn start_with_dns(served: &[(&str, &str)], names: &[(&str, &str)]) -> Self {
        Self::start_full(&Options {
            served,
            names,
            ..Options::default()
        })
    }

    /// [`World::start`] with an installed svcd: `svcd` is its binary, and svcd.toml is its
    /// packaged configuration `conffile` with this world's settings appended (its paths, the
    /// test hosts, the outside world's DNS and CA), as an operator edits the conffile.
    pub fn start_installed(svcd: &Path, conffile: &str) -> Self {
        Self::start_full(&Options {
            svcd: Some(svcd),
            config_head: conffile,
            ..Options::default()
        })
    }

    pub fn start_with_upstream_proxy() -> Self {
        Self::start_full(&Options {
            upstream_proxy: true,
            ..Options::default()
        })
    }

    fn start_full(o: &Options<'_>) -> Self {
        // Checked before anything is started: a panic past this point would leave the outside
        // world's processes running (holding whatever descriptors the test runner gave them).
        let image = image_dir();
        let host = NetNs::new();
        let outside = NetNs::new();
        link_outside(&host, &outside, o);
        let dir = crate::fresh_dir("svw");
        let git_root = dir.join("git");
        bare_repo(&git_root, "acme", "widget");
        bare_repo(&git_root, "evil", "exfil");
        let outside_world = start_outside_world(&outside, &dir.join("outside"), &git_root, o);
        let ssh = o.git_ssh.then(|| {
            crate::ssh_host::SshHost::start(
                &dir.join("ssh"),
                &git_root,
                Some(&outside.name),
                CODE_SSH_ADDR,
                22,
            )
        });
        let git_ssh_lines = ssh.as_ref().map_or(String::new(), |h| {
            format!(
                "[git_ssh]\nknown_hosts = \"{}\"\nagent_socket = \"{}\"\n",
                h.known_hosts.display(),
                h.agent_sock.display()
            )
        });
        let (upstream_lines, forward_proxy) = if o.upstream_proxy {
            let (lines, child) = start_forward_proxy(&dir, &outside, &host);
            (lines, Some(child))
        } else {
            (String::new(), None)
        };
        let pins = PinDir::new();
        // The host's own code-host token, brokered by `--repo` without `--secret`.
        std::fs::write(dir.join("code-host-token"), format!("{CODE_TOKEN}\n")).expect("token");
        let config = dir.join("svcd.toml");
        let cgroup_parent = format!("svc-test/{}", unique_where("w", cgroup_free));
        let toml = format!("{}\n", o.config_head)
            + &svcd_toml(&dir, &image, &pins.path, &cgroup_parent, o)
            + &format!("{git_ssh_lines}\n{upstream_lines}\n");
        std::fs::write(&config, toml).expect("svcd.toml");
        let mut world = Self {
            host,
            outside,
            pins,
            socket: dir.join("svcd.sock"),
            dir,
            config,
            cgroup_parent,
            ssh,
            svcd_exe: o.svcd.map_or_else(|| workspace_bin("svcd"), Path::to_owned),
            forward_proxy,
            svcd: None,
            outside_world,
        };
        world.start_svcd();
        world
    }
}

/// The host's link to the outside world (`ho` 192.0.2.1/24), and the outside world's
/// addresses on `oh`: every served name's, the DNS server's, the forward proxy's.
fn link_outside(host: &NetNs, outside: &NetNs, o: &Options<'_>) {
    veth(outside, "oh", host, "ho");
    host.ip(&["addr", "add", "192.0.2.1/24", "dev", "ho"]);
    host.ip(&["link", "set", "ho", "up"]);
    let mut addrs: Vec<&str> = NAMES.iter().chain(o.served).map(|(_, a)| *a).collect();
    addrs.push(DNS);
    if o.upstream_proxy {
        addrs.push(FORWARD_PROXY);
    }
    for a in addrs {
        outside.ip(&["addr", "add", &format!("{a}/24"), "dev", "oh"]);
    }
    outside.ip(&["link", "set", "oh", "up"]);
    outside.ip(&["route", "add", "10.203.0.0/16", "via", "192.0.2.1"]);
}

/// Start the outside world's servers (`outside-world`, state in `out_dir`, repositories
/// under `git_root`) and wait until they are ready.
fn start_outside_world(outside: &NetNs, out_dir: &Path, git_root: &Path, o: &Options<'_>) -> Child {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &outside.name])
        .arg(workspace_bin("outside-world"))
        .arg("--dir")
        .arg(out_dir)
        .args(["--dns", DNS, "--git-root"])
        .arg(git_root)
        .args(["--token", CODE_TOKEN, "--token", EXAMPLE_TOKEN]);
    for (name, addr) in NAMES.iter().chain(o.served) {
        cmd.args(["--serve", &format!("{name}={addr}")]);
    }
    for (name, addr) in SHARED_NAMES.iter().chain(o.names) {
        cmd.args(["--name", &format!("{name}={addr}")]);
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("outside-world");
    wait_for(&out_dir.join("ready"), "the outside world");
    child
}

/// `KEY = "PATH"` for a tool the tests' images directory holds, empty when it holds none.
fn tool_line(key: &str, name: &str) -> String {
    tool(name).map_or(String::new(), |p| format!("{key} = \"{}\"", p.display()))
}

/// svcd.toml of a world in `dir` (up to its `[metrics]` table; the optional `[git_ssh]` and
/// `[upstream]` tables follow).
fn svcd_toml(
    dir: &Path,
    image: &Path,
    pins: &Path,
    cgroup_parent: &str,
    o: &Options<'_>,
) -> String {
    let token_line = if o.no_code_token {
        String::new()
    } else {
        format!(
            "code_host_token_file = \"{}\"",
            dir.join("code-host-token").display()
        )
    };
    format!(
        r#"state_dir = "{state}"
socket = "{socket}"
pin_dir = "{pins}"
audit_dir = "{audit}"
api_group = "nogroup"
[hosts]
agent = ["api.agent.test", "console.agent.test"]
code_host = "code.test"
code_api_host = "api.code.test"
code_uploads_host = "uploads.code.test"
code_archive_host = "archive.code.test"
[dns]
upstreams = ["{DNS}"]
[proxy]
extra_roots = ["{ca}"]
[credentials]
{token_line}
key_file = "{key}"
{credentials}
[microvm]
{virtiofsd}
{vhost_vsock}
{microvm}
[container]
image = "{image}"
cgroup_parent = "{cgroup_parent}"
{container}
[metrics]
listen = "127.0.0.1:{METRICS_PORT}"
"#,
        image = image.display(),
        virtiofsd = if o.microvm.lines().any(|l| l.starts_with("virtiofsd")) {
            String::new()
        } else {
            tool_line("virtiofsd", "virtiofsd")
        },
        vhost_vsock = tool_line("vhost_vsock", "vhost-device-vsock"),
        state = dir.join("state").display(),
        socket = dir.join("svcd.sock").display(),
        pins = pins.display(),
        audit = dir.join("audit").display(),
        ca = dir.join("outside").join("ca.pem").display(),
        key = dir.join("secrets.key").display(),
        credentials = o.credentials,
        microvm = o.microvm,
        container = o.container,
    )
}

/// Whether no controller's hierarchy holds `svc-test/<name>` yet: a killed test's world may
/// have left its cgroups (process ids are reused), and a new svcd would make its sandboxes'
/// cgroups beside that world's.
fn cgroup_free(name: &str) -> bool {
    !super::cgroup_roots()
        .iter()
        .any(|root| root.join("svc-test").join(name).exists())
}
