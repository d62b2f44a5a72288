//! `svc doctor --kubernetes`: what a Kubernetes node needs for pods with `runtimeClassName:
//! svc` (`kubernetes:NAME`), each with a fix hint: the shim on containerd's `PATH`, containerd's
//! configuration registering the runtime type `io.containerd.svc.v1` for the CRI plugin, and
//! containerd's socket. (svcd answering on its socket is `host:svcd`, probed beside these.)

use std::{
    os::unix::fs::{FileTypeExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    time::Instant,
};

use super::report::{CheckResult, HostOutcome, host_result_named};

/// The shim's file name, as containerd looks it up for runtime type `io.containerd.svc.v1`.
pub const SHIM: &str = "containerd-shim-svc-v1";
/// The runtime type the shim serves.
pub const RUNTIME_TYPE: &str = "io.containerd.svc.v1";
/// containerd's configuration, where `--containerd-config` does not name another.
pub const DEFAULT_CONFIG: &str = "/etc/containerd/config.toml";
/// containerd's socket, where its configuration's `[grpc] address` does not name another.
pub const DEFAULT_SOCKET: &str = "/run/containerd/containerd.sock";

/// The CRI plugin's runtimes table: containerd 1.x's (config version 2), then 2.x's (3).
const RUNTIME_TABLES: [(&str, &str); 2] = [
    ("io.containerd.grpc.v1.cri", "containerd"),
    ("io.containerd.cri.v1.runtime", "containerd"),
];

/// The table the fix hints name.
const TABLE_HINT: &str = "add to containerd's configuration (then restart containerd):\n  \
    [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.svc]\n    \
    runtime_type = \"io.containerd.svc.v1\"\n(containerd 2.x: [plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.svc])";

/// The node's probes: `config` is containerd's configuration file, `path` the `PATH` the shim
/// is looked up on (containerd's; the caller's when not known).
pub fn kubernetes_probes(config: &Path, path: &str) -> Vec<CheckResult> {
    let t0 = Instant::now();
    let shim = host_result_named("kubernetes:shim", true, t0, shim_on_path(path));
    let t0 = Instant::now();
    let parsed = read_config(config);
    let registered = match &parsed {
        Ok(doc) => runtime_registered(config, doc),
        Err(e) => Err(e.clone()),
    };
    let registered = host_result_named("kubernetes:containerd-config", true, t0, registered);
    let t0 = Instant::now();
    let socket = parsed
        .as_ref()
        .ok()
        .and_then(grpc_address)
        .unwrap_or_else(|| DEFAULT_SOCKET.into());
    let socket = host_result_named(
        "kubernetes:containerd-socket",
        true,
        t0,
        socket_present(Path::new(&socket)),
    );
    vec![shim, registered, socket]
}

/// `containerd-shim-svc-v1` in a directory of `path`, executable, and its version. As
/// containerd's lookup does, an entry that is not an executable regular file is passed over;
/// when no entry is one, the first entry found is named with what is wrong with it.
fn shim_on_path(path: &str) -> HostOutcome {
    let mut unusable = None;
    for shim in path
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| PathBuf::from(d).join(SHIM))
    {
        let Ok(meta) = std::fs::metadata(&shim) else {
            continue;
        };
        let mode = meta.permissions().mode();
        let wrong = if !meta.is_file() {
            (
                format!("{} is not a regular file", shim.display()),
                "remove what is in its place and install the shim there (the svc package does)",
            )
        } else if mode & 0o111 == 0 {
            (
                format!("{} is not executable (mode {mode:o})", shim.display()),
                "chmod 755 it",
            )
        } else {
            return Ok(format!("{} ({})", shim.display(), version(&shim)));
        };
        unusable.get_or_insert(wrong);
    }
    Err(unusable.unwrap_or_else(|| {
        (
            format!("{SHIM} is not on PATH ({path})"),
            "install it into a directory of containerd's PATH, e.g. /usr/local/bin (the svc \
             package does)",
        )
    }))
}

/// What `SHIM -v` says of its version (its line naming one), or that it does not say; a shim
/// that has not answered within 5 s is killed.
fn version(shim: &Path) -> String {
    use std::process::{Command, Stdio};
    let child = Command::new(shim)
        .arg("-v")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return format!("cannot run it: {e}"),
    };
    let deadline = Instant::now() + std::time::Duration::from_secs(5);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return "-v did not answer within 5 s".into();
            }
        }
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
    }
    if !status.success() {
        return format!("-v exited with {status}");
    }
    out.lines()
        .map(str::trim)
        .find(|l| l.to_ascii_lowercase().starts_with("version"))
        .map_or_else(|| "no version given".into(), str::to_owned)
}

/// containerd's configuration, parsed; an error names the file.
fn read_config(config: &Path) -> Result<toml::Table, (String, &'static str)> {
    let text = std::fs::read_to_string(config).map_err(|e| {
        (
            format!(
                "cannot read containerd's configuration {}: {e}",
                config.display()
            ),
            "give its path with --containerd-config PATH, or create it (containerd config default)",
        )
    })?;
    text.parse::<toml::Table>().map_err(|e| {
        (
            format!("{} is not valid TOML: {e}", config.display()),
            "fix the file (containerd refuses it too)",
        )
    })
}

/// Whether a CRI runtime of `doc` has `runtime_type = "io.containerd.svc.v1"`: its handler
/// name (what a RuntimeClass's `handler` names).
fn runtime_registered(config: &Path, doc: &toml::Table) -> HostOutcome {
    let mut other = Vec::new();
    for (plugin, section) in RUNTIME_TABLES {
        let runtimes = doc
            .get("plugins")
            .and_then(|p| p.get(plugin))
            .and_then(|p| p.get(section))
            .and_then(|c| c.get("runtimes"))
            .and_then(toml::Value::as_table);
        for (handler, runtime) in runtimes.into_iter().flatten() {
            match runtime.get("runtime_type").and_then(toml::Value::as_str) {
                Some(RUNTIME_TYPE) => {
                    return Ok(format!(
                        "{}: [plugins.\"{plugin}\".{section}.runtimes.{handler}] runtime_type = \
                         \"{RUNTIME_TYPE}\" (RuntimeClass handler {handler:?})",
                        config.display()
                    ));
                }
                Some(t) => other.push(format!("{handler} ({t})")),
                None => other.push(handler.clone()),
            }
        }
    }
    Err((
        format!(
            "{} registers no CRI runtime of type {RUNTIME_TYPE}: no table \
             [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.svc] with runtime_type = \
             \"{RUNTIME_TYPE}\"{}",
            config.display(),
            if other.is_empty() {
                String::new()
            } else {
                format!(" (its runtimes: {})", other.join(", "))
            }
        ),
        TABLE_HINT,
    ))
}

/// `[grpc] address`, where the configuration sets it.
fn grpc_address(doc: &toml::Table) -> Option<String> {
    doc.get("grpc")
        .and_then(|g| g.get("address"))
        .and_then(toml::Value::as_str)
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
}

/// A Unix socket at `socket`.
fn socket_present(socket: &Path) -> HostOutcome {
    match std::fs::metadata(socket) {
        Ok(m) if m.file_type().is_socket() => Ok(format!("{} is a socket", socket.display())),
        Ok(_) => Err((
            format!("{} is not a socket", socket.display()),
            "check containerd's [grpc] address; remove what is in its place and restart containerd",
        )),
        Err(e) => Err((
            format!("no containerd socket at {}: {e}", socket.display()),
            "start containerd (systemctl start containerd); its [grpc] address names the socket",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("config.toml");
        std::fs::write(&p, text).expect("write");
        (dir, p)
    }

    #[test]
    fn the_runtime_table_is_found_in_either_containerds_layout_and_named_when_missing() {
        let cases: &[(&str, &str, Result<&str, &str>)] = &[
            (
                "containerd 1.x",
                "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.svc]\n  runtime_type = \"io.containerd.svc.v1\"\n",
                Ok("RuntimeClass handler \"svc\""),
            ),
            (
                "containerd 2.x, another handler name",
                "version = 3\n[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.sandboxed]\n  runtime_type = \"io.containerd.svc.v1\"\n",
                Ok("RuntimeClass handler \"sandboxed\""),
            ),
            (
                "only runc",
                "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n",
                Err("its runtimes: runc (io.containerd.runc.v2)"),
            ),
            (
                "empty",
                "",
                Err("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.svc]"),
            ),
            ("not TOML", "[plugins", Err("is not valid TOML")),
        ];
        for (name, text, want) in cases {
            let (_dir, p) = config(text);
            let got = read_config(&p).and_then(|doc| runtime_registered(&p, &doc));
            match (want, got) {
                (Ok(w), Ok(detail)) => assert!(detail.contains(w), "{name}: {detail}"),
                (Err(w), Err((why, _))) => assert!(why.contains(w), "{name}: {why}"),
                (_, got) => panic!("{name}: {got:?}"),
            }
        }
    }

    #[test]
    fn the_socket_is_the_configurations_grpc_address() {
        let (dir, p) = config("[grpc]\n  address = \"/nowhere/c.sock\"\n");
        let results = kubernetes_probes(&p, dir.path().to_str().expect("utf-8"));
        let socket = &results[2];
        assert_eq!(socket.name, "kubernetes:containerd-socket");
        let why = socket.reason.as_deref().unwrap_or_default();
        assert!(why.contains("/nowhere/c.sock"), "{why}");
        let shim = &results[0];
        assert!(shim.failed(), "no shim in an empty directory");
        assert!(
            shim.reason
                .as_deref()
                .unwrap_or_default()
                .contains("not on PATH"),
            "{shim:?}"
        );
    }
}
