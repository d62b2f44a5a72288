//! The channel to the init of a guest an earlier svcd made (adopted after a restart).
//!
//! The socket pair svcd handed the init at create ended with that svcd. The init's server
//! keeps one end of a socket pair of its own, the *hand-over* socket, at [`HANDOVER_FD`]
//! (`svc-init`'s module comment): this svcd takes a copy of it from the server with
//! `pidfd_getfd(2)` (root on the host may take any process's descriptor), makes a new socket
//! pair and sends the server the guest's end over it (`SCM_RIGHTS`); the server serves the
//! channel's protocol on that as on the first, and the channel is greeted as a new guest's is.
//!
//! The server is the guest's: what it holds at that number is checked before anything is sent
//! on it (a Unix stream socket whose peer is the server itself: `socketpair` records its maker),
//! the greeting has a short limit, and any failure leaves the guest to the runtime's `exec`,
//! as before the channel existed. Nothing is taken from a process that is not the guest's
//! init's oldest child (the server: started before anything of the guest's).

use std::{
    io::IoSlice,
    os::{
        fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::net::UnixStream,
    },
};

use rustix::net::{
    AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketType, sendmsg,
    sockopt,
};

use super::init::InitChannel;
use crate::runtime::{GuestHandle, start_time};

/// Where `svc-init`'s server keeps the svcd end of its hand-over socket.
pub const HANDOVER_FD: i32 = 5;

/// A new channel to `guest`'s init through its server's hand-over socket, greeted; or why
/// there is none (the guest's commands then run with the runtime's `exec`).
pub(super) async fn reattach(guest: &GuestHandle) -> Result<InitChannel, String> {
    let guest = guest.clone();
    let ours = tokio::task::spawn_blocking(move || hand_over(&guest))
        .await
        .map_err(|e| e.to_string())??;
    let init = InitChannel::readopted(ours);
    init.get().await?;
    Ok(init)
}

/// Take the hand-over socket from `guest`'s init's server and send it the guest's end of a
/// new socket pair; svcd's end.
fn hand_over(guest: &GuestHandle) -> Result<UnixStream, String> {
    if start_time(guest.pid) != Some(guest.start) {
        return Err("the guest is not running".into());
    }
    let server = server_of(guest.pid).ok_or("its init has no server")?;
    let server_start = start_time(server).ok_or("its init's server is gone")?;
    let pidfd = pidfd_open(server).map_err(|e| format!("pidfd_open of its server: {e}"))?;
    // The pid was not reused between reading it and holding it.
    if start_time(server) != Some(server_start) {
        return Err("its init's server is gone".into());
    }
    let handover = pidfd_getfd(&pidfd, HANDOVER_FD)
        .map_err(|e| format!("taking its server's hand-over socket: {e}"))?;
    check(&handover, server)?;
    let (ours, theirs) = UnixStream::pair().map_err(|e| format!("a socket pair: {e}"))?;
    let fds = [theirs.as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if !cmsg.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err("the descriptor does not fit its message".into());
    }
    let sent = sendmsg(
        &handover,
        &[IoSlice::new(b"c")],
        &mut cmsg,
        SendFlags::DONTWAIT | SendFlags::NOSIGNAL,
    )
    .map_err(|e| format!("sending the new channel to its server: {e}"))?;
    if sent != 1 {
        return Err("sending the new channel to its server: nothing was sent".into());
    }
    Ok(ours)
}

/// The hand-over socket is a Unix stream socket its server made (the peer of a socket pair is
/// its maker).
fn check(handover: &OwnedFd, server: u32) -> Result<(), String> {
    let bad = |what: String| Err(format!("its server's descriptor {HANDOVER_FD} is {what}"));
    match sockopt::socket_domain(handover) {
        Ok(AddressFamily::UNIX) => {}
        Ok(_) => return bad("not a Unix socket".into()),
        Err(e) => return bad(format!("not a socket ({e})")),
    }
    if sockopt::socket_type(handover).ok() != Some(SocketType::STREAM) {
        return bad("not a stream socket".into());
    }
    let peer = sockopt::socket_peercred(handover).map_err(|e| format!("its peer: {e}"))?;
    if u32::try_from(peer.pid.as_raw_nonzero().get()).ok() != Some(server) {
        return bad(format!("connected to pid {:?}, not the server", peer.pid));
    }
    Ok(())
}

/// The init's oldest child: the server it starts before anything of the guest's runs.
pub(super) fn server_of(init: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .filter_map(|p| start_time(p).map(|t| (t, p)))
        .min()
        .map(|(_, p)| p)
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).map_err(std::io::Error::other)?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(std::io::Error::other)?;
    // SAFETY: the descriptor was just made for us and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pidfd_getfd(pidfd: &OwnedFd, target: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_getfd takes a pidfd, a descriptor number of that process and flags, and
    // returns a new descriptor (close-on-exec) or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(std::io::Error::other)?;
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
