//! The monitor the microvm backend drives: QEMU `-M microvm`, behind the [`Monitor`] trait so
//! that a Firecracker driver can follow on hosts that have it.
//!
//! Each VM gets: the kernel (and initramfs) and a copy-on-write overlay of the root file
//! system (qcow2 over the raw ext4 image); one virtio-net device on a tap named after the
//! sandbox's link (QEMU makes the tap; svcd addresses and fences it before the guest runs);
//! a virtio-serial port for the agent's channel; QMP on a unix socket; the serial console in
//! a bounded ring buffer (a guest that writes its console forever fills nothing). No balloon
//! device. QEMU starts paused (`-S`), opens its devices as root, then runs as an unprivileged
//! user (`-run-with user=`) under its own seccomp filter (`-sandbox on`, no spawning, no
//! obsolete or resource-control calls).

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use super::qmp::Qmp;
use crate::runtime::BoxFuture;

/// The files of a VM, in its sandbox's directory.
#[derive(Debug, Clone)]
pub struct VmDir(pub PathBuf);

impl VmDir {
    pub fn disk(&self) -> PathBuf {
        self.0.join("disk.qcow2")
    }
    pub fn qmp(&self) -> PathBuf {
        self.0.join("qmp.sock")
    }
    pub fn agent(&self) -> PathBuf {
        self.0.join("agent.sock")
    }
    pub fn pidfile(&self) -> PathBuf {
        self.0.join("qemu.pid")
    }
    pub fn log(&self) -> PathBuf {
        self.0.join("qemu.log")
    }
    /// vhost-device-vsock's vhost-user socket (QEMU's side).
    pub fn vsock_device(&self) -> PathBuf {
        self.0.join("vhu-vsock.sock")
    }
    /// The hybrid vsock socket svcd connects to (`CONNECT <port>`).
    pub fn vsock(&self) -> PathBuf {
        self.0.join("vsock.sock")
    }
    pub fn vsock_pidfile(&self) -> PathBuf {
        self.0.join("vsock.pid")
    }
    /// virtiofsd's socket for shared directory `i`.
    pub fn fs_socket(&self, i: usize) -> PathBuf {
        self.0.join(format!("fs{i}.sock"))
    }
    /// virtiofsd's pid for shared directory `i`.
    pub fn fs_pidfile(&self, i: usize) -> PathBuf {
        self.0.join(format!("fs{i}.pid"))
    }
}

/// The kernel, initramfs and root file system images (SPEC 2.8).
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

/// How guest code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation.
    Kvm,
    /// QEMU's emulator: slower by an order of magnitude, but it runs anywhere.
    Tcg,
}

impl Accel {
    pub const fn name(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        }
    }

    /// `auto`: KVM where `/dev/kvm` opens and the CPU shows vmx or svm (a nested machine
    /// without them has `/dev/kvm` but cannot run a guest), else TCG.
    pub fn choose(asked: &str) -> (Self, String) {
        match asked {
            "kvm" => (Self::Kvm, "microvm.accel = \"kvm\"".into()),
            "tcg" => (Self::Tcg, "microvm.accel = \"tcg\"".into()),
            _ => {
                let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
                let flags = cpu
                    .lines()
                    .filter(|l| l.starts_with("flags"))
                    .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
                let kvm = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/kvm");
                match (flags, kvm) {
                    (true, Ok(_)) => (Self::Kvm, "/dev/kvm opens and the CPU has vmx/svm".into()),
                    (false, _) => (
                        Self::Tcg,
                        "the CPU shows no vmx/svm (nested without virtualisation?)".into(),
                    ),
                    (true, Err(e)) => (Self::Tcg, format!("/dev/kvm: {e}")),
                }
            }
        }
    }
}

/// One VM to launch.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    pub dir: &'a VmDir,
    pub images: &'a Images,
    /// The tap (the sandbox's link) the monitor makes and plugs the guest's NIC into.
    pub tap: &'a str,
    pub memory_mib: u64,
    pub cpus: u32,
    /// Restore from this snapshot instead of booting (a fork's clone). Given on the command
    /// line, so QEMU opens it before it drops to `run_as` (the snapshot is its source VM's).
    pub incoming: Option<&'a Path>,
    /// The uid and gid QEMU runs as once its devices are open: this VM's own.
    pub run_as: (u32, u32),
    /// virtio-fs devices: (the virtiofsd socket, the tag the guest mounts).
    pub shared: &'a [(PathBuf, String)],
    /// The agent's channel over vsock instead of virtio-serial: the vhost-user socket of its
    /// vhost-device-vsock.
    pub vsock: Option<&'a Path>,
}

/// A VM monitor.
pub trait Monitor: Send + Sync {
    fn name(&self) -> &'static str;
    /// Start a VM, paused, with its devices open (the tap exists once this returns); the
    /// monitor's pid.
    fn launch<'a>(&'a self, vm: &'a Launch<'a>) -> BoxFuture<'a, Result<u32, String>>;
    /// Let the guest run (after launch or a pause).
    fn resume<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<(), String>>;
    /// Freeze the guest's CPUs.
    fn pause<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<(), String>>;
    /// Save a paused guest's memory and device state to `file`.
    fn snapshot<'a>(&'a self, dir: &'a VmDir, file: &'a Path) -> BoxFuture<'a, Result<(), String>>;
    /// Ask the monitor to exit (the guest ends with it).
    fn quit<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<(), String>>;
    /// The last of what the guest wrote on its console (for an error that explains a boot).
    fn console<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<String, String>>;
}

/// QEMU.
#[derive(Debug, Clone)]
pub struct Qemu {
    pub binary: PathBuf,
    pub accel: Accel,
}

/// How long QMP may take to answer one command.
const QMP_TIMEOUT: Duration = Duration::from_secs(30);

impl Qemu {
    /// QEMU's command line for `vm`.
    pub fn args(&self, vm: &Launch<'_>) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |s: &str| a.push(s.into());
        push("-M");
        if vm.shared.is_empty() && vm.vsock.is_none() {
            push("microvm,pit=on,acpi=on");
        } else {
            // vhost-user devices (virtiofsd) need the guest's RAM in shared memory, and modern
            // virtio-mmio.
            push("microvm,pit=on,acpi=on,memory-backend=mem");
            push("-object");
            push(&format!(
                "memory-backend-memfd,id=mem,size={}M,share=on",
                vm.memory_mib
            ));
            push("-global");
            push("virtio-mmio.force-legacy=false");
        }
        push("-accel");
        push(match self.accel {
            Accel::Kvm => "kvm",
            // A smaller code cache than the 1 GiB default: RSS stays near the guest's size.
            Accel::Tcg => "tcg,tb-size=64",
        });
        if self.accel == Accel::Kvm {
            push("-cpu");
            push("host");
        }
        for s in [
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
            "-S",
        ] {
            push(s);
        }
        push("-m");
        push(&vm.memory_mib.to_string());
        push("-smp");
        push(&vm.cpus.to_string());
        push("-chardev");
        push("ringbuf,id=console,size=1M");
        push("-serial");
        push("chardev:console");
        push("-kernel");
        a.push(vm.images.kernel.clone().into());
        if let Some(initrd) = &vm.images.initrd {
            a.push("-initrd".into());
            a.push(initrd.clone().into());
        }
        a.push("-append".into());
        a.push(cmdline(self.accel).into());
        a.push("-drive".into());
        a.push(
            format!(
                "id=root,file={},format=qcow2,if=none",
                vm.dir.disk().display()
            )
            .into(),
        );
        a.push("-device".into());
        a.push("virtio-blk-device,drive=root".into());
        match vm.vsock {
            None => {
                for s in ["-device", "virtio-serial-device", "-chardev"] {
                    a.push(s.into());
                }
                a.push(
                    format!(
                        "socket,id=agent,path={},server=on,wait=off",
                        vm.dir.agent().display()
                    )
                    .into(),
                );
                a.push("-device".into());
                a.push(
                    format!("virtserialport,chardev=agent,name={}", svc_guest::PORT_NAME).into(),
                );
            }
            Some(device) => {
                a.push("-chardev".into());
                a.push(format!("socket,id=vsock,path={}", device.display()).into());
                a.push("-device".into());
                a.push("vhost-user-vsock-device,chardev=vsock".into());
            }
        }
        a.push("-netdev".into());
        // No vhost: the kernel's vhost-net is not everywhere, and the fence is on the tap.
        a.push(
            format!(
                "tap,id=net,ifname={},script=no,downscript=no,vhost=off",
                vm.tap
            )
            .into(),
        );
        a.push("-device".into());
        a.push("virtio-net-device,netdev=net,mac=52:54:00:5c:00:02".into());
        for (i, (socket, tag)) in vm.shared.iter().enumerate() {
            a.push("-chardev".into());
            a.push(format!("socket,id=fs{i},path={}", socket.display()).into());
            a.push("-device".into());
            a.push(format!("vhost-user-fs-device,chardev=fs{i},tag={tag}").into());
        }
        a.push("-qmp".into());
        a.push(format!("unix:{},server=on,wait=off", vm.dir.qmp().display()).into());
        a.push("-pidfile".into());
        a.push(vm.dir.pidfile().into());
        for s in [
            "-sandbox",
            "on,obsolete=deny,spawn=deny,resourcecontrol=deny",
            "-run-with",
        ] {
            a.push(s.into());
        }
        a.push(format!("user={}:{}", vm.run_as.0, vm.run_as.1).into());
        if let Some(snapshot) = vm.incoming {
            let mut uri = OsString::from("file:");
            uri.push(snapshot);
            a.push("-incoming".into());
            a.push(uri);
        }
        a
    }

    async fn qmp(&self, dir: &VmDir) -> Result<Qmp, String> {
        Qmp::connect(&dir.qmp(), QMP_TIMEOUT).await.map_err(|e| {
            format!(
                "{e}: {}",
                std::error::Error::source(&e)
                    .map(ToString::to_string)
                    .unwrap_or_default()
            )
        })
    }

    async fn command(&self, dir: &VmDir, command: &str) -> Result<(), String> {
        let mut qmp = self.qmp(dir).await?;
        qmp.execute(command, None)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// The guest kernel's command line. Under TCG the early TSC calibration can hang: give it the
/// host's TSC frequency. A panic reboots at once, and `-no-reboot` turns that into QEMU's exit.
pub fn cmdline(accel: Accel) -> String {
    let mut c = "console=ttyS0 quiet panic=-1 ipv6.disable=1".to_owned();
    if accel == Accel::Tcg {
        c.push_str(&format!(" tsc_early_khz={}", tsc_khz()));
    }
    c
}

/// The host's TSC frequency in kHz.
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
        .filter(|mhz| mhz.is_finite() && *mhz > 0.0)
        .map_or(2_000_000, |mhz| {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "positive and finite, checked above"
            )]
            let khz = (mhz * 1000.0) as u64;
            khz
        })
}

impl Monitor for Qemu {
    fn name(&self) -> &'static str {
        "qemu"
    }

    fn launch<'a>(&'a self, vm: &'a Launch<'a>) -> BoxFuture<'a, Result<u32, String>> {
        Box::pin(async move {
            let log = std::fs::File::create(vm.dir.log())
                .map_err(|e| format!("{}: {e}", vm.dir.log().display()))?;
            let err = log.try_clone().map_err(|e| e.to_string())?;
            let args = self.args(vm);
            tracing::debug!(binary = %self.binary.display(), ?args, "launching QEMU");
            let mut child = tokio::process::Command::new(&self.binary)
                .args(args)
                .stdin(std::process::Stdio::null())
                .stdout(log)
                .stderr(err)
                // Its own process group: a signal to svcd's terminal does not reach it, and it
                // outlives an svcd restart.
                .process_group(0)
                .spawn()
                .map_err(|e| format!("running {}: {e}", self.binary.display()))?;
            let pid = child.id().ok_or("QEMU exited at once")?;
            // Reap it whenever it ends (after an svcd restart, init does).
            let (tx, mut exited) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                let status = child.wait().await;
                let _ = tx.send(status);
            });
            let deadline = Instant::now() + QMP_TIMEOUT;
            loop {
                if let Ok(status) = exited.try_recv() {
                    let said = std::fs::read_to_string(vm.dir.log()).unwrap_or_default();
                    return Err(format!(
                        "QEMU exited ({}): {}",
                        status.map_or_else(|e| e.to_string(), |s| s.to_string()),
                        said.trim()
                    ));
                }
                if vm.dir.qmp().exists()
                    && let Ok(mut qmp) = Qmp::connect(&vm.dir.qmp(), QMP_TIMEOUT).await
                {
                    let status = qmp.status().await.map_err(|e| e.to_string())?;
                    if status != "prelaunch" && status != "inmigrate" {
                        return Err(format!("QEMU started in state {status}, not paused"));
                    }
                    if vm.incoming.is_some() {
                        wait_loaded(&mut qmp, deadline).await?;
                    }
                    return Ok(pid);
                }
                if Instant::now() > deadline {
                    return Err(format!("QEMU did not open QMP within {QMP_TIMEOUT:?}"));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    }

    fn resume<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.command(dir, "cont"))
    }

    fn pause<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(self.command(dir, "stop"))
    }

    fn snapshot<'a>(&'a self, dir: &'a VmDir, file: &'a Path) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let mut qmp = self.qmp(dir).await?;
            qmp.execute(
                "migrate",
                Some(serde_json::json!({"uri": format!("file:{}", file.display())})),
            )
            .await
            .map_err(|e| e.to_string())?;
            let deadline = Instant::now() + Duration::from_secs(300);
            loop {
                let m = qmp
                    .execute("query-migrate", None)
                    .await
                    .map_err(|e| e.to_string())?;
                match m["status"].as_str() {
                    Some("completed") => return Ok(()),
                    Some("failed" | "cancelled") => {
                        return Err(format!(
                            "the snapshot failed: {}",
                            m["error-desc"].as_str().unwrap_or("no reason given")
                        ));
                    }
                    _ if Instant::now() > deadline => {
                        return Err("the snapshot took over 300 s".into());
                    }
                    _ => tokio::time::sleep(Duration::from_millis(5)).await,
                }
            }
        })
    }

    fn console<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let mut qmp = self.qmp(dir).await?;
            let text = qmp
                .execute(
                    "ringbuf-read",
                    Some(
                        serde_json::json!({"device": "console", "size": 1 << 20, "format": "utf8"}),
                    ),
                )
                .await
                .map_err(|e| e.to_string())?;
            Ok(text.as_str().unwrap_or_default().to_owned())
        })
    }

    fn quit<'a>(&'a self, dir: &'a VmDir) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let mut qmp = Qmp::connect(&dir.qmp(), Duration::from_secs(2))
                .await
                .map_err(|e| e.to_string())?;
            // QEMU may close the socket before it answers.
            let _ = qmp.execute("quit", None).await;
            Ok(())
        })
    }
}

/// Wait until the snapshot given with `-incoming` is loaded (the VM stays stopped: `-S`).
async fn wait_loaded(qmp: &mut Qmp, deadline: Instant) -> Result<(), String> {
    loop {
        let m = qmp
            .execute("query-migrate", None)
            .await
            .map_err(|e| e.to_string())?;
        match m["status"].as_str().unwrap_or("none") {
            "completed" => return Ok(()),
            "failed" => {
                return Err(format!(
                    "loading the snapshot failed: {}",
                    m["error-desc"].as_str().unwrap_or("QEMU gave no reason")
                ));
            }
            s if Instant::now() > deadline => {
                return Err(format!(
                    "the snapshot was still loading ({s}) at the deadline"
                ));
            }
            _ => tokio::time::sleep(Duration::from_millis(5)).await,
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
    fn the_command_line_fences_what_qemu_may_do() {
        let dir = VmDir(PathBuf::from("/state/sandboxes/a"));
        let images = Images {
            kernel: "/i/vmlinuz".into(),
            initrd: None,
            rootfs: "/i/rootfs.ext4".into(),
        };
        let q = Qemu {
            binary: "qemu-system-x86_64".into(),
            accel: Accel::Tcg,
        };
        let launch = Launch {
            dir: &dir,
            images: &images,
            tap: "svc7",
            memory_mib: 512,
            cpus: 1,
            incoming: None,
            run_as: (300_007, 300_007),
            shared: &[],
            vsock: None,
        };
        let args: Vec<String> = q
            .args(&launch)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = args.join(" ");
        for want in [
            "-S",
            "-nodefaults",
            "-no-reboot",
            "-sandbox on,obsolete=deny,spawn=deny,resourcecontrol=deny",
            "-run-with user=300007:300007",
            "ifname=svc7,script=no,downscript=no,vhost=off",
            "ringbuf,id=console",
            "-m 512",
        ] {
            assert!(joined.contains(want), "{want} missing from {joined}");
        }
        assert!(!joined.contains("balloon"), "no balloon device");
        assert!(!joined.contains("-initrd"), "no initramfs unless given");
        assert!(!joined.contains("-incoming"));
        let restore = Launch {
            incoming: Some(Path::new("/s/snap")),
            ..launch
        };
        let joined: Vec<String> = q
            .args(&restore)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        assert!(
            joined.join(" ").ends_with("-incoming file:/s/snap"),
            "the snapshot on the command line, opened before QEMU drops its ids"
        );
        let device = PathBuf::from("/s/vhu-vsock.sock");
        let over_vsock = Launch {
            vsock: Some(&device),
            ..launch.clone()
        };
        let joined: Vec<String> = q
            .args(&over_vsock)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = joined.join(" ");
        assert!(
            joined.contains("vhost-user-vsock-device,chardev=vsock"),
            "{joined}"
        );
        assert!(joined.contains("memory-backend-memfd"), "{joined}");
        assert!(!joined.contains("virtserialport"), "one channel: {joined}");
        let shared = [(PathBuf::from("/s/fs0.sock"), "svcfs0".to_owned())];
        let with_fs = Launch {
            shared: &shared,
            ..launch
        };
        let joined: Vec<String> = q
            .args(&with_fs)
            .into_iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = joined.join(" ");
        for want in [
            "memory-backend=mem",
            "memory-backend-memfd,id=mem,size=512M,share=on",
            "virtio-mmio.force-legacy=false",
            "socket,id=fs0,path=/s/fs0.sock",
            "vhost-user-fs-device,chardev=fs0,tag=svcfs0",
        ] {
            assert!(joined.contains(want), "{want} missing from {joined}");
        }
    }
}
