//! Streaming split of one artifact into a chunk set.
//!
//! One pass over the input (a file, [`split_file`], or any stream, [`split_reader`]), in a
//! pipeline of four threads that pass a fixed pool of [`BUFFERS_IN_FLIGHT`] buffers along bounded
//! channels: the reader fills a buffer, the whole hasher adds it to the artifact's SHA-256, the
//! chunk hasher to its chunk's SHA-256 (cut at the chunk boundaries), and the writer appends it
//! to the chunk's temporary, fsyncs each chunk once it is complete, and returns the buffer to
//! the reader. Both digests are `sha2`'s. The four stages overlap, so the split takes about as
//! long as its slowest stage rather than the sum of them, and memory is the pool whatever the
//! artifact size. When the chunk size is a multiple of [`DIRECT_ALIGN`], chunks are written
//! with O_DIRECT ([`AtomicFile::create_direct`]): copying every byte into the page cache and
//! writing it back would take CPU time from the two hashes.
//!
//! Nothing appears under a final name until every chunk is durable: then the old chunk manifest
//! (if any) is removed, the chunks are renamed into place, the `.sha256` sidecar is written, and the
//! `.chunkmanifest` is written last. A crash at any point leaves either the previous complete set
//! or something that readers treat as "not present".

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread;

use fs_err as fs;
use serde::Serialize;

use crate::atomic::{self, AtomicFile, DIRECT_ALIGN};
use crate::digest::{Hasher, PieceHashes};
use crate::error::{Error, Result};
use crate::{
    DEFAULT_CHUNK_SIZE, Form, MAX_CHUNKS, Sha256Digest, check_name, chunk_count_for,
    chunk_manifest_name, chunk_name, form_of, format_chunk_manifest, format_sidecar, sidecar_name,
};

/// Buffers in the pool: bounds memory to this many [`SPLIT_BUFFER`]s (32 MiB), enough that the
/// hashers do not wait while the writer waits on the device.
const BUFFERS_IN_FLIGHT: usize = 16;

/// Bytes in one pool buffer.
const SPLIT_BUFFER: usize = 2 << 20;

/// How to split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitOptions {
    /// Bytes per chunk; every chunk but the last has exactly this size.
    pub chunk_size: u64,
}

impl Default for SplitOptions {
    fn default() -> Self {
        Self {
            chunk_size: DEFAULT_CHUNK_SIZE,
        }
    }
}

/// One written chunk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChunkInfo {
    /// The chunk's file name (`NAME.chunkNNofMM`).
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256.
    pub sha256: Sha256Digest,
}

/// What a split produced. Serializes to the `release-cli chunk split --json` shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SplitReport {
    /// The logical artifact name.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// The SHA-256 of the whole artifact (what the `.sha256` sidecar records).
    pub sha256: Sha256Digest,
    /// Number of chunks written (what the `.chunkmanifest` records).
    pub chunk_count: u32,
    /// Every chunk, in order.
    pub chunks: Vec<ChunkInfo>,
}

/// Split the file `src` into a chunk set named after it in `out_dir`.
///
/// The source file itself is left untouched. If `out_dir` is the source's directory, the plain
/// file keeps winning over the chunk set for readers (docs/formats.md, "Reading") until it is removed.
pub fn split_file(src: &Path, out_dir: &Path, opts: &SplitOptions) -> Result<SplitReport> {
    let file = fs::File::open(src)?;
    split_open_file(file.into_parts().0, src, out_dir, opts, &|_| {})
}

/// [`split_file`] of a file the caller has opened (and checked) already, so that the file split
/// is the one checked even if `src` is replaced meanwhile, calling `progress` with each piece's
/// length once it is written (from the writer threads: the sum reaches the file's size). `src` names the chunk set
/// and the errors; the size is the open file's. The file is read from its current position: one
/// already read from gives [`Error::InputChanged`], never a split of part of it.
pub fn split_open_file(
    file: std::fs::File,
    src: &Path,
    out_dir: &Path,
    opts: &SplitOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<SplitReport> {
    let name = crate::file_name_of(src);
    if name.is_empty() {
        let name = src.display().to_string();
        return Err(Error::InvalidName { name });
    }
    // Through fs_err, so that a failure names the file.
    let file = fs::File::from_parts(file, src);
    let size = file.metadata()?.len();
    stage_with(file, size, &name, out_dir, opts, progress)
        .map_err(|e| e.naming_input(src))?
        .install()
}

/// The temporaries in `file_names` that an earlier, no longer running split of the chunk set
/// `name` left behind (killed by Ctrl-C or a crash): made for one of the set's files
/// (`NAME.chunkNNofMM`, `NAME.chunkmanifest`, `NAME.sha256`) by a process `alive` says is gone.
/// Another set's temporaries and a running writer's are never chosen.
pub fn stale_temporaries<'a>(
    name: &str,
    file_names: impl IntoIterator<Item = &'a str>,
    alive: impl Fn(u32) -> bool,
) -> Vec<&'a str> {
    file_names
        .into_iter()
        .filter(|f| {
            atomic::temp_owner(f).is_some_and(|(pid, dest)| {
                let ours = dest == crate::chunk_manifest_name(name)
                    || dest == crate::sidecar_name(name)
                    || matches!(form_of(name, dest), Some(Form::Chunk { .. }));
                ours && !alive(pid)
            })
        })
        .collect()
}

/// What a split would write and remove, found without writing anything: the `--dry-run` of
/// `release-cli chunk split`. It checks what [`split_reader`] checks before reading the input
/// (the name, the chunk size, the size, the chunk count) but reads no content, so it has no
/// SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SplitPlan {
    /// The logical artifact name.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Number of chunks it would split into.
    pub chunk_count: u32,
    /// The chunks, in order, with the size each would have.
    pub chunks: Vec<PlannedChunk>,
    /// Every file the split would write, in the order it writes them (chunks, the `.sha256`
    /// sidecar, the `.chunkmanifest` last).
    pub written: Vec<String>,
    /// The files it would remove, sorted: chunks of an earlier set with another count and the
    /// stale temporaries of an interrupted split of this set.
    pub removed: Vec<String>,
}

/// One chunk a split would write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedChunk {
    /// The chunk's file name (`NAME.chunkNNofMM`).
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
}

/// Plan the split of `size` bytes into the chunk set `name` in `out_dir` ([`SplitPlan`]). Reads
/// the listing of `out_dir` (a missing directory holds nothing to remove); writes nothing.
pub fn plan_split(name: &str, size: u64, out_dir: &Path, opts: &SplitOptions) -> Result<SplitPlan> {
    check_name(name)?;
    let count = planned_count(name, size, opts.chunk_size)?;
    let chunks = (1..=count)
        .map(|i| PlannedChunk {
            name: chunk_name(name, i, count),
            size: (size - u64::from(i - 1) * opts.chunk_size).min(opts.chunk_size),
        })
        .collect();
    let listing = names_in(out_dir)?;
    let mut removed: Vec<String> = listing
        .iter()
        .filter(|f| matches!(form_of(name, f), Some(Form::Chunk { count: c, .. }) if c != count))
        .cloned()
        .collect();
    removed.extend(
        stale_temporaries(
            name,
            listing.iter().map(String::as_str),
            atomic::process_alive,
        )
        .into_iter()
        .map(str::to_string),
    );
    removed.sort();
    Ok(SplitPlan {
        name: name.to_string(),
        size,
        chunk_count: count,
        chunks,
        written: set_file_names(name, count),
        removed,
    })
}

/// Remove the stale temporaries of the chunk set `name` from `out_dir` (see
/// [`stale_temporaries`]), so an interrupted split does not leave them for good.
fn remove_stale_temporaries(out_dir: &Path, name: &str) -> Result<()> {
    let names = names_in(out_dir)?;
    let alive = atomic::process_alive;
    for stale in stale_temporaries(name, names.iter().map(String::as_str), alive) {
        atomic::remove_if_exists(out_dir.join(stale))?;
    }
    Ok(())
}

/// The names in `dir` (lossily as text); none when it does not exist.
fn names_in(dir: &Path) -> Result<Vec<String>> {
    match fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| Ok(e?.file_name().to_string_lossy().into_owned()))
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// What [`split_reader`]'s errors call the stream it reads, which it cannot name.
const INPUT: &str = "<input>";

impl Error {
    /// Name the file a [`split_reader`] stream came from in the errors about that stream (a
    /// read error, an input that changed size), which otherwise name `<input>` or the output.
    pub fn naming_input(self, src: &Path) -> Self {
        match self {
            Error::ReadInput { path, source } if path == Path::new(INPUT) => Error::ReadInput {
                path: src.to_path_buf(),
                source,
            },
            Error::InputChanged {
                expected, actual, ..
            } => Error::InputChanged {
                path: src.to_path_buf(),
                expected,
                actual,
            },
            other => other,
        }
    }
}

/// Split exactly `size` bytes from `reader` into the chunk set `name` in `out_dir`.
/// The size must be known up front because every chunk name carries the count.
pub fn split_reader<R: Read>(
    reader: R,
    size: u64,
    name: &str,
    out_dir: &Path,
    opts: &SplitOptions,
) -> Result<SplitReport> {
    stage_reader(reader, size, name, out_dir, opts)?.install()
}

/// The first half of [`split_reader`]: every chunk written and durable under a temporary name,
/// nothing visible yet.
pub fn stage_reader<R: Read>(
    reader: R,
    size: u64,
    name: &str,
    out_dir: &Path,
    opts: &SplitOptions,
) -> Result<StagedSplit> {
    stage_with(reader, size, name, out_dir, opts, &|_| {})
}

/// [`stage_reader`], calling `progress` as pieces are written.
fn stage_with<R: Read>(
    mut reader: R,
    size: u64,
    name: &str,
    out_dir: &Path,
    opts: &SplitOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<StagedSplit> {
    let writer_cfg = WriterConfig::prepare(name, size, out_dir, opts)?;
    let sizes = (1..=writer_cfg.count)
        .map(|i| writer_cfg.chunk_len(i))
        .collect();
    let (empty_tx, empty_rx) = sync_channel::<Buf>(BUFFERS_IN_FLIGHT);
    for _ in 0..BUFFERS_IN_FLIGHT {
        empty_tx.send(Buf::new()).expect("pool fits");
    }
    let (read_tx, read_rx) = sync_channel::<Filled>(BUFFERS_IN_FLIGHT);
    let (hashed_tx, hashed_rx) = sync_channel::<Filled>(BUFFERS_IN_FLIGHT);
    let (write_tx, write_rx) = sync_channel::<Filled>(BUFFERS_IN_FLIGHT);
    let (read_result, whole, digests, write_result) = thread::scope(|scope| {
        let whole = scope.spawn(|| hash_whole(read_rx, hashed_tx));
        let hasher = scope.spawn(|| hash_chunks(sizes, hashed_rx, write_tx));
        let writer = scope.spawn(move || write_chunks(writer_cfg, write_rx, empty_tx, progress));
        let read_result = read_input(&mut reader, size, read_tx, empty_rx);
        let whole = whole.join().expect("whole-artifact hasher panicked");
        let digests = hasher.join().expect("chunk hasher panicked");
        let write_result = writer.join().expect("chunk writer panicked");
        (read_result, whole, digests, write_result)
    });
    // A writer error explains a reader's broken pipe, so report it first.
    let mut staged = write_result?;
    let read_total = read_result?;
    // Every chunk is durable only when the stream held exactly `size` bytes (a chunk the
    // stream ended inside is never fsynced): never stage fewer files than chunks.
    let count = staged.chunks.len();
    if read_total != size || staged.files.len() != count || digests.len() != count {
        return Err(Error::InputChanged {
            path: out_dir.join(name),
            expected: size,
            actual: read_total,
        });
    }
    for (chunk, digest) in staged.chunks.iter_mut().zip(digests) {
        chunk.sha256 = digest;
    }
    Ok(StagedSplit {
        name: name.to_string(),
        out_dir: out_dir.to_path_buf(),
        staged,
        whole,
        size,
    })
}

/// A split whose chunks are written and fsynced under temporary names but not yet visible:
/// [`StagedSplit::install`] it, or drop it, which removes the temporaries and leaves `out_dir`
/// as it was. Lets a caller check the digest (against a sidecar, say) before anything changes.
pub struct StagedSplit {
    name: String,
    out_dir: PathBuf,
    staged: Staged,
    whole: Sha256Digest,
    size: u64,
}

impl StagedSplit {
    /// The SHA-256 of the whole artifact.
    pub fn sha256(&self) -> Sha256Digest {
        self.whole
    }

    /// The chunks, in order, with their sizes and digests.
    pub fn chunks(&self) -> &[ChunkInfo] {
        &self.staged.chunks
    }

    /// Make the set visible (see the module comment for the crash-safe order).
    pub fn install(self) -> Result<SplitReport> {
        let Self {
            name,
            out_dir,
            staged,
            whole,
            size,
        } = self;
        let count = staged.chunks.len() as u32;
        let manifest_path = out_dir.join(chunk_manifest_name(&name));
        atomic::remove_if_exists(&manifest_path)?;
        atomic::sync_dir(&out_dir)?;
        for file in staged.files {
            file.commit()?;
        }
        remove_stale_chunks(&name, &out_dir, count)?;
        let sidecar = out_dir.join(sidecar_name(&name));
        atomic::write_atomic(&sidecar, format_sidecar(&whole, &name).as_bytes())?;
        atomic::write_atomic(&manifest_path, format_chunk_manifest(count).as_bytes())?;
        Ok(SplitReport {
            name,
            size,
            sha256: whole,
            chunk_count: count,
            chunks: staged.chunks,
        })
    }

    /// [`StagedSplit::install`], then remove every other form of the artifact in `out_dir`
    /// ([`other_forms`]: the plain file, which would shadow the set, and legacy parts), so
    /// that only the new chunk set remains. They go only once the new set is complete: a crash
    /// before leaves the old artifact readable (a plain file wins over a chunk set), after it
    /// the new one. Returns the report and the names removed (including chunks of the old set
    /// with another count), sorted.
    pub fn install_replacing(self) -> Result<(SplitReport, Vec<String>)> {
        let out_dir = self.out_dir.clone();
        let removed = other_forms(&self.name, &out_dir, self.staged.chunks.len() as u32)?;
        let report = self.install()?;
        for name in &removed {
            let path = out_dir.join(name);
            atomic::remove_if_exists(&path)?;
        }
        atomic::sync_dir(&out_dir)?;
        Ok((report, removed))
    }
}

/// The names of the files a chunk set of `count` chunks of `name` consists of: the chunks in
/// order, the `.sha256` sidecar and the `.chunkmanifest`.
pub fn set_file_names(name: &str, count: u32) -> Vec<String> {
    let mut names: Vec<String> = (1..=count).map(|i| chunk_name(name, i, count)).collect();
    names.push(sidecar_name(name));
    names.push(chunk_manifest_name(name));
    names
}

/// The files in `dir` that hold `name` in a form other than a chunk set of `count` chunks:
/// the plain file, legacy `.pNN` parts and chunks of a set with another count, sorted.
/// [`StagedSplit::install_replacing`] removes exactly these; a dry run can list them.
pub fn other_forms(name: &str, dir: &Path, count: u32) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        let other_form = match form_of(name, file_name) {
            Some(Form::Plain | Form::LegacyPart(_)) => true,
            Some(Form::Chunk { count: c, .. }) => c != count,
            _ => false,
        };
        if other_form && entry.file_type()?.is_file() {
            found.push(file_name.to_string());
        }
    }
    found.sort();
    Ok(found)
}

fn planned_count(name: &str, size: u64, chunk_size: u64) -> Result<u32> {
    if chunk_size == 0 {
        return Err(Error::ZeroChunkSize);
    }
    if size == 0 {
        return Err(Error::EmptyInput {
            name: name.to_string(),
        });
    }
    let needed = chunk_count_for(size, chunk_size);
    if needed > u64::from(MAX_CHUNKS) {
        return Err(Error::TooManyChunks {
            name: name.to_string(),
            size,
            chunk_size,
            needed,
            max: MAX_CHUNKS,
        });
    }
    Ok(needed as u32)
}

/// A pool buffer and how many of its bytes the reader filled.
type Filled = (Buf, usize);

/// Reader side: fill buffers and hand them on. Reads at most `size + 1` bytes so that a growing
/// input is noticed without reading it all; returns the bytes read.
fn read_input<R: Read>(
    reader: &mut R,
    size: u64,
    full_tx: SyncSender<Filled>,
    empty_rx: Receiver<Buf>,
) -> Result<u64> {
    let mut total = 0u64;
    let limit = size + 1;
    while total < limit {
        let Ok(mut buf) = empty_rx.recv() else {
            break; // writer stopped; its error is reported by the caller
        };
        let want = (limit - total).min(buf.len() as u64) as usize;
        let n = match fill(reader, &mut buf[..want]) {
            Ok(n) => n,
            Err(source) => {
                return Err(Error::ReadInput {
                    path: PathBuf::from(INPUT),
                    source,
                });
            }
        };
        if n == 0 {
            break;
        }
        total += n as u64;
        if total > size {
            break; // the input grew; report it, do not write past the declared size
        }
        if full_tx.send((buf, n)).is_err() {
            break;
        }
    }
    Ok(total)
}

/// Read until `buf` is full or EOF.
fn fill<R: Read>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Hashing stage: the SHA-256 of the whole artifact; buffers go on to the chunk hasher.
fn hash_whole(read_rx: Receiver<Filled>, hashed_tx: SyncSender<Filled>) -> Sha256Digest {
    let mut whole = Hasher::new();
    for (buf, len) in read_rx {
        whole.update(&buf[..len]);
        if hashed_tx.send((buf, len)).is_err() {
            break; // a later stage stopped; its error is reported by the caller
        }
    }
    whole.finish()
}

/// Hashing stage: the SHA-256 of each chunk (cut at `sizes`), on a thread of its own so that
/// the two hashes of every byte run on two cores; buffers go on to the writer untouched.
fn hash_chunks(
    sizes: Vec<u64>,
    hashed_rx: Receiver<Filled>,
    write_tx: SyncSender<Filled>,
) -> Vec<Sha256Digest> {
    let mut hashes = PieceHashes::new(sizes.into_iter());
    for (buf, len) in hashed_rx {
        hashes.update(&buf[..len]);
        if write_tx.send((buf, len)).is_err() {
            break; // the writer stopped; its error is reported by the caller
        }
    }
    hashes.finish()
}

struct WriterConfig {
    name: String,
    out_dir: PathBuf,
    /// The declared size of the input.
    size: u64,
    chunk_size: u64,
    count: u32,
    /// Write chunks with O_DIRECT: possible when every chunk starts on an aligned offset.
    direct: bool,
}

impl WriterConfig {
    /// What the split checks and clears before it writes (the name, the chunk count `size`
    /// needs, a dead split's temporaries), then where and how the chunks are written.
    fn prepare(name: &str, size: u64, out_dir: &Path, opts: &SplitOptions) -> Result<Self> {
        check_name(name)?;
        let count = planned_count(name, size, opts.chunk_size)?;
        remove_stale_temporaries(out_dir, name)?;
        // A new `out_dir` (and any new directory above it) is made durable before a chunk goes
        // in: the set's own directory sync would not keep the directory itself.
        atomic::create_dir_all_durable(out_dir)?;
        Ok(Self {
            name: name.to_string(),
            out_dir: out_dir.to_path_buf(),
            size,
            chunk_size: opts.chunk_size,
            count,
            // Buffers are aligned and full (but the last), and chunks start at multiples of the
            // chunk size, so with an aligned chunk size every piece but the artifact's tail is
            // aligned; `AtomicFile::write_piece` writes that one through the page cache.
            direct: opts.chunk_size.is_multiple_of(DIRECT_ALIGN as u64),
        })
    }

    /// The size chunk `index` (from 1) has in an input of the declared size.
    fn chunk_len(&self, index: u32) -> u64 {
        let start = u64::from(index - 1) * self.chunk_size;
        self.chunk_size.min(self.size.saturating_sub(start))
    }

    /// The temporary of chunk `index` (from 1), opened for O_DIRECT where [`Self::direct`].
    fn create(&self, index: u32) -> Result<AtomicFile> {
        let dest = self.out_dir.join(chunk_name(&self.name, index, self.count));
        Ok(match self.direct {
            true => AtomicFile::create_direct(&dest),
            false => AtomicFile::create(&dest),
        }?)
    }
}

/// One pool buffer: [`SPLIT_BUFFER`] bytes starting on a [`DIRECT_ALIGN`] boundary, as O_DIRECT
/// needs, inside a slightly larger allocation (which is zero until touched).
struct Buf {
    mem: Vec<u8>,
    start: usize,
}

impl Buf {
    fn new() -> Self {
        let mem = vec![0u8; SPLIT_BUFFER + DIRECT_ALIGN];
        let start = mem.as_ptr().align_offset(DIRECT_ALIGN);
        Self { mem, start }
    }
}

impl std::ops::Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.mem[self.start..self.start + SPLIT_BUFFER]
    }
}

impl std::ops::DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.mem[self.start..self.start + SPLIT_BUFFER]
    }
}

/// Chunks written and fsynced under temporary names, waiting to be renamed. Chunk digests are
/// filled in from the hashing stage.
struct Staged {
    files: Vec<AtomicFile>,
    chunks: Vec<ChunkInfo>,
}

/// Writing stage: cut the stream into chunks, append each piece to its chunk's temporary, and
/// fsync each chunk as soon as its last byte is written; every buffer goes back to the reader.
/// Returns the chunks begun, in order, and the temporaries of those completed and fsynced (a
/// chunk the stream ended inside is neither synced nor kept: its temporary is removed).
fn write_chunks(
    cfg: WriterConfig,
    write_rx: Receiver<Filled>,
    empty_tx: SyncSender<Buf>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Staged> {
    let mut files = Vec::with_capacity(cfg.count as usize);
    let mut chunks: Vec<ChunkInfo> = Vec::with_capacity(cfg.count as usize);
    // The chunk being written and how many of its bytes are still to come.
    let mut current: Option<(AtomicFile, u64)> = None;
    for (buf, len) in write_rx {
        let mut data = &buf[..len];
        while !data.is_empty() {
            let (file, left) = match &mut current {
                Some(open) => open,
                None => {
                    let index = chunks.len() as u32 + 1;
                    let size = cfg.chunk_len(index);
                    chunks.push(ChunkInfo {
                        name: chunk_name(&cfg.name, index, cfg.count),
                        size,
                        // Filled in from the chunk hasher once every stage is done.
                        sha256: Sha256Digest::from_bytes([0; 32]),
                    });
                    current.insert((cfg.create(index)?, size))
                }
            };
            // The reader never passes on more than the declared size, so no chunk overflows.
            let n = (*left).min(data.len() as u64) as usize;
            let (piece, rest) = data.split_at(n);
            file.write_piece(piece)?;
            data = rest;
            *left -= n as u64;
            progress(n as u64);
            if *left == 0 {
                let (mut file, _) = current.take().expect("a chunk is open");
                file.sync()?;
                files.push(file);
            }
        }
        // The reader may have stopped; returning the buffer is best effort.
        let _ = empty_tx.try_send(buf);
    }
    Ok(Staged { files, chunks })
}

/// Chunks of an earlier split with a different count would only confuse people and tools.
fn remove_stale_chunks(name: &str, dir: &Path, count: u32) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        if let Some(Form::Chunk { count: c, .. }) = form_of(name, file_name)
            && c != count
        {
            let p = entry.path();
            atomic::remove_if_exists(&p)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_temporaries_table() {
        let names = [
            ".tmp-100-0-m.pkl.chunk01of03",   // ours, dead writer
            ".tmp-100-1-m.pkl.chunkmanifest", // ours, dead writer
            ".tmp-100-2-m.pkl.sha256",        // ours, dead writer
            ".tmp-200-0-m.pkl.chunk02of03",   // ours, writer still running
            ".tmp-100-3-other.pkl.chunk01of01",
            ".tmp-100-4-m.pkl.x.chunk01of01", // the set `m.pkl.x`, not `m.pkl`
            ".tmp-100-5-m.pkl",               // the whole artifact, not a chunk-set file
            "m.pkl.chunk01of03",
            ".tmp-junk",
        ];
        let stale = stale_temporaries("m.pkl", names, |pid| pid == 200);
        assert_eq!(
            stale,
            [
                ".tmp-100-0-m.pkl.chunk01of03",
                ".tmp-100-1-m.pkl.chunkmanifest",
                ".tmp-100-2-m.pkl.sha256"
            ]
        );
    }

    /// The file split writes byte for byte the set the stream split writes and reports the
    /// same: sizes around the chunk size, a single chunk, an exact multiple, an aligned chunk
    /// size (O_DIRECT) and not.
    #[test]
    fn a_file_split_writes_and_reports_what_the_stream_split_does() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        for (size, chunk_size) in [
            (1, 5),
            (5, 5),
            (6, 5),
            (23, 5),
            (4096 * 3, 4096),
            (4096 * 9 + 17, 4096),
            (SPLIT_BUFFER * 2 + 1, SPLIT_BUFFER as u64),
            (3 * SPLIT_BUFFER + 5, 2 * SPLIT_BUFFER as u64 + 4096),
        ] {
            for d in [&a, &b] {
                let _ = fs::remove_dir_all(d);
                fs::create_dir_all(d).unwrap();
            }
            let data = pattern(size);
            let src = dir.path().join("m.pkl");
            fs::write(&src, &data).unwrap();
            let opts = SplitOptions { chunk_size };
            let done = std::sync::atomic::AtomicU64::new(0);
            let file = std::fs::File::open(&src).unwrap();
            let by_file = split_open_file(file, &src, &a, &opts, &|n| {
                done.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            })
            .unwrap();
            let by_stream = split_reader(&data[..], size as u64, "m.pkl", &b, &opts).unwrap();
            assert_eq!(by_file, by_stream, "{size} {chunk_size}");
            assert_eq!(done.into_inner(), size as u64);
            let (fa, fb) = (names_in(&a), names_in(&b));
            assert_eq!(fa, fb, "{size} {chunk_size}");
            for n in fa {
                assert_eq!(
                    fs::read(a.join(&n)).unwrap(),
                    fs::read(b.join(&n)).unwrap(),
                    "{n}"
                );
            }
        }
    }

    /// The digests are SHA-256's, of the artifact and of each chunk, and the chunks join to the
    /// input: chunk sizes that are multiples of 64 (a SHA-256 block) and not, chunks that end
    /// inside a buffer and on its end, chunks longer and shorter than a buffer.
    #[test]
    fn the_whole_and_every_chunk_digest_are_sha256s() {
        let dir = tempfile::tempdir().unwrap();
        for (size, chunk_size) in [
            (1000, 64),
            (1000, 100),
            (64 * 3, 64),
            (SPLIT_BUFFER * 3 + 77, SPLIT_BUFFER as u64 / 2 + 4096),
            (SPLIT_BUFFER * 2, SPLIT_BUFFER as u64),
            (SPLIT_BUFFER + 1, 64 * 1001),
            (SPLIT_BUFFER * 4 + 5, SPLIT_BUFFER as u64 * 3 / 2 + 64),
        ] {
            let data = pattern(size);
            let out = dir.path().join(format!("{size}-{chunk_size}"));
            fs::create_dir_all(&out).unwrap();
            let opts = SplitOptions { chunk_size };
            let staged = stage_reader(&data[..], size as u64, "m.pkl", &out, &opts).unwrap();
            assert_eq!(
                staged.sha256(),
                Sha256Digest::of_bytes(&data),
                "{size} {chunk_size}"
            );
            let expected: Vec<_> = data
                .chunks(chunk_size as usize)
                .map(Sha256Digest::of_bytes)
                .collect();
            let got: Vec<_> = staged.chunks().iter().map(|c| c.sha256).collect();
            assert_eq!(got, expected, "{size} {chunk_size}");
            staged.install().unwrap();
            let mut joined = Vec::new();
            for i in 1..=expected.len() as u32 {
                joined.extend(
                    fs::read(out.join(chunk_name("m.pkl", i, expected.len() as u32))).unwrap(),
                );
            }
            assert!(
                joined == data,
                "{size} {chunk_size}: the chunks do not join to the input"
            );
        }
    }

    /// Regression (from the split's earlier pool of writer threads, which then left a queue
    /// nobody took from): a progress callback that panics in the writer stops the split, the
    /// panic reaches the caller and the temporaries are gone.
    #[test]
    fn a_panic_in_the_writer_reaches_the_caller_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().to_path_buf();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let data = pattern(SPLIT_BUFFER * 4);
            let opts = SplitOptions {
                chunk_size: 256 << 10,
            };
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                stage_with(&data[..], data.len() as u64, "m.pkl", &out, &opts, &|_| {
                    panic!("progress")
                })
                .map(|_| ())
            }));
            let _ = tx.send(result.is_err());
        });
        let panicked = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the split is still running a minute after its writer panicked");
        assert!(panicked, "the writer's panic did not reach the caller");
        assert!(
            names_in(dir.path()).is_empty(),
            "{:?}",
            names_in(dir.path())
        );
    }

    /// A file that holds fewer or more bytes than its declared size (it changed under the split)
    /// is refused as the stream split refuses it, and leaves nothing behind.
    #[test]
    fn a_file_that_is_not_its_declared_size_is_refused_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        fs::create_dir_all(&out).unwrap();
        let src = dir.path().join("m.pkl");
        fs::write(&src, [3u8; 23]).unwrap();
        let opts = SplitOptions { chunk_size: 5 };
        for (declared, actual) in [(30, 23), (26, 23), (10, 11), (22, 23)] {
            let file = std::fs::File::open(&src).unwrap();
            let staged = stage_with(file, declared, "m.pkl", &out, &opts, &|_| {});
            let err = match staged {
                Err(e) => e,
                Ok(_) => panic!("{declared}: staged"),
            };
            assert!(
                matches!(
                    err,
                    Error::InputChanged { expected, actual: a, .. } if expected == declared && a == actual
                ),
                "{declared}: {err}"
            );
            assert!(
                names_in(&out).is_empty(),
                "{declared}: {:?}",
                names_in(&out)
            );
        }
    }

    /// Regression: a Ctrl-C'd split left its `.tmp-*` files for good.
    #[test]
    fn a_split_removes_its_own_stale_temporaries_first() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        // A pid that cannot be running: above the kernel's pid_max limit (2^22).
        let dead = 4_194_305;
        let stale = out.join(format!(".tmp-{dead}-0-m.pkl.chunk01of02"));
        let other = out.join(format!(".tmp-{dead}-1-other.pkl.chunk01of01"));
        // A counter value this process's own writes never reach (other tests in the binary
        // advance the shared counter; a small one would collide with the split's own temporary).
        let live = out.join(format!(
            ".tmp-{}-{}-m.pkl.chunkmanifest",
            std::process::id(),
            u64::MAX
        ));
        for p in [&stale, &other, &live] {
            fs::write(p, b"half").unwrap();
        }
        let data = [7u8; 10];
        split_reader(&data[..], 10, "m.pkl", out, &SplitOptions { chunk_size: 5 }).unwrap();
        assert!(!stale.exists(), "the stale temporary is still there");
        assert!(other.exists(), "another set's temporary was removed");
        if cfg!(target_os = "linux") {
            assert!(live.exists(), "a running writer's temporary was removed");
        }
        assert!(out.join("m.pkl.chunk02of02").exists());
    }

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_dropped_stage_leaves_the_directory_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("m.pkl"), b"old").unwrap();
        let staged = stage_reader(
            &[1u8; 10][..],
            10,
            "m.pkl",
            dir.path(),
            &SplitOptions { chunk_size: 4 },
        )
        .unwrap();
        assert_eq!(staged.chunks().len(), 3);
        assert_eq!(staged.sha256(), Sha256Digest::of_bytes(&[1u8; 10]));
        drop(staged);
        assert_eq!(names_in(dir.path()), ["m.pkl"]);
    }

    #[test]
    fn install_replacing_leaves_only_the_new_set() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for n in [
            "m.pkl",
            "m.pkl.p00",
            "m.pkl.p01",
            "m.pkl.chunk01of03",
            "m.pkl.chunk02of03",
            "m.pkl.chunk03of03",
            "m.pkl.chunkmanifest",
            "m.pkl.sha256",
            "m.pkl.px",
            "other.pkl",
        ] {
            fs::write(d.join(n), b"old").unwrap();
        }
        assert_eq!(
            other_forms("m.pkl", d, 2).unwrap(),
            [
                "m.pkl",
                "m.pkl.chunk01of03",
                "m.pkl.chunk02of03",
                "m.pkl.chunk03of03",
                "m.pkl.p00",
                "m.pkl.p01"
            ]
        );
        let staged = stage_reader(
            &[2u8; 8][..],
            8,
            "m.pkl",
            d,
            &SplitOptions { chunk_size: 4 },
        )
        .unwrap();
        let (report, removed) = staged.install_replacing().unwrap();
        assert_eq!(report.chunk_count, 2);
        assert_eq!(removed.len(), 6, "{removed:?}");
        let mut want = set_file_names("m.pkl", 2);
        want.extend(["m.pkl.px".to_string(), "other.pkl".to_string()]);
        want.sort();
        assert_eq!(names_in(d), want);
        crate::verify(
            &d.join("m.pkl"),
            &crate::Expected {
                sha256: Some(Sha256Digest::of_bytes(&[2u8; 8])),
                ..Default::default()
            },
        )
        .unwrap();
    }
}
