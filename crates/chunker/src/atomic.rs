//! The one place for durable, atomic file writes: write to a temporary name in the destination
//! directory, fsync the file, rename it over the final name, fsync the directory. A crash at any
//! instant leaves either the old file or the new one under the final name, never a partial one.
//!
//! Temporary names start with [`TEMP_PREFIX`] so that cleanup tools can recognise strays.
//!
//! Every file call goes through `fs_err`, so an error names the operation and the path (the
//! temporary's, or both names of a rename).

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use fs_err::{self as fs, File, OpenOptions};

use crate::effects::{self, Effect};

/// Every temporary file made by this module starts with this prefix.
pub const TEMP_PREFIX: &str = ".tmp-";

/// Whether a file name is one of our temporaries (a stray after a crash).
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX)
}

/// The process and final file name a temporary was made for: `.tmp-<pid>-<n>-<dest>` gives
/// `Some((pid, dest))`; `None` for any other name.
pub fn temp_owner(name: &str) -> Option<(u32, &str)> {
    let rest = name.strip_prefix(TEMP_PREFIX)?;
    let (pid, rest) = rest.split_once('-')?;
    let (n, dest) = rest.split_once('-')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || dest.is_empty() {
        return None;
    }
    Some((pid.parse().ok()?, dest))
}

/// Whether a process is still running. Only Linux can tell (`/proc`); elsewhere every process
/// counts as alive, so nothing of a possibly running writer is ever removed.
pub fn process_alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new("/proc").join(pid.to_string()).exists()
    } else {
        true
    }
}

/// A file being written under a temporary name beside its final path. Dropping it without
/// [`AtomicFile::commit`] removes the temporary.
pub struct AtomicFile {
    file: Option<File>,
    temp: PathBuf,
    dest: PathBuf,
    committed: bool,
    /// Opened with O_DIRECT, which is still on.
    direct: bool,
}

/// Alignment of memory, file offsets and lengths that O_DIRECT writes need (the page size, which
/// covers every logical block size in use).
pub const DIRECT_ALIGN: usize = 4096;

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn temp_path_for(dest: &Path) -> io::Result<PathBuf> {
    let dir = parent_dir(dest);
    let name = dest
        .file_name()
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("`{}` has no file name to write to", dest.display()),
            )
        })?
        .to_string_lossy();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    Ok(dir.join(format!("{TEMP_PREFIX}{}-{n}-{name}", std::process::id())))
}

/// The directory holding `path` (`.` for a bare name).
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

impl AtomicFile {
    /// Create a temporary file beside `dest`.
    pub fn create(dest: impl AsRef<Path>) -> io::Result<Self> {
        Self::open(dest.as_ref(), false)
    }

    /// Like [`AtomicFile::create`], but bypassing the page cache (O_DIRECT) where the platform
    /// and filesystem allow it, for large sequential writes; otherwise an ordinary file. Write
    /// with [`AtomicFile::write_piece`], which falls back to buffered writes for any piece that
    /// is not aligned. Durability is unchanged: [`AtomicFile::sync`] still fsyncs.
    pub fn create_direct(dest: impl AsRef<Path>) -> io::Result<Self> {
        match Self::open(dest.as_ref(), cfg!(target_os = "linux")) {
            // Filesystems without O_DIRECT (tmpfs) refuse the open with EINVAL (fs_err keeps
            // the kind, not the raw code): write through the cache.
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => Self::create(dest),
            other => other,
        }
    }

    /// The temporary beside `dest`, opened with O_DIRECT when `direct` (Linux only).
    fn open(dest: &Path, direct: bool) -> io::Result<Self> {
        let temp = temp_path_for(dest)?;
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(target_os = "linux")]
        if direct {
            use fs_err::os::unix::fs::OpenOptionsExt;
            options.custom_flags(rustix::fs::OFlags::DIRECT.bits() as i32);
        }
        let file = options.open(&temp).inspect_err(|e| {
            // A refused O_DIRECT open may have made the file first.
            if direct && e.kind() == io::ErrorKind::InvalidInput {
                let _ = std::fs::remove_file(&temp);
            }
        })?;
        Ok(Self {
            file: Some(file),
            temp,
            dest: dest.to_path_buf(),
            committed: false,
            direct,
        })
    }

    /// Append `data`. On an O_DIRECT file, an unaligned piece (in memory or in length, such as
    /// the tail of an artifact) switches the file to buffered writes first; so does a
    /// filesystem that refuses the direct write outright.
    pub fn write_piece(&mut self, data: &[u8]) -> io::Result<()> {
        if self.direct {
            // The file position is aligned: every earlier direct write was.
            if !direct_aligned(data, 0) {
                self.stop_direct()?;
            } else {
                match self.file().write(data) {
                    Ok(n) if n == data.len() => return Ok(()),
                    // A short direct write (a full disk): finish buffered, which reports it.
                    Ok(n) => {
                        self.stop_direct()?;
                        return self.file().write_all(&data[n..]);
                    }
                    // EINVAL, seen through fs_err as its kind.
                    Err(e) if e.kind() == io::ErrorKind::InvalidInput => self.stop_direct()?,
                    Err(e) => return Err(e),
                }
            }
        }
        self.file().write_all(data)
    }

    /// Turn O_DIRECT off for the rest of this file.
    fn stop_direct(&mut self) -> io::Result<()> {
        self.direct = false;
        let temp = self.temp.clone();
        clear_direct(self.file().file(), &temp)
    }

    /// The final path this file is renamed to on commit.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// The open temporary file. Panics after [`AtomicFile::sync`].
    pub fn file(&mut self) -> &mut File {
        self.file
            .as_mut()
            .expect("file is open until sync or commit")
    }

    /// fsync the data and close the file, but keep it under its temporary name. Lets many files
    /// be made durable first and renamed into place together later.
    pub fn sync(&mut self) -> io::Result<()> {
        if let Some(file) = self.file.take() {
            effects::note(Effect::Wrote(&self.temp));
            file.sync_all()?;
            effects::note(Effect::SyncedFile(&self.temp));
        }
        Ok(())
    }

    /// fsync the data (unless [`AtomicFile::sync`] did) and rename it over the final name. The
    /// directory is not synced here so that many files can share one directory sync; call
    /// [`sync_dir`] afterwards (or use [`AtomicFile::commit_and_sync_dir`]).
    pub fn commit(mut self) -> io::Result<PathBuf> {
        self.sync()?;
        fs::rename(&self.temp, &self.dest)?;
        self.committed = true;
        effects::note(Effect::Renamed {
            from: &self.temp,
            to: &self.dest,
        });
        Ok(std::mem::take(&mut self.dest))
    }

    /// [`AtomicFile::commit`], then fsync the directory so the rename itself is durable.
    pub fn commit_and_sync_dir(self) -> io::Result<PathBuf> {
        let dest = self.commit()?;
        sync_dir(parent_dir(&dest))?;
        Ok(dest)
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file().write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file().flush()
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if !self.committed {
            self.file = None;
            let _ = fs::remove_file(&self.temp);
        }
    }
}

/// Whether `data`, written at `offset`, meets O_DIRECT's alignment ([`DIRECT_ALIGN`]) in memory,
/// length and offset.
fn direct_aligned(data: &[u8], offset: u64) -> bool {
    (data.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN)
        && data.len().is_multiple_of(DIRECT_ALIGN)
        && offset.is_multiple_of(DIRECT_ALIGN as u64)
}

/// Turn O_DIRECT off on the open file description of `file` (shared by every handle duplicated
/// from it), so that the writes after go through the page cache. `path` names it in the error.
fn clear_direct(file: &std::fs::File, path: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
        fcntl_getfl(file)
            .and_then(|flags| fcntl_setfl(file, flags - OFlags::DIRECT))
            // fcntl is not a file call fs_err wraps: name the file here.
            .map_err(|e| {
                let e = io::Error::from(e);
                let what = format!("failed to turn O_DIRECT off on `{}`: {e}", path.display());
                io::Error::new(e.kind(), what)
            })?;
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, path);
    Ok(())
}

/// Write `data` to `dest` atomically and durably (file and directory fsynced).
pub fn write_atomic(dest: impl AsRef<Path>, data: &[u8]) -> io::Result<()> {
    let mut f = AtomicFile::create(dest)?;
    f.write_all(data)?;
    f.commit_and_sync_dir()?;
    Ok(())
}

/// fsync a directory so that renames and removals in it survive a power cut.
pub fn sync_dir(dir: impl AsRef<Path>) -> io::Result<()> {
    File::open(dir.as_ref())?.sync_all()?;
    effects::note(Effect::SyncedDir(dir.as_ref()));
    Ok(())
}

/// `create_dir_all` that survives a power cut: every directory it creates is fsynced, and so
/// is the parent of each, up to the directory that already existed (under strict POSIX a new
/// directory's entry is durable only once its parent is fsynced, so without this a store's
/// first file, or a chunk set split into a new `--out-dir`, could be fsynced and renamed into
/// place, and still vanish with the directory holding it). Creates nothing and syncs nothing
/// when `dir` exists. Shared by the directory store and `chunk split`.
pub fn create_dir_all_durable(dir: impl AsRef<Path>) -> io::Result<()> {
    let dir = dir.as_ref();
    // The missing directories, deepest first, and the one that exists above them.
    let mut missing: Vec<&Path> = Vec::new();
    let mut cur = dir;
    let existing = loop {
        match std::fs::metadata(cur) {
            Ok(_) => break cur,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing.push(cur);
                match cur.parent() {
                    Some(p) if !p.as_os_str().is_empty() => cur = p,
                    _ => break Path::new("."),
                }
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("failed to look at `{}`: {e}", cur.display()),
                ));
            }
        }
    };
    if missing.is_empty() {
        return Ok(());
    }
    for d in missing.iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => effects::note(Effect::CreatedDir(d)),
            // Another writer made it meanwhile: it is still ours to make durable.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) => return Err(e),
        }
    }
    // Each new directory, deepest first, then the one that existed: each sync makes the entry
    // of the directory below it durable.
    for d in &missing {
        sync_dir(d)?;
    }
    sync_dir(existing)
}

/// Remove a file if it exists; a missing file is not an error.
pub fn remove_if_exists(path: impl AsRef<Path>) -> io::Result<bool> {
    let path = path.as_ref();
    match fs::remove_file(path) {
        Ok(()) => {
            effects::note(Effect::Removed(path));
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_atomic_file_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("x.bin");
        {
            let mut f = AtomicFile::create(&dest).unwrap();
            f.write_all(b"partial").unwrap();
        }
        assert!(!dest.exists());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// Once O_DIRECT is turned off on a file's description, an unaligned write through any
    /// handle of it goes through the page cache.
    #[test]
    #[cfg(target_os = "linux")]
    fn clearing_direct_lets_every_handle_write_unaligned() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().unwrap();
        let mut f = AtomicFile::create_direct(dir.path().join("x")).unwrap();
        if !f.direct {
            eprintln!("this filesystem has no O_DIRECT: nothing to turn off");
            return;
        }
        let handle = f.file().file().try_clone().unwrap();
        assert!(!direct_aligned(b"tail", 0));
        assert!(
            handle.write_at(b"tail", 0).is_err(),
            "an unaligned O_DIRECT write was taken"
        );
        clear_direct(&handle, &f.temp).unwrap();
        handle.write_at(b"tail", 0).unwrap();
        f.file().file().write_at(b"T", 0).unwrap();
        f.sync().unwrap();
        let temp = dir
            .path()
            .read_dir()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        assert_eq!(fs::read(temp).unwrap(), b"Tail");
    }

    #[test]
    fn write_atomic_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("x");
        write_atomic(&dest, b"one").unwrap();
        write_atomic(&dest, b"two").unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
