//! What a pod container's root file system is given of its guest, on every backend (the
//! container backend's `container::ctr_root`, the microvm's `microvm::ctr_root`): where it goes
//! in the guest, and the guest's places bound over the same places inside it.

use crate::{
    proxy::guest_trust,
    runtime::{GuestHandle, RuntimeError},
};

/// The guest path of container `ctr`'s root.
pub fn guest_path(ctr: &str) -> String {
    format!("{}/{ctr}", svc_guest::enter::ROOTS_DIR)
}

/// The guest's paths bound into each container's tree, relative to both roots: (path, a
/// directory). The guest's `/proc`, `/dev` and `/sys`, its relay directory and the files svcd
/// gives every guest (resolv.conf, hosts, the CA bundle): a command in the container reaches
/// the same resolver, proxy CA and devices as the sandbox's own.
pub fn guest_binds() -> [(&'static str, bool); 8] {
    [
        ("proc", true),
        ("dev", true),
        ("sys", true),
        ("run/svc", true),
        ("etc/resolv.conf", false),
        ("etc/hosts", false),
        (trimmed(guest_trust::GUEST_BUNDLE), false),
        (trimmed(guest_trust::GUEST_CA_FILE), false),
    ]
}

/// An `operation` on container `ctr`'s root file system in `guest` that failed, saying why.
pub(crate) fn lifecycle<'a>(
    operation: &'static str,
    guest: &'a GuestHandle,
    ctr: &'a str,
) -> impl Fn(String) -> RuntimeError + 'a {
    move |message| RuntimeError::Lifecycle {
        operation,
        name: guest.name.clone(),
        message: format!("container {ctr}: {message}"),
    }
}

const fn trimmed(p: &'static str) -> &'static str {
    match p.as_bytes() {
        [b'/', ..] => p.split_at(1).1,
        _ => p,
    }
}
