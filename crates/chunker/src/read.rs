//! Finding and reading a logical artifact in whatever form is on disk.
//!
//! Resolution follows docs/formats.md, "Reading": a plain file `NAME` wins; otherwise a `.chunkmanifest`
//! whose chunks are all present; otherwise legacy `.pNN` parts with their `.sha256` sidecar. A
//! chunk manifest with a missing chunk means "not present" to [`resolve`], and a
//! [`Error::MissingChunk`] to the strict entry points ([`open`], [`join`], [`crate::verify`]).

use fs_err::{self as fs, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::atomic::AtomicFile;
use crate::error::{Error, Result};
use crate::{
    Hasher, IO_BUFFER_SIZE, MAX_LEGACY_PARTS, Sha256Digest, chunk_manifest_name, chunk_name,
    legacy_part_name, parse_chunk_manifest, parse_sidecar, sidecar_name,
};

/// A logical artifact found on disk, with the size of every piece at the time it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// One plain file.
    Plain {
        /// The file.
        path: PathBuf,
        /// Its size in bytes when found.
        size: u64,
    },
    /// A native chunk set; `pieces` are the chunks in order.
    Chunked {
        /// The `.chunkmanifest`.
        manifest: PathBuf,
        /// The chunks in order, with their sizes.
        pieces: Vec<(PathBuf, u64)>,
    },
    /// Legacy `.pNN` parts in order, with the digest from their `.sha256` sidecar.
    Legacy {
        /// The `.sha256` sidecar of the parts.
        sidecar: PathBuf,
        /// The digest it records for the whole artifact.
        digest: Sha256Digest,
        /// The parts in order, with their sizes.
        pieces: Vec<(PathBuf, u64)>,
    },
}

impl Resolved {
    /// The files to concatenate, in order, with their sizes.
    pub fn pieces(&self) -> Vec<(PathBuf, u64)> {
        match self {
            Resolved::Plain { path, size } => vec![(path.clone(), *size)],
            Resolved::Chunked { pieces, .. } | Resolved::Legacy { pieces, .. } => pieces.clone(),
        }
    }

    /// The logical size: the sum of the pieces' sizes.
    pub fn size(&self) -> u64 {
        self.pieces().iter().map(|(_, s)| s).sum()
    }

    /// The manifest's `artifact_chunk_count` for this form: 0 for one plain file.
    pub fn chunk_count(&self) -> u32 {
        match self {
            Resolved::Plain { .. } => 0,
            Resolved::Chunked { pieces, .. } | Resolved::Legacy { pieces, .. } => {
                pieces.len() as u32
            }
        }
    }

    /// `plain`, `chunked` or `legacy`.
    pub fn form(&self) -> &'static str {
        match self {
            Resolved::Plain { .. } => "plain",
            Resolved::Chunked { .. } => "chunked",
            Resolved::Legacy { .. } => "legacy",
        }
    }
}

fn split_logical(logical: &Path) -> Result<(&Path, String)> {
    let name = crate::file_name_of(logical);
    if name.is_empty() {
        let name = logical.display().to_string();
        return Err(Error::InvalidName { name });
    }
    Ok((crate::atomic::parent_dir(logical), name))
}

fn file_size(path: &Path) -> Result<Option<u64>> {
    match fs::metadata(path) {
        Ok(m) if m.is_file() => Ok(Some(m.len())),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Like [`resolve`], but a missing chunk ([`Error::MissingChunk`]) or a missing artifact
/// ([`Error::NotFound`]) is an error saying which.
pub(crate) fn resolve_strict(logical: &Path) -> Result<Resolved> {
    let (dir, name) = split_logical(logical)?;
    if let Some(size) = file_size(logical)? {
        let path = logical.to_path_buf();
        return Ok(Resolved::Plain { path, size });
    }
    let manifest = dir.join(chunk_manifest_name(&name));
    if let Some(count) = read_chunk_manifest(&manifest)? {
        let mut pieces = Vec::with_capacity(count as usize);
        for index in 1..=count {
            let path = dir.join(chunk_name(&name, index, count));
            match file_size(&path)? {
                Some(size) => pieces.push((path, size)),
                None => return Err(Error::MissingChunk { index, count, path }),
            }
        }
        return Ok(Resolved::Chunked { manifest, pieces });
    }
    let first = dir.join(legacy_part_name(&name, 0));
    let sidecar = dir.join(sidecar_name(&name));
    if file_size(&first)?.is_some()
        && let Some(digest) = read_sidecar(&sidecar)?
    {
        let mut pieces = Vec::new();
        for index in 0..MAX_LEGACY_PARTS {
            let path = dir.join(legacy_part_name(&name, index));
            match file_size(&path)? {
                Some(size) => pieces.push((path, size)),
                None => break,
            }
        }
        return Ok(Resolved::Legacy {
            sidecar,
            digest,
            pieces,
        });
    }
    let path = logical.to_path_buf();
    Err(Error::NotFound { path })
}

/// Read and parse the `.chunkmanifest` at `path`; `Ok(None)` when there is none.
pub fn read_chunk_manifest(path: &Path) -> Result<Option<u32>> {
    read_small(path, parse_chunk_manifest)
}

/// Read and parse the `.sha256` sidecar at `path`; `Ok(None)` when there is none.
pub fn read_sidecar(path: &Path) -> Result<Option<Sha256Digest>> {
    read_small(path, parse_sidecar)
}

/// Read a sidecar or chunk manifest, never more than [`crate::SMALL_FILE_LIMIT`], and parse it;
/// `Ok(None)` when there is none.
fn read_small<T>(path: &Path, parse: fn(&[u8], &Path) -> Result<T>) -> Result<Option<T>> {
    if file_size(path)?.is_none() {
        return Ok(None);
    }
    let mut buf = Vec::new();
    File::open(path)?
        .take(crate::SMALL_FILE_LIMIT)
        .read_to_end(&mut buf)?;
    parse(&buf, path).map(Some)
}

/// Find the logical artifact at `logical` (e.g. `models/pop223_driving_tinygrad.pkl`).
/// `Ok(None)` when nothing complete is there; an error only for I/O failures and malformed
/// chunk manifests or sidecars.
pub fn resolve(logical: &Path) -> Result<Option<Resolved>> {
    match resolve_strict(logical) {
        Ok(r) => Ok(Some(r)),
        Err(Error::MissingChunk { .. } | Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Open the logical artifact for streaming reads, in whatever form it is present.
pub fn open(logical: &Path) -> Result<ArtifactReader> {
    Ok(ArtifactReader::new(resolve_strict(logical)?.pieces()))
}

/// A `Read + Seek` view of several files as one, opening one file at a time. Sizes are those
/// recorded when the artifact was resolved; a piece that turns out shorter is an error naming it,
/// and bytes past a piece's recorded size are never read.
pub struct ArtifactReader {
    pieces: Vec<(PathBuf, u64)>,
    starts: Vec<u64>,
    total: u64,
    pos: u64,
    /// The open piece, and the offset within it that the file cursor is at.
    current: Option<(usize, File, u64)>,
}

impl ArtifactReader {
    /// A reader over `pieces` concatenated in order, each read only up to its recorded size. Opens
    /// nothing until the first read.
    pub fn new(pieces: Vec<(PathBuf, u64)>) -> Self {
        let mut starts = Vec::with_capacity(pieces.len());
        let mut total = 0;
        for (_, size) in &pieces {
            starts.push(total);
            total += size;
        }
        Self {
            pieces,
            starts,
            total,
            pos: 0,
            current: None,
        }
    }

    /// Total size of the logical artifact.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// Whether the logical artifact has no bytes.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Index of the piece holding the byte at `pos` (which must be < total).
    fn piece_at(&self, pos: u64) -> usize {
        match self.starts.binary_search(&pos) {
            Ok(mut i) => {
                // Skip empty pieces that start at the same offset.
                while self.pieces[i].1 == 0 {
                    i += 1;
                }
                i
            }
            Err(i) => i - 1,
        }
    }
}

impl Read for ArtifactReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.total || buf.is_empty() {
            return Ok(0);
        }
        let idx = self.piece_at(self.pos);
        let (path, size) = &self.pieces[idx];
        let offset = self.pos - self.starts[idx];
        // Within the open piece a seek is a seek, not a reopen (the OOB check hops over
        // every buffer record).
        if let Some((i, f, o)) = &mut self.current
            && *i == idx
            && *o != offset
        {
            f.seek(SeekFrom::Start(offset))?;
            *o = offset;
        }
        let reopen = !matches!(&self.current, Some((i, _, o)) if *i == idx && *o == offset);
        if reopen {
            let mut f = File::open(path)?;
            if offset > 0 {
                f.seek(SeekFrom::Start(offset))?;
            }
            self.current = Some((idx, f, offset));
        }
        let (_, file, cursor) = self.current.as_mut().expect("opened above");
        let want = (size - offset).min(buf.len() as u64) as usize;
        let n = loop {
            match file.read(&mut buf[..want]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{}: truncated (expected {size} bytes, ended at {offset})",
                    path.display()
                ),
            ));
        }
        *cursor += n as u64;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Seek for ArtifactReader {
    fn seek(&mut self, from: SeekFrom) -> io::Result<u64> {
        let target = match from {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.total.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        let target = target.ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "seek before start of artifact")
        })?;
        self.pos = target;
        Ok(target)
    }
}

/// Join the logical artifact at `logical` into the plain file `output`, atomically and durably.
/// Returns its digest and size. Where a `.sha256` sidecar is present (always for legacy parts),
/// the joined bytes must match it, or nothing is written.
pub fn join(logical: &Path, output: &Path) -> Result<(Sha256Digest, u64)> {
    join_checked(logical, output, None, &mut |_| {})
}

/// [`join`], calling `progress` with the number of bytes read each time it reads, and with the
/// whole artifact's SHA-256 given when `sha256` is (e.g. the manifest's `artifact_sha256`): the
/// joined bytes must match it, or nothing is written. A chunk set with neither a given digest nor a `.sha256` (as Python's chunker writes them) is
/// checked by its chunk sizes before anything is written.
pub fn join_checked(
    logical: &Path,
    output: &Path,
    sha256: Option<Sha256Digest>,
    progress: &mut dyn FnMut(u64),
) -> Result<(Sha256Digest, u64)> {
    let resolved = resolve_strict(logical)?;
    let mut wanted: Vec<Sha256Digest> = sha256.into_iter().collect();
    match &resolved {
        Resolved::Legacy { digest, .. } => wanted.push(*digest),
        _ if sha256.is_none() => {
            let (dir, name) = split_logical(logical)?;
            let sidecar = dir.join(sidecar_name(&name));
            wanted.extend(read_sidecar(&sidecar)?);
        }
        _ => {}
    }
    if wanted.is_empty()
        && let Resolved::Chunked { pieces, .. } = &resolved
    {
        check_chunk_sizes(pieces)?;
    }
    let mut reader = Counting {
        inner: ArtifactReader::new(resolved.pieces()),
        progress,
    };
    let mut out = AtomicFile::create(output)?;
    let mut hasher = Hasher::new();
    let mut buf = vec![0u8; IO_BUFFER_SIZE];
    let mut total = 0u64;
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])?;
        total += n as u64;
    }
    let digest = hasher.finish();
    if let Some(expected) = wanted.into_iter().find(|w| *w != digest) {
        return Err(Error::DigestMismatch {
            what: logical.display().to_string(),
            expected,
            actual: digest,
        });
    }
    out.commit_and_sync_dir()?;
    Ok((digest, total))
}

/// A reader that reports how many bytes each read returned, for progress bars.
pub(crate) struct Counting<'a, R> {
    pub(crate) inner: R,
    pub(crate) progress: &'a mut dyn FnMut(u64),
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        (self.progress)(n as u64);
        Ok(n)
    }
}
/// Every chunk but the last has the chunk size; the last holds 1 to chunk-size bytes. The set
/// does not record its chunk size, so it is taken as the most common size of the non-last chunks
/// (the larger one on a tie, since truncation is the usual damage): a truncated first chunk is
/// then named as the bad one instead of every good chunk after it.
pub(crate) fn check_chunk_sizes(pieces: &[(PathBuf, u64)]) -> Result<()> {
    let n = pieces.len();
    let Some((last, body)) = pieces.split_last() else {
        return Ok(());
    };
    let mut counts: std::collections::BTreeMap<u64, usize> = std::collections::BTreeMap::new();
    for (_, size) in body {
        *counts.entry(*size).or_default() += 1;
    }
    let chunk_size = counts
        .iter()
        .max_by_key(|&(size, count)| (*count, *size))
        .map(|(size, _)| *size)
        .unwrap_or(last.1);
    let bad = |i: usize, expected: u64, why: &str| Error::SizeMismatch {
        what: format!("chunk {} of {n} ({}) ({why})", i + 1, pieces[i].0.display()),
        expected,
        actual: pieces[i].1,
    };
    for (i, (_, size)) in body.iter().enumerate() {
        if *size != chunk_size || *size == 0 {
            return Err(bad(
                i,
                chunk_size,
                "every chunk but the last must have the chunk size",
            ));
        }
    }
    if last.1 == 0 || last.1 > chunk_size {
        // With one chunk before the last, a first chunk shorter than the last is the likelier
        // damage (an interrupted copy) than a last chunk that grew.
        if n == 2 && last.1 > chunk_size {
            return Err(bad(
                0,
                last.1,
                "shorter than the last chunk: every chunk but the last must have the chunk size, or the last chunk is too long",
            ));
        }
        return Err(bad(
            n - 1,
            chunk_size,
            "the last chunk must hold 1 to chunk-size bytes",
        ));
    }
    Ok(())
}
