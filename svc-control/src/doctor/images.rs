//! Where `svc doctor --microvm` finds the microvm images: what the running svcd says it uses
//! (`GET /v1/backends`), or, when svcd does not answer, this environment's `SVC_MICROVM_*`
//! and else svcd.toml's `[microvm]` keys, resolved as svcd resolves them.

use std::time::Instant;

use super::report::{CheckResult, HostOutcome, Status, host_result};
use crate::{api::BackendInfo, config::host::ImagePaths};

/// Where the microvm probes read the images.
#[derive(Debug, Clone)]
pub enum ImageSource {
    /// The running svcd's answer: its microvm backend (`None`: it runs without one), and
    /// where it was asked (for the note).
    Svcd(Option<BackendInfo>, String),
    /// svcd did not answer (why): this process's environment, else svcd.toml's `[microvm]`.
    Local(ImagePaths, String),
}

/// The image `name` (`kernel`, `rootfs`), its variable `var`: its path, or what is wrong and
/// the fix.
pub(super) fn image(
    source: &ImageSource,
    env: &dyn Fn(&str) -> Option<String>,
    name: &str,
    var: &str,
) -> Result<String, (String, &'static str)> {
    match source {
        ImageSource::Svcd(None, _) => Err((
            "the running svcd has no microvm backend".into(),
            "upgrade svcd (supervisor-upgrade) to one with the microvm backend",
        )),
        ImageSource::Svcd(Some(b), _) => match b.uses.iter().find(|u| u.name == name) {
            Some(u) => Ok(u.path.clone()),
            None => Err((
                format!(
                    "svcd's microvm backend is not available: {}",
                    b.unavailable.as_deref().unwrap_or("it names no image")
                ),
                "set microvm.kernel and microvm.rootfs in svcd.toml (or SVC_MICROVM_KERNEL and SVC_MICROVM_ROOTFS in svcd's environment) and restart svcd",
            )),
        },
        ImageSource::Local(paths, _) => {
            let configured = match name {
                "kernel" => &paths.kernel,
                _ => &paths.rootfs,
            };
            match (env(var).filter(|v| !v.is_empty()), configured) {
                (Some(p), _) => readable(var, p),
                (None, Some(p)) => readable(&format!("microvm.{name}"), p.display().to_string()),
                (None, None) => Err((
                    format!("{var} is not set"),
                    "set it to the microvm image (svcd images build makes them)",
                )),
            }
        }
    }
}

/// `p` (named by `what`) when it can be opened.
fn readable(what: &str, p: String) -> Result<String, (String, &'static str)> {
    match std::fs::File::open(&p) {
        Ok(_) => Ok(p),
        Err(e) => Err((format!("{what}={p}: {e}"), "point it at a readable file")),
    }
}

/// The image probe's outcome: the path and, from svcd, where svcd took it.
pub(super) fn probe(
    source: &ImageSource,
    env: &dyn Fn(&str) -> Option<String>,
    name: &str,
    var: &str,
) -> HostOutcome {
    let path = image(source, env, name, var)?;
    Ok(match source {
        ImageSource::Svcd(Some(b), _) => {
            let from = b.uses.iter().find(|u| u.name == name).map(|u| &u.from);
            format!("{path} (svcd uses it, from {})", from.map_or("?", |f| f))
        }
        _ => path,
    })
}

/// `host:microvm-images`: where the microvm probes read the images — svcd's answer, or a note
/// that svcd did not answer and this environment was read instead (skipped, not failed).
pub(super) fn source_result(source: &ImageSource) -> CheckResult {
    let t0 = Instant::now();
    match source {
        ImageSource::Svcd(_, asked) => host_result(
            "microvm-images",
            false,
            t0,
            Ok(format!("the running svcd's images (asked on {asked})")),
        ),
        ImageSource::Local(_, why) => CheckResult {
            status: Status::Skipped,
            reason: Some(format!(
                "svcd did not answer ({why}): the images below are read from this shell's \
                 environment and svcd.toml, which may not be svcd's"
            )),
            ..host_result("microvm-images", false, t0, Ok(String::new()))
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Used;

    fn microvm(uses: &[(&str, &str, &str)], unavailable: Option<&str>) -> BackendInfo {
        BackendInfo {
            kind: "microvm".into(),
            aliases: Vec::new(),
            summary: String::new(),
            isolates_with: String::new(),
            can_fork: true,
            available: unavailable.is_none(),
            unavailable: unavailable.map(Into::into),
            accel: None,
            uses: uses
                .iter()
                .map(|(name, path, from)| Used {
                    name: (*name).into(),
                    path: (*path).into(),
                    from: (*from).into(),
                })
                .collect(),
        }
    }

    #[test]
    fn the_images_come_from_svcd_when_it_answers_else_from_here() {
        let none = |_: &str| None;
        let asked = "/run/svc/svcd.sock".to_owned();
        let svcd = ImageSource::Svcd(
            Some(microvm(
                &[("kernel", "/img/vmlinuz", "microvm.kernel")],
                None,
            )),
            asked.clone(),
        );
        assert_eq!(
            probe(&svcd, &none, "kernel", "SVC_MICROVM_KERNEL"),
            Ok("/img/vmlinuz (svcd uses it, from microvm.kernel)".into())
        );
        let why = "the microvm backend needs SVC_MICROVM_KERNEL …";
        let off = ImageSource::Svcd(Some(microvm(&[], Some(why))), asked.clone());
        let (wrong, fix) = probe(&off, &none, "kernel", "SVC_MICROVM_KERNEL").expect_err("off");
        assert_eq!(
            wrong,
            format!("svcd's microvm backend is not available: {why}")
        );
        assert!(fix.contains("microvm.kernel"), "{fix}");
        let without = ImageSource::Svcd(None, asked);
        assert!(probe(&without, &none, "rootfs", "SVC_MICROVM_ROOTFS").is_err());

        // Not answered: this environment, else svcd.toml's keys.
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("vmlinuz");
        std::fs::write(&file, b"k").expect("write");
        let local = ImageSource::Local(
            ImagePaths {
                kernel: Some(file.clone()),
                ..ImagePaths::default()
            },
            "refused".into(),
        );
        assert_eq!(
            probe(&local, &none, "kernel", "SVC_MICROVM_KERNEL"),
            Ok(file.display().to_string())
        );
        let env = |_: &str| Some("/nonexistent/vmlinuz".to_owned());
        let (wrong, _) = probe(&local, &env, "kernel", "SVC_MICROVM_KERNEL").expect_err("env wins");
        assert!(
            wrong.starts_with("SVC_MICROVM_KERNEL=/nonexistent/vmlinuz: "),
            "{wrong}"
        );
        assert_eq!(source_result(&local).status, Status::Skipped);
    }
}
