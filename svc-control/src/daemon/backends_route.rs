//! `GET /v1/backends`: what each registered backend is, whether it can make sandboxes now
//! and what it uses (the microvm backend's images, with where svcd took each from). What it
//! uses names the host's files: root reads it, other callers get the rest.

use crate::{
    api::{BackendInfo, Backends, Used},
    runtime::Backends as Registry,
};

/// The answer of `GET /v1/backends` for the backends in `registry`; `env` reads svcd's
/// environment (to say whether an image came from it or from svcd.toml). `root`: the caller
/// is root, and reads the host paths each backend uses too.
pub(super) fn describe(
    registry: &Registry,
    env: impl Fn(&str) -> Option<String>,
    root: bool,
) -> Backends {
    let backends = registry
        .all()
        .map(|b| {
            let (about, availability) = (b.describe(), b.availability());
            BackendInfo {
                kind: about.kind.name.to_owned(),
                aliases: about.kind.aliases.iter().map(|a| (*a).to_owned()).collect(),
                summary: about.summary.to_owned(),
                isolates_with: about.isolates_with.to_owned(),
                can_fork: about.can_fork,
                available: availability.is_ok(),
                unavailable: availability.err(),
                accel: b.accel(),
                uses: (if root { b.details() } else { Vec::new() })
                    .into_iter()
                    .map(|(name, path)| Used {
                        from: source(about.kind.name, name, &env),
                        name: name.to_owned(),
                        path,
                    })
                    .collect(),
            }
        })
        .collect();
    Backends {
        default: registry.default_name().to_owned(),
        backends,
    }
}

/// Where backend `kind`'s `name` came from: its `SVC_<KIND>_<NAME>` variable when svcd's
/// environment sets it (it wins), else its key in svcd.toml.
fn source(kind: &str, name: &str, env: &impl Fn(&str) -> Option<String>) -> String {
    let var = format!("SVC_{}_{}", kind.to_uppercase(), name.to_uppercase());
    if env(&var).is_some_and(|v| !v.is_empty()) {
        var
    } else {
        format!("{kind}.{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_comes_from_the_environment_when_it_is_set_there() {
        let env = |v: &str| (v == "SVC_MICROVM_KERNEL").then(|| "/k".to_owned());
        assert_eq!(source("microvm", "kernel", &env), "SVC_MICROVM_KERNEL");
        assert_eq!(source("microvm", "rootfs", &env), "microvm.rootfs");
        let empty = |_: &str| Some(String::new());
        assert_eq!(source("microvm", "initrd", &empty), "microvm.initrd");
    }
}
