//! The monitor the microvm backend drives today: QEMU `-M microvm`, one implementation of
//! [`Monitor`] (a Firecracker or cloud-hypervisor driver would be another module beside it).
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

use super::qmp::{Qmp, QmpError};
pub use super::{
    images::Images,
    monitor::{Accel, Launch, Monitor},
    vm_dir::VmDir,
};
use crate::runtime::{BoxFuture, start_time};

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
        let mut a = Args::default();
        machine(&mut a, vm, self.accel);
        a.all(&[
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
            "-S",
        ]);
        a.push("-m").push(vm.memory_mib.to_string());
        a.push("-smp").push(vm.cpus.to_string());
        a.all(&[
            "-chardev",
            "ringbuf,id=console,size=1M",
            "-serial",
            "chardev:console",
        ]);
        boot_disk(&mut a, vm, self.accel);
        agent_channel(&mut a, vm);
        devices(&mut a, vm);
        confinement(&mut a, vm);
        a.0
    }

    async fn qmp(&self, dir: &VmDir) -> Result<Qmp, String> {
        Qmp::connect(&dir.qmp(), QMP_TIMEOUT)
            .await
            .map_err(|e| chain(&e))
    }

    async fn command(&self, dir: &VmDir, command: &str) -> Result<(), String> {
        let mut qmp = self.qmp(dir).await?;
        qmp.execute(command, None)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// A command line being built.
#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn push(&mut self, arg: impl Into<OsString>) -> &mut Self {
        self.0.push(arg.into());
        self
    }

    fn all(&mut self, args: &[&str]) -> &mut Self {
        for arg in args {
            self.push(*arg);
        }
        self
    }
}

/// The machine and its accelerator. vhost-user devices (virtiofsd, vhost-device-vsock) need
/// the guest's RAM in shared memory, and modern virtio-mmio.
fn machine(a: &mut Args, vm: &Launch<'_>, accel: Accel) {
    a.push("-M");
    if vm.shared.is_empty() && vm.vsock.is_none() {
        a.push("microvm,pit=on,acpi=on");
    } else {
        a.push("microvm,pit=on,acpi=on,memory-backend=mem");
        a.push("-object").push(format!(
            "memory-backend-memfd,id=mem,size={}M,share=on",
            vm.memory_mib
        ));
        a.all(&["-global", "virtio-mmio.force-legacy=false"]);
    }
    a.push("-accel");
    a.push(match accel {
        Accel::Kvm => "kvm",
        // A smaller code cache than the 1 GiB default: RSS stays near the guest's size.
        Accel::Tcg => "tcg,tb-size=64",
    });
    if accel == Accel::Kvm {
        a.all(&["-cpu", "host"]);
    }
}

/// The kernel, its initramfs and command line, and the root disk (the VM's overlay).
fn boot_disk(a: &mut Args, vm: &Launch<'_>, accel: Accel) {
    a.push("-kernel").push(&vm.images.kernel);
    if let Some(initrd) = &vm.images.initrd {
        a.push("-initrd").push(initrd);
    }
    a.push("-append").push(cmdline(accel));
    a.push("-drive").push(format!(
        "id=root,file={},format=qcow2,if=none",
        vm.dir.disk().display()
    ));
    a.all(&["-device", "virtio-blk-device,drive=root"]);
}

/// The agent's channel: a virtio-serial port on a unix socket, or a vhost-user vsock device.
fn agent_channel(a: &mut Args, vm: &Launch<'_>) {
    match vm.vsock {
        None => {
            a.all(&["-device", "virtio-serial-device", "-chardev"]);
            a.push(format!(
                "socket,id=agent,path={},server=on,wait=off",
                vm.dir.agent().display()
            ));
            a.push("-device").push(format!(
                "virtserialport,chardev=agent,name={}",
                svc_guest::PORT_NAME
            ));
        }
        Some(device) => {
            a.push("-chardev")
                .push(format!("socket,id=vsock,path={}", device.display()));
            a.all(&["-device", "vhost-user-vsock-device,chardev=vsock"]);
        }
    }
}

/// The NIC on the sandbox's tap and a virtio-fs device per shared directory.
fn devices(a: &mut Args, vm: &Launch<'_>) {
    // No vhost: the kernel's vhost-net is not everywhere, and the fence is on the tap.
    a.push("-netdev").push(format!(
        "tap,id=net,ifname={},script=no,downscript=no,vhost=off",
        vm.tap
    ));
    a.all(&[
        "-device",
        "virtio-net-device,netdev=net,mac=52:54:00:5c:00:02",
    ]);
    for (i, (socket, tag)) in vm.shared.iter().enumerate() {
        a.push("-chardev")
            .push(format!("socket,id=fs{i},path={}", socket.display()));
        a.push("-device")
            .push(format!("vhost-user-fs-device,chardev=fs{i},tag={tag}"));
    }
}

/// QMP and the pid file, QEMU's own seccomp filter and unprivileged ids, and the snapshot a
/// clone restores (last: opened before QEMU drops its ids).
fn confinement(a: &mut Args, vm: &Launch<'_>) {
    a.push("-qmp").push(format!(
        "unix:{},server=on,wait=off",
        vm.dir.qmp().display()
    ));
    a.push("-pidfile").push(vm.dir.pidfile());
    a.all(&[
        "-sandbox",
        "on,obsolete=deny,spawn=deny,resourcecontrol=deny",
        "-run-with",
    ]);
    a.push(format!("user={}:{}", vm.run_as.0, vm.run_as.1));
    if let Some(snapshot) = vm.incoming {
        let mut uri = OsString::from("file:");
        uri.push(snapshot);
        a.push("-incoming").push(uri);
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

    fn accel(&self) -> Accel {
        self.accel
    }

    /// QEMU's pid from its pidfile, if that process is still this VM's QEMU (its command line
    /// names the VM's directory).
    fn running(&self, dir: &VmDir) -> Option<(u32, u64)> {
        let pid: u32 = std::fs::read_to_string(dir.pidfile())
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        // Every QEMU of ours names its QMP socket, whichever channel it has.
        let mine = dir.qmp().display().to_string();
        String::from_utf8_lossy(&cmdline)
            .contains(&mine)
            .then_some(())?;
        Some((pid, start_time(pid)?))
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

    /// `query-status`, the whole exchange within `limit`: QEMU serves one QMP client at a
    /// time, so a monitor another client holds (or a hung QEMU) is an error, not a wait.
    fn status<'a>(
        &'a self,
        dir: &'a VmDir,
        limit: Duration,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            let asked = async {
                let mut qmp = Qmp::connect(&dir.qmp(), limit).await?;
                qmp.status().await
            };
            match tokio::time::timeout(limit, asked).await {
                Ok(Ok(status)) => Ok(status),
                Ok(Err(QmpError::Timeout(_))) | Err(_) => Err(format!(
                    "QEMU's monitor ({}) did not answer within {} s",
                    dir.qmp().display(),
                    limit.as_secs_f32()
                )),
                // Its queue full of clients that wait as svcd would (QEMU listens with a
                // backlog of one while it serves another).
                Ok(Err(QmpError::Connect { source, .. }))
                    if source.kind() == std::io::ErrorKind::WouldBlock =>
                {
                    Err(format!(
                        "QEMU's monitor ({}) takes no connection now (another client holds it)",
                        dir.qmp().display()
                    ))
                }
                Ok(Err(e)) => Err(format!(
                    "QEMU's monitor ({}): {}",
                    dir.qmp().display(),
                    chain(&e)
                )),
            }
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

/// A QMP error with its cause (a connection's error names the socket, its source why).
fn chain(e: &QmpError) -> String {
    match std::error::Error::source(e) {
        Some(source) => format!("{e}: {source}"),
        None => e.to_string(),
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
