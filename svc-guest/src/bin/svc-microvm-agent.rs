//! `svc-microvm-agent`: the in-guest agent of the microvm backend, started by the guest's init
//! (tini, after the initramfs switched to the root file system).
//!
//! It finds its channel to the host — the virtio-serial port named [`svc_guest::PORT_NAME`] —
//! says [`svc_guest::READY`] on it, and answers the channel's bootstrap requests
//! ([`svc_guest::handshake`]). End of file on the port means the host side went away (svcd
//! restarting, the VM forked): the agent waits and opens the port again, so it survives host
//! reconnects. Statically linked (`-C target-feature=+crt-static`): it runs on any guest tree.
#![forbid(unsafe_code)]

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

fn main() -> ExitCode {
    let ports = PathBuf::from("/sys/class/virtio-ports");
    // Said once until it changes: while no host is connected the port fails every attempt.
    let mut last_error = String::new();
    loop {
        let Some(dev) = svc_guest::find_port(&ports, svc_guest::PORT_NAME) else {
            eprintln!(
                "svc-microvm-agent: no virtio-serial port named {} under {} yet",
                svc_guest::PORT_NAME,
                ports.display()
            );
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        match serve(&dev) {
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
        std::thread::sleep(Duration::from_millis(100));
        if std::env::var_os("SVC_AGENT_ONCE").is_some() {
            return ExitCode::SUCCESS;
        }
    }
}

/// One host connection: say ready, then answer requests line by line until end of file.
fn serve(dev: &std::path::Path) -> std::io::Result<()> {
    let port = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)?;
    let mut out = port.try_clone()?;
    writeln!(out, "{}", svc_guest::READY)?;
    out.flush()?;
    let mut lines = BufReader::new(port);
    let mut line = String::new();
    loop {
        line.clear();
        if lines.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let answer = svc_guest::handshake(line.trim_end_matches(['\r', '\n']));
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
}
