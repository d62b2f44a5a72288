//! Several datagrams per system call (`recvmmsg`, `sendmmsg`): under load the guard's per-call
//! kernel work (entry, the file lookup, the security hooks) was the larger part of a cached
//! answer's cost, so one call now carries up to [`BATCH`] questions in and their answers out.

use std::{
    io,
    net::SocketAddr,
    os::fd::{AsRawFd as _, BorrowedFd},
};

use nix::sys::socket::{SockaddrLike as _, SockaddrStorage};

/// Datagrams per call.
pub const BATCH: usize = 32;

/// Receive buffers for one batch.
pub struct Inbox {
    bufs: Vec<Vec<u8>>,
}

impl Inbox {
    pub fn new(size: usize) -> Self {
        Self {
            bufs: (0..BATCH).map(|_| vec![0u8; size]).collect(),
        }
    }

    /// Read what is waiting, up to [`BATCH`] datagrams, without blocking: (payload, sender)
    /// of each. `WouldBlock` when nothing is.
    pub fn receive(&mut self, fd: BorrowedFd<'_>) -> io::Result<Vec<(&[u8], SocketAddr)>> {
        // SAFETY: all-zero is a valid value of these plain C structs.
        let mut names: [libc::sockaddr_storage; BATCH] = unsafe { std::mem::zeroed() };
        let mut iovs: Vec<libc::iovec> = self
            .bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        let mut hdrs = headers(
            names.iter_mut().map(|n| {
                (
                    std::ptr::from_mut(n).cast(),
                    socklen::<libc::sockaddr_storage>(),
                )
            }),
            &mut iovs,
        );
        // SAFETY: every header points at a live name buffer of the length it gives and at one
        // iovec over a live buffer of its length; all outlive the call.
        let n = unsafe {
            libc::recvmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr(),
                libc::c_uint::try_from(hdrs.len()).unwrap_or(0),
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        let n = usize::try_from(n).map_err(|_| io::Error::last_os_error())?;
        let mut out = Vec::with_capacity(n);
        for (i, h) in hdrs.iter().enumerate().take(n) {
            // SAFETY: the kernel wrote a socket address of `msg_namelen` bytes there.
            let name = unsafe {
                SockaddrStorage::from_raw(
                    std::ptr::from_ref(&names[i]).cast(),
                    Some(h.msg_hdr.msg_namelen),
                )
            };
            let Some(peer) = name.and_then(|n| to_std(&n)) else {
                continue;
            };
            let len = (h.msg_len as usize).min(self.bufs[i].len());
            out.push((&self.bufs[i][..len], peer));
        }
        Ok(out)
    }
}

/// Send `answers` in as few calls as the socket takes without blocking: how many went (the
/// rest are the caller's, e.g. when the send buffer is full).
pub fn send(fd: BorrowedFd<'_>, answers: &[(Vec<u8>, SocketAddr)]) -> io::Result<usize> {
    let mut sent = 0;
    while sent < answers.len() {
        let chunk = &answers[sent..answers.len().min(sent + BATCH)];
        let names: Vec<SockaddrStorage> = chunk.iter().map(|(_, a)| (*a).into()).collect();
        let mut iovs: Vec<libc::iovec> = chunk
            .iter()
            .map(|(b, _)| libc::iovec {
                iov_base: b.as_ptr().cast_mut().cast(),
                iov_len: b.len(),
            })
            .collect();
        let mut hdrs = headers(
            names
                .iter()
                .map(|n| (n.as_ptr().cast_mut().cast(), n.len())),
            &mut iovs,
        );
        // SAFETY: each header points at a live socket address of the length it gives and at
        // one iovec over a live buffer (only read by the kernel); all outlive the call.
        let n = unsafe {
            libc::sendmmsg(
                fd.as_raw_fd(),
                hdrs.as_mut_ptr(),
                chunk.len() as libc::c_uint,
                libc::MSG_DONTWAIT,
            )
        };
        match usize::try_from(n) {
            Ok(0) => break,
            Ok(n) => sent += n,
            Err(_) if sent > 0 => break,
            Err(_) => return Err(io::Error::last_os_error()),
        }
    }
    Ok(sent)
}

/// One message header per (socket address, length) and iovec: the name and one buffer each.
fn headers(
    names: impl Iterator<Item = (*mut libc::c_void, libc::socklen_t)>,
    iovs: &mut [libc::iovec],
) -> Vec<libc::mmsghdr> {
    names
        .zip(iovs.iter_mut())
        .map(|((name, len), iov)| {
            // SAFETY: all-zero is a valid value of this plain C struct.
            let mut h: libc::mmsghdr = unsafe { std::mem::zeroed() };
            h.msg_hdr.msg_name = name;
            h.msg_hdr.msg_namelen = len;
            h.msg_hdr.msg_iov = std::ptr::from_mut(iov);
            h.msg_hdr.msg_iovlen = 1;
            h
        })
        .collect()
}

fn to_std(name: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = name.as_sockaddr_in() {
        return Some(SocketAddr::from((v4.ip(), v4.port())));
    }
    name.as_sockaddr_in6()
        .map(|v6| SocketAddr::V6(std::net::SocketAddrV6::from(*v6)))
}

fn socklen<T>() -> libc::socklen_t {
    libc::socklen_t::try_from(std::mem::size_of::<T>()).unwrap_or(libc::socklen_t::MAX)
}
