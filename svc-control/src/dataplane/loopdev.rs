//! Loop devices: a sandbox's disk image as a block device its file system can be mounted from.
//!
//! A free device comes from `/dev/loop-control` (`LOOP_CTL_GET_FREE`) and is bound to the
//! image in one call (`LOOP_CONFIGURE`, Linux 5.8) with `LO_FLAGS_AUTOCLEAR`: the kernel
//! detaches it by itself once nothing holds it any more — no open descriptor and no mount. So
//! the device lives exactly as long as the mount made from it (in the container's own mount
//! namespace), and a crash between attaching and mounting leaves nothing behind: the
//! descriptor's close releases it.

use std::{
    fs::OpenOptions,
    io,
    os::{
        fd::{AsRawFd as _, OwnedFd},
        unix::{ffi::OsStrExt as _, fs::OpenOptionsExt as _},
    },
    path::{Path, PathBuf},
};

/// `LOOP_CTL_GET_FREE` (linux/loop.h).
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
/// `LOOP_CONFIGURE` (linux/loop.h, Linux 5.8).
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
/// `LO_FLAGS_AUTOCLEAR`: detach at the last close.
const LO_FLAGS_AUTOCLEAR: u32 = 4;
/// How often a free device is asked for when another process takes it first.
const ATTEMPTS: u32 = 8;

/// `struct loop_info64` (linux/loop.h).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` (linux/loop.h).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const _: () = assert!(size_of::<LoopInfo64>() == 232);
const _: () = assert!(size_of::<LoopConfig>() == 304);

/// A loop device bound to an image, held open: dropping it lets the kernel detach the device
/// as soon as no mount holds it either.
#[derive(Debug)]
pub struct LoopDevice {
    number: u32,
    _fd: OwnedFd,
}

impl LoopDevice {
    /// `/dev/loopN`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/dev/loop{}", self.number))
    }

    pub fn number(&self) -> u32 {
        self.number
    }
}

/// Bind a free loop device to `image` (read-write, detached automatically: see the module).
pub fn attach(image: &Path) -> io::Result<LoopDevice> {
    let what = |op: &str, e: io::Error| io::Error::new(e.kind(), format!("{op}: {e}"));
    let backing = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(image)
        .map_err(|e| what(&format!("opening {}", image.display()), e))?;
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/loop-control")
        .map_err(|e| what("opening /dev/loop-control", e))?;
    let mut last = io::Error::other("no attempt made");
    for _ in 0..ATTEMPTS {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number or -1.
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
        if n < 0 {
            return Err(what("LOOP_CTL_GET_FREE", io::Error::last_os_error()));
        }
        let number =
            u32::try_from(n).map_err(|e| what("LOOP_CTL_GET_FREE", io::Error::other(e)))?;
        let path = format!("/dev/loop{number}");
        let dev = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| what(&format!("opening {path}"), e))?;
        let mut config = LoopConfig {
            fd: u32::try_from(backing.as_raw_fd()).unwrap_or(u32::MAX),
            block_size: 0,
            info: LoopInfo64 {
                lo_device: 0,
                lo_inode: 0,
                lo_rdevice: 0,
                lo_offset: 0,
                lo_sizelimit: 0,
                lo_number: 0,
                lo_encrypt_type: 0,
                lo_encrypt_key_size: 0,
                lo_flags: LO_FLAGS_AUTOCLEAR,
                lo_file_name: [0; 64],
                lo_crypt_name: [0; 64],
                lo_encrypt_key: [0; 32],
                lo_init: [0; 2],
            },
            reserved: [0; 8],
        };
        let name = image.as_os_str().as_bytes();
        let len = name.len().min(63);
        config.info.lo_file_name[..len].copy_from_slice(&name[..len]);
        // SAFETY: LOOP_CONFIGURE reads one `struct loop_config`, which `config` is (layout
        // checked above); the backing descriptor is open for the whole call.
        let rc = unsafe {
            libc::ioctl(
                dev.as_raw_fd(),
                LOOP_CONFIGURE,
                std::ptr::from_mut(&mut config),
            )
        };
        if rc == 0 {
            return Ok(LoopDevice {
                number,
                _fd: dev.into(),
            });
        }
        last = io::Error::last_os_error();
        // Another process bound this device between our two calls: ask again.
        if last.raw_os_error() != Some(libc::EBUSY) {
            break;
        }
    }
    Err(what(
        &format!("binding a loop device to {}", image.display()),
        last,
    ))
}

/// The image `/dev/loopN` is bound to, if it is bound.
pub fn backing_file(number: u32) -> Option<PathBuf> {
    let text =
        std::fs::read_to_string(format!("/sys/block/loop{number}/loop/backing_file")).ok()?;
    let t = text.trim_end_matches('\n');
    (!t.is_empty()).then(|| PathBuf::from(t))
}
