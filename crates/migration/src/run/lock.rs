//! One manager at a time: an exclusive `flock` on the models directory itself (std
//! `File::try_lock` on the directory's descriptor). The kernel drops it when the process dies,
//! even by kill -9, so a crash never leaves the device locked.
//!
//! Locking the directory, not a file in it, means the lock survives anyone deleting or replacing
//! a lock file: there is no path to delete while the directory holds files. The previous build
//! locked `<models>/.manager.lock`; that file is still locked too, so a manager of the previous
//! build (during an update) and this one exclude each other, but it is opened with `O_NOFOLLOW`
//! and `O_NONBLOCK`, never written, and used only when it is a regular file: a symlink planted at
//! that name is unlinked (which never touches its target) instead of being followed, and a FIFO
//! or directory there is ignored.

use std::fs::TryLockError;
use std::io;
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt};
use std::path::Path;

use fs_err::File;

use crate::error::{Error, Result};

/// The previous build's lock file, still locked for compatibility (see the module docs).
pub const LOCK_FILE: &str = ".manager.lock";

/// Held while alive.
#[derive(Debug)]
pub struct ManagerLock {
    _dir: File,
    _legacy: Option<File>,
}

impl ManagerLock {
    /// Take the lock or fail at once with [`Error::Busy`].
    pub fn acquire(models_dir: &Path) -> Result<Self> {
        fs_err::create_dir_all(models_dir)?;
        let dir = File::open(models_dir)?;
        if !dir.metadata()?.is_dir() {
            return Err(Error::Lock {
                path: models_dir.to_path_buf(),
                source: io::Error::new(io::ErrorKind::NotADirectory, "not a directory"),
            });
        }
        take(&dir, models_dir)?;
        let legacy_path = models_dir.join(LOCK_FILE);
        let legacy = open_legacy(&legacy_path).map_err(|source| Error::Lock {
            path: legacy_path.clone(),
            source,
        })?;
        if let Some(f) = &legacy {
            take(f, &legacy_path)?;
        }
        Ok(Self {
            _dir: dir,
            _legacy: legacy,
        })
    }
}

fn take(file: &File, path: &Path) -> Result<()> {
    match file.try_lock() {
        Ok(()) => Ok(()),
        Err(TryLockError::WouldBlock) => Err(Error::Busy {
            path: path.to_path_buf(),
        }),
        Err(TryLockError::Error(source)) => Err(Error::Lock {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The previous build's lock file as a regular file, or `None` when something other than a
/// regular file or symlink sits at its name. std's open, not fs-err's: the next step depends on
/// its raw errno (`ELOOP`, `ENXIO`), which fs-err hides; the caller names the path.
fn open_legacy(path: &Path) -> io::Result<Option<File>> {
    for _ in 0..3 {
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .create(true)
            .write(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path);
        match opened {
            Ok(f) => {
                let f = File::from_parts(f, path);
                let t = f.metadata()?.file_type();
                return Ok((t.is_file() && !t.is_fifo()).then_some(f));
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                // A symlink: remove the link itself and make our own file.
                fs_err::remove_file(path)?;
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EISDIR) | Some(libc::ENXIO) | Some(libc::ENOTDIR)
                ) =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// The pid of the process that holds the manager lock on `models_dir` now (the daemon, or a
/// `refresh` or `download` in another shell), read from the kernel's `/proc/locks`: nothing is
/// locked or opened for it, so a manager starting meanwhile is never turned away. `None`: not
/// held, or not knowable (no `/proc`).
pub fn holder(models_dir: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = std::fs::metadata(models_dir).ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    holder_in(&locks, meta.dev(), meta.ino())
}

/// The pid holding a `flock` on the file `(dev, ino)` in `/proc/locks`' text (lines such as
/// `1: FLOCK  ADVISORY  WRITE 7990 fe:00:5398791 0 EOF`; waiters, `1: -> FLOCK ...`, are not
/// holders). Pure.
pub fn holder_in(locks: &str, dev: u64, ino: u64) -> Option<u32> {
    // The kernel prints a dev_t's major and minor in hex.
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [_, "FLOCK", _, "WRITE", pid, file, ..] => {
                let mut parts = file.split(':');
                let (ma, mi, i) = (parts.next()?, parts.next()?, parts.next()?);
                let same = u32::from_str_radix(ma, 16).ok()? == major
                    && u32::from_str_radix(mi, 16).ok()? == minor
                    && i.parse::<u64>().ok()? == ino;
                same.then(|| pid.parse().ok()).flatten()
            }
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    /// `/proc/locks` read for the models directory's inode: a writer's pid, never a waiter's
    /// or another file's.
    #[test]
    fn the_lock_holder_is_read_from_proc_locks() {
        let locks = "1: FLOCK  ADVISORY  WRITE 27528 fe:00:10048770 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 999 fe:01:42 0 EOF\n\
                     3: FLOCK  ADVISORY  READ 7990 fe:01:42 0 EOF\n\
                     4: POSIX  ADVISORY  WRITE 5 fe:01:42 0 EOF\n\
                     5: FLOCK  ADVISORY  WRITE 7991 fe:01:42 0 EOF\n";
        let dev = (0xfe << 8) | 1;
        assert_eq!(super::holder_in(locks, dev, 42), Some(7991));
        assert_eq!(super::holder_in(locks, dev, 43), None);
        assert_eq!(super::holder_in(locks, 0xfe << 8, 10_048_770), Some(27528));
        assert_eq!(super::holder_in("", dev, 42), None);
    }

    /// A held lock is seen with the holder's pid; a free one is not held.
    #[test]
    fn holder_sees_a_held_lock() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(super::holder(dir.path()), None);
        let lock = super::ManagerLock::acquire(dir.path()).unwrap();
        assert_eq!(super::holder(dir.path()), Some(std::process::id()));
        drop(lock);
        assert_eq!(super::holder(dir.path()), None);
    }

    use super::*;

    #[test]
    fn second_holder_is_busy() {
        let dir = tempfile::tempdir().unwrap();
        let first = ManagerLock::acquire(dir.path()).unwrap();
        let err = ManagerLock::acquire(dir.path()).unwrap_err();
        assert!(
            err.to_string().contains("another model manager is running"),
            "{err}"
        );
        drop(first);
        ManagerLock::acquire(dir.path()).unwrap();
    }

    #[test]
    fn deleting_the_lock_file_does_not_let_a_second_manager_in() {
        let dir = tempfile::tempdir().unwrap();
        let _first = ManagerLock::acquire(dir.path()).unwrap();
        std::fs::remove_file(dir.path().join(LOCK_FILE)).unwrap();
        let err = ManagerLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(err, Error::Busy { .. }), "{err}");
    }

    #[test]
    fn a_symlinked_lock_file_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let models = dir.path().join("models");
        std::fs::create_dir(&models).unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        // Dangling: following it would create a file outside the data dir.
        std::os::unix::fs::symlink(outside.join("created"), models.join(LOCK_FILE)).unwrap();
        let lock = ManagerLock::acquire(&models).unwrap();
        assert!(!outside.join("created").exists());
        assert!(
            std::fs::symlink_metadata(models.join(LOCK_FILE))
                .unwrap()
                .is_file()
        );
        drop(lock);

        // A FIFO at the name neither blocks nor breaks the lock.
        std::fs::remove_file(models.join(LOCK_FILE)).unwrap();
        let c = std::ffi::CString::new(models.join(LOCK_FILE).to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let _held = ManagerLock::acquire(&models).unwrap();
        assert!(matches!(
            ManagerLock::acquire(&models).unwrap_err(),
            Error::Busy { .. }
        ));
    }
}
