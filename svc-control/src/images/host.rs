//! What the build takes from the host: root, its tools (each named with the Debian package
//! that has it), its Debian suite and apt sources, and running a command.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use super::ImagesError;

/// The tools the build runs, the Debian package of each, and what it is for.
const TOOLS: &[(&str, &str, &str)] = &[
    (
        "mmdebstrap",
        "mmdebstrap",
        "it builds the base tree from Debian packages",
    ),
    (
        "apt-get",
        "apt",
        "it downloads the microvm kernel and busybox",
    ),
    ("dpkg-deb", "dpkg", "it unpacks the downloaded packages"),
    (
        "mkfs.ext4",
        "e2fsprogs",
        "it makes the microvm root file system",
    ),
    (
        "debugfs",
        "e2fsprogs",
        "it puts the agent into the microvm root file system",
    ),
];

/// Refuse unless running as root.
pub(super) fn require_root() -> Result<(), ImagesError> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        Err(ImagesError::NotRoot)
    }
}

/// Refuse, naming its package, when `tool` is not on PATH.
pub(super) fn require_tool(tool: &str) -> Result<(), ImagesError> {
    let Some(&(tool, package, why)) = TOOLS.iter().find(|(t, _, _)| *t == tool) else {
        return Err(ImagesError::Input(format!("unknown tool {tool}")));
    };
    if on_path(tool).is_some() {
        Ok(())
    } else {
        Err(ImagesError::MissingTool { tool, package, why })
    }
}

/// `name` in a directory of PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The host's Debian suite (`VERSION_CODENAME` of /etc/os-release).
pub(super) fn suite() -> Result<String, ImagesError> {
    let text =
        std::fs::read_to_string("/etc/os-release").map_err(super::io("reading /etc/os-release"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim_matches('"').to_owned())
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            ImagesError::Input(
                "/etc/os-release names no VERSION_CODENAME: the images are built from Debian \
                 packages, on a Debian host"
                    .into(),
            )
        })
}

/// The host's own Debian apt sources: `SVC_IMAGE_SOURCES` if set, else the Debian entry of
/// sources.list.d (deb822), else sources.list.
pub(super) fn sources() -> Result<PathBuf, ImagesError> {
    if let Some(p) = std::env::var_os("SVC_IMAGE_SOURCES") {
        return Ok(PathBuf::from(p));
    }
    for p in [
        "/etc/apt/sources.list.d/debian.sources",
        "/etc/apt/sources.list",
    ] {
        let path = Path::new(p);
        if std::fs::read_to_string(path).is_ok_and(|t| {
            t.lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        }) {
            return Ok(path.to_path_buf());
        }
    }
    Err(ImagesError::Input(
        "no apt sources found (/etc/apt/sources.list.d/debian.sources, /etc/apt/sources.list): \
         set SVC_IMAGE_SOURCES to a sources file mmdebstrap can use"
            .into(),
    ))
}

/// Run `cmd` with no input and return its stdout; fail with its stderr.
pub(super) fn run(cmd: &mut Command) -> Result<String, ImagesError> {
    let shown = shown(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(super::io(format!("starting {shown}")))?;
    if !out.status.success() {
        return Err(ImagesError::Command {
            command: shown,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A command line as a person would type it.
fn shown(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Nanoseconds since the epoch: a build's identity in its stamp.
pub(super) fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}
