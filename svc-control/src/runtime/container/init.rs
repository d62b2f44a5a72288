//! The channel to a container guest's init (`svc-init`), over which svcd runs commands in the
//! guest without a runtime process per command.
//!
//! svcd makes a socket pair at create and hands one end to the runtime as descriptor 3
//! (`--preserve-fds 1`); the init serves the channel's protocol (`svc_guest::proto`) on it.
//! svcd never connects to a path: nothing in the guest's reach names this socket, so no guest
//! can swap it for another. The init is the guest's: everything it sends is checked by the
//! channel (bounded frames, a window per stream, a frame that breaks the protocol ends this
//! sandbox's channel and nothing else), and it may open no streams of its own.
//!
//! The channel is taken up at the sandbox's first exec: until then its end waits here, and
//! whatever the init writes waits in the kernel's socket buffer.

use std::{
    os::{fd::AsRawFd as _, unix::net::UnixStream},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use tokio::sync::OnceCell;

use crate::runtime::microvm::channel::Channel;

/// Where the init finds its end of the channel.
pub const CHANNEL_FD: i32 = 3;

/// How long the init has to answer the channel's first hello.
const GREET: Duration = Duration::from_secs(10);

/// How long the init of an adopted guest (`reinit`), up already, has to answer a new
/// channel's hello.
const READOPTED_GREET: Duration = Duration::from_secs(3);

/// A socket pair for a guest being created: (svcd's end, the guest's end), both
/// close-on-exec (the guest's end is put at [`CHANNEL_FD`] in the runtime's process only).
pub(super) fn socket_pair() -> Result<(UnixStream, UnixStream), String> {
    UnixStream::pair().map_err(|e| format!("the init's channel: {e}"))
}

/// In the runtime's process, between fork and exec: `fd` at [`CHANNEL_FD`], kept open across
/// exec. Only system calls (async-signal-safe).
pub(super) fn to_channel_fd(fd: i32) -> std::io::Result<()> {
    // SAFETY: dup2 and fcntl on descriptors of this process; no memory is touched.
    let r = unsafe {
        if fd == CHANNEL_FD {
            libc::fcntl(fd, libc::F_SETFD, 0)
        } else {
            libc::dup2(fd, CHANNEL_FD)
        }
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// svcd's end of one guest's channel: a socket until the first exec, a channel from then on.
#[derive(Debug)]
pub(super) struct InitChannel {
    socket: Mutex<Option<UnixStream>>,
    channel: OnceCell<Arc<Channel>>,
    /// Why the channel could not be taken up, once it could not.
    failed: Mutex<Option<String>>,
    /// How long the init has to answer the first hello.
    greet: Duration,
}

impl InitChannel {
    pub(super) fn new(socket: UnixStream) -> Self {
        Self {
            socket: Mutex::new(Some(socket)),
            channel: OnceCell::new(),
            failed: Mutex::new(None),
            greet: GREET,
        }
    }

    /// The channel to the init of a guest an earlier svcd made (`reinit`): greeted within
    /// [`READOPTED_GREET`], the init being up already.
    pub(super) fn readopted(socket: UnixStream) -> Self {
        Self {
            greet: READOPTED_GREET,
            ..Self::new(socket)
        }
    }

    /// The channel, greeted the first time; or why there is none.
    pub(super) async fn get(&self) -> Result<Arc<Channel>, String> {
        let channel = self
            .channel
            .get_or_try_init(|| async {
                let taken = self.take_up().await;
                if let Err(e) = &taken {
                    *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.clone());
                }
                taken
            })
            .await?;
        if !channel.is_open() {
            return Err(channel.ended_reason());
        }
        Ok(channel.clone())
    }

    async fn take_up(&self) -> Result<Arc<Channel>, String> {
        let socket = self
            .socket
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(socket) = socket else {
            let failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
            return Err(failed
                .clone()
                .unwrap_or_else(|| "the channel was already taken up".into()));
        };
        let stream = socket
            .set_nonblocking(true)
            .and_then(|()| tokio::net::UnixStream::from_std(socket))
            .map_err(|e| format!("the channel: {e}"))?;
        let (r, w) = stream.into_split();
        let (channel, mut hellos) = Channel::over(r, w);
        channel.refuse_guest_streams();
        channel
            .greet(&mut hellos, Instant::now() + self.greet)
            .await
            .map_err(|e| format!("the guest's init did not answer: {e}"))?;
        // No one hears a later hello: the channel drops what the guest says again.
        drop(hellos);
        Ok(channel)
    }
}

/// The raw descriptor of a socket (for the runtime's `pre_exec`).
pub(super) fn raw(socket: &UnixStream) -> i32 {
    socket.as_raw_fd()
}
