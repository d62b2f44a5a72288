//! Making sure a bpffs is mounted where we pin.

use std::{ffi::CString, io, os::unix::ffi::OsStrExt as _, path::Path};

use super::error::DataplaneError;

/// `BPF_FS_MAGIC` from `linux/magic.h`.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Ensure `dir`'s parent chain reaches a bpffs: if `/sys/fs/bpf` is not a bpffs, mount one there.
/// Idempotent.
pub fn ensure_bpffs(root: &Path) -> Result<(), DataplaneError> {
    if is_bpffs(root)? {
        return Ok(());
    }
    std::fs::create_dir_all(root).map_err(|source| DataplaneError::MountBpffs {
        path: root.to_owned(),
        source,
    })?;
    let target =
        CString::new(root.as_os_str().as_bytes()).map_err(|e| DataplaneError::MountBpffs {
            path: root.to_owned(),
            source: io::Error::new(io::ErrorKind::InvalidInput, e),
        })?;
    // SAFETY: all pointers are valid NUL-terminated strings that outlive the call; `data` is
    // null, which mount(2) accepts for bpffs.
    let rc = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            target.as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(DataplaneError::MountBpffs {
            path: root.to_owned(),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

fn is_bpffs(path: &Path) -> Result<bool, DataplaneError> {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else {
        return Ok(false);
    };
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `c_path` is a valid C string and `stat` points at writable memory of the right
    // size for statfs(2) to fill.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), stat.as_mut_ptr()) };
    if rc != 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::NotFound {
            return Ok(false);
        }
        return Err(DataplaneError::MountBpffs {
            path: path.to_owned(),
            source: err,
        });
    }
    // SAFETY: statfs returned 0, so it initialised the whole struct.
    let stat = unsafe { stat.assume_init() };
    #[expect(
        clippy::unnecessary_cast,
        reason = "f_type's width differs between libc targets"
    )]
    Ok(stat.f_type as i64 == BPF_FS_MAGIC)
}
