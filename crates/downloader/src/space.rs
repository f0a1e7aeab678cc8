//! Free space of the filesystem holding a directory, and up-front reservation of a file's blocks.
//!
//! `statvfs` through `rustix` (already on the device for the staging directory's `openat`
//! family) and `posix_fallocate` through `libc` rather than `fs4`: two calls do not justify
//! another crate. `posix_fallocate`, not the `fallocate` system call: where a filesystem has no
//! `fallocate`, glibc's writes the blocks out, so a full disk still shows up before the download.

use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use fs_err::File;

use crate::error::os_error;

/// Bytes an unprivileged process may still write on the filesystem of `dir`. An error names
/// `dir`.
pub fn available_bytes(dir: &Path) -> io::Result<u64> {
    let fail = |e| os_error("query free space of", dir, e);
    let st = rustix::fs::statvfs(dir).map_err(|e| fail(e.into()))?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
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
