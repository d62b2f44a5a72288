//! The microvm guest's images (kernel, optional initramfs, root file system), as svcd's
//! environment names them; or why they are not usable.

use std::{ffi::OsString, path::PathBuf};

/// The kernel, initramfs and root file system images.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Images {
    pub kernel: PathBuf,
    /// Our addition: Debian's kernels build virtio as modules, loaded by an initramfs.
    pub initrd: Option<PathBuf>,
    pub rootfs: PathBuf,
}

impl Images {
    /// The images named by `SVC_MICROVM_KERNEL`, `SVC_MICROVM_ROOTFS` and (optional)
    /// `SVC_MICROVM_INITRD` in `env`; an error naming the variable that is missing or wrong.
    pub fn from_env(env: impl Fn(&str) -> Option<OsString>) -> Result<Self, String> {
        let path = |var: &str, what: &str, required: bool| -> Result<Option<PathBuf>, String> {
            let Some(v) = env(var).filter(|v| !v.is_empty()) else {
                return if required {
                    Err(format!(
                        "the microvm backend needs {var} (the path to {what}) in svcd's environment"
                    ))
                } else {
                    Ok(None)
                };
            };
            let p = PathBuf::from(v);
            if !p.is_absolute() {
                return Err(format!("{var}={}: expected an absolute path", p.display()));
            }
            match std::fs::metadata(&p) {
                Ok(m) if m.is_file() => Ok(Some(p)),
                Ok(_) => Err(format!("{var}={}: not a file", p.display())),
                Err(e) => Err(format!("{var}={}: {e}", p.display())),
            }
        };
        let kernel = path("SVC_MICROVM_KERNEL", "the microvm kernel image", true)?;
        let rootfs = path(
            "SVC_MICROVM_ROOTFS",
            "the microvm rootfs image (ext4)",
            true,
        )?;
        let initrd = path("SVC_MICROVM_INITRD", "the microvm initramfs", false)?;
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
}
