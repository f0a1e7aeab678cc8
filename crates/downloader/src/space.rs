//! Free space of the filesystem holding a directory, and up-front reservation of a file's blocks.
//!
//! `statvfs` and `posix_fallocate` through `libc` (already in the tree for other reasons) rather
//! than `fs4`: two calls do not justify another crate on the device.

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use fs_err::File;

use crate::error::os_error;

/// Bytes an unprivileged process may still write on the filesystem of `dir`. An error names
/// `dir`.
pub fn available_bytes(dir: &Path) -> io::Result<u64> {
    let fail = |e| os_error("query free space of", dir, e);
    let c = CString::new(dir.as_os_str().as_bytes()).map_err(|_| {
        fail(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path contains NUL",
        ))
    })?;
    // SAFETY: statvfs only writes into the zeroed struct we pass; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut st) };
    if rc != 0 {
        return Err(fail(io::Error::last_os_error()));
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Reserve `len` bytes for `file`, so that a full disk shows up now as `ENOSPC` instead of
/// halfway through a download. Filesystems without support fall back to a sparse `set_len`.
/// A full disk is an error of kind [`io::ErrorKind::StorageFull`]; every error names the file.
pub fn reserve(file: &File, len: u64) -> io::Result<()> {
    // SAFETY: a valid open fd; posix_fallocate does not touch our memory.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    match rc {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL => file.set_len(len),
        errno => Err(os_error(
            "reserve space for",
            file.path(),
            io::Error::from_raw_os_error(errno),
        )),
    }
}
