//! `svc-init`: the container guest's init (PID 1), in place of tini and of a `runc exec`
//! process per command.
//!
//! svcd hands it one end of a socket pair as file descriptor 3 (the runtime's
//! `--preserve-fds 1`): no path, nothing in the guest's file system that a guest could swap.
//! PID 1 starts one child, `svc-init --serve`, that serves the channel's protocol
//! ([`svc_guest::agent`]) on that descriptor: svcd's commands, with their standard streams,
//! terminals, signals and exit codes. PID 1 itself keeps no copy of the channel; it reaps every
//! orphan of the guest and passes the signals it gets on to the server, as tini does for its
//! child, and ends with it (the container ends with its init). The commands are the server's
//! children: they get the init's user, capabilities, no_new_privs, seccomp filter, cgroup,
//! limits and umask, which are the container's process configuration, as `runc exec` gives.
//!
//! When svcd closes its end (it restarts), the server ends what svcd started and stays, so the
//! guest keeps running, and waits for the next svcd's channel: the server keeps one end of a
//! socket pair of its own (the *hand-over* socket) at descriptor [`HANDOVER_FD`], which a
//! later svcd takes from it (`pidfd_getfd(2)`, as root on the host) to send the server the
//! guest's end of a new socket pair (`SCM_RIGHTS`); the server serves the channel's protocol
//! on that as on the first. A svcd that cannot (an image's older init, a kernel without
//! `pidfd_getfd`) runs commands with the runtime's `exec`. Statically linked like the other
//! guest binaries.
#![deny(unsafe_code)]

use std::{
    os::fd::{FromRawFd as _, OwnedFd},
    process::ExitCode,
    sync::Arc,
};

use nix::{
    sys::{
        signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask},
        wait::{WaitPidFlag, WaitStatus, waitpid},
    },
    unistd::Pid,
};

/// The descriptor svcd's end of the channel arrives on.
const CHANNEL_FD: i32 = 3;

/// Where the server keeps the svcd end of its hand-over socket pair, for a later svcd to take
/// (svc-control's `runtime::container::reinit` names the same number).
const HANDOVER_FD: i32 = 5;

fn main() -> ExitCode {
    match std::env::args().nth(1).as_deref() {
        Some("--serve") => serve(),
        Some("--enter") => enter(std::env::args().skip(2).collect()),
        _ => init(),
    }
}

/// `svc-init --enter ROOT CWD USER [HARDENING] -- COMMAND…`: the runtime-exec fallback of a
/// rooted exec (a guest with no channel to its init, or an older svcd's): started by
/// `runc exec` as the guest's root, chroot into ROOT (a pod container's root file system under
/// `/.svc/ctr`), enter CWD inside it, take USER (`UID:GID[:G1,G2…]`, or `-` for root) and
/// HARDENING (`svc_guest::caps::Hardening::to_arg`: capability sets, `no_new_privs`) and exec
/// COMMAND (looked up on `PATH` inside the root). A command that cannot start is said in
/// runc's words with the shell's codes, as the server says it.
fn enter(args: Vec<String>) -> ExitCode {
    let usage = "svc-init --enter: usage: svc-init --enter ROOT CWD USER [HARDENING] -- COMMAND…";
    let (Some(root), Some(cwd), Some(user)) = (args.first(), args.get(1), args.get(2)) else {
        eprintln!("{usage}");
        return ExitCode::from(125);
    };
    let (hardening, command) = match (args.get(3).map(String::as_str), args.get(4)) {
        (Some("--"), _) => ("-", &args[4..]),
        (Some(h), Some(dashes)) if dashes == "--" => (h, &args[5..]),
        _ => {
            eprintln!("{usage}");
            return ExitCode::from(125);
        }
    };
    let hardening = match svc_guest::caps::Hardening::from_arg(hardening) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("svc-init --enter: {e}");
            return ExitCode::from(125);
        }
    };
    let Some(program) = command.first() else {
        eprintln!("svc-init --enter: no command");
        return ExitCode::from(125);
    };
    let user = match parse_user(user) {
        Ok(u) => u,
        Err(e) => {
            eprintln!("svc-init --enter: {e}");
            return ExitCode::from(125);
        }
    };
    let entry = match svc_guest::enter::Enter::new(root, cwd, user.as_ref()) {
        Ok(e) => e.hardened(hardening),
        Err(e) => {
            eprintln!("svc-init --enter: {e}");
            return ExitCode::from(125);
        }
    };
    let no_cwd = entry.cwd_missing();
    if let Err(e) = entry.enter() {
        eprintln!("exec failed: unable to start container process: entering the root {root}: {e}");
        return ExitCode::from(if no_cwd { 126 } else { 125 });
    }
    let e = std::os::unix::process::CommandExt::exec(
        std::process::Command::new(program).args(&command[1..]),
    );
    let code = if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    eprintln!("exec failed: unable to start container process: exec: {program:?}: {e}");
    ExitCode::from(code)
}

/// `UID:GID[:G1,G2…]`, or `-`: the guest's root.
fn parse_user(s: &str) -> Result<Option<(u32, u32, Vec<u32>)>, String> {
    if s == "-" {
        return Ok(None);
    }
    let bad = || format!("user {s:?}: expected UID:GID[:G1,G2…] or -");
    let mut parts = s.split(':');
    let uid = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let gid = parts.next().and_then(|p| p.parse().ok()).ok_or_else(bad)?;
    let groups = match parts.next() {
        None | Some("") => Vec::new(),
        Some(g) => g
            .split(',')
            .map(|g| g.parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?,
    };
    if parts.next().is_some() {
        return Err(bad());
    }
    Ok(Some((uid, gid, groups)))
}

/// PID 1: start the server, then reap and pass signals on until it ends.
fn init() -> ExitCode {
    let all = SigSet::all();
    if let Err(e) = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&all), None) {
        eprintln!("svc-init: blocking signals: {e}");
        return ExitCode::FAILURE;
    }
    // This very binary again (whatever its path); the spawn resets the child's signal mask, and
    // the child inherits the channel (not close-on-exec).
    let server = match std::process::Command::new("/proc/self/exe")
        .arg("--serve")
        .spawn()
    {
        Ok(c) => Pid::from_raw(i32::try_from(c.id()).unwrap_or(i32::MAX)),
        Err(e) => {
            eprintln!("svc-init: starting the server: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Only the server holds the channel: when it is gone, svcd reads the end of it.
    drop(channel());
    loop {
        let signal = match all.wait() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("svc-init: waiting for signals: {e}");
                continue;
            }
        };
        if signal != Signal::SIGCHLD {
            let _ = kill(server, signal);
            continue;
        }
        if let Some(code) = reap(server) {
            return ExitCode::from(code);
        }
    }
}

/// Reap every child that ended; the exit code to end with when the server is one of them.
fn reap(server: Pid) -> Option<u8> {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == server => {
                return Some(u8::try_from(code).unwrap_or(1));
            }
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == server => {
                eprintln!("svc-init: the server was ended by {signal}");
                return Some(128u8.saturating_add(u8::try_from(signal as i32).unwrap_or(0)));
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return None,
            Ok(_) => {}
        }
    }
}

/// The channel's descriptor, owned (once: PID 1 closes its copy, the server serves on its).
fn channel() -> Option<OwnedFd> {
    // Only a socket is taken: fd 3 is svcd's socket pair end when svcd started the guest.
    let fd = std::fs::read_link(format!("/proc/self/fd/{CHANNEL_FD}")).ok()?;
    if !fd.to_string_lossy().starts_with("socket:") {
        return None;
    }
    #[expect(
        unsafe_code,
        reason = "fd 3 is inherited from the runtime (--preserve-fds) and owned by nothing else"
    )]
    // SAFETY: descriptor 3 is open (its /proc link was just read), and nothing else in this
    // process owns it: it is taken once, here.
    Some(unsafe { OwnedFd::from_raw_fd(CHANNEL_FD) })
}

/// The server: the channel's protocol on fd 3 until svcd closes it, then idle (the guest goes
/// on without it).
fn serve() -> ExitCode {
    // PID 1 blocks every signal; nothing of that may reach the commands run here (a blocked
    // SIGTERM outlived `timeout`'s group kill): the server and all it starts unblock them.
    if let Err(e) = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None) {
        eprintln!("svc-init: unblocking signals: {e}");
        return ExitCode::FAILURE;
    }
    let Some(fd) = channel() else {
        eprintln!("svc-init: no channel on fd {CHANNEL_FD}; commands run with the runtime's exec");
        return idle();
    };
    // Only the server holds the channel: the runtime handed it over open across exec, and
    // every command started here would inherit it (and could read svcd's frames for the
    // others, or write its own in the server's name).
    if let Err(e) = rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC) {
        eprintln!("svc-init: the channel could not be kept from commands ({e}); not serving it");
        return idle();
    }
    // The hand-over socket: made before the first channel is served, so that a svcd that
    // starts while this one is still being ended finds it.
    let handover = match handover() {
        Ok(h) => Some(h),
        Err(e) => {
            eprintln!(
                "svc-init: no hand-over socket ({e}); a later svcd runs commands with the runtime's exec"
            );
            None
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("svc-init: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let hub = Arc::new(svc_guest::agent::relay::Hub::default());
    let mut next = Some(fd);
    while let Some(fd) = next.take() {
        if let Err(e) = rt.block_on(serve_channel(fd, hub.clone())) {
            eprintln!("svc-init: the channel: {e}");
        }
        // svcd went (or broke the channel): wait for the next one's.
        let Some(h) = &handover else { break };
        next = match next_channel(h) {
            Ok(fd) => Some(fd),
            Err(e) => {
                eprintln!(
                    "svc-init: the hand-over socket: {e}; commands run with the runtime's exec"
                );
                None
            }
        };
    }
    drop(rt);
    idle()
}

/// Serve the channel's protocol on `fd` until svcd closes it.
async fn serve_channel(fd: OwnedFd, hub: Arc<svc_guest::agent::relay::Hub>) -> std::io::Result<()> {
    let stream = std::os::unix::net::UnixStream::from(fd);
    stream.set_nonblocking(true)?;
    let (r, w) = tokio::net::UnixStream::from_std(stream)?.into_split();
    let system: Arc<dyn svc_guest::agent::System> = Arc::new(Container);
    svc_guest::agent::serve(r, w, system, hub)
        .await
        .map_err(std::io::Error::other)
}

/// The hand-over socket pair: svcd's end put at [`HANDOVER_FD`] (close-on-exec: no command
/// inherits it), the server's end returned.
fn handover() -> std::io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType, socketpair};
    let (ours, theirs) = socketpair(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    // Ours must not be where theirs goes.
    let ours = if std::os::fd::AsRawFd::as_raw_fd(&ours) == HANDOVER_FD {
        rustix::io::fcntl_dupfd_cloexec(&ours, HANDOVER_FD + 1)?
    } else {
        ours
    };
    place(theirs, HANDOVER_FD)?;
    Ok(ours)
}

/// Put `fd` at descriptor number `at` (close-on-exec), closing the original.
fn place(fd: OwnedFd, at: i32) -> std::io::Result<()> {
    if std::os::fd::AsRawFd::as_raw_fd(&fd) == at {
        // Already there (close-on-exec from its making): kept open for the server's life.
        std::mem::forget(fd);
        return Ok(());
    }
    #[expect(
        unsafe_code,
        reason = "an OwnedFd for a descriptor number dup3 is about to make this process own"
    )]
    // SAFETY: `at` is a number nothing else in this process owns (svcd's first channel is 3,
    // std's descriptors are 0–2); dup3 replaces whatever was there, and the OwnedFd is
    // forgotten: the descriptor stays open for the life of the server.
    let mut target = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(at) };
    rustix::io::dup3(&fd, &mut target, rustix::io::DupFlags::CLOEXEC)?;
    std::mem::forget(target);
    Ok(())
}

/// The next svcd's channel: the guest's end of its socket pair, as it sends it over the
/// hand-over socket (one byte, one descriptor). Anything else on it is dropped.
fn next_channel(handover: &OwnedFd) -> std::io::Result<OwnedFd> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
    loop {
        let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut cmsg = RecvAncillaryBuffer::new(&mut space);
        let mut byte = [0u8; 1];
        let got = recvmsg(
            handover,
            &mut [std::io::IoSliceMut::new(&mut byte)],
            &mut cmsg,
            RecvFlags::CMSG_CLOEXEC,
        )?;
        if got.bytes == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "closed",
            ));
        }
        let mut fds = Vec::new();
        for msg in cmsg.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = msg {
                fds.extend(received);
            }
        }
        // Exactly one socket: anything else (no descriptor, several) is not svcd's.
        if fds.len() == 1
            && let Some(fd) = fds.pop()
            && rustix::net::sockopt::socket_type(&fd)
                .is_ok_and(|t| t == rustix::net::SocketType::STREAM)
        {
            return Ok(fd);
        }
    }
}

/// Wait forever (PID 1 ends the guest when this process ends).
fn idle() -> ExitCode {
    loop {
        std::thread::park();
    }
}

/// The container guest: svcd sets its network, host name and mounts up from outside.
struct Container;

impl svc_guest::agent::System for Container {
    fn setup(&self, _: &svc_guest::proto::Setup) -> Result<(), String> {
        Err("a container guest is set up by svcd, not by its init".into())
    }

    fn mount(&self, _: &str, _: &str) -> Result<(), String> {
        Err("a container guest's mounts are made by svcd, not by its init".into())
    }

    fn exec_style(&self) -> svc_guest::agent::ExecStyle {
        svc_guest::agent::ExecStyle::Runtime
    }
}
