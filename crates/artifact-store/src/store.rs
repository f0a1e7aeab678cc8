//! The `Store` trait: what publish, reuse and serve need from a place that holds artifacts.
//!
//! Paths are [`StorePath`]s in the Hugging Face bucket layout (`manifests/model_names_v25.json`,
//! `models/v25/<id>/<file>`, `onnx/<source-id>/<file>`); a backend with another layout (the
//! GitHub `Models` branch) maps them itself, so callers never think about it.

use fs_err::File;
use std::io::{self, Read};
use std::path::Path;

use chunker::Sha256Digest;
use manifest::StoreLayout;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::paths::StorePath;
use crate::progress::Transfer;

/// The SHA-256 of `pieces` read in order through `store` (`name` and the piece in a read
/// error), streaming, and with `each` every piece's own digest from the same read; `on_read`
/// is told each read's byte count. The one store digest of publish's look and audit's `--deep`.
pub fn digest_of<'p>(
    store: &dyn Store,
    name: &str,
    pieces: impl IntoIterator<Item = &'p StorePath>,
    each: bool,
    on_read: &mut dyn FnMut(u64),
) -> Result<(Sha256Digest, Vec<Sha256Digest>)> {
    let (mut whole, mut own) = (chunker::Hasher::new(), Vec::new());
    for p in pieces {
        let mut piece = chunker::Hasher::new();
        let mut seen = Seen {
            inner: store.open(p)?,
            piece: each.then_some(&mut piece),
            on_read: &mut *on_read,
        };
        whole
            .update_from_reader(&mut seen)
            .map_err(|source| Error::StoreRead {
                what: format!("{name} {p}"),
                source,
            })?;
        if each {
            own.push(piece.finish());
        }
    }
    Ok((whole.finish(), own))
}

/// A reader that tells each read to `on_read` and, when given one, to a piece's own hasher.
struct Seen<'a, R> {
    inner: R,
    piece: Option<&'a mut chunker::Hasher>,
    on_read: &'a mut dyn FnMut(u64),
}

impl<R: Read> Read for Seen<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(h) = &mut self.piece {
            h.update(&buf[..n]);
        }
        (self.on_read)(n as u64);
        Ok(n)
    }
}

/// What a store knows about one file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileStat {
    /// Size in bytes.
    pub size: u64,
}

/// One file found by [`Store::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    /// The file's store path.
    pub path: StorePath,
    /// Its size in bytes.
    pub size: u64,
}

/// A store's name as publish's events and reports give it, with the layout the store keeps its
/// files in, which messages show its paths in (a `github:` checkout's: its branch's). Known
/// from the opened store, never read back from the name. Shown and serialised as the name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct StoreName {
    /// How the user names the store (`/srv/store`, `hf://buckets/NS/NAME`, `github:/x`).
    pub name: String,
    /// The layout of the store's files.
    #[serde(skip)]
    pub layout: StoreLayout,
}

impl std::fmt::Display for StoreName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

/// A place that holds artifacts and manifests.
pub trait Store: Send + Sync {
    /// This store's name and the layout of its files.
    fn name(&self) -> StoreName;

    /// How the user names this store (`/srv/store`, `hf://buckets/NS/NAME`, `github:/x`).
    fn describe(&self) -> String {
        self.name().name
    }

    /// Size of a file, `None` when it does not exist.
    fn stat(&self, path: &StorePath) -> Result<Option<FileStat>>;

    /// A streaming reader over a file's bytes; [`Error::NotFound`] when it does not exist.
    fn open(&self, path: &StorePath) -> Result<Box<dyn Read + Send>>;

    /// Write a file from a stream, replacing any previous content. Atomic where the backend
    /// allows: readers see the old file or the new one, never a part. Returns the bytes written.
    /// [`Store::write_reporting`] without reports.
    fn write(&self, path: &StorePath, src: &mut dyn Read) -> Result<u64> {
        self.write_reporting(path, src, &mut |_| {})
    }

    /// Write a file from a local file. Backends that can hand the file over directly (the `hf`
    /// CLI) override this; the default streams it through [`Store::write`].
    fn write_file(&self, path: &StorePath, local: &Path) -> Result<u64> {
        let mut f = File::open(local)?;
        self.write(path, &mut f)
    }

    /// [`Store::write_file`], handing `report` what the backend learns while it writes (see
    /// [`crate::progress`]: bytes within the file, a local commit waiting for a push, a push's
    /// bytes). The default streams the file through [`Store::write_reporting`].
    fn write_file_reporting(
        &self,
        path: &StorePath,
        local: &Path,
        report: &mut dyn FnMut(Transfer),
    ) -> Result<u64> {
        let mut f = File::open(local)?;
        self.write_reporting(path, &mut f, report)
    }

    /// The one writer every store implements: [`Store::write`] handing `report` what the
    /// backend learns while it writes, as [`Store::write_file_reporting`] describes. A stream
    /// whose length the backend does not learn (the `hf` CLI's stdin) reports nothing.
    fn write_reporting(
        &self,
        path: &StorePath,
        src: &mut dyn Read,
        report: &mut dyn FnMut(Transfer),
    ) -> Result<u64>;

    /// [`Store::flush`] with reports of the pushes it makes (a `github:` store).
    fn flush_reporting(&self, _report: &mut dyn FnMut(Transfer)) -> Result<()> {
        self.flush()
    }

    /// Every file at or below `prefix`, sorted by path. A missing prefix lists nothing.
    fn list(&self, prefix: &StorePath) -> Result<Vec<ListEntry>>;

    /// Copy a file within the store, server-side where the backend can; the default streams it
    /// through [`Store::open`] and [`Store::write`].
    fn copy(&self, from: &StorePath, to: &StorePath) -> Result<()> {
        let mut src = self.open(from)?;
        self.write(to, &mut src)?;
        Ok(())
    }

    /// Delete a file; `Ok(false)` when it was not there.
    fn delete(&self, path: &StorePath) -> Result<bool>;

    /// Make every write so far visible to the store's readers. A backend that holds writes
    /// back to send them together (the GitHub checkout batches its pushes) sends them now;
    /// for the others every write is visible once it returns and this does nothing.
    fn flush(&self) -> Result<()> {
        Ok(())
    }

    /// Whether reading a file costs only local disk I/O (a directory, a git checkout). Publish
    /// then re-hashes every listed artifact it did not just verify, because a sidecar that
    /// agrees with the manifest cannot catch a chunk corrupted in place at the same size.
    fn reads_are_local(&self) -> bool {
        false
    }

    /// The file's `hf://` address when it lives on the Hugging Face Hub, so that a copy between
    /// two Hub locations can happen server-side.
    fn hub_uri(&self, _path: &StorePath) -> Option<String> {
        None
    }

    /// Copy a Hub file (`hf://...`) into this store without the bytes passing through this
    /// machine. `Ok(false)` when this backend cannot do that (the caller then streams).
    fn copy_from_hub(&self, _src_uri: &str, _to: &StorePath) -> Result<bool> {
        Ok(false)
    }

    /// Fill `buf` with the bytes of `path` from `offset` on ([`Error::NotFound`] when the file
    /// does not exist, an error when it ends first). Backends that can read a range without the
    /// bytes before it (a seek, an HTTP range) override this; the default streams up to it.
    fn read_at(&self, path: &StorePath, offset: u64, buf: &mut [u8]) -> Result<()> {
        let mut reader = self.open(path)?;
        let what = format!("{} {}", self.describe(), path);
        let read_failed = |what: &str, source| Error::StoreRead {
            what: what.to_string(),
            source,
        };
        let skipped = io::copy(&mut (&mut reader).take(offset), &mut io::sink())
            .map_err(|e| read_failed(&what, e))?;
        if skipped != offset {
            return Err(Error::BadResponse {
                url: what,
                reason: format!("ends at byte {skipped}, before {offset}"),
            });
        }
        reader.read_exact(buf).map_err(|e| read_failed(&what, e))
    }

    /// SHA-256 and size of a file, streamed; `None` when it does not exist.
    fn sha256(&self, path: &StorePath) -> Result<Option<(Sha256Digest, u64)>> {
        let mut reader = match self.open(path) {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let what = format!("{} {}", self.describe(), path);
        Sha256Digest::of_reader(&mut reader)
            .map(Some)
            .map_err(|source| Error::StoreRead { what, source })
    }

    /// Read a small file (manifests, sidecars, chunk manifests) whole, refusing anything larger
    /// than `limit` so a bad store cannot make us read endless data.
    fn read_small(&self, path: &StorePath, limit: u64) -> Result<Option<Vec<u8>>> {
        let reader = match self.open(path) {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let buf =
            chunker::bounded::read_up_to(reader, limit).map_err(|source| Error::StoreRead {
                what: format!("{} {}", self.describe(), path),
                source,
            })?;
        match buf {
            Some(buf) => Ok(Some(buf)),
            None => Err(Error::BadResponse {
                url: format!("{} {}", self.describe(), path),
                reason: format!("larger than the {limit}-byte limit for this kind of file"),
            }),
        }
    }

    /// Write a small in-memory file.
    fn write_bytes(&self, path: &StorePath, data: &[u8]) -> Result<u64> {
        self.write(path, &mut io::Cursor::new(data))
    }
}
