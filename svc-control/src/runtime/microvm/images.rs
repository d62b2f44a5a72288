//! The microvm guest's images (kernel, optional initramfs, root file system), as svcd's
//! environment or its configuration names them; or why they are not usable.

use std::{ffi::OsString, path::PathBuf};

use crate::config::host::ImagePaths;

/// The kernel, initramfs and root file system images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Images {
    pub kernel: PathBuf,
    /// Our addition: Debian's kernels build virtio as modules, loaded by an initramfs.
    pub initrd: Option<PathBuf>,
    pub rootfs: PathBuf,
}

/// One image: its environment variable, its key in `[microvm]`, what it is, whether required.
struct Image {
    var: &'static str,
    key: &'static str,
    what: &'static str,
    required: bool,
}

const KERNEL: Image = Image {
    var: "SVC_MICROVM_KERNEL",
    key: "kernel",
    what: "the microvm kernel image",
    required: true,
};
const ROOTFS: Image = Image {
    var: "SVC_MICROVM_ROOTFS",
    key: "rootfs",
    what: "the microvm rootfs image (ext4)",
    required: true,
};
const INITRD: Image = Image {
    var: "SVC_MICROVM_INITRD",
    key: "initrd",
    what: "the microvm initramfs",
    required: false,
};

impl Images {
    /// The images named by `SVC_MICROVM_KERNEL`, `SVC_MICROVM_ROOTFS` and (optional)
    /// `SVC_MICROVM_INITRD` in `env`; an error naming the variable that is missing or wrong.
    pub fn from_env(env: impl Fn(&str) -> Option<OsString>) -> Result<Self, String> {
        Self::resolve(&ImagePaths::default(), env)
    }

    /// The images named in `env` (`SVC_MICROVM_*`, which win) or else in `[microvm]`
    /// (`configured`); an error naming the variable or key that is missing or wrong.
    pub fn resolve(
        configured: &ImagePaths,
        env: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Self, String> {
        let path = |image: &Image, file: &Option<PathBuf>| -> Result<Option<PathBuf>, String> {
            let (name, p) = match (env(image.var).filter(|v| !v.is_empty()), file) {
                (Some(v), _) => (image.var.to_owned(), PathBuf::from(v)),
                (None, Some(p)) => (format!("microvm.{}", image.key), p.clone()),
                (None, None) if image.required => {
                    return Err(format!(
                        "the microvm backend needs {} (the path to {}) in svcd's environment, \
                         or {} in svcd.toml's [microvm]",
                        image.var, image.what, image.key
                    ));
                }
                (None, None) => return Ok(None),
            };
            if !p.is_absolute() {
                return Err(format!("{name}={}: expected an absolute path", p.display()));
            }
            match std::fs::metadata(&p) {
                Ok(m) if m.is_file() => Ok(Some(p)),
                Ok(_) => Err(format!("{name}={}: not a file", p.display())),
                Err(e) => Err(format!("{name}={}: {e}", p.display())),
            }
        };
        let kernel = path(&KERNEL, &configured.kernel)?;
        let rootfs = path(&ROOTFS, &configured.rootfs)?;
        let initrd = path(&INITRD, &configured.initrd)?;
        match (kernel, rootfs) {
            (Some(kernel), Some(rootfs)) => Ok(Self {
                kernel,
                initrd,
                rootfs,
            }),
            _ => Err("the microvm images are not set".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_or_wrong_images_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kernel = dir.path().join("vmlinuz");
        std::fs::write(&kernel, b"k").expect("write");
        let k = kernel.clone().into_os_string();
        type Env = Vec<(&'static str, OsString)>;
        let cases: Vec<(&str, Env, &str)> = vec![
            (
                "no kernel",
                vec![],
                "the microvm backend needs SVC_MICROVM_KERNEL (the path to the microvm kernel image) in svcd's environment",
            ),
            (
                "no rootfs",
                vec![("SVC_MICROVM_KERNEL", k.clone())],
                "the microvm backend needs SVC_MICROVM_ROOTFS (the path to the microvm rootfs image (ext4)) in svcd's environment",
            ),
            (
                "relative",
                vec![("SVC_MICROVM_KERNEL", "vmlinuz".into())],
                "SVC_MICROVM_KERNEL=vmlinuz: expected an absolute path",
            ),
            (
                "absent file",
                vec![
                    ("SVC_MICROVM_KERNEL", k.clone()),
                    ("SVC_MICROVM_ROOTFS", "/nonexistent/rootfs.ext4".into()),
                ],
                "SVC_MICROVM_ROOTFS=/nonexistent/rootfs.ext4: No such file or directory (os error 2)",
            ),
            (
                "a directory",
                vec![("SVC_MICROVM_KERNEL", dir.path().as_os_str().to_owned())],
                "not a file",
            ),
        ];
        for (name, env, want) in cases {
            let err =
                Images::from_env(|v| env.iter().find(|(k, _)| *k == v).map(|(_, x)| x.clone()))
                    .expect_err(name);
            assert!(err.contains(want), "{name}: {err}");
        }
        let ok = Images::from_env(|v| match v {
            "SVC_MICROVM_KERNEL" | "SVC_MICROVM_ROOTFS" => Some(k.clone()),
            _ => None,
        })
        .expect("both set");
        assert_eq!(ok.initrd, None, "the initramfs is optional");
    }

    #[test]
    fn the_environment_wins_over_the_configuration() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = |name: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, b"x").expect("write");
            p
        };
        let (k_env, k_file, rootfs) = (file("env-vmlinuz"), file("vmlinuz"), file("rootfs"));
        let configured = ImagePaths {
            kernel: Some(k_file.clone()),
            rootfs: Some(rootfs.clone()),
            initrd: None,
        };
        let none = |_: &str| None;
        let from_file = Images::resolve(&configured, none).expect("the file's images");
        assert_eq!((&from_file.kernel, &from_file.rootfs), (&k_file, &rootfs));
        let env = |v: &str| (v == "SVC_MICROVM_KERNEL").then(|| k_env.clone().into_os_string());
        let both = Images::resolve(&configured, env).expect("both");
        assert_eq!(both.kernel, k_env, "the environment wins");
        assert_eq!(both.rootfs, rootfs, "the file fills in the rest");
        let missing = ImagePaths {
            initrd: Some(dir.path().join("no-initrd")),
            ..configured
        };
        let err = Images::resolve(&missing, none).expect_err("an absent initramfs");
        assert!(
            err.starts_with(&format!(
                "microvm.initrd={}: No such file",
                dir.path().join("no-initrd").display()
            )),
            "{err}"
        );
        let err = Images::resolve(&ImagePaths::default(), none).expect_err("nothing");
        assert_eq!(
            err,
            "the microvm backend needs SVC_MICROVM_KERNEL (the path to the microvm kernel \
             image) in svcd's environment, or kernel in svcd.toml's [microvm]"
        );
    }
}
