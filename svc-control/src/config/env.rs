//! Environment variables svc reads: the microvm backend's images, and the variables
//! that were removed and must not be silently ignored.

use std::path::PathBuf;

use serde::Serialize;

use super::{ConfigError, ConfigErrors, Location};

/// Removed, no longer supported. Setting one is an error, not a no-op.
pub const REMOVED_VARIABLES: [&str; 3] = [
    "SVC_DOCTOR_MICROVM_EXEC_MODE",
    "SVC_DOCTOR_MICROVM_INSTANCE",
    "SVC_DOCTOR_MICROVM_DOCKER_MODE",
];
pub const MICROVM_KERNEL: &str = "SVC_MICROVM_KERNEL";
pub const MICROVM_ROOTFS: &str = "SVC_MICROVM_ROOTFS";

const FILE: &str = "<environment>";

/// Refuse every removed variable that is set, naming each.
pub fn check_removed(get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigErrors> {
    let errors: Vec<ConfigError> = REMOVED_VARIABLES
        .iter()
        .filter(|v| get(v).is_some())
        .map(|v| {
            ConfigError::new(
                FILE,
                Location::at(*v),
                format!("{v} is set, but it was removed and is no longer supported; unset it"),
            )
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ConfigErrors(errors))
    }
}

/// The microvm backend's kernel and rootfs images.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MicrovmImages {
    pub kernel: PathBuf,
    pub rootfs: PathBuf,
}

/// Read `SVC_MICROVM_KERNEL` and `SVC_MICROVM_ROOTFS`; both are required for the microvm backend.
pub fn microvm_images(get: impl Fn(&str) -> Option<String>) -> Result<MicrovmImages, ConfigErrors> {
    let mut errors = Vec::new();
    let mut read = |var: &str, what: &str| match get(var).filter(|v| !v.is_empty()) {
        Some(v) => PathBuf::from(v),
        None => {
            errors.push(ConfigError::new(
                FILE,
                Location::at(var),
                format!("{var} is not set: the microvm backend needs the path to its {what}"),
            ));
            PathBuf::new()
        }
    };
    let kernel = read(MICROVM_KERNEL, "kernel image");
    let rootfs = read(MICROVM_ROOTFS, "rootfs image (ext4)");
    if errors.is_empty() {
        Ok(MicrovmImages { kernel, rootfs })
    } else {
        Err(ConfigErrors(errors))
    }
}
