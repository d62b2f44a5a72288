//! `svc-microvm-agent`: the in-guest agent of the microvm backend, started by the guest's init
//! (tini, after the initramfs switched to the root file system).
//!
//! It finds its channel to the host — the virtio-serial port named [`svc_guest::PORT_NAME`] —
//! and serves the channel's protocol on it ([`svc_guest::agent`]): the host's hello, commands
//! with their streams, files, and the guest's setup (network, host name, entropy). End of file
//! on the port means the host side went away (svcd restarting, the VM forked): the agent opens
//! the port again and waits for the next hello, so it survives host reconnects. Statically
//! linked (`-C target-feature=+crt-static`): it runs on any guest tree.
#![deny(unsafe_code)]

use std::{path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

mod guest;

fn main() -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("svc-microvm-agent: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = guest::Guest::prepare() {
        eprintln!("svc-microvm-agent: {e} (the host's setup will try again)");
    }
    rt.block_on(run())
}

async fn run() -> ExitCode {
    let ports = PathBuf::from("/sys/class/virtio-ports");
    let system: Arc<dyn svc_guest::agent::System> = Arc::new(guest::Guest);
    // Said once until it changes: while no host is connected the port may fail every attempt.
    let mut last_error = String::new();
    loop {
        let Some(dev) = svc_guest::find_port(&ports, svc_guest::PORT_NAME) else {
            eprintln!(
                "svc-microvm-agent: no virtio-serial port named {} under {} yet",
                svc_guest::PORT_NAME,
                ports.display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let served = match open(&dev) {
            Ok((r, w)) => svc_guest::agent::serve(r, w, system.clone())
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match served {
            // The host went away (or none is there yet: then the port says end of file at
            // once, every time, so nothing is said here).
            Ok(()) => last_error.clear(),
            Err(e) => {
                let said = format!("svc-microvm-agent: {}: {e}", dev.display());
                if said != last_error {
                    eprintln!("{said} (waiting for the host)");
                    last_error = said;
                }
            }
        }
        // The host closed its end: it comes back (restart, fork). Open the port again.
        tokio::time::sleep(Duration::from_millis(100)).await;
        if std::env::var_os("SVC_AGENT_ONCE").is_some() {
            return ExitCode::SUCCESS;
        }
    }
}

/// The port, once for reading and once (a duplicate) for writing: a tokio file does one
/// operation at a time, and a port can be opened only once.
fn open(dev: &std::path::Path) -> std::io::Result<(tokio::fs::File, tokio::fs::File)> {
    let port = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)?;
    let writer = port.try_clone()?;
    Ok((
        tokio::fs::File::from_std(port),
        tokio::fs::File::from_std(writer),
    ))
}
