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
    let hub = Arc::new(svc_guest::agent::relay::Hub::default());
    match listen_relay() {
        Ok(l) => {
            tokio::spawn(hub.clone().listen(l));
        }
        Err(e) => eprintln!(
            "svc-microvm-agent: {}: {e} (git over SSH will not work in this guest)",
            svc_guest::agent::relay::SOCKET
        ),
    }
    // Said once until it changes: while no host is connected the port may fail every attempt.
    let mut last_error = String::new();
    loop {
        let Some(dev) = svc_guest::find_port(&ports, svc_guest::PORT_NAME) else {
            // No virtio-serial port: the second transport, vsock, when the guest has it.
            if std::path::Path::new("/dev/vsock").exists() {
                return serve_vsock(system, hub).await;
            }
            eprintln!(
                "svc-microvm-agent: no virtio-serial port named {} under {} yet",
                svc_guest::PORT_NAME,
                ports.display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let served = match open(&dev) {
            Ok((r, w)) => svc_guest::agent::serve(r, w, system.clone(), hub.clone())
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

/// Serve hosts that connect over vsock, one connection at a time (each is a new host).
async fn serve_vsock(
    system: Arc<dyn svc_guest::agent::System>,
    hub: Arc<svc_guest::agent::relay::Hub>,
) -> ExitCode {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, VsockAddr, bind, listen, socket};
    let listener = socket(
        AddressFamily::Vsock,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .and_then(|fd| {
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &VsockAddr::new(libc_cid_any(), svc_guest::VSOCK_PORT),
        )?;
        listen(&fd, nix::sys::socket::Backlog::new(4)?)?;
        Ok(fd)
    });
    let listener = match listener {
        Ok(fd) => std::sync::Arc::new(fd),
        Err(e) => {
            eprintln!(
                "svc-microvm-agent: listening on vsock port {}: {e}",
                svc_guest::VSOCK_PORT
            );
            return ExitCode::FAILURE;
        }
    };
    loop {
        // A vsock stream is a byte stream like a unix one: the same reads and writes.
        // (std's unix listener refuses a vsock peer address: accept the socket as it is.)
        let l = listener.clone();
        let accepted = tokio::task::spawn_blocking(move || rustix::net::accept(&*l))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r.map_err(std::io::Error::from))
            .and_then(|fd| {
                let s = std::os::unix::net::UnixStream::from(fd);
                s.set_nonblocking(true)?;
                tokio::net::UnixStream::from_std(s)
            });
        match accepted {
            Ok(stream) => {
                let (r, w) = stream.into_split();
                if let Err(e) = svc_guest::agent::serve(r, w, system.clone(), hub.clone()).await {
                    eprintln!("svc-microvm-agent: vsock: {e} (waiting for the host)");
                }
            }
            Err(e) => {
                eprintln!("svc-microvm-agent: vsock accept: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Listen where the git SSH shim connects: a socket any guest user may use (the host decides
/// every request), in a directory only root may change.
fn listen_relay() -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::PermissionsExt as _;
    let socket = std::path::Path::new(svc_guest::agent::relay::SOCKET);
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let listener = tokio::net::UnixListener::bind(socket)?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}

/// `VMADDR_CID_ANY`.
const fn libc_cid_any() -> u32 {
    u32::MAX
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
