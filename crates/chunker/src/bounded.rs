//! Reading a small file a user or an attacker can influence (a key, a signature, a record, a pin
//! table, a source map, a manifest) with a size cap, regular files only.
//!
//! [`read_capped`] opens without blocking (a FIFO planted at the path cannot hang the reader),
//! refuses anything that is not a regular file after following symlinks (`/dev/zero` behind a
//! symlink is a character device, refused before a byte is read), and never reads more than the
//! limit plus one byte, so an oversized file costs a `stat`, not its size in memory. One helper
//! for the release tools and the device, so the rule is written once.

use std::io::{self, Read};
use std::path::Path;

use fs_err::OpenOptions;
use fs_err::os::unix::fs::OpenOptionsExt;
use rustix::fs::OFlags;

use crate::error::{Error, Result};

/// The whole file, or `None` when it does not exist. Anything but a regular file is
/// [`Error::NotRegularFile`]; a file over `limit` bytes (at open, or grown while read) is
/// [`Error::FileTooLarge`]; other I/O errors are [`Error::Io`] naming the path.
pub fn read_capped(path: &Path, limit: u64) -> Result<Option<Vec<u8>>> {
    match read_capped_existing(path, limit) {
        Err(Error::Io(e)) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        other => other.map(Some),
    }
}

/// [`read_capped`] for a file that must exist: a missing file is [`Error::Io`] (`NotFound`,
/// from fs-err: "failed to open file `PATH`: No such file or directory").
pub fn read_capped_existing(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags((OFlags::NONBLOCK | OFlags::CLOEXEC).bits() as i32)
        .open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(Error::NotRegularFile {
            path: path.to_path_buf(),
        });
    }
    let too_large = |size: u64| Error::FileTooLarge {
        path: path.to_path_buf(),
        size,
        limit,
    };
    if meta.len() > limit {
        return Err(too_large(meta.len()));
    }
    // `None`: the file grew between the stat and the read.
    read_up_to(file, limit)?.ok_or_else(|| too_large(limit.saturating_add(1)))
}

/// All of `reader` when it holds at most `limit` bytes, else `None`; never reads more than
/// `limit + 1` bytes, so an endless stream (an HTTP body, a pipe) costs nothing. The cap of
/// every bounded read: [`read_capped`]'s files, a store's small files, a listing page, a
/// staging directory's state.
pub fn read_up_to(reader: impl Read, limit: u64) -> io::Result<Option<Vec<u8>>> {
    let mut out = Vec::new();
    reader.take(limit.saturating_add(1)).read_to_end(&mut out)?;
    Ok((out.len() as u64 <= limit).then_some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_is_read_whole_up_to_the_limit_and_no_further() {
        for (len, limit, whole) in [
            (0, 0, true),
            (1, 0, false),
            (4, 4, true),
            (5, 4, false),
            (3, 4, true),
            (10, u64::MAX, true),
        ] {
            let data = vec![b'x'; len];
            let got = read_up_to(&data[..], limit).unwrap();
            assert_eq!(
                got,
                whole.then(|| data.clone()),
                "{len} bytes, limit {limit}"
            );
        }
        // An endless reader is cut after limit + 1 bytes.
        assert_eq!(read_up_to(io::repeat(0), 1 << 20).unwrap(), None);
    }

    #[test]
    fn caps_sizes_and_refuses_what_is_not_a_regular_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x");
        assert_eq!(read_capped(&p, 4).unwrap(), None);
        assert!(
            read_capped_existing(&p, 4)
                .unwrap_err()
                .to_string()
                .contains("/x")
        );
        std::fs::write(&p, b"1234").unwrap();
        assert_eq!(read_capped(&p, 4).unwrap().as_deref(), Some(&b"1234"[..]));
        std::fs::write(&p, b"12345").unwrap();
        let e = read_capped(&p, 4).unwrap_err();
        assert!(
            matches!(
                e,
                Error::FileTooLarge {
                    size: 5,
                    limit: 4,
                    ..
                }
            ),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.contains("/x") && text.contains("4-byte limit"),
            "{text}"
        );

        // A FIFO would block a plain read forever; here it is refused at once.
        let fifo = d.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_capped(&fifo, 4).unwrap_err();
        assert!(matches!(e, Error::NotRegularFile { .. }), "{e:?}");
        assert!(e.to_string().contains("not a regular file"), "{e}");

        // A symlink to /dev/zero (endless) is refused without reading it.
        let zero = d.path().join("zero");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        assert!(matches!(
            read_capped(&zero, 4).unwrap_err(),
            Error::NotRegularFile { .. }
        ));
        // A symlink to a regular file is followed.
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        assert!(matches!(
            read_capped(&link, 4).unwrap_err(),
            Error::FileTooLarge { .. }
        ));
        assert_eq!(read_capped(&link, 5).unwrap().unwrap(), b"12345");
        // A directory.
        assert!(matches!(
            read_capped(d.path(), 4).unwrap_err(),
            Error::NotRegularFile { .. }
        ));
    }
}
