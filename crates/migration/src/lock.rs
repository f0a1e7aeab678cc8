//! One manager at a time: an exclusive lock on `<models>/.manager.lock` (std `File::try_lock`,
//! flock on Linux). The kernel drops it when the process dies, even by kill -9, so a crash never
//! leaves the device locked.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use crate::error::{Error, IoContext, Result};

pub const LOCK_FILE: &str = ".manager.lock";

/// Held while alive.
#[derive(Debug)]
pub struct ManagerLock {
    _file: File,
    path: PathBuf,
}

impl ManagerLock {
    /// Take the lock or fail at once with [`Error::Busy`].
    pub fn acquire(models_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(models_dir).ctx(models_dir)?;
        let path = models_dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .ctx(&path)?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file, path }),
            Err(TryLockError::WouldBlock) => Err(Error::Busy { path }),
            Err(TryLockError::Error(e)) => Err(Error::Io { path, source: e }),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
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
}
