//! Streaming split of one artifact into a chunk set.
//!
//! One pass over the input (a file, [`split_file`], or any stream, [`split_reader`]), in a
//! pipeline that passes a fixed pool of buffers along: the reader fills them, the whole hasher
//! hashes the whole artifact, the chunk hasher hashes each chunk, a dispatcher cuts the stream into
//! chunks and hands the pieces to [`WRITERS`] threads that write them at their offsets in each
//! chunk's temporary, and the thread that writes a chunk's last piece fsyncs it. Hashing,
//! reading (a copy out of the page cache, a thread of its own that the scheduler spreads over the
//! cores) and durable writing overlap, so the split is bounded by the slower of hashing and
//! writing rather than by their sum (issue 27 item 1). Writes use O_DIRECT when the chunk size is
//! aligned: copying into the page cache and writing it back would take CPU time from the two
//! hashes. Each chunk's temporary is given its size up front, so that its writes are in flight
//! side by side. Every chunk's SHA-256 state starts in the whole hasher, which may hash the first
//! part of the chunk in the same pass as the artifact ([`crate::pair`], [`kept_share`]) before it
//! hands the state to the chunk hasher. Memory is the buffer pool whatever the artifact size.
//!
//! Nothing appears under a final name until every chunk is durable: then the old chunk manifest
//! (if any) is removed, the chunks are renamed into place, the `.sha256` sidecar is written, and the
//! `.chunkmanifest` is written last. A crash at any point leaves either the previous complete set
//! or something that readers treat as "not present".

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread;

use fs_err as fs;
use serde::Serialize;

use crate::atomic::{self, AtomicFile, DIRECT_ALIGN};
use crate::error::{Error, Result};
use crate::pair::State;
use crate::{
    DEFAULT_CHUNK_SIZE, Form, MAX_CHUNKS, Sha256Digest, check_name, chunk_count_for,
    chunk_manifest_name, chunk_name, format_chunk_manifest, format_sidecar, parse_chunk_name,
    sidecar_name,
};

/// Buffers in flight between the reader and the writers: bounds memory to this many
/// [`SPLIT_BUFFER`]s (32 MiB), enough that the hashers do not wait while the writers wait on the
/// device.
const BUFFERS_IN_FLIGHT: usize = 16;

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
    pub name: String,
    pub size: u64,
    pub sha256: Sha256Digest,
}

/// What a split produced. Serializes to the `release-cli chunk split --json` shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SplitReport {
    pub name: String,
    pub size: u64,
    pub sha256: Sha256Digest,
    pub chunk_count: u32,
    pub chunks: Vec<ChunkInfo>,
}

/// Split the file `src` into a chunk set named after it in `out_dir`.
///
/// The source file itself is left untouched. If `out_dir` is the source's directory, the plain
/// file keeps winning over the chunk set for readers (docs/formats.md, "Reading") until it is removed.
pub fn split_file(src: &Path, out_dir: &Path, opts: &SplitOptions) -> Result<SplitReport> {
    split_file_reporting(src, out_dir, opts, &|_| {})
}

/// [`split_file`], calling `progress` with each piece's length once it is written (from the
/// writer threads: the sum reaches the file's size).
pub fn split_file_reporting(
    src: &Path,
    out_dir: &Path,
    opts: &SplitOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<SplitReport> {
    let file = fs::File::open(src)?;
    split_open_file(file.into_parts().0, src, out_dir, opts, progress)
}

/// [`split_file_reporting`] of a file the caller has opened (and checked) already, so that the
/// file split is the one checked even if `src` is replaced meanwhile. `src` names the chunk set
/// and the errors; the size is the open file's. The file is read from its current position: one
/// already read from gives [`Error::InputChanged`], never a split of part of it.
pub fn split_open_file(
    file: std::fs::File,
    src: &Path,
    out_dir: &Path,
    opts: &SplitOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<SplitReport> {
    let name = src
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::InvalidName {
            name: src.display().to_string(),
        })?;
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
                    || crate::parse_chunk_name(name, dest).is_some();
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
    pub name: String,
    pub size: u64,
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
    pub name: String,
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
    let mut listing = Vec::new();
    match fs::read_dir(out_dir) {
        Ok(entries) => {
            for entry in entries {
                listing.push(entry?.file_name().to_string_lossy().into_owned());
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    let mut removed: Vec<String> = listing
        .iter()
        .filter(|f| parse_chunk_name(name, f).is_some_and(|(_, c)| c != count))
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
    let entries = match fs::read_dir(out_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let mut names = Vec::new();
    for entry in entries {
        names.push(entry?.file_name().to_string_lossy().into_owned());
    }
    for stale in stale_temporaries(
        name,
        names.iter().map(String::as_str),
        atomic::process_alive,
    ) {
        let path = out_dir.join(stale);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
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
    reader: R,
    size: u64,
    name: &str,
    out_dir: &Path,
    opts: &SplitOptions,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<StagedSplit> {
    let cores = thread::available_parallelism().map_or(1, |n| n.get());
    let kept = kept_share(opts.chunk_size, cores);
    stage_sharing(reader, size, name, out_dir, opts, kept, progress)
}

/// [`stage_with`], the whole-artifact hasher taking the first `kept` bytes of each chunk.
fn stage_sharing<R: Read>(
    mut reader: R,
    size: u64,
    name: &str,
    out_dir: &Path,
    opts: &SplitOptions,
    kept: u64,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<StagedSplit> {
    let writer_cfg = WriterConfig::prepare(name, size, out_dir, opts)?;
    let (full_tx, full_rx) = sync_channel::<Hashed>(BUFFERS_IN_FLIGHT);
    let (empty_tx, empty_rx) = sync_channel::<Buf>(BUFFERS_IN_FLIGHT);
    for _ in 0..BUFFERS_IN_FLIGHT {
        empty_tx.send(Buf::new()).expect("pool fits");
    }

    let (read_tx, read_rx) = sync_channel::<(Buf, usize)>(BUFFERS_IN_FLIGHT);
    let (hashed_tx, hashed_rx) = sync_channel::<(Buf, usize)>(BUFFERS_IN_FLIGHT);
    let chunks = Chunks {
        size: opts.chunk_size,
        kept,
    };
    let (read_result, (whole, by_whole), by_chunks, write_result) = thread::scope(|scope| {
        let whole = scope.spawn(|| hash_whole(&chunks, read_rx, full_tx));
        let hasher = scope.spawn(|| hash_chunks(&chunks, full_rx, hashed_tx));
        let writer = scope.spawn(move || write_chunks(writer_cfg, hashed_rx, empty_tx, progress));
        let read_result = read_input(&mut reader, size, read_tx, empty_rx);
        let whole = whole.join().expect("whole-artifact hasher panicked");
        let digests = hasher.join().expect("chunk hasher panicked");
        let write_result = writer.join().expect("chunk writer panicked");
        (read_result, whole, digests, write_result)
    });
    // A writer error explains a reader's broken pipe, so report it first.
    let mut staged = write_result?;
    let digests = merge_digests(by_chunks, by_whole);
    if digests.len() != staged.chunks.len() {
        // Only possible when a stage stopped early; the reader's error says why.
        read_result?;
        return Err(Error::InputChanged {
            path: out_dir.join(name),
            expected: size,
            actual: staged.chunks.iter().map(|c| c.size).sum(),
        });
    }
    for (chunk, digest) in staged.chunks.iter_mut().zip(digests) {
        chunk.sha256 = digest;
    }
    let read_total = read_result?;
    // Every chunk is durable only when the stream held exactly `size` bytes (a chunk the
    // stream ended inside is never fsynced): never stage fewer files than chunks.
    if read_total != size || staged.files.len() != staged.chunks.len() {
        return Err(Error::InputChanged {
            path: out_dir.join(name),
            expected: size,
            actual: read_total,
        });
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
        install(
            &self.name,
            &self.out_dir,
            self.staged,
            self.whole,
            self.size,
        )
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
        let other_form = match crate::form_of(name, file_name) {
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

/// Reader side: fill buffers and hand them on. Reads at most `size + 1` bytes so that a growing
/// input is noticed without reading it all; returns the bytes read.
fn read_input<R: Read>(
    reader: &mut R,
    size: u64,
    full_tx: SyncSender<(Buf, usize)>,
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

/// A buffer on its way from the whole-artifact hasher to the chunk hasher, with the states of the
/// chunks the whole hasher hands over in it: `(chunk index, bytes of the chunk the state holds,
/// state)`; the chunk hasher goes on from that byte.
type Hashed = (Buf, usize, Vec<(usize, u64, State)>);

/// Hashing stage: the SHA-256 of the whole artifact; buffers go on to the chunk hasher.
///
/// Every chunk's state starts here. This thread hashes the first [`kept_share`] bytes of each
/// chunk for the chunk too, in the same pass as the artifact ([`State::update_both`], far cheaper
/// than a second pass), then hands the state over with the buffer and the chunk hasher goes on
/// from that byte. So on a machine with cores to spare every chunk is hashed on its own core,
/// and on two cores the two hashers share the work of both digests. Returns the artifact's
/// digest and the digests of the chunks this thread finished (those no longer than its share).
fn hash_whole(
    chunks: &Chunks,
    read_rx: Receiver<(Buf, usize)>,
    full_tx: SyncSender<Hashed>,
) -> (Sha256Digest, Vec<(usize, Sha256Digest)>) {
    let mut whole = State::new();
    let mut cutter = Cutter::new(chunks.size);
    let (mut index, mut finished) = (0usize, Vec::new());
    let mut kept: Option<State> = None;
    for (buf, len) in read_rx {
        let mut handed = Vec::new();
        let mut data = &buf[..len];
        while !data.is_empty() {
            let at = cutter.filled;
            if at == 0 {
                kept = Some(State::new());
            }
            let (piece, full) = cutter.next(&mut data);
            let mut rest = piece;
            if let Some(mut state) = kept.take() {
                let share = chunks.kept.saturating_sub(at).min(piece.len() as u64) as usize;
                whole.update_both(&mut state, &piece[..share]);
                rest = &piece[share..];
                if !rest.is_empty() {
                    handed.push((index, at + share as u64, state));
                } else if full {
                    finished.push((index, state.finish()));
                } else {
                    kept = Some(state);
                }
            }
            whole.update(rest);
            if full {
                index += 1;
            }
        }
        if full_tx.send((buf, len, handed)).is_err() {
            break; // a later stage stopped; its error is reported by the caller
        }
    }
    // A last chunk shorter than the others ends with the stream.
    finished.extend(kept.map(|state| (index, state.finish())));
    (whole.finish(), finished)
}

/// How many bytes at the start of each chunk of `size` the whole-artifact hasher hashes for the
/// chunk too, on a machine with `cores`. With more than two cores each digest has a core of its
/// own (and reading and writing a third): none. On two, the two hashers and the reading and
/// writing share both cores, so it takes the first quarter, which the chunk hasher then does not
/// hash. Measured on 1 GiB, 2 cores, 8 runs each (median wall time): none 0.93 s, 15 % 0.88 s,
/// 25 % 0.88 s, 40 % 0.88 s (user time 1.22 → 1.05 s); a quarter is the balance the per-byte
/// costs predict (the whole hasher's work grows by 0.3 of what it takes, the chunk hasher's
/// falls by all of it). A chunk size that is not a multiple of 64 bytes gets none: the two
/// states would not stand at the same place in a block.
pub(crate) fn kept_share(size: u64, cores: usize) -> u64 {
    match cores <= 2 && size.is_multiple_of(64) {
        true => size / 4,
        false => 0,
    }
}

/// What the two hashers share: where chunks are cut and how much of each the whole hasher takes.
struct Chunks {
    size: u64,
    kept: u64,
}

/// Every chunk's digest in order, from the two hashers' `(index, digest)` lists; stops at the
/// first chunk neither finished (a stage stopped early, so the count no longer matches).
fn merge_digests(
    mut by_chunks: Vec<(usize, Sha256Digest)>,
    by_whole: Vec<(usize, Sha256Digest)>,
) -> Vec<Sha256Digest> {
    by_chunks.extend(by_whole);
    by_chunks.sort_by_key(|(index, _)| *index);
    by_chunks
        .into_iter()
        .enumerate()
        .map_while(|(i, (index, digest))| (i == index).then_some(digest))
        .collect()
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

/// Cuts a byte stream into chunk-size pieces, remembering where the current chunk stands, so that
/// the hashing and the writing stage cut the same stream at the same places.
struct Cutter {
    chunk_size: u64,
    filled: u64,
}

impl Cutter {
    fn new(chunk_size: u64) -> Self {
        Self {
            chunk_size,
            filled: 0,
        }
    }

    /// Split off the next piece of `data` that fits in the current chunk. The flag says whether
    /// the piece completes the chunk.
    fn next<'a>(&mut self, data: &mut &'a [u8]) -> (&'a [u8], bool) {
        let room = (self.chunk_size - self.filled).min(data.len() as u64) as usize;
        let (piece, rest) = data.split_at(room);
        *data = rest;
        self.filled += room as u64;
        let full = self.filled == self.chunk_size;
        if full {
            self.filled = 0;
        }
        (piece, full)
    }
}

/// Hashing stage: the digests of the chunks the whole-artifact hasher hands over, on a thread of
/// its own so that the two hashes of every byte run on two cores; buffers go on to the writer
/// untouched. Returns `(chunk index, digest)` for each chunk it finished.
fn hash_chunks(
    chunks: &Chunks,
    full_rx: Receiver<Hashed>,
    hashed_tx: SyncSender<(Buf, usize)>,
) -> Vec<(usize, Sha256Digest)> {
    let mut cutter = Cutter::new(chunks.size);
    let (mut index, mut finished) = (0usize, Vec::new());
    let mut state: Option<State> = None;
    for (buf, len, handed) in full_rx {
        let mut handed = handed.into_iter().peekable();
        let mut data = &buf[..len];
        while !data.is_empty() {
            let at = cutter.filled;
            let (piece, full) = cutter.next(&mut data);
            let mut from = 0;
            if let Some((_, held, s)) = handed.next_if(|(i, _, _)| *i == index) {
                // The state holds the chunk's bytes up to `held`, inside this piece.
                from = (held - at) as usize;
                state = Some(s);
            }
            if let Some(s) = &mut state {
                s.update(&piece[from..]);
            }
            if full {
                finished.extend(state.take().map(|s| (index, s.finish())));
                index += 1;
            }
        }
        if hashed_tx.send((buf, len)).is_err() {
            break; // the writer stopped; its error is reported by the caller
        }
    }
    finished.extend(state.map(|s| (index, s.finish())));
    finished
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
        Ok(Self {
            name: name.to_string(),
            out_dir: out_dir.to_path_buf(),
            size,
            chunk_size: opts.chunk_size,
            count,
            // Pieces are full buffers (but a chunk's last) and chunks start at multiples of the
            // chunk size, so with an aligned chunk size every write but a tail is aligned.
            direct: opts.chunk_size.is_multiple_of(DIRECT_ALIGN as u64),
        })
    }

    /// The size chunk `index` (from 1) has in an input of the declared size.
    fn chunk_len(&self, index: u32) -> u64 {
        let start = u64::from(index - 1) * self.chunk_size;
        self.chunk_size.min(self.size.saturating_sub(start))
    }

    /// Chunk `index`'s temporary, given its `size` up front, ready for the writers.
    fn open_chunk(&self, index: u32, size: u64) -> Result<std::sync::Arc<OpenChunk>> {
        let mut temp = self.create(index)?;
        let handle = temp.handle()?;
        let path = temp.temp_path().to_path_buf();
        preallocate(&handle, size, &path)?;
        Ok(std::sync::Arc::new(OpenChunk {
            index,
            direct: AtomicBool::new(temp.is_direct()),
            temp: std::sync::Mutex::new(Some(temp)),
            handle,
            path,
            remaining: std::sync::atomic::AtomicU64::new(size),
        }))
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

/// Bytes in one pool buffer: a huge page (2 MiB on x86_64 and aarch64).
const SPLIT_BUFFER: usize = 2 << 20;

/// One pool buffer: [`SPLIT_BUFFER`] bytes of their own mapping, aligned on [`SPLIT_BUFFER`] and
/// (on Linux) advised as a transparent huge page. O_DIRECT needs the alignment ([`DIRECT_ALIGN`]);
/// the huge page is measured: the kernel pins one page per write instead of 512 for the device,
/// and the hashers' reads do not miss at every 4 KiB page boundary (issue 27: user time of a
/// 1 GiB split 1.09 → 1.04 s, 8,300 page faults → 130). The mapping is zero until touched, so
/// the pool costs nothing before the reader fills it.
struct Buf {
    /// The aligned start, inside `map`.
    start: std::ptr::NonNull<u8>,
    map: *mut libc::c_void,
    map_len: usize,
}

// SAFETY: `Buf` owns its mapping outright (no other pointer to it exists), like a `Vec<u8>`:
// moving it to another thread moves that ownership, and `&Buf` only ever reads.
unsafe impl Send for Buf {}
// SAFETY: as above; shared references give `&[u8]` only.
unsafe impl Sync for Buf {}

impl Buf {
    fn new() -> Self {
        // Twice the size, so that an aligned buffer fits whatever address the kernel picks.
        let map_len = 2 * SPLIT_BUFFER;
        // SAFETY: an anonymous private mapping; no file, no fixed address.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if map == libc::MAP_FAILED {
            // As a failed allocation would.
            std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(SPLIT_BUFFER, SPLIT_BUFFER).expect("layout"),
            );
        }
        let offset = map.cast::<u8>().align_offset(SPLIT_BUFFER);
        // SAFETY: `offset` < SPLIT_BUFFER, so the buffer lies inside the mapping.
        let start = unsafe { map.cast::<u8>().add(offset) };
        #[cfg(target_os = "linux")]
        // SAFETY: advice on a range of our own mapping; a refusal (THP disabled) leaves 4 KiB
        // pages, which work the same.
        unsafe {
            libc::madvise(start.cast(), SPLIT_BUFFER, libc::MADV_HUGEPAGE);
        }
        Self {
            start: std::ptr::NonNull::new(start).expect("mapped"),
            map,
            map_len,
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}

impl std::ops::Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: SPLIT_BUFFER bytes of our mapping, readable (zero until written).
        unsafe { std::slice::from_raw_parts(self.start.as_ptr(), SPLIT_BUFFER) }
    }
}

impl std::ops::DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `deref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.start.as_ptr(), SPLIT_BUFFER) }
    }
}

/// Chunks written and fsynced under temporary names, waiting to be renamed. Chunk digests are
/// filled in from the hashing stage.
struct Staged {
    files: Vec<AtomicFile>,
    chunks: Vec<ChunkInfo>,
}

/// Writers of [`write_chunks`]: each has one positioned write in flight, so the device has that
/// many queued while the hashers hold both cores and a writer waits to be scheduled.
const WRITERS: usize = 3;

/// Writing stage: cut the stream into chunks and hand each piece, with its chunk's temporary and
/// its offset there, to [`WRITERS`] threads that write pieces at their offsets; the thread that
/// writes a chunk's last piece fsyncs it. A chunk's temporary is given its full size up front
/// (`fallocate`), so that the writes of one chunk run side by side instead of each extending
/// the file after the one before, and a full disk shows before the chunk is written.
fn write_chunks(
    cfg: WriterConfig,
    hashed_rx: Receiver<(Buf, usize)>,
    empty_tx: SyncSender<Buf>,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<Staged> {
    let (job_tx, job_rx) = sync_channel::<Piece>(BUFFERS_IN_FLIGHT);
    let pool = WriterPool {
        jobs: std::sync::Mutex::new(Some(job_rx)),
        running: std::sync::atomic::AtomicUsize::new(WRITERS),
        failed: AtomicBool::new(false),
        error: std::sync::Mutex::new(None),
        done: std::sync::Mutex::new(Vec::with_capacity(cfg.count as usize)),
    };
    let cut = thread::scope(|scope| {
        for _ in 0..WRITERS {
            scope.spawn(|| pool.run(progress));
        }
        let cut = cut_chunks(&cfg, hashed_rx, &empty_tx, &job_tx, &pool.failed);
        drop(job_tx);
        cut
    });
    if let Some(e) = pool.error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let chunks = cut?;
    let mut done = pool.done.into_inner().unwrap_or_else(|e| e.into_inner());
    done.sort_by_key(|(index, _)| *index);
    let files = done.into_iter().map(|(_, f)| f).collect();
    Ok(Staged { files, chunks })
}

/// A buffer lent to the writers: back to the reader's pool once its last piece is written.
struct Loaned {
    buf: Option<Buf>,
    home: SyncSender<Buf>,
}

impl Drop for Loaned {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            // The reader may have stopped; returning the buffer is best effort.
            let _ = self.home.try_send(buf);
        }
    }
}

/// A chunk being written: its temporary (taken out by the thread that writes its last piece, to
/// fsync it), a handle for positioned writes, and the bytes not yet written.
struct OpenChunk {
    index: u32,
    temp: std::sync::Mutex<Option<AtomicFile>>,
    handle: std::fs::File,
    path: PathBuf,
    /// Writes may go direct: opened with O_DIRECT, and no direct write refused since.
    direct: AtomicBool,
    remaining: std::sync::atomic::AtomicU64,
}

/// One piece of a chunk: `buf[start..end]`, to be written at `offset` in the chunk.
struct Piece {
    buf: std::sync::Arc<Loaned>,
    start: usize,
    end: usize,
    chunk: std::sync::Arc<OpenChunk>,
    offset: u64,
}

/// What the writer threads share: the queue of pieces (closed by the last writer to stop, so that
/// the dispatcher never waits on a queue nobody takes from), the first error, and the chunks
/// written and fsynced.
struct WriterPool {
    jobs: std::sync::Mutex<Option<Receiver<Piece>>>,
    running: std::sync::atomic::AtomicUsize,
    failed: AtomicBool,
    error: std::sync::Mutex<Option<Error>>,
    done: std::sync::Mutex<Vec<(u32, AtomicFile)>>,
}

/// Held by each writer thread: however it stops (the queue closed, a panic in `progress`), the
/// last one out closes the queue, and a panic stops the split (the scope passes it on).
struct Running<'a>(&'a WriterPool);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.failed.store(true, Ordering::Relaxed);
        }
        if self.0.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            let jobs = self.0.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
            drop(jobs);
        }
    }
}

impl WriterPool {
    fn run(&self, progress: &(dyn Fn(u64) + Sync)) {
        let _running = Running(self);
        loop {
            let job = match &*self.jobs.lock().unwrap_or_else(|e| e.into_inner()) {
                Some(jobs) => jobs.recv(),
                None => return,
            };
            let Ok(piece) = job else { return };
            if self.failed.load(Ordering::Relaxed) {
                continue; // dropping the piece returns its buffer; the chunk is never synced
            }
            if let Err(e) = self.write(&piece) {
                self.fail(e.into());
                continue;
            }
            progress((piece.end - piece.start) as u64);
        }
    }

    fn write(&self, piece: &Piece) -> io::Result<()> {
        let buf = piece.buf.buf.as_ref().expect("lent buffer");
        let data = &buf[piece.start..piece.end];
        write_at(&piece.chunk, data, piece.offset)?;
        let len = data.len() as u64;
        if piece.chunk.remaining.fetch_sub(len, Ordering::AcqRel) == len {
            // The last piece: every other write of the chunk has returned.
            let taken = piece
                .chunk
                .temp
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(mut file) = taken {
                file.sync()?;
                let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
                done.push((piece.chunk.index, file));
            }
        }
        Ok(())
    }

    fn fail(&self, e: Error) {
        self.failed.store(true, Ordering::Relaxed);
        self.error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(e);
    }
}

/// Write `data` at `offset` in the chunk: with O_DIRECT where the chunk has it and the piece is
/// aligned ([`atomic::direct_aligned`]); otherwise through the page cache. A filesystem that
/// takes the flag but refuses the writes has it turned off for the whole chunk
/// ([`atomic::clear_direct`], as [`AtomicFile::write_piece`] does). An unaligned piece (the
/// artifact's tail) or the rest after a short direct write goes through a buffered handle of its
/// own, so that the other writers' pieces of the chunk stay direct.
fn write_at(chunk: &OpenChunk, data: &[u8], offset: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let named = |e: io::Error| {
        io::Error::new(
            e.kind(),
            format!("failed to write to `{}`: {e}", chunk.path.display()),
        )
    };
    let mut written = 0;
    while chunk.direct.load(Ordering::Relaxed) && written < data.len() {
        let at = offset + written as u64;
        if !atomic::direct_aligned(&data[written..], at) {
            break;
        }
        match chunk.handle.write_at(&data[written..], at) {
            Ok(0) => break, // let the buffered write say why
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => {
                chunk.direct.store(false, Ordering::Relaxed);
                atomic::clear_direct(&chunk.handle, &chunk.path)?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(named(e)),
        }
    }
    if written < data.len() {
        let own;
        let buffered = match chunk.direct.load(Ordering::Relaxed) {
            true => {
                own = std::fs::OpenOptions::new()
                    .write(true)
                    .open(&chunk.path)
                    .map_err(named)?;
                &own
            }
            false => &chunk.handle,
        };
        buffered
            .write_all_at(&data[written..], offset + written as u64)
            .map_err(named)?;
    }
    Ok(())
}

/// Give chunk file `file` its `len` bytes up front (see [`write_chunks`]). Only a full disk or
/// quota is an error; a filesystem without `fallocate` just writes as it goes.
fn preallocate(file: &std::fs::File, len: u64, path: &Path) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let Ok(len) = libc::off_t::try_from(len) else {
            return Ok(());
        };
        // SAFETY: fallocate on a file descriptor we own; plain integer arguments.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } != 0 {
            let e = io::Error::last_os_error();
            if matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) {
                return Err(io::Error::new(
                    e.kind(),
                    format!("failed to make room for `{}`: {e}", path.display()),
                ));
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, len, path);
    Ok(())
}

/// The dispatcher: cut the stream into chunks, open each chunk's temporary, and queue its
/// pieces for the writers. Returns the chunks in order (digests filled in later).
fn cut_chunks(
    cfg: &WriterConfig,
    hashed_rx: Receiver<(Buf, usize)>,
    empty_tx: &SyncSender<Buf>,
    jobs: &SyncSender<Piece>,
    failed: &AtomicBool,
) -> Result<Vec<ChunkInfo>> {
    let mut chunks: Vec<ChunkInfo> = Vec::with_capacity(cfg.count as usize);
    let mut cutter = Cutter::new(cfg.chunk_size);
    let mut current: Option<(std::sync::Arc<OpenChunk>, u64)> = None;
    for (buf, len) in hashed_rx {
        if failed.load(Ordering::Relaxed) {
            break; // a writer's error is the one reported
        }
        let lent = std::sync::Arc::new(Loaned {
            buf: Some(buf),
            home: empty_tx.clone(),
        });
        let whole = &lent.buf.as_ref().expect("lent buffer")[..len];
        let mut data = whole;
        while !data.is_empty() {
            let start = whole.len() - data.len();
            let (chunk, offset) = match &mut current {
                Some(open) => open,
                None => {
                    let index = chunks.len() as u32 + 1;
                    let size = cfg.chunk_len(index);
                    let open = cfg.open_chunk(index, size)?;
                    chunks.push(ChunkInfo {
                        name: chunk_name(&cfg.name, index, cfg.count),
                        size,
                        // Filled in from the hashing stage once every stage is done.
                        sha256: Sha256Digest::from_bytes([0; 32]),
                    });
                    current.insert((open, 0))
                }
            };
            let (piece, full) = cutter.next(&mut data);
            let job = Piece {
                buf: lent.clone(),
                start,
                end: start + piece.len(),
                chunk: chunk.clone(),
                offset: *offset,
            };
            *offset += piece.len() as u64;
            if jobs.send(job).is_err() {
                break;
            }
            if full {
                current = None;
            }
        }
    }
    // A stream that ended inside a chunk (shorter than declared) leaves that chunk unsynced;
    // the reader's count reports it.
    Ok(chunks)
}

/// Make the staged set visible: old manifest out, chunks in, sidecar, manifest last.
fn install(
    name: &str,
    out_dir: &Path,
    staged: Staged,
    whole: Sha256Digest,
    size: u64,
) -> Result<SplitReport> {
    let count = staged.chunks.len() as u32;
    let manifest_path = out_dir.join(chunk_manifest_name(name));
    atomic::remove_if_exists(&manifest_path)?;
    atomic::sync_dir(out_dir)?;
    for file in staged.files {
        file.commit()?;
    }
    remove_stale_chunks(name, out_dir, count)?;
    let sidecar = out_dir.join(sidecar_name(name));
    atomic::write_atomic(&sidecar, format_sidecar(&whole, name).as_bytes())?;
    atomic::write_atomic(&manifest_path, format_chunk_manifest(count).as_bytes())?;
    Ok(SplitReport {
        name: name.to_string(),
        size,
        sha256: whole,
        chunk_count: count,
        chunks: staged.chunks,
    })
}

/// Chunks of an earlier split with a different count would only confuse people and tools.
fn remove_stale_chunks(name: &str, dir: &Path, count: u32) -> Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        if let Some((_, c)) = parse_chunk_name(name, file_name)
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

    /// The file split (chunks on several threads) writes byte for byte the set the stream split
    /// writes and reports the same: sizes around the chunk size, a single chunk, an exact
    /// multiple, an aligned chunk size (O_DIRECT) and not, more chunks than workers.
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
            let by_file = split_file_reporting(&src, &a, &opts, &|n| {
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

    /// Whoever hashes a chunk (the chunk hasher, the whole-artifact hasher in the same pass as
    /// the artifact's digest, or the one after the other, handed over at any byte: a block
    /// boundary or not, a buffer boundary or not), the digests are SHA-256's: chunk sizes that
    /// are multiples of 64 (the states share blocks) and not, chunks that end inside a buffer and
    /// on its end.
    #[test]
    fn every_share_of_a_chunk_the_whole_hasher_takes_gives_sha256s_digests() {
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
            for (label, kept) in [
                ("none", 0),
                ("all", u64::MAX),
                ("a third and 5 bytes", chunk_size / 3 + 5),
                ("a quarter", kept_share(chunk_size, 2)),
                ("one buffer and a block", SPLIT_BUFFER as u64 + 64),
            ] {
                let out = dir.path().join(format!("{size}-{chunk_size}-{label}"));
                fs::create_dir_all(&out).unwrap();
                let opts = SplitOptions { chunk_size };
                let staged =
                    stage_sharing(&data[..], size as u64, "m.pkl", &out, &opts, kept, &|_| {})
                        .unwrap();
                assert_eq!(
                    staged.sha256(),
                    Sha256Digest::of_bytes(&data),
                    "{size} {chunk_size} {label}"
                );
                let expected: Vec<_> = data
                    .chunks(chunk_size as usize)
                    .map(Sha256Digest::of_bytes)
                    .collect();
                let got: Vec<_> = staged.chunks().iter().map(|c| c.sha256).collect();
                assert_eq!(got, expected, "{size} {chunk_size} {label}");
                staged.install().unwrap();
                let mut joined = Vec::new();
                for i in 1..=expected.len() as u32 {
                    joined.extend(
                        fs::read(out.join(chunk_name("m.pkl", i, expected.len() as u32))).unwrap(),
                    );
                }
                assert!(
                    joined == data,
                    "{size} {chunk_size} {label}: the chunks do not join to the input"
                );
            }
        }
    }

    #[test]
    fn the_whole_hasher_takes_a_quarter_of_each_chunk_on_two_cores_and_none_on_more() {
        for (size, cores, kept) in [
            (100 * 64, 1, 25 * 64),
            (100 * 64, 2, 25 * 64),
            (45 << 20, 2, (45 << 20) / 4),
            (100 * 64, 3, 0),
            (100 * 64, 64, 0),
            // The states would not share blocks.
            (100, 2, 0),
            (64 * 1000 + 1, 2, 0),
            (64, 2, 16),
        ] {
            assert_eq!(kept_share(size, cores), kept, "{size}, {cores} cores");
        }
    }

    /// Regression: a progress callback that panicked in every writer thread left the dispatcher
    /// waiting forever on a queue nobody took from. The panic now reaches the caller and the
    /// temporaries are gone.
    #[test]
    fn a_panic_in_every_writer_reaches_the_caller_and_leaves_nothing() {
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
            .expect("the split is still running a minute after its writers panicked");
        assert!(panicked, "the writers' panic did not reach the caller");
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
