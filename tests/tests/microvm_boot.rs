//! The microvm images boot under a bare QEMU `-M microvm` (KVM where usable, else TCG) with
//! the kernel, initramfs and ext4 root file system `cargo xtask images` builds, and the
//! in-guest agent serves its virtio-serial channel — also after the host side disconnects and
//! comes back (svcd restarting, a VM forked); QMP pauses and resumes it.

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use svc_control::runtime::microvm::{
    channel::Channel,
    qemu::{self, Accel},
};
use svc_guest::proto::Exec;
use svc_tests::{require_root, world::microvm_images};
use tokio::io::AsyncReadExt as _;

struct Vm {
    child: Child,
    dir: PathBuf,
    channel: PathBuf,
}

impl Vm {
    fn boot() -> Self {
        let images = microvm_images();
        let dir = svc_tests::fresh_dir("svm");
        let disk = dir.join("disk.qcow2");
        let made = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(images.join("rootfs.ext4"))
            .arg(&disk)
            .status()
            .expect("qemu-img");
        assert!(made.success(), "qemu-img create");
        let channel = dir.join("agent.sock");
        // The backend's own choice of accelerator and kernel command line.
        let (accel, _) = Accel::choose("auto");
        let child = Command::new("qemu-system-x86_64")
            .args(["-M", "microvm,pit=on,acpi=on", "-accel"])
            .arg(accel.name())
            .args([
                "-m",
                "256",
                "-nodefaults",
                "-no-user-config",
                "-nographic",
                "-no-reboot",
            ])
            .arg("-serial")
            .arg(format!("file:{}", dir.join("console.log").display()))
            .arg("-kernel")
            .arg(images.join("vmlinuz"))
            .arg("-initrd")
            .arg(images.join("initrd.img"))
            .arg("-append")
            .arg(qemu::cmdline(accel))
            .arg("-drive")
            .arg(format!(
                "id=root,file={},format=qcow2,if=none",
                disk.display()
            ))
            .args(["-device", "virtio-blk-device,drive=root"])
            .args(["-device", "virtio-serial-device", "-chardev"])
            .arg(format!(
                "socket,id=agent,path={},server=on,wait=off",
                channel.display()
            ))
            .args(["-device", "virtserialport,chardev=agent,name=svc.agent"])
            .arg("-qmp")
            .arg(format!(
                "unix:{},server=on,wait=off",
                dir.join("qmp.sock").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("qemu-system-x86_64 (cargo xtask setup installs it)");
        Self {
            child,
            dir,
            channel,
        }
    }

    fn console(&self) -> String {
        std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    /// Connect to the agent's channel (it answers hello once the guest is up).
    async fn connect(&self, limit: Duration) -> Arc<Channel> {
        match Channel::connect(&self.channel, limit).await {
            Ok(c) => c,
            Err(e) => panic!("no agent: {e}\nconsole:\n{}", self.console()),
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Run `script` in the guest; (exit code, stdout).
async fn sh(ch: &Arc<Channel>, script: &str) -> (i32, String) {
    let mut h = ch
        .exec(Exec {
            argv: vec!["sh".into(), "-c".into(), script.into()],
            env: vec![("PATH".into(), "/usr/bin:/bin:/usr/sbin:/sbin".into())],
            ..Exec::default()
        })
        .expect("exec");
    let mut out = String::new();
    h.stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .await
        .expect("read");
    (h.wait().await.expect("exit code"), out)
}

#[test]
fn the_agent_serves_across_host_reconnects_and_ends_what_a_gone_host_started() {
    require_root();
    let vm = Vm::boot();
    let rt = runtime();
    rt.block_on(async {
        let ch = vm.connect(Duration::from_secs(60)).await;
        assert_eq!(sh(&ch, "echo hi").await, (0, "hi\n".into()));
        // A command left running when the host side goes away (svcd restarting, a fork).
        let _orphan = ch
            .exec(Exec {
                argv: vec!["sleep".into(), "1000".into()],
                ..Exec::default()
            })
            .expect("exec");
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(ch);
        let ch = vm.connect(Duration::from_secs(20)).await;
        let (code, out) = sh(
            &ch,
            "for i in $(seq 50); do pgrep -x sleep >/dev/null || { echo gone; exit 0; }; sleep 0.1; done; ps -eo pid,pgid,stat,comm",
        )
        .await;
        assert_eq!((code, out.trim()), (0, "gone"), "the orphaned command still runs");
    });
}

#[test]
fn a_vm_pauses_and_resumes_over_qmp_and_its_agent_waits_meanwhile() {
    require_root();
    let vm = Vm::boot();
    let rt = runtime();
    rt.block_on(async {
        let ch = vm.connect(Duration::from_secs(60)).await;
        let mut qmp = svc_control::runtime::microvm::qmp::Qmp::connect(
            &vm.dir.join("qmp.sock"),
            Duration::from_secs(10),
        )
        .await
        .expect("QMP");
        assert!(qmp.version.starts_with("10."), "QEMU {}", qmp.version);
        assert_eq!(qmp.status().await.expect("status"), "running");
        let t = Instant::now();
        qmp.execute("stop", None).await.expect("stop");
        let paused_in = t.elapsed();
        assert_eq!(qmp.status().await.expect("status"), "paused");
        // Paused: a command does not run until the guest resumes.
        let pending = tokio::spawn({
            let ch = ch.clone();
            async move { sh(&ch, "echo after").await }
        });
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert!(!pending.is_finished(), "a paused guest ran a command");
        let t = Instant::now();
        qmp.execute("cont", None).await.expect("cont");
        let resumed_in = t.elapsed();
        let done = tokio::time::timeout(Duration::from_secs(20), pending)
            .await
            .expect("runs after resume")
            .expect("join");
        assert_eq!(done, (0, "after\n".into()));
        let events: Vec<&str> = qmp
            .events
            .iter()
            .filter_map(|e| e["event"].as_str())
            .collect();
        assert!(
            events.contains(&"STOP") && events.contains(&"RESUME"),
            "{events:?}"
        );
        // A command QEMU refuses is an error naming it, not a hang.
        let err = qmp
            .execute("no-such-command", None)
            .await
            .expect_err("refused");
        assert!(err.to_string().contains("no-such-command"), "{err}");
        println!("QMP stop {paused_in:?}, cont {resumed_in:?}");
        let _ = qmp.execute("quit", None).await;
    });
}
