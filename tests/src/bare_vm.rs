//! A VM booted bare, without svcd, for the benches that put svcd's figures beside the floor:
//! its disk an overlay of the image, QEMU started paused as root with `Qemu::args`'s command
//! line, continued, up to its agent's hello on its channel.

use std::{
    ffi::OsString,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use svc_control::runtime::microvm::{
    channel::Channel,
    qemu::{Accel, Images, Launch, Qemu, VmDir},
    qmp::Qmp,
};

/// A booted bare VM: its QEMU, its monitor, its agent's channel.
pub struct BareVm {
    pub child: tokio::process::Child,
    pub qmp: Qmp,
    pub channel: Arc<Channel>,
}

/// The test images a bare VM boots (`world::microvm_images`).
pub fn images() -> Images {
    let dir = crate::world::microvm_images();
    Images {
        kernel: dir.join("vmlinuz"),
        initrd: Some(dir.join("initrd.img")),
        rootfs: dir.join("rootfs.ext4"),
    }
}

/// The runtime the benches boot bare VMs on: two workers.
///
/// # Panics
/// When tokio cannot make it.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The guest's disk in `dir`: a qcow2 overlay of `images.rootfs`, of `size_mib` when given
/// (else the image's size).
///
/// # Panics
/// When `qemu-img` fails.
pub async fn overlay(images: &Images, dir: &VmDir, size_mib: Option<u64>) {
    let mut made = tokio::process::Command::new("qemu-img");
    made.args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
        .arg(&images.rootfs)
        .arg(dir.disk());
    if let Some(mib) = size_mib {
        made.arg(format!("{mib}M"));
    }
    assert!(made.status().await.expect("qemu-img").success(), "qemu-img");
}

/// QEMU's command line for a 512 MiB, one-CPU VM in `dir` on tap `tap` with the vhost-user
/// devices `shared`, as root (without the switch to an unprivileged user svcd makes).
pub fn root_args(
    dir: &VmDir,
    images: &Images,
    accel: Accel,
    tap: &str,
    shared: &[(PathBuf, String)],
) -> Vec<OsString> {
    let qemu = Qemu {
        binary: "qemu-system-x86_64".into(),
        accel,
    };
    let launch = Launch {
        dir,
        images,
        tap,
        memory_mib: 512,
        cpus: 1,
        incoming: None,
        run_as: (0, 0),
        shared,
        vsock: None,
    };
    let mut args = qemu.args(&launch);
    if let Some(i) = args.iter().position(|a| a == "-run-with") {
        args.drain(i..i + 2);
    }
    args
}

/// QEMU started with `args` (its VM in `dir`, paused), continued, until its agent says hello.
///
/// # Panics
/// When QEMU ends or makes no monitor within 20 s, or its agent does not answer in 120 s.
pub async fn boot(dir: &VmDir, args: Vec<OsString>) -> BareVm {
    let mut child = tokio::process::Command::new("qemu-system-x86_64")
        .args(args)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("qemu");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut qmp = loop {
        if let Ok(q) = Qmp::connect(&dir.qmp(), Duration::from_secs(10)).await {
            break q;
        }
        assert!(
            child.try_wait().expect("qemu").is_none() && Instant::now() < deadline,
            "QEMU did not start"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    qmp.execute("cont", None).await.expect("cont");
    let channel = Channel::connect(&dir.agent(), Duration::from_secs(120))
        .await
        .expect("the agent answers");
    BareVm {
        child,
        qmp,
        channel,
    }
}

impl BareVm {
    /// Ask QEMU to quit, and wait for it.
    pub async fn quit(mut self) {
        let _ = self.qmp.execute("quit", None).await;
        let _ = self.child.wait().await;
    }
}
