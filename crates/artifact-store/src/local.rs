//! The local directory store: the embedded default, the origin `serve` publishes, and the
//! stand-in for a bucket in tests. Every write goes through `chunker::atomic` (temp file in the
//! same directory, fsync, rename, fsync the directory), so a crash leaves the old file or the
//! new one and a stray `.tmp-*` at worst, which listings skip. The directories a write creates
//! (the store's own on a first publish) are fsynced up to the one that existed
//! (`atomic::create_dir_all_durable`), so a power cut cannot keep a file and lose its directory.

use fs_err::{self as fs, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use chunker::atomic::{self, AtomicFile};

use crate::error::{Error, Result};
use crate::paths::{StorePath, to_fs_path};
use crate::progress::{Measure, Transfer};
use crate::store::{FileStat, ListEntry, Store, StoreName};

/// A directory store reports the bytes it has copied into a file each time this many more are
/// there (and at the start), so a file larger than this has more than one report.
pub const COPY_REPORT_BYTES: u64 = 4 << 20;

/// A directory as a [`Store`]: store paths are paths under the root, every write is atomic
/// (temporary, fsync, rename, fsync of the directory), and a server-side copy is a local copy.
#[derive(Debug, Clone)]
pub struct LocalStore {
    root: PathBuf,
}

impl LocalStore {
    /// A store rooted at `root`. The directory is created on the first write if missing.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn fs_path(&self, path: &StorePath) -> PathBuf {
        to_fs_path(path, &self.root)
    }

    fn not_found(&self, path: &StorePath) -> Error {
        Error::NotFound {
            store: self.describe(),
            path: path.to_string(),
        }
    }

    /// A FIFO, device or socket where a store file belongs: an error naming it, never read.
    fn not_regular(&self, path: &StorePath) -> Error {
        Error::StoreRead {
            what: format!("{} {}", self.describe(), path),
            source: io::Error::other(
                "not a regular file (a FIFO, device or socket); remove it from the store",
            ),
        }
    }
}

/// Opens for reading without blocking: a FIFO planted in a store cannot hang the reader (the
/// caller refuses anything but a regular file; a regular file's reads ignore the flag).
fn open_nonblocking(p: &Path) -> io::Result<File> {
    use fs_err::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(p)
}

impl Store for LocalStore {
    fn name(&self) -> StoreName {
        StoreName {
            name: self.root.display().to_string(),
            layout: manifest::StoreLayout::HfBucket,
        }
    }

    fn reads_are_local(&self) -> bool {
        true
    }

    fn stat(&self, path: &StorePath) -> Result<Option<FileStat>> {
        let p = self.fs_path(path);
        match fs::metadata(&p) {
            Ok(m) if m.is_file() => Ok(Some(FileStat { size: m.len() })),
            Ok(_) => Ok(None),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            // A file where a directory should be (ENOTDIR) also means "not there".
            Err(e) if e.kind() == io::ErrorKind::NotADirectory => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    fn open(&self, path: &StorePath) -> Result<Box<dyn Read + Send>> {
        let p = self.fs_path(path);
        match open_nonblocking(&p) {
            Ok(f) => {
                let meta = f.metadata()?;
                if meta.is_file() {
                    Ok(Box::new(f))
                } else if meta.is_dir() {
                    Err(self.not_found(path))
                } else {
                    Err(self.not_regular(path))
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(self.not_found(path)),
            Err(e) => Err(e.into()),
        }
    }

    fn read_at(&self, path: &StorePath, offset: u64, buf: &mut [u8]) -> Result<()> {
        use std::io::{Seek, SeekFrom};
        let p = self.fs_path(path);
        let mut f = match open_nonblocking(&p) {
            Ok(f) if f.metadata()?.is_file() => f,
            Ok(_) => return Err(self.not_regular(path)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(self.not_found(path)),
            Err(e) => return Err(e.into()),
        };
        // read_exact's own end-of-file error names no file: say which.
        let what = || format!("{} {}", self.describe(), path);
        f.seek(SeekFrom::Start(offset))
            .and_then(|_| f.read_exact(buf))
            .map_err(|source| Error::StoreRead {
                what: what(),
                source,
            })
    }

    /// The copy counts its bytes as they go ([`Measure::Copied`], every [`COPY_REPORT_BYTES`]);
    /// the file is still written through `chunker::atomic` (temporary, fsync, rename).
    fn write_reporting(
        &self,
        path: &StorePath,
        src: &mut dyn Read,
        report: &mut dyn FnMut(Transfer),
    ) -> Result<u64> {
        let dest = self.fs_path(path);
        let dir = dest
            .parent()
            .expect("store paths have a parent under the root");
        // A first write creates the store's directories: each is fsynced up to the one that
        // existed, or a power cut could keep this file's manifest and lose its directory.
        atomic::create_dir_all_durable(dir)?;
        let mut tmp = AtomicFile::create(&dest)?;
        // The source is any stream (an HTTP body, another store's file): name the destination.
        let n = copy_reporting(src, tmp.file(), report).map_err(|source| Error::StoreRead {
            what: format!("the stream written to {}", dest.display()),
            source,
        })?;
        tmp.commit_and_sync_dir()?;
        Ok(n)
    }

    fn list(&self, prefix: &StorePath) -> Result<Vec<ListEntry>> {
        let start = self.fs_path(prefix);
        let mut out = Vec::new();
        match fs::metadata(&start) {
            Ok(m) if m.is_file() => {
                out.push(ListEntry {
                    path: prefix.clone(),
                    size: m.len(),
                });
                return Ok(out);
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e.into()),
        }
        walk(&start, prefix.as_str(), &mut out)?;
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    fn delete(&self, path: &StorePath) -> Result<bool> {
        let p = self.fs_path(path);
        let removed = atomic::remove_if_exists(&p)?;
        if removed && let Some(dir) = p.parent() {
            atomic::sync_dir(dir)?;
        }
        Ok(removed)
    }
}

/// `io::copy`, reporting the bytes copied at the start and every [`COPY_REPORT_BYTES`].
fn copy_reporting(
    src: &mut dyn Read,
    dst: &mut impl io::Write,
    report: &mut dyn FnMut(Transfer),
) -> io::Result<u64> {
    let copied = |done| Transfer::File {
        done,
        measure: Measure::Copied,
    };
    report(copied(0));
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    let mut reported = 0u64;
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        dst.write_all(&buf[..n])?;
        done += n as u64;
        if done - reported >= COPY_REPORT_BYTES {
            reported = done;
            report(copied(done));
        }
    }
    Ok(done)
}

fn walk(dir: &Path, rel: &str, out: &mut Vec<ListEntry>) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        // Temporaries are half-written files, not content.
        if atomic::is_temp_name(name) {
            continue;
        }
        let child_rel = format!("{rel}/{name}");
        let Ok(store_path) = child_rel.parse::<StorePath>() else {
            continue;
        };
        let ty = entry.file_type()?;
        if ty.is_dir() {
            walk(&entry.path(), &child_rel, out)?;
        } else {
            let meta = entry.metadata()?;
            if meta.is_file() {
                out.push(ListEntry {
                    path: store_path,
                    size: meta.len(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> StorePath {
        s.parse().unwrap()
    }

    #[test]
    fn write_read_stat_list_copy_delete() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path().join("store"));
        let a = p("models/v25/x/a.bin");
        assert_eq!(store.stat(&a).unwrap(), None);
        assert!(store.open(&a).err().unwrap().is_not_found());
        assert_eq!(store.write_bytes(&a, b"hello").unwrap(), 5);
        assert_eq!(store.stat(&a).unwrap(), Some(FileStat { size: 5 }));
        let mut s = String::new();
        store.open(&a).unwrap().read_to_string(&mut s).unwrap();
        assert_eq!(s, "hello");
        let b = p("models/v25/y/b.bin");
        store.copy(&a, &b).unwrap();
        assert_eq!(store.read_small(&b, 10).unwrap().unwrap(), b"hello");
        // A stray temporary is not listed.
        fs::write(dir.path().join("store/models/v25/x/.tmp-1-a.bin"), b"x").unwrap();
        let listed: Vec<_> = store
            .list(&p("models/v25"))
            .unwrap()
            .into_iter()
            .map(|e| (e.path.to_string(), e.size))
            .collect();
        assert_eq!(
            listed,
            vec![
                ("models/v25/x/a.bin".to_string(), 5),
                ("models/v25/y/b.bin".to_string(), 5)
            ]
        );
        assert!(store.list(&p("models/v24")).unwrap().is_empty());
        assert!(store.delete(&a).unwrap());
        assert!(!store.delete(&a).unwrap());
        assert_eq!(
            store.sha256(&b).unwrap().unwrap().0,
            chunker::Sha256Digest::of_bytes(b"hello")
        );
        assert!(store.read_small(&b, 4).is_err());
    }

    /// A FIFO or a device where a store file belongs is an error naming it, returned at once
    /// (opening a FIFO for reading would otherwise wait for a writer forever).
    #[test]
    fn special_files_are_errors_not_hangs() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path());
        let m = p("manifests/model_names_v25.json");
        fs::create_dir_all(dir.path().join("manifests")).unwrap();
        let fifo = std::ffi::CString::new(
            dir.path()
                .join("manifests/model_names_v25.json")
                .into_os_string()
                .into_encoded_bytes(),
        )
        .unwrap();
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let start = std::time::Instant::now();
        for e in [
            store.open(&m).err().unwrap(),
            store.read_small(&m, 100).unwrap_err(),
            store.read_at(&m, 0, &mut [0u8; 4]).unwrap_err(),
        ] {
            assert!(!e.is_not_found(), "{e}");
            let text = e.to_string();
            assert!(text.contains("manifests/model_names_v25.json"), "{text}");
            assert!(text.contains("not a regular file"), "{text}");
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(5));
        // A directory there is "not there", as before.
        let d = p("models/v25/x");
        fs::create_dir_all(dir.path().join("models/v25/x")).unwrap();
        assert!(store.open(&d).err().unwrap().is_not_found());
    }

    #[test]
    fn file_errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let store = LocalStore::new(dir.path().join("store"));
        let missing = dir.path().join("no-such-chunk.bin");
        let err = store
            .write_file(&p("models/v25/x/a.bin"), &missing)
            .unwrap_err();
        assert!(
            matches!(&err, Error::Io(e) if e.kind() == io::ErrorKind::NotFound),
            "{err:?}"
        );
        assert!(
            err.to_string().contains(&*missing.to_string_lossy()),
            "{err}"
        );
        // A file where a directory should be is "not there", as before.
        fs::write(dir.path().join("store/models"), b"x")
            .or_else(|_| {
                fs::create_dir_all(dir.path().join("store"))?;
                fs::write(dir.path().join("store/models"), b"x")
            })
            .unwrap();
        assert_eq!(store.stat(&p("models/v25/x/a.bin")).unwrap(), None);
    }
}
