//! The microvm images boot: QEMU `-M microvm` (KVM where usable, else TCG) with the kernel,
//! initramfs and ext4 root file system `cargo xtask images` builds, and the in-guest agent
//! answers on its virtio-serial channel — also after the host side disconnects and comes back
//! (svcd restarting, a VM forked).

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::net::UnixStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use svc_tests::{require_root, unique, world::image_dir};

/// The microvm images next to the base image.
fn microvm_dir() -> PathBuf {
    let dir = image_dir()
        .parent()
        .expect("images directory")
        .join("microvm");
    for f in ["vmlinuz", "initrd.img", "rootfs.ext4"] {
        assert!(
            dir.join(f).exists(),
            "{} is missing: build the images with `cargo xtask images` (`cargo xtask test` does)",
            dir.join(f).display()
        );
    }
    dir
}

/// The host's TSC frequency in kHz, for the guest's early calibration under TCG.
fn tsc_khz() -> u64 {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("cpu MHz"))
        .and_then(|v| {
            v.trim_start_matches([' ', '\t', ':'])
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(2_000_000, |mhz| (mhz * 1000.0) as u64)
}

/// KVM only where the CPU shows virtualisation and /dev/kvm is there (a nested machine without
/// vmx/svm has /dev/kvm but cannot run a guest).
fn kvm_usable() -> bool {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    Path::new("/dev/kvm").exists()
        && cpu
            .lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"))
}

struct Vm {
    child: Child,
    dir: PathBuf,
    channel: PathBuf,
}

impl Vm {
    fn boot() -> Self {
        let images = microvm_dir();
        let dir = std::env::temp_dir().join(unique("svm"));
        std::fs::create_dir_all(&dir).expect("vm dir");
        let disk = dir.join("disk.qcow2");
        let made = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(images.join("rootfs.ext4"))
            .arg(&disk)
            .status()
            .expect("qemu-img");
        assert!(made.success(), "qemu-img create");
        let channel = dir.join("agent.sock");
        let accel = if kvm_usable() { "kvm" } else { "tcg" };
        let child = Command::new("qemu-system-x86_64")
            .args(["-M", "microvm,pit=on,acpi=on", "-accel"])
            .arg(accel)
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
            .arg(format!(
                "console=ttyS0 tsc_early_khz={} panic=-1 quiet",
                tsc_khz()
            ))
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

    /// What QEMU printed, if it has exited.
    fn qemu_said(&mut self) -> String {
        match self.child.try_wait() {
            Ok(Some(status)) => {
                let mut err = String::new();
                if let Some(mut e) = self.child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut e, &mut err);
                }
                format!("exited ({status}): {err}")
            }
            _ => "still running".into(),
        }
    }

    /// Boot and wait for the agent's first ready line on a fresh connection.
    fn boot_ready() -> (Self, BufReader<UnixStream>, UnixStream) {
        let mut vm = Self::boot();
        let (reader, writer, first) = vm.connect(Duration::from_secs(60));
        assert_eq!(
            first.trim_end(),
            svc_guest::READY,
            "console:\n{}",
            vm.console()
        );
        (vm, reader, writer)
    }

    fn console(&self) -> String {
        std::fs::read_to_string(self.dir.join("console.log")).unwrap_or_default()
    }

    /// Connect to the agent's channel and read its first line, within `limit`.
    fn connect(&mut self, limit: Duration) -> (BufReader<UnixStream>, UnixStream, String) {
        let deadline = Instant::now() + limit;
        let stream = loop {
            match UnixStream::connect(&self.channel) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => panic!(
                    "no agent channel: {e}\nconsole:\n{}\nqemu: {}",
                    self.console(),
                    self.qemu_said()
                ),
            }
        };
        stream
            .set_read_timeout(Some(deadline.saturating_duration_since(Instant::now())))
            .expect("timeout");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut first = String::new();
        if let Err(e) = reader.read_line(&mut first) {
            panic!("the agent said nothing ({e}); console:\n{}", self.console());
        }
        (reader, stream, first)
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ask(reader: &mut BufReader<UnixStream>, writer: &mut UnixStream, line: &str) -> String {
    writeln!(writer, "{line}").expect("write");
    let mut answer = String::new();
    reader.read_line(&mut answer).expect("answer");
    answer.trim_end().to_owned()
}

#[test]
fn the_images_boot_and_the_agent_answers_across_host_reconnects() {
    require_root();
    let (mut vm, mut reader, mut writer) = Vm::boot_ready();
    assert_eq!(ask(&mut reader, &mut writer, "ping"), "pong");
    assert!(ask(&mut reader, &mut writer, "version").starts_with(svc_guest::READY));
    let bad = ask(&mut reader, &mut writer, "rm -rf /");
    assert!(bad.starts_with("error: unknown request"), "{bad}");

    // The host side goes away and comes back: the agent says ready again.
    drop(reader);
    drop(writer);
    std::thread::sleep(Duration::from_millis(300));
    let (mut reader, mut writer, again) = vm.connect(Duration::from_secs(20));
    assert_eq!(
        again.trim_end(),
        svc_guest::READY,
        "console:\n{}",
        vm.console()
    );
    assert_eq!(ask(&mut reader, &mut writer, "ping"), "pong");
}

#[test]
fn a_vm_pauses_and_resumes_over_qmp_and_its_agent_waits_meanwhile() {
    require_root();
    let (vm, mut reader, mut writer) = Vm::boot_ready();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let qmp_path = vm.dir.join("qmp.sock");
    let mut qmp = rt
        .block_on(svc_control::runtime::microvm::qmp::Qmp::connect(
            &qmp_path,
            Duration::from_secs(10),
        ))
        .expect("QMP");
    assert!(qmp.version.starts_with("10."), "QEMU {}", qmp.version);
    assert_eq!(rt.block_on(qmp.status()).expect("status"), "running");

    let t = Instant::now();
    rt.block_on(qmp.execute("stop", None)).expect("stop");
    let paused_in = t.elapsed();
    assert_eq!(rt.block_on(qmp.status()).expect("status"), "paused");
    // Paused: the agent cannot answer.
    writeln!(writer, "ping").expect("write");
    // One socket behind both handles: its read timeout is the reader's.
    reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(800)))
        .expect("timeout");
    let mut answer = String::new();
    assert!(
        reader.read_line(&mut answer).is_err(),
        "a paused guest answered: {answer:?}"
    );
    let t = Instant::now();
    rt.block_on(qmp.execute("cont", None)).expect("cont");
    let resumed_in = t.elapsed();
    reader
        .get_ref()
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    answer.clear();
    reader
        .read_line(&mut answer)
        .expect("the answer after resume");
    assert_eq!(answer.trim_end(), "pong");
    assert_eq!(rt.block_on(qmp.status()).expect("status"), "running");
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
    let err = rt
        .block_on(qmp.execute("no-such-command", None))
        .expect_err("refused");
    assert!(err.to_string().contains("no-such-command"), "{err}");
    println!("QMP stop {paused_in:?}, cont {resumed_in:?}");
    let _ = rt.block_on(qmp.execute("quit", None));
}
