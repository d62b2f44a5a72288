//! The microvm backend (in progress): QEMU `-M microvm` guests. What is here so far is the QMP
//! client the backend drives QEMU with; the images and the in-guest agent are built by
//! `cargo xtask images` and `svc-guest` (docs/microvm.md).

pub mod channel;
pub mod qmp;
