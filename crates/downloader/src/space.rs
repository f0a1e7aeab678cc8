//! Free space of the filesystem holding a directory, and up-front reservation of a file's blocks.
//!
//! `statvfs` and `fallocate` through `rustix` (already on the device for the staging directory's
//! `openat` family) rather than `fs4`: two calls do not justify another crate.

use std::io;
use std::path::Path;

use rustix::fs::FallocateFlags;
use rustix::io::Errno;

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
    match rustix::fs::fallocate(file, FallocateFlags::empty(), 0, len) {
        Ok(()) => Ok(()),
        Err(Errno::OPNOTSUPP | Errno::INVAL) => file.set_len(len),
        Err(errno) => Err(os_error("reserve space for", file.path(), errno.into())),
    }
}
