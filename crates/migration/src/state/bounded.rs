//! Reading state with a size cap. Every param and state file this crate reads goes through
//! [`read_capped`]: it opens without blocking (a FIFO planted at a param's path cannot hang
//! `resolve`), refuses anything that is not a regular file, and never reads more than the
//! limit, so a 1 GiB param costs a `stat`, not a gigabyte of memory.

use std::io;
use std::path::Path;

use crate::error::{Error, Result};

/// A param value (`/data/params/d/<key>`, the memory params): the longest we write is a
/// comma-joined catalog list, a few KiB.
pub const PARAM_LIMIT: u64 = 256 * 1024;
/// `.migration.json`, `.choice.json`, `.accepted-release.json` (one entry per generation),
/// `.refused-manifest.json`: a few hundred bytes.
pub const JOURNAL_LIMIT: u64 = 64 * 1024;
/// `.verified.json`: one line per installed artifact.
pub const VERIFIED_LIMIT: u64 = 1024 * 1024;
/// A local model's sidecar `local-<id>.json`.
pub const SIDECAR_LIMIT: u64 = 64 * 1024;
/// `.catalog.json`: the manifest read limit, so what was accepted online is accepted again.
pub const CATALOG_LIMIT: u64 = manifest::Limits::DEFAULT_MAX_MANIFEST_BYTES;

/// The whole file, or `None` when it does not exist. A file over `limit` bytes, or anything
/// but a regular file, is a [`Error::CorruptState`] naming the path and the limit. The reading
/// itself is [`chunker::bounded::read_capped`], the one bounded read of the workspace.
pub fn read_capped(path: &Path, limit: u64) -> Result<Option<Vec<u8>>> {
    let corrupt = |message: String| Error::CorruptState {
        path: path.to_path_buf(),
        message,
    };
    match chunker::bounded::read_capped(path, limit) {
        Ok(bytes) => Ok(bytes),
        Err(chunker::Error::NotRegularFile { .. }) => Err(corrupt("not a regular file".into())),
        Err(chunker::Error::FileTooLarge { size, limit, .. }) => Err(corrupt(format!(
            "{size} bytes, over the {limit}-byte limit"
        ))),
        Err(chunker::Error::Io(e)) => Err(e.into()),
        Err(other) => Err(io::Error::other(other).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_sizes_and_refuses_what_is_not_a_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x");
        assert_eq!(read_capped(&p, 4).unwrap(), None);
        std::fs::write(&p, b"1234").unwrap();
        assert_eq!(read_capped(&p, 4).unwrap().as_deref(), Some(&b"1234"[..]));
        std::fs::write(&p, b"12345").unwrap();
        let e = read_capped(&p, 4).unwrap_err().to_string();
        assert!(
            e.contains("over the 4-byte limit") && e.contains("/x"),
            "{e}"
        );
        // A FIFO would block a plain read forever; here it is refused at once.
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(
            read_capped(&fifo, 4)
                .unwrap_err()
                .to_string()
                .contains("not a regular file")
        );
        assert!(read_capped(d.path(), 4).is_err());
    }

    /// A file error is an `Error::Io` from fs-err: its message names the operation and the
    /// path, and its kind is kept for the callers that branch on it.
    #[test]
    fn a_file_error_names_the_path() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("params");
        std::fs::write(&file, b"").unwrap();
        // A path under a regular file: ENOTDIR, even as root.
        let below = file.join("Model");
        let e = read_capped(&below, 4).unwrap_err();
        let Error::Io(io) = &e else {
            panic!("not an Io error: {e:?}")
        };
        assert_eq!(io.kind(), io::ErrorKind::NotADirectory);
        let text = e.to_string();
        assert!(
            text.contains("failed to open file") && text.contains(&*below.to_string_lossy()),
            "{text}"
        );
    }
}
