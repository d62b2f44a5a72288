//! A container made ahead of its request (a warm pool's, docs/pool.md) given to the sandbox
//! that claims it: its UTS namespace's host name set to the sandbox's name, as `runc create`
//! sets a fresh one's from the bundle.

use std::os::fd::AsRawFd as _;

use crate::runtime::{GuestHandle, RuntimeError, start_time};

/// Set the host name in the UTS namespace of `guest`'s init to `hostname`: a short-lived
/// helper process joins the namespace (never one of svcd's own threads) and calls
/// sethostname(2) there.
pub(super) async fn set_hostname(guest: GuestHandle, hostname: String) -> Result<(), RuntimeError> {
    let err = |message: String| RuntimeError::Lifecycle {
        operation: "naming",
        name: guest.name.clone(),
        message,
    };
    if start_time(guest.pid) != Some(guest.start) {
        return Err(RuntimeError::NotRunning);
    }
    let uts = std::fs::File::open(format!("/proc/{}/ns/uts", guest.pid))
        .map_err(|e| err(format!("its UTS namespace: {e}")))?;
    let name = hostname.clone().into_bytes();
    let mut c = tokio::process::Command::new("/bin/true");
    c.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true);
    let fd = uts.as_raw_fd();
    // SAFETY: the closure only makes system calls (setns, sethostname) on data prepared
    // before the fork.
    unsafe {
        c.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWUTS) != 0
                || libc::sethostname(name.as_ptr().cast(), name.len()) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let status = c
        .status()
        .await
        .map_err(|e| err(format!("setting its host name {hostname:?}: {e}")))?;
    drop(uts);
    if status.success() {
        Ok(())
    } else {
        Err(err(format!("setting its host name {hostname:?}: {status}")))
    }
}
