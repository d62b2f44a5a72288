//! The main job (`cargo xtask demo`): a sandbox that reaches exactly what it should.
//!
//! Builds a small outside world in network namespaces (DNS, HTTPS servers, a code host with
//! `git http-backend`, a host that must stay unreachable), starts the real svcd beside it,
//! creates a sandbox with the real `svc`, and shows what it can and cannot reach, the audit
//! lines and the eBPF allow map. Everything is removed at the end; nothing leaves the
//! namespaces.

use std::{process::ExitCode, time::Duration};

use serde_json::Value;
use svc_tests::world::{CODE_SSH_ADDR, CODE_TOKEN, DNS, EXAMPLE_TOKEN, NAMES, World};

const BOLD: &str = "\x1b[1m";
const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

fn heading(text: &str) {
    println!("\n{BOLD}== {text}{RESET}");
}
fn ok(text: &str) {
    println!("  \x1b[32m✓\x1b[0m {text}");
}
fn info(text: &str) {
    println!("  · {text}");
}
fn shown(text: &str) {
    for line in text.trim_end().lines() {
        println!("    {DIM}{line}{RESET}");
    }
}
fn cmd(text: &str) {
    println!("  $ {text}");
}

struct Demo {
    w: World,
    /// The sandbox is a microVM (`--backend=microvm`).
    microvm: bool,
}

impl Demo {
    /// `svc sandbox exec demo -- sh -c SCRIPT`, shown: (exit code, stdout, stderr).
    fn sh(&self, script: &str) -> (i32, String, String) {
        cmd(&format!("svc sandbox exec demo -- sh -c '{script}'"));
        let out = self
            .w
            .svc(&["sandbox", "exec", "demo", "--", "sh", "-c", script]);
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn audit_lines(&self, pick: impl Fn(&Value) -> bool) -> Vec<String> {
        let raw = std::fs::read_to_string(self.w.audit_path()).unwrap_or_default();
        raw.lines()
            .filter(|l| serde_json::from_str::<Value>(l).is_ok_and(|v| pick(&v)))
            .map(str::to_owned)
            .collect()
    }
}

fn check(cond: bool, what: &str) -> Result<(), String> {
    if cond {
        ok(what);
        Ok(())
    } else {
        Err(what.to_owned())
    }
}

fn story(d: &Demo) -> Result<(), String> {
    let w = &d.w;
    heading("1. an outside world, in its own network namespace");
    info(&format!(
        "DNS server {DNS}, authoritative for the test names"
    ));
    for (name, addr) in NAMES {
        let role = match *name {
            "api.agent.test" | "console.agent.test" => "the coding agent's built-in hosts",
            "code.test" => "the code host (git http-backend: acme/widget, evil/exfil)",
            "api.code.test" | "uploads.code.test" | "archive.code.test" => "the code host's family",
            "allowed.example.test" => "a host the sandbox will be allowed",
            _ => "a host that must stay unreachable",
        };
        info(&format!("HTTPS {name:<24} {addr:<12} {role}"));
    }
    info(&format!(
        "SSH   {:<24} {CODE_SSH_ADDR:<12} the code host's sshd (git over SSH; the host's ssh-agent holds the only key)",
        "code.test:22"
    ));

    heading("2. svcd, the host supervisor (eBPF fence, DNS guard, HTTPS proxy, API socket)");
    info(&format!("configuration {}", w.config.display()));
    info(&format!("API socket {}", w.socket.display()));
    info(&format!("fence pinned under {}", w.pins.path.display()));

    heading(if d.microvm {
        "3. create a sandbox: a microVM with its own kernel (QEMU -M microvm)"
    } else {
        "3. create a sandbox: an unprivileged container"
    });
    cmd(if d.microvm {
        "svc sandbox create --backend microvm --workspace project --trust --repo acme/widget --secret CODE_HOST_TOKEN@env:DEMO_CODE_TOKEN \\\n      \
         --allow-host allowed.example.test \\\n      \
         --secret SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN@env:DEMO_EXAMPLE_TOKEN demo"
    } else {
        "svc sandbox create --backend container --workspace project --trust --repo acme/widget --secret CODE_HOST_TOKEN@env:DEMO_CODE_TOKEN \\\n      \
         --allow-host allowed.example.test \\\n      \
         --secret SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN@env:DEMO_EXAMPLE_TOKEN demo"
    });
    // The project's .svc/config.yaml: the repository git may reach over SSH.
    let project = w.dir.join("project");
    let config_yaml =
        format!("egress:\n  policy:\n    {CODE_SSH_ADDR}:\n      repos: [acme/widget]\n");
    std::fs::create_dir_all(project.join(".svc")).map_err(|e| e.to_string())?;
    std::fs::write(project.join(".svc/config.yaml"), &config_yaml).map_err(|e| e.to_string())?;
    info(&format!("{}/.svc/config.yaml:", project.display()));
    shown(&config_yaml);
    // Named: a workspace without a runtime block would get the automatic choice.
    let mut backend_args: Vec<&str> = if d.microvm {
        vec!["--backend", "microvm"]
    } else {
        vec!["--backend", "container"]
    };
    let project_arg = project.display().to_string();
    // --trust: the demo wrote the project's perimeter itself just above (shown), so it
    // approves it as it is (`svc workspace trust project` would do the same first).
    backend_args.extend(["--workspace", &project_arg, "--trust"]);
    let out = w.svc_env(
        &[
            &["sandbox", "create"][..],
            &backend_args,
            &[
                "--repo",
                "acme/widget",
                "--secret",
                "CODE_HOST_TOKEN@env:DEMO_CODE_TOKEN",
                "--allow-host",
                "allowed.example.test",
                "--secret",
                "SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN@env:DEMO_EXAMPLE_TOKEN",
                "demo",
            ],
        ]
        .concat(),
        &[
            ("DEMO_CODE_TOKEN", CODE_TOKEN),
            ("DEMO_EXAMPLE_TOKEN", EXAMPLE_TOKEN),
        ],
    );
    shown(&String::from_utf8_lossy(&out.stdout));
    if !out.status.success() {
        return Err(format!(
            "svc sandbox create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let show: Value = serde_json::from_str(&w.svc_ok(&["sandbox", "show", "demo", "--json"]))
        .map_err(|e| e.to_string())?;

    heading("4. an allowed host: the request succeeds, the credential is swapped on the wire");
    let (_, var, _) = d.sh("echo $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN");
    let placeholder = var.trim().to_owned();
    info(&format!(
        "the sandbox holds a placeholder: SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN={}…{} (64 hex)",
        &placeholder.get(..8).unwrap_or(""),
        &placeholder.get(56..).unwrap_or("")
    ));
    let (code, body, err) = d.sh(
        "curl -sS -H \"Authorization: Bearer $SVC_CRED_ALLOWED_EXAMPLE_TEST_TOKEN\" https://allowed.example.test/v1/models",
    );
    info("the sandbox got:");
    shown(&body);
    shown(&err);
    let received = w.received();
    let upstream = received
        .iter()
        .rev()
        .find(|r| r["kind"] == "http" && r["host"] == "allowed.example.test");
    if let Some(r) = upstream {
        info(&format!(
            "the upstream received: {} {}  Authorization: {}",
            r["method"].as_str().unwrap_or(""),
            r["path"].as_str().unwrap_or(""),
            r["authorization"].as_str().unwrap_or("")
        ));
    }
    check(
        code == 0
            && upstream.is_some_and(|r| r["authorization"] == format!("Bearer {EXAMPLE_TOKEN}")),
        "the real token reached the upstream; the sandbox never held it",
    )?;

    heading("5. a host off the list: refused at DNS");
    let (code, _, _) = d.sh("getent hosts forbidden.example.test");
    let asked = w
        .received()
        .iter()
        .any(|r| r["name"] == "forbidden.example.test");
    check(
        code != 0 && !asked,
        &format!("no answer (exit {code}); the outside DNS server never saw the question"),
    )?;
    std::thread::sleep(Duration::from_millis(200));
    for l in d
        .audit_lines(|v| v["layer"] == "dns" && v["decision"] == "refused")
        .iter()
        .take(1)
    {
        info("audit:");
        shown(l);
    }

    heading("6. its address, dialled directly: dropped by the eBPF fence");
    let (code, _, err) = d.sh("curl -sS --connect-timeout 2 -k https://192.0.2.66/");
    shown(&err);
    std::thread::sleep(Duration::from_millis(300));
    let drops = d.audit_lines(|v| v["layer"] == "packet" && v["dst"] == "192.0.2.66");
    check(
        code != 0 && !drops.is_empty(),
        "the SYN never left the host: dropped at the guest's link",
    )?;
    info("audit:");
    shown(&drops[0]);

    heading("7. a repository the sandbox is not bound to: 403 from the proxy");
    let (_, out, _) = d.sh(
        "curl -sS -w \"\\nHTTP %{http_code}\\n\" \"https://code.test/evil/exfil.git/info/refs?service=git-upload-pack\"",
    );
    shown(&out);
    let reached = w
        .received()
        .iter()
        .any(|r| r["path"].as_str().is_some_and(|p| p.contains("evil")));
    check(
        out.contains("HTTP 403") && !reached,
        "refused with 403 and a JSON body naming the rule; the code host never saw it",
    )?;

    heading("8. the bound repository: git clone and push a svc/ branch, token swapped");
    let (code, out, err) = d.sh(
        "cd /tmp && git -c http.extraHeader=\"Authorization: Bearer $CODE_HOST_TOKEN\" clone -q https://code.test/acme/widget.git && cd widget && git -c user.name=agent -c user.email=agent@svc.invalid commit -q --allow-empty -m work && git -c http.extraHeader=\"Authorization: Bearer $CODE_HOST_TOKEN\" push -q origin HEAD:refs/heads/svc/demo && git log --oneline",
    );
    shown(&out);
    shown(&err);
    let git_ok = w
        .received()
        .iter()
        .filter(|r| r["kind"] == "http" && r["host"] == "code.test")
        .all(|r| r["authorization"] == format!("Bearer {CODE_TOKEN}"));
    check(
        code == 0 && git_ok,
        "cloned and pushed refs/heads/svc/demo; every git request upstream carried the real token",
    )?;

    heading(
        "9. git over SSH: no key in the guest; svcd's relay decides, the host's agent signs in",
    );
    let remote = format!("root@{CODE_SSH_ADDR}:acme/widget.git");
    let (code, out, err) = d.sh(&format!(
        "cd /tmp && git clone -q {remote} widget-ssh && cd widget-ssh && git log --oneline -1 && ls ~/.ssh 2>/dev/null; echo \"SSH_AUTH_SOCK=${{SSH_AUTH_SOCK:-unset}} GIT_SSH_COMMAND=$GIT_SSH_COMMAND\""
    ));
    shown(&out);
    shown(&err);
    check(
        code == 0 && out.contains("SSH_AUTH_SOCK=unset"),
        "cloned acme/widget over SSH through the relay; the guest has no key and no agent",
    )?;
    let before = w
        .ssh
        .as_ref()
        .map(|h| h.refs("acme/widget"))
        .unwrap_or_default();
    let (code, _, err) = d.sh(
        "cd /tmp/widget-ssh && git -c user.name=agent -c user.email=agent@svc.invalid commit -q --allow-empty -m sneaky && git push -q origin HEAD:refs/heads/main",
    );
    shown(&err);
    let after = w
        .ssh
        .as_ref()
        .map(|h| h.refs("acme/widget"))
        .unwrap_or_default();
    check(
        code != 0
            && err.contains("svc: refused: ref refs/heads/main not in allowed branches")
            && before == after,
        "a push to main is refused before a byte reaches the server; its refs are unchanged",
    )?;
    cmd(&format!(
        "svc egress explain --ssh \"root@{CODE_SSH_ADDR} git-receive-pack 'acme/widget.git'\" --ref refs/heads/main"
    ));
    let explained = std::process::Command::new(svc_tests::world::workspace_bin("svc"))
        .current_dir(&project)
        .args([
            "egress",
            "explain",
            "--host-config",
            "/dev/null",
            "--ssh",
            &format!("root@{CODE_SSH_ADDR} git-receive-pack 'acme/widget.git'"),
            "--ref",
            "refs/heads/main",
        ])
        .output()
        .map_err(|e| e.to_string())?;
    shown(&String::from_utf8_lossy(&explained.stdout));
    std::thread::sleep(Duration::from_millis(200));
    for l in d.audit_lines(|v| v["layer"] == "ssh") {
        shown(&l);
    }

    heading(&format!(
        "10. the audit log ({}), one JSON line per decision",
        w.audit_path().display()
    ));
    std::thread::sleep(Duration::from_millis(300));
    for l in d.audit_lines(|v| v["layer"] == "http").iter().take(6) {
        shown(l);
    }
    let raw = std::fs::read_to_string(w.audit_path()).unwrap_or_default();
    check(
        !raw.contains(CODE_TOKEN) && !raw.contains(EXAMPLE_TOKEN) && !raw.contains(&placeholder),
        "no token or placeholder in the audit log",
    )?;

    heading("11. the sandbox's allow map, with bpftool");
    let map = w.pins.path.join("SVC_ALLOW4");
    cmd(&format!("bpftool map dump pinned {}", map.display()));
    let dump = std::process::Command::new("bpftool")
        .args(["map", "dump", "pinned"])
        .arg(&map)
        .output()
        .map_err(|e| format!("bpftool: {e}"))?;
    let text = String::from_utf8_lossy(&dump.stdout);
    for l in text.lines().take(24) {
        println!("    {DIM}{l}{RESET}");
    }
    info(&format!(
        "keys are (sandbox {}, generation, IPv4 address): what the DNS guard committed before it \
         answered; values hold the allowed (port, protocol) rules and the expiry. Decoded:",
        show["id"]
    ));
    for (addr, rules) in decode_allow4(&w.pins.path.join("SVC_ALLOW4")) {
        let name = NAMES
            .iter()
            .find(|(_, a)| *a == addr)
            .map_or("?", |(n, _)| *n);
        info(&format!("  {addr:<12} {name:<22} {}", rules.join(", ")));
    }
    check(dump.status.success(), "the map is pinned and readable")?;

    heading("12. the guest is root in its sandbox, not on the host: going around the fence fails");
    let pins = w.pins.path.display().to_string();
    let vm_moves: [(&str, String); 5] = [
        (
            "find the fence's pinned allow map",
            format!("ls {pins}/SVC_ALLOW4"),
        ),
        (
            "reach svcd's socket",
            format!("test -S {}", w.socket.display()),
        ),
        ("see svcd among its processes", "pgrep -x svcd".to_owned()),
        (
            "speak from another address",
            "ip addr add 10.203.9.9/32 dev eth0 && curl -sS --interface 10.203.9.9 \
             --connect-timeout 3 https://allowed.example.test/"
                .to_owned(),
        ),
        (
            "reach the host's own address",
            format!(
                "curl -sS --connect-timeout 3 http://{}:15443/",
                show["gateway_v4"].as_str().unwrap_or("")
            ),
        ),
    ];
    let container_moves: [(&str, String); 6] = [
        (
            "enter another network namespace",
            "nsenter --net=/proc/1/ns/net true".to_owned(),
        ),
        (
            "find the fence's pinned allow map",
            format!("ls {pins}/SVC_ALLOW4"),
        ),
        (
            "load eBPF (bpf(2))",
            "python3 -c 'import ctypes as c,sys; r=c.CDLL(None).syscall(321,0,0,0); sys.exit(r<0)'"
                .to_owned(),
        ),
        (
            "reach svcd's socket",
            format!("test -S {}", w.socket.display()),
        ),
        (
            "give itself another address",
            "ip addr add 10.203.9.9/32 dev eth0".to_owned(),
        ),
        ("mount a bpffs", "mount -t bpf bpf /mnt".to_owned()),
    ];
    if d.microvm {
        info(
            "in a microVM the guest is root of its own kernel: eBPF, mounts and namespaces are \
             its own; the host's are not there to reach",
        );
    }
    let moves: &[(&str, String)] = if d.microvm {
        &vm_moves
    } else {
        &container_moves
    };
    let mut held = true;
    for (what, script) in moves {
        let (code, _, err) = d.sh(script);
        let said = err.lines().next().unwrap_or("").trim();
        info(&format!(
            "{what:<36} {} (exit {code}{}{said})",
            if code != 0 { "refused" } else { "ALLOWED" },
            if said.is_empty() { "" } else { ": " }
        ));
        held &= code != 0;
    }
    let marker = std::path::Path::new("/etc/svc-demo-was-here");
    let _ = d.sh(&format!("touch {}", marker.display()));
    check(
        held && !marker.exists(),
        if d.microvm {
            "every move refused; `touch /etc/…` wrote only the guest's own disk, not the host's"
        } else {
            "every move refused; `touch /etc/…` wrote only the sandbox's own layer, not the host's"
        },
    )?;

    heading("13. destroy the sandbox");
    cmd("svc sandbox destroy demo");
    shown(&w.svc_ok(&["sandbox", "destroy", "demo"]));
    let links = w.host.exec("ip", &["-o", "link", "show"]);
    let link = show["link"].as_str().unwrap_or("svc1");
    check(
        !String::from_utf8_lossy(&links.stdout).contains(&format!(" {link}:")),
        "its link, fence entries, nftables entry, processes, files and state are gone",
    )
}

/// The allow map's entries as (address, ["tcp/443", …]), from `bpftool -j`.
fn decode_allow4(map: &std::path::Path) -> Vec<(String, Vec<String>)> {
    let out = std::process::Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(map)
        .output();
    let Ok(out) = out else { return Vec::new() };
    let entries: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let bytes = |v: &Value| -> Vec<u8> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|b| b.as_str())
                    .filter_map(|b| u8::from_str_radix(b.trim_start_matches("0x"), 16).ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    entries
        .iter()
        .filter_map(|e| {
            let key = bytes(&e["key"]);
            let value = bytes(&e["value"]);
            let addr = key.get(8..12)?;
            let rules = value
                .get(8..40)?
                .chunks_exact(4)
                .filter(|r| r.iter().any(|b| *b != 0))
                .map(|r| {
                    let port = u16::from_le_bytes([r[0], r[1]]);
                    let proto = match r[2] {
                        6 => "tcp",
                        17 => "udp",
                        _ => "other",
                    };
                    format!("{proto}/{port}")
                })
                .collect::<Vec<_>>();
            Some((
                format!("{}.{}.{}.{}", addr[0], addr[1], addr[2], addr[3]),
                rules,
            ))
        })
        .collect()
}

fn main() -> ExitCode {
    println!("{BOLD}svc demo: a sandbox that reaches exactly what it should{RESET}");
    println!(
        "{DIM}(everything runs in throwaway network namespaces and is removed at the end){RESET}"
    );
    let microvm = match std::env::args().nth(1).as_deref() {
        None | Some("--backend=container") => false,
        Some("--backend=microvm") => true,
        Some(other) => {
            eprintln!("svc-demo: unknown argument {other:?} (--backend=container|microvm)");
            return ExitCode::from(2);
        }
    };
    let demo = Demo {
        w: World::start_with_git_ssh(""),
        microvm,
    };
    let result = story(&demo);
    drop(demo);
    match result {
        Ok(()) => {
            println!(
                "\n{BOLD}done:{RESET} the sandbox reached its allowed hosts with credentials swapped on the wire, and nothing else."
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\n\x1b[31m✗ {e}\x1b[0m");
            ExitCode::FAILURE
        }
    }
}
