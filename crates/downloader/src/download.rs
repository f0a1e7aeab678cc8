//! One model's artifact: plan the pieces, fetch them in parallel into one staging file, verify,
//! then install with a single rename.
//!
//! Install layout: whatever the published form (plain file or chunk set), the artifact is
//! assembled into one staging file `<sha16>-<name>` in the staging directory
//! `<models>/.starpilot-staging` (see [`crate::staging`]), each piece written at its own offset. After the whole SHA-256 matches, the file is fsynced and
//! renamed over `<id>_driving_tinygrad.pkl`, and the directory fsynced. A plain file wins over a
//! chunk set for every reader (docs/formats.md, "Reading"), so that one rename is the moment the new
//! artifact becomes visible; a reader holding the old file keeps reading the old inode, so it can
//! never see a mix. Leftover chunk-set or `.pNN` files of the same name are removed afterwards,
//! `.chunkmanifest` first.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::hash::{BuildHasher, Hasher as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use chunker::atomic::{remove_if_exists, sync_dir};
use chunker::{Hasher, Sha256Digest};
use fs_err as fs;
use fs_err::File;
use fs_err::os::unix::fs::FileExt;
use manifest::{FileName, Generation, ModelEntry, ModelId};

use crate::error::{Error, Result};
use crate::http::{Ctl, Http, HttpConfig};
use crate::origin::Origin;
use crate::space;
use crate::staging::{StagingDir, staging_names};

/// Tuning of one download.
#[derive(Debug, Clone)]
pub struct DownloadConfig {
    /// Parallel connections per download.
    pub connections: usize,
    /// Ranges fetched in parallel within one chunk (1 = a chunk is one request).
    pub ranges_per_chunk: usize,
    /// Tries per range before the origin counts as failed.
    pub max_attempts: u32,
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Free space required beyond the artifact itself.
    pub space_margin: u64,
    pub http: HttpConfig,
}

impl Default for DownloadConfig {
    fn default() -> Self {
        Self {
            connections: 4,
            ranges_per_chunk: 1,
            max_attempts: 5,
            backoff_base: Duration::from_millis(250),
            backoff_max: Duration::from_secs(8),
            space_margin: 64 * 1024 * 1024,
            http: HttpConfig::default(),
        }
    }
}

/// What a download reports while it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Trying this origin.
    Origin { origin: String },
    /// Bytes of the artifact present in staging so far.
    Progress { done: u64, total: u64 },
    /// All bytes are in; hashing before install.
    Verifying,
    /// Verified and renamed into place.
    Installed { path: PathBuf },
}

/// A cancellation flag shared between the one who asks and the download.
#[derive(Debug, Clone, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Where the digest a download was verified against came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DigestSource {
    /// `artifact_sha256` of the manifest entry.
    Manifest,
    /// The origin's `<name>.sha256` sidecar, because the entry declares no digest (the live
    /// manifest's shape). The bytes are still verified against it before install, and the
    /// digest is kept next to the installed file ([`installed_sidecar_digest`]).
    Sidecar,
}

impl DigestSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Manifest => "manifest",
            Self::Sidecar => "sidecar",
        }
    }
}

impl std::fmt::Display for DigestSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A verified, installed artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub path: PathBuf,
    pub size: u64,
    pub sha256: Sha256Digest,
    pub digest_source: DigestSource,
    pub origin: String,
}

/// What to fetch, checked against the manifest entry before any request. Fields the entry
/// does not declare are `None` and learned from each origin before the first payload byte:
/// the chunk count from `.chunkmanifest` (absent: one plain file), the digest from the
/// `.sha256` sidecar (absent too: not downloadable), the size from `HEAD`.
#[derive(Debug, Clone)]
pub struct Target {
    pub id: ModelId,
    /// Remote logical name (`artifact_filename` or `<id>_driving_tinygrad.pkl`).
    pub remote_name: FileName,
    /// Local logical name: `<id>_driving_tinygrad.pkl` (what modeld opens), or
    /// `<id>_driving_chestnut_tinygrad.pkl` for the eGPU variant.
    pub local_name: FileName,
    pub size: Option<u64>,
    pub sha256: Option<Sha256Digest>,
    /// `Some(0)` = one plain file.
    pub chunk_count: Option<u32>,
    pub chunk_sha256: Option<Vec<Sha256Digest>>,
}

impl Target {
    pub fn from_entry(entry: &ModelEntry) -> Result<Self> {
        let model = entry.id().to_string();
        let bad = |reason: &str| Error::NotDownloadable {
            model: model.clone(),
            reason: reason.to_string(),
        };
        if entry.id().is_local() {
            return Err(bad("local models are never downloaded"));
        }
        if !entry.is_supported() {
            return Err(bad("unsupported artifact_format"));
        }
        let chunk_count = entry.artifact_chunk_count().map(|c| c.get());
        let chunk_sha256 = entry.chunk_digests();
        if let (Some(list), Some(count)) = (&chunk_sha256, chunk_count)
            && list.len() != count as usize
        {
            return Err(bad(
                "artifact_chunk_sha256 does not have one digest per chunk",
            ));
        }
        Ok(Self {
            id: entry.id().clone(),
            remote_name: entry.file_name(),
            local_name: manifest::layout::artifact_file_name(entry.id()),
            size: entry.artifact_size().map(|s| s.get()),
            sha256: entry.artifact_sha256(),
            chunk_count,
            chunk_sha256,
        })
    }

    /// Where this target's digest will come from.
    pub fn digest_source(&self) -> DigestSource {
        if self.sha256.is_some() {
            DigestSource::Manifest
        } else {
            DigestSource::Sidecar
        }
    }

    /// The staging file's name inside [`STAGING_DIR`](crate::STAGING_DIR): tied to the artifact digest so bytes of
    /// two different artifacts are never mixed. `None` until the digest is known.
    pub fn staging_name(&self) -> Option<String> {
        self.sha256
            .map(|d| staging_names(&d.to_hex(), self.local_name.as_str()).0)
    }
}

/// What one origin publishes for a target, every unknown resolved: what the payload must be.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub size: u64,
    pub sha256: Sha256Digest,
    pub digest_source: DigestSource,
    pub chunk_count: u32,
    pub chunk_sha256: Option<Vec<Sha256Digest>>,
}

/// Digest of an installed artifact whose entry declares none, as recorded at install from the
/// origin's sidecar (`<models>/<local_name>.sha256`, upstream's sidecar format). `None` when
/// there is no such record or it is malformed.
pub fn installed_sidecar_digest(models_dir: &Path, local_name: &str) -> Option<Sha256Digest> {
    let path = models_dir.join(chunker::sidecar_name(local_name));
    chunker::read_sidecar(&path).ok().flatten()
}

/// A sidecar's digest as upstream reads it: the first token, 64 hex digits in either case.
fn parse_remote_sidecar(body: &[u8], url: &str) -> Result<Sha256Digest> {
    let token = std::str::from_utf8(body)
        .ok()
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or("");
    token
        .to_ascii_lowercase()
        .parse()
        .map_err(|_| Error::Protocol {
            url: url.to_string(),
            message: format!(
                "malformed .sha256 sidecar: first token is not 64 hex digits (got {:?})",
                &token[..token.len().min(80)]
            ),
        })
}

/// One remote file of the artifact, placed at `offset` in the assembled artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// 1-based chunk index (1 for a plain file).
    pub index: u32,
    pub remote: String,
    pub offset: u64,
    pub len: u64,
}

/// A byte range `[start, end)` of one piece, fetched by one request (plus retries).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Segment {
    piece: usize,
    start: u64,
    end: u64,
}

/// Pieces of an artifact of `size` bytes published as `count` chunks whose first chunk has
/// `chunk_len` bytes (ignored for `count <= 1`). Pure: no I/O.
pub fn plan_pieces(
    remote_name: &str,
    size: u64,
    count: u32,
    chunk_len: u64,
) -> std::result::Result<Vec<Piece>, String> {
    if count == 0 {
        return Ok(vec![Piece {
            index: 1,
            remote: remote_name.to_string(),
            offset: 0,
            len: size,
        }]);
    }
    let n = u64::from(count);
    let chunk_len = if count == 1 { size } else { chunk_len };
    let before_last = chunk_len
        .checked_mul(n - 1)
        .filter(|b| *b < size && chunk_len > 0)
        .ok_or_else(|| {
            format!("{count} chunks of {chunk_len} bytes cannot hold a {size}-byte artifact")
        })?;
    let last = size - before_last;
    if last > chunk_len {
        return Err(format!(
            "{count} chunks of {chunk_len} bytes leave {last} bytes for the last chunk; more than a chunk"
        ));
    }
    Ok((1..=count)
        .map(|i| Piece {
            index: i,
            remote: chunker::chunk_name(remote_name, i, count),
            offset: u64::from(i - 1) * chunk_len,
            len: if i == count { last } else { chunk_len },
        })
        .collect())
}

/// Byte ranges `[a, b)` of pieces already on disk (by piece index), kept merged.
pub(crate) type Partial = BTreeMap<u32, Vec<(u64, u64)>>;

/// Adds `[a, b)` to a sorted list of disjoint ranges, merging what touches. Pure.
fn add_range(ranges: &mut Vec<(u64, u64)>, (a, b): (u64, u64)) {
    if a >= b {
        return;
    }
    ranges.push((a, b));
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for &(x, y) in ranges.iter() {
        match merged.last_mut() {
            Some((_, end)) if x <= *end => *end = (*end).max(y),
            _ => merged.push((x, y)),
        }
    }
    *ranges = merged;
}

/// Split every piece not yet done into up to `ranges` segments of at least 1 MiB, each starting
/// after whatever prefix of it `partial` already has on disk (so a resume never fetches those
/// bytes again). A segment wholly on disk stays, empty, so its piece still gets finished. Pure.
fn plan_segments(
    pieces: &[Piece],
    done: &BTreeSet<u32>,
    partial: &Partial,
    ranges: usize,
) -> Vec<Segment> {
    const MIN_SEGMENT: u64 = 1024 * 1024;
    let mut out = Vec::new();
    for (i, p) in pieces.iter().enumerate() {
        if done.contains(&p.index) {
            continue;
        }
        let have = partial.get(&p.index).map(Vec::as_slice).unwrap_or(&[]);
        let parts = (ranges.max(1) as u64)
            .min(p.len.div_ceil(MIN_SEGMENT))
            .max(1);
        let step = p.len.div_ceil(parts);
        let mut start = 0;
        while start < p.len {
            let end = (start + step).min(p.len);
            let mut from = start;
            for &(a, b) in have {
                if a <= from && from < b {
                    from = b.min(end);
                }
            }
            out.push(Segment {
                piece: i,
                start: from,
                end,
            });
            start = end;
        }
    }
    out
}

/// Bytes of `pieces` on disk according to `done` and `partial`.
fn bytes_on_disk(pieces: &[Piece], done: &BTreeSet<u32>, partial: &Partial) -> u64 {
    pieces
        .iter()
        .map(|p| {
            if done.contains(&p.index) {
                p.len
            } else {
                partial
                    .get(&p.index)
                    .map(|r| {
                        r.iter()
                            .map(|(a, b)| b.min(&p.len).saturating_sub(*a))
                            .sum()
                    })
                    .unwrap_or(0)
            }
        })
        .sum()
}

/// The staging file plus the record of which pieces (and, when each chunk has its own digest,
/// which ranges inside unfinished pieces) are on disk and fsynced, both in the verified staging
/// directory (see [`crate::staging`]).
struct Staging {
    dir: StagingDir,
    data_name: String,
    state_name: String,
    /// Open on `data_name`; its errors name that path (fs-err).
    file: File,
    record: Mutex<(BTreeSet<u32>, Partial)>,
    header: String,
    /// Whether ranges inside a piece are recorded: only when each chunk's digest is known, so
    /// bytes resumed into a chunk are checked before the chunk counts as done.
    keep_partial: bool,
}

/// How often, in bytes of one segment, its progress is recorded (fsync + record) while it
/// downloads, so even a crash loses at most this much of a chunk.
const RANGE_RECORD_STEP: u64 = 8 * 1024 * 1024;

/// The completion record is a header line and one index per line: small by construction.
const MAX_STATE_BYTES: u64 = 64 * 1024;

impl Staging {
    fn open(
        models_dir: &Path,
        local_name: &FileName,
        plan: &Plan,
        pieces: &[Piece],
        margin: u64,
    ) -> Result<Self> {
        let dir = StagingDir::open(models_dir)?;
        let (data_name, state_name) = staging_names(&plan.sha256.to_hex(), local_name.as_str());
        dir.clean(&[&data_name, &state_name], local_name.as_str());
        let header = format!(
            "{} {} {}\n",
            plan.sha256,
            plan.size,
            pieces.first().map(|p| p.len).unwrap_or(0)
        );
        let keep_partial = plan.chunk_sha256.is_some();
        let existing = dir.open_existing(&data_name).ok();
        let resumed = existing.as_ref().and_then(|f| {
            Self::read_state(
                &dir,
                f,
                &state_name,
                &header,
                plan.size,
                pieces,
                keep_partial,
            )
        });
        let file = match (resumed.is_some(), existing) {
            (true, Some(f)) => f,
            _ => {
                let available = space::available_bytes(models_dir)?;
                let needed = plan.size.saturating_add(margin);
                if available < needed {
                    return Err(Error::InsufficientSpace {
                        path: models_dir.to_path_buf(),
                        needed,
                        available,
                    });
                }
                dir.remove(&state_name)?;
                let f = dir.create_new(&data_name)?;
                if let Err(e) = space::reserve(&f, plan.size) {
                    drop(f);
                    let _ = dir.remove(&data_name);
                    if e.kind() == std::io::ErrorKind::StorageFull {
                        return Err(Error::InsufficientSpace {
                            path: models_dir.to_path_buf(),
                            needed,
                            available: space::available_bytes(models_dir).unwrap_or(0),
                        });
                    }
                    return Err(e.into());
                }
                f
            }
        };
        Ok(Self {
            dir,
            data_name,
            state_name,
            file,
            record: Mutex::new(resumed.unwrap_or_default()),
            header,
            keep_partial,
        })
    }

    /// Pieces (and ranges) recorded by an earlier run, if its record matches this artifact.
    /// Lines: `<index>` for a complete piece, `<index> <start> <end>` for a range inside one.
    fn read_state(
        dir: &StagingDir,
        data: &File,
        state_name: &str,
        header: &str,
        size: u64,
        pieces: &[Piece],
        keep_partial: bool,
    ) -> Option<(BTreeSet<u32>, Partial)> {
        let len = data.metadata().ok()?.len();
        if len != size {
            return None;
        }
        let bytes = dir.read_small(state_name, MAX_STATE_BYTES).ok()?;
        let text = String::from_utf8(bytes).ok()?;
        let rest = text.strip_prefix(header)?;
        let mut done = BTreeSet::new();
        let mut partial = Partial::new();
        for line in rest.lines() {
            let mut words = line.split_ascii_whitespace();
            let i: u32 = words.next()?.parse().ok()?;
            let piece = pieces.iter().find(|p| p.index == i)?;
            match (words.next(), words.next(), words.next()) {
                (None, None, None) => {
                    done.insert(i);
                }
                (Some(a), Some(b), None) if keep_partial => {
                    let (a, b): (u64, u64) = (a.parse().ok()?, b.parse().ok()?);
                    if a >= b || b > piece.len {
                        return None;
                    }
                    add_range(partial.entry(i).or_default(), (a, b));
                }
                _ => return None,
            }
        }
        for i in &done {
            partial.remove(i);
        }
        Some((done, partial))
    }

    fn write_record(&self, record: &(BTreeSet<u32>, Partial)) -> Result<()> {
        let mut text = self.header.clone();
        for i in record.0.iter() {
            text.push_str(&format!("{i}\n"));
        }
        for (i, ranges) in &record.1 {
            for (a, b) in ranges {
                text.push_str(&format!("{i} {a} {b}\n"));
            }
        }
        Ok(self.dir.write_atomic(&self.state_name, text.as_bytes())?)
    }

    /// fsync the data, then record `index` as complete (atomically), so a restart skips it.
    fn mark_done(&self, index: u32) -> Result<()> {
        self.file.sync_data()?;
        let mut record = self.record.lock().unwrap();
        record.0.insert(index);
        record.1.remove(&index);
        self.write_record(&record)
    }

    /// fsync the data, then record bytes `[a, b)` of piece `index` as on disk, so a restart
    /// continues inside the piece. A no-op unless each chunk has its own digest.
    fn mark_range(&self, index: u32, a: u64, b: u64) -> Result<()> {
        if !self.keep_partial || a >= b {
            return Ok(());
        }
        self.file.sync_data()?;
        let mut record = self.record.lock().unwrap();
        if record.0.contains(&index) {
            return Ok(());
        }
        add_range(record.1.entry(index).or_default(), (a, b));
        self.write_record(&record)
    }

    /// Forget every range of piece `index` (its bytes failed the chunk digest).
    fn forget(&self, index: u32) -> Result<()> {
        let mut record = self.record.lock().unwrap();
        if record.1.remove(&index).is_some() {
            self.write_record(&record)?;
        }
        Ok(())
    }

    fn discard(self) {
        let _ = self.dir.remove(&self.state_name);
        let _ = self.dir.remove(&self.data_name);
    }
}

struct Run<'a> {
    http: &'a Http,
    config: &'a DownloadConfig,
    target: &'a Target,
    plan: &'a Plan,
    pieces: Vec<Piece>,
    urls: Vec<String>,
    staging: &'a Staging,
    cancel: &'a CancelToken,
    on_event: &'a (dyn Fn(Event) + Sync),
    ctl: Ctl,
    queue: Mutex<VecDeque<Segment>>,
    open_segments: Mutex<Vec<usize>>,
    done_bytes: AtomicU64,
    abort: Arc<AtomicBool>,
    error: Mutex<Option<Error>>,
    /// Pieces already fetched once more from their first byte after failing their digest.
    refetched: Mutex<BTreeSet<usize>>,
}

/// Fetch the artifact from one origin into staging, verify it and install it.
pub(crate) struct Job<'a> {
    pub http: &'a Http,
    pub config: &'a DownloadConfig,
    pub generation: Generation,
    pub target: &'a Target,
    pub models_dir: &'a Path,
    pub cancel: &'a CancelToken,
    pub on_event: &'a (dyn Fn(Event) + Sync),
}

pub(crate) fn download_from(job: &Job<'_>, origin: &Origin) -> Result<Installed> {
    let Job {
        http,
        config,
        generation,
        target,
        models_dir,
        cancel,
        on_event,
    } = *job;
    let url_of = |name: &str| -> Result<String> {
        let file: FileName = name.parse().map_err(|e| Error::NotDownloadable {
            model: target.id.to_string(),
            reason: format!("bad remote file name: {e}"),
        })?;
        Ok(origin.artifact_url(generation, &target.id, &file))
    };
    let remote = target.remote_name.as_str();
    let start = Instant::now();
    // What the entry leaves open is learned under the manifest's budget; the transfer then
    // gets the artifact's deadline, counted from the same start.
    let budget = config.http.origin_deadline;
    let mut ctl = Ctl::new(cancel, target.id.as_str(), budget, start + budget);
    if let Some(size) = target.size {
        let deadline = config.http.artifact_deadline(start, size);
        ctl = Ctl::new(
            cancel,
            target.id.as_str(),
            deadline.saturating_duration_since(start),
            deadline,
        );
    }
    let (plan, chunk_len) = resolve_plan(http, config, target, &ctl, &url_of)?;
    if target.size.is_none() {
        let deadline = config.http.artifact_deadline(start, plan.size);
        ctl = Ctl::new(
            cancel,
            target.id.as_str(),
            deadline.saturating_duration_since(start),
            deadline,
        );
    }
    let pieces =
        plan_pieces(remote, plan.size, plan.chunk_count, chunk_len).map_err(|message| {
            Error::SizeMismatch {
                url: url_of(&chunker::chunk_name(remote, 1, plan.chunk_count.max(1)))
                    .unwrap_or_default(),
                message,
            }
        })?;
    let urls = pieces
        .iter()
        .map(|p| url_of(&p.remote))
        .collect::<Result<Vec<_>>>()?;

    let staging = Staging::open(
        models_dir,
        &target.local_name,
        &plan,
        &pieces,
        config.space_margin,
    )?;
    let (done, partial) = staging.record.lock().unwrap().clone();
    let segments = plan_segments(&pieces, &done, &partial, config.ranges_per_chunk);
    let mut open_segments = vec![0usize; pieces.len()];
    for s in &segments {
        open_segments[s.piece] += 1;
    }
    let already = bytes_on_disk(&pieces, &done, &partial);
    let abort = Arc::new(AtomicBool::new(false));
    ctl.abort = Some(abort.clone());
    let run = Run {
        http,
        ctl,
        config,
        target,
        plan: &plan,
        urls,
        staging: &staging,
        cancel,
        on_event,
        queue: Mutex::new(segments.into_iter().collect()),
        open_segments: Mutex::new(open_segments),
        done_bytes: AtomicU64::new(already),
        abort,
        error: Mutex::new(None),
        refetched: Mutex::new(BTreeSet::new()),
        pieces,
    };
    on_event(Event::Progress {
        done: already,
        total: plan.size,
    });
    let workers = config.connections.max(1);
    thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| run.worker());
        }
    });
    if let Some(e) = run.error.lock().unwrap().take() {
        // Without per-chunk digests a digest failure cannot say which bytes are bad: drop them
        // all. With them, only the failing chunk was forgotten (in `finish_piece`); every
        // verified chunk is kept. Anything else keeps what is on disk for a resume.
        if matches!(e, Error::DigestMismatch { .. }) && plan.chunk_sha256.is_none() {
            staging.discard();
        }
        return Err(e);
    }
    if cancel.is_cancelled() {
        return Err(Error::Cancelled {
            model: target.id.to_string(),
        });
    }

    on_event(Event::Verifying);
    let actual = hash_file(&staging.file, plan.size, &run.ctl)?;
    if actual != plan.sha256 {
        staging.discard();
        return Err(Error::DigestMismatch {
            what: format!(
                "{} from {origin} (digest from the {})",
                target.local_name, plan.digest_source
            ),
            expected: plan.sha256,
            actual,
        });
    }
    if cancel.is_cancelled() {
        return Err(Error::Cancelled {
            model: target.id.to_string(),
        });
    }
    let path = install(&staging, models_dir, &target.local_name, &plan)?;
    on_event(Event::Installed { path: path.clone() });
    Ok(Installed {
        path,
        size: plan.size,
        sha256: actual,
        digest_source: plan.digest_source,
        origin: origin.to_string(),
    })
}

/// Everything one origin must tell before the first payload byte: the chunk count (checked
/// against the entry's, or learned from `.chunkmanifest`; none published means one plain
/// file), the digest (the entry's, or the `.sha256` sidecar's), the size (the entry's, or
/// from `HEAD`), and the first chunk's length. A few small requests; no payload.
fn resolve_plan(
    http: &Http,
    config: &DownloadConfig,
    target: &Target,
    ctl: &Ctl,
    url_of: &dyn Fn(&str) -> Result<String>,
) -> Result<(Plan, u64)> {
    let remote = target.remote_name.as_str();
    let gone = |e: &Error| {
        matches!(
            e,
            Error::Status {
                status: 404 | 403 | 410,
                ..
            }
        )
    };

    let chunk_count = match target.chunk_count {
        Some(0) => 0,
        declared => {
            let url = url_of(&chunker::chunk_manifest_name(remote))?;
            match with_retries(config, ctl, &url, || http.get_small(&url, 64, ctl)) {
                Ok(body) => {
                    let remote_count = chunker::parse_chunk_manifest(&body, Path::new(&url))
                        .map_err(|source| Error::BadChunkManifest {
                            url: url.clone(),
                            source,
                        })?;
                    if let Some(expected) = declared
                        && remote_count != expected
                    {
                        return Err(Error::ChunkCountMismatch {
                            url,
                            expected,
                            remote: remote_count,
                        });
                    }
                    remote_count
                }
                // Nothing published as chunks, and the entry does not say there are any:
                // upstream then reads the name as one plain file.
                Err(e) if declared.is_none() && gone(&e) => 0,
                Err(e) => return Err(e),
            }
        }
    };
    if let Some(list) = &target.chunk_sha256
        && list.len() != chunk_count as usize
    {
        return Err(Error::ChunkCountMismatch {
            url: url_of(&chunker::chunk_manifest_name(remote))?,
            expected: list.len() as u32,
            remote: chunk_count,
        });
    }

    let (sha256, digest_source) = match target.sha256 {
        Some(d) => (d, DigestSource::Manifest),
        None => {
            let url = url_of(&chunker::sidecar_name(remote))?;
            match with_retries(config, ctl, &url, || http.get_small(&url, 1024, ctl)) {
                Ok(body) => (parse_remote_sidecar(&body, &url)?, DigestSource::Sidecar),
                Err(e) if gone(&e) => {
                    return Err(Error::NotDownloadable {
                        model: target.id.to_string(),
                        reason: format!(
                            "the manifest declares no artifact_sha256 and the origin has no sidecar ({url}: {e}); nothing to verify the bytes against"
                        ),
                    });
                }
                Err(e) => return Err(e),
            }
        }
    };

    let head_len = |name: &str| -> Result<u64> {
        let url = url_of(name)?;
        let (len, _) = with_retries(config, ctl, &url, || http.head(&url, ctl))?;
        len.ok_or_else(|| Error::Protocol {
            url,
            message: "HEAD gave no Content-Length".into(),
        })
    };
    let first_len = if chunk_count > 1 {
        Some(head_len(&chunker::chunk_name(remote, 1, chunk_count))?)
    } else {
        None
    };
    let size = match target.size {
        Some(s) => s,
        None => {
            let learned = match (chunk_count, first_len) {
                (0, _) => head_len(remote)?,
                (1, _) => head_len(&chunker::chunk_name(remote, 1, 1))?,
                (n, Some(first)) => {
                    let last = head_len(&chunker::chunk_name(remote, n, n))?;
                    first
                        .checked_mul(u64::from(n - 1))
                        .and_then(|b| b.checked_add(last))
                        .unwrap_or(u64::MAX)
                }
                (_, None) => unreachable!("the first chunk's length is read for n > 1"),
            };
            manifest::ArtifactSize::new(learned)
                .map_err(|e| Error::SizeMismatch {
                    url: url_of(remote).unwrap_or_default(),
                    message: format!("the published files add up to {learned} bytes: {e}"),
                })?
                .get()
        }
    };
    let plan = Plan {
        size,
        sha256,
        digest_source,
        chunk_count,
        chunk_sha256: target.chunk_sha256.clone(),
    };
    Ok((plan, first_len.unwrap_or(size)))
}

/// Rename the verified staging file over the final name and remove any other form of the same
/// artifact (see the module docs for why this is atomic for modeld). Right before the rename
/// the staging name is checked to still be the file we wrote and verified: another manager's
/// cleanup may have removed it (then nothing is installed and the next try starts over), and
/// nothing swapped in under our name is ever installed. A digest learned from the origin's
/// sidecar is written next to the installed file afterwards, so `status` and `verify` can check
/// it later.
fn install(staging: &Staging, dir: &Path, local: &FileName, plan: &Plan) -> Result<PathBuf> {
    staging.file.sync_all()?;
    let dest = dir.join(local.as_str());
    let ours = staging
        .dir
        .still_is(&staging.data_name, &staging.file)
        .unwrap_or(false);
    if !ours {
        return Err(Error::Io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!(
                "{}: the verified staging file was removed or replaced before install (another process cleaning the models directory?); nothing was installed, the next try downloads it again",
                staging.file.path().display()
            ),
        )));
    }
    staging.dir.rename_out(&staging.data_name, &dest)?;
    sync_dir(dir)?;
    remove_other_forms(dir, local.as_str())?;
    if plan.digest_source == DigestSource::Sidecar {
        let sidecar = dir.join(chunker::sidecar_name(local.as_str()));
        chunker::atomic::write_atomic(
            &sidecar,
            chunker::format_sidecar(&plan.sha256, local.as_str()).as_bytes(),
        )?;
    }
    staging.dir.remove(&staging.state_name)?;
    staging.dir.sync()?;
    sync_dir(dir)?;
    Ok(dest)
}

/// Remove the chunk-set and legacy forms of `name` in `dir` (`.chunkmanifest` first, so no reader
/// ever sees a manifest without its chunks), leaving the plain file.
pub fn remove_other_forms(dir: &Path, name: &str) -> Result<()> {
    let manifest = dir.join(chunker::chunk_manifest_name(name));
    remove_if_exists(&manifest)?;
    let sidecar = dir.join(chunker::sidecar_name(name));
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        let legacy = file_name
            .strip_prefix(name)
            .and_then(|r| r.strip_prefix(".p"))
            .is_some_and(|d| d.len() == 2 && d.bytes().all(|b| b.is_ascii_digit()));
        if chunker::parse_chunk_name(name, file_name).is_some() || legacy {
            remove_if_exists(entry.path())?;
        }
    }
    remove_if_exists(&sidecar)?;
    Ok(())
}

/// The whole staging file's digest; a cancel stops it between two buffers.
fn hash_file(file: &File, size: u64, ctl: &Ctl) -> Result<Sha256Digest> {
    let mut hasher = Hasher::new();
    let step = 16 * chunker::IO_BUFFER_SIZE as u64;
    let mut at = 0;
    while at < size {
        if ctl.cancel.is_cancelled() {
            return Err(Error::Cancelled {
                model: ctl.what.clone(),
            });
        }
        let len = step.min(size - at);
        hash_region(file, at, len, &mut hasher)?;
        at += len;
    }
    Ok(hasher.finish())
}

fn hash_region(file: &File, offset: u64, len: u64, hasher: &mut Hasher) -> Result<()> {
    let mut buf = vec![0u8; chunker::IO_BUFFER_SIZE];
    let mut pos = 0;
    while pos < len {
        let want = (len - pos).min(buf.len() as u64) as usize;
        file.read_exact_at(&mut buf[..want], offset + pos)?;
        hasher.update(&buf[..want]);
        pos += want as u64;
    }
    Ok(())
}

/// Run `op` with exponential backoff and jitter while its error is retryable.
pub(crate) fn with_retries<T>(
    config: &DownloadConfig,
    ctl: &Ctl,
    url: &str,
    mut op: impl FnMut() -> Result<T>,
) -> Result<T> {
    let mut attempt = 0;
    loop {
        match op() {
            Err(e) if retry_again(&e, attempt, config.max_attempts) => {
                backoff_sleep(config, attempt, ctl, url)?;
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// The retry decision: another try after failed attempt `attempt` (0-based) when the error is
/// one a retry can fix and the attempts are not used up.
fn retry_again(e: &Error, attempt: u32, max_attempts: u32) -> bool {
    e.is_retryable() && attempt + 1 < max_attempts
}

/// The wait after failed attempt `attempt` (0-based) before jitter: `base * 2^attempt`, capped
/// at `backoff_max`.
fn backoff_delay(config: &DownloadConfig, attempt: u32) -> Duration {
    config
        .backoff_base
        .saturating_mul(1u32 << attempt.min(16))
        .min(config.backoff_max)
}

/// `base * 2^attempt`, capped, plus up to half of it again at random, so that many devices
/// failing together do not retry in lockstep. Wakes early on cancel; a sleep that would pass the
/// origin's deadline fails at once with [`Error::Deadline`].
fn backoff_sleep(config: &DownloadConfig, attempt: u32, ctl: &Ctl, url: &str) -> Result<()> {
    let base = backoff_delay(config, attempt);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(attempt);
    let jitter_ms = base.as_millis() as u64 / 2;
    let jitter = if jitter_ms == 0 {
        Duration::ZERO
    } else {
        Duration::from_millis(h.finish() % (jitter_ms + 1))
    };
    let until = Instant::now() + base + jitter;
    if until >= ctl.deadline {
        return Err(Error::Deadline {
            url: url.to_string(),
            seconds: ctl.budget.as_secs(),
        });
    }
    loop {
        ctl.check(url)?;
        let now = Instant::now();
        if now >= until {
            return Ok(());
        }
        thread::sleep(Duration::from_millis(20).min(until - now));
    }
}

impl Run<'_> {
    fn stopped(&self) -> bool {
        self.abort.load(Ordering::SeqCst) || self.cancel.is_cancelled()
    }

    fn fail(&self, e: Error) {
        let mut slot = self.error.lock().unwrap();
        if slot.is_none() {
            *slot = Some(e);
        }
        self.abort.store(true, Ordering::SeqCst);
    }

    fn worker(&self) {
        loop {
            if self.stopped() {
                return;
            }
            let Some(seg) = self.queue.lock().unwrap().pop_front() else {
                return;
            };
            let res = self.fetch_segment(&seg).and_then(|()| {
                let finished = {
                    let mut open = self.open_segments.lock().unwrap();
                    open[seg.piece] -= 1;
                    open[seg.piece] == 0
                };
                if finished {
                    self.finish_piece(seg.piece)
                } else {
                    Ok(())
                }
            });
            if let Err(e) = res {
                if !matches!(e, Error::Cancelled { .. }) || !self.abort.load(Ordering::SeqCst) {
                    self.fail(e);
                }
                return;
            }
        }
    }

    /// A piece is complete: check its own digest when the manifest has one, then record it.
    fn finish_piece(&self, i: usize) -> Result<()> {
        let piece = &self.pieces[i];
        if let Some(list) = &self.plan.chunk_sha256 {
            let want = list[i];
            let mut h = Hasher::new();
            hash_region(&self.staging.file, piece.offset, piece.len, &mut h)?;
            let got = h.finish();
            if got != want {
                // Only this chunk's bytes are known bad: forget them, keep every other chunk.
                self.staging.forget(piece.index)?;
                if self.refetched.lock().unwrap().insert(i) {
                    // Bytes resumed from an earlier run or origin, or a prefix a broken answer
                    // left before a retry, may be the bad ones: fetch the whole chunk once more
                    // from its first byte before giving up on this origin.
                    self.done_bytes.fetch_sub(piece.len, Ordering::SeqCst);
                    self.open_segments.lock().unwrap()[i] = 1;
                    self.queue.lock().unwrap().push_back(Segment {
                        piece: i,
                        start: 0,
                        end: piece.len,
                    });
                    return Ok(());
                }
                return Err(Error::DigestMismatch {
                    what: format!("chunk {} ({})", piece.index, self.urls[i]),
                    expected: want,
                    actual: got,
                });
            }
        }
        self.staging.mark_done(piece.index)
    }

    fn fetch_segment(&self, seg: &Segment) -> Result<()> {
        if seg.start == seg.end {
            return Ok(());
        }
        let mut written = 0u64;
        let mut etag: Option<String> = None;
        let res = with_retries(self.config, &self.ctl, &self.urls[seg.piece], || {
            self.try_segment(seg, &mut written, &mut etag)
        });
        if res.is_err() {
            // Stopping (cancel, SIGTERM, this origin given up): what this segment has on disk
            // is kept for the next run, when each chunk's digest can check it.
            let index = self.pieces[seg.piece].index;
            let _ = self
                .staging
                .mark_range(index, seg.start, seg.start + written);
        }
        res
    }

    /// One request for the rest of `seg`. `written` is how much of the segment is already on
    /// disk (kept across attempts, so a retry resumes); `etag` is the validator for `If-Range`.
    fn try_segment(
        &self,
        seg: &Segment,
        written: &mut u64,
        etag: &mut Option<String>,
    ) -> Result<()> {
        let piece = &self.pieces[seg.piece];
        let url = &self.urls[seg.piece];
        let start = seg.start + *written;
        let last = seg.end - 1;
        let protocol = |message: String| Error::Protocol {
            url: url.clone(),
            message,
        };
        let mismatch = |message: String| Error::SizeMismatch {
            url: url.clone(),
            message,
        };
        let validator = if *written > 0 { etag.as_deref() } else { None };
        let mut body = self
            .http
            .get(url, Some((start, last)), validator, &self.ctl)?;
        match body.meta.status {
            206 => {
                let range_ok = matches!(body.meta.content_range, Some((a, b, _))
                    if a == start && b == last);
                let total_ok = matches!(body.meta.content_range, Some((_, _, total))
                    if total.is_none_or(|t| t == piece.len));
                if !range_ok || !total_ok {
                    let message = format!(
                        "asked for bytes {start}-{last} of {}, got Content-Range {:?}",
                        piece.len, body.meta.content_range
                    );
                    return Err(if range_ok {
                        mismatch(message)
                    } else {
                        protocol(message)
                    });
                }
                if let Some(len) = body.meta.content_length
                    && len != last - start + 1
                {
                    return Err(protocol(format!(
                        "Content-Length {len} for a {}-byte range",
                        last - start + 1
                    )));
                }
            }
            _ => {
                // The server ignored Range (or If-Range did not match): this is the whole piece.
                // Start the segment over from the body, skipping what lies before it.
                if let Some(len) = body.meta.content_length
                    && len != piece.len
                {
                    return Err(mismatch(format!(
                        "Content-Length {len}, but this piece is {} bytes; refusing a size the manifest does not declare",
                        piece.len
                    )));
                }
                self.done_bytes.fetch_sub(*written, Ordering::SeqCst);
                *written = 0;
                body.skip(seg.start)?;
            }
        }
        if body.meta.etag.is_some() {
            *etag = body.meta.etag.clone();
        }
        let seg_len = seg.end - seg.start;
        let mut buf = vec![0u8; 64 * 1024];
        while *written < seg_len {
            if self.stopped() {
                return Err(Error::Cancelled {
                    model: self.target.id.to_string(),
                });
            }
            // Never ask for more than the segment still needs: extra bytes a server sends are
            // never read, let alone written.
            let want = (seg_len - *written).min(buf.len() as u64) as usize;
            let n = body.read(&mut buf[..want])?;
            if n == 0 {
                return Err(Error::Transport {
                    url: url.clone(),
                    message: format!("body ended after {} of {} bytes", *written, seg_len),
                });
            }
            let at = piece.offset + seg.start + *written;
            debug_assert!(at + n as u64 <= self.plan.size);
            self.staging.file.write_all_at(&buf[..n], at)?;
            let before = *written;
            *written += n as u64;
            if before / RANGE_RECORD_STEP != *written / RANGE_RECORD_STEP {
                self.staging
                    .mark_range(piece.index, seg.start, seg.start + *written)?;
            }
            let done = self.done_bytes.fetch_add(n as u64, Ordering::SeqCst) + n as u64;
            (self.on_event)(Event::Progress {
                done,
                total: self.plan.size,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one device retry helper stops waiting as soon as the download is cancelled (what a
    /// SIGTERM or IsOnroad turns into), well before a long backoff would end.
    #[test]
    fn retries_stop_waiting_on_cancel() {
        let config = DownloadConfig {
            backoff_base: Duration::from_secs(30),
            backoff_max: Duration::from_secs(30),
            max_attempts: 5,
            ..DownloadConfig::default()
        };
        let cancel = CancelToken::new();
        let ctl = crate::http::Ctl::new(
            &cancel,
            "m",
            Duration::from_secs(600),
            Instant::now() + Duration::from_secs(600),
        );
        let canceller = cancel.clone();
        let start = Instant::now();
        let mut calls = 0;
        let err = with_retries(&config, &ctl, "http://o/x", || -> Result<()> {
            calls += 1;
            let c = canceller.clone();
            thread::spawn(move || {
                thread::sleep(Duration::from_millis(50));
                c.cancel();
            });
            Err(Error::Status {
                url: "http://o/x".into(),
                status: 503,
            })
        })
        .unwrap_err();
        assert!(matches!(err, Error::Cancelled { .. }), "{err}");
        assert_eq!(calls, 1);
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
    }

    /// The device's backoff schedule and retry decision as a table: doubling from the base,
    /// capped; retried only while the error is retryable and attempts remain.
    #[test]
    fn backoff_schedule_and_retry_decision() {
        let config = DownloadConfig {
            backoff_base: Duration::from_millis(250),
            backoff_max: Duration::from_secs(8),
            ..DownloadConfig::default()
        };
        let ms: Vec<u128> = [0, 1, 2, 3, 4, 5, 6, 40]
            .iter()
            .map(|&a| backoff_delay(&config, a).as_millis())
            .collect();
        assert_eq!(ms, [250, 500, 1000, 2000, 4000, 8000, 8000, 8000]);

        let status = |status| Error::Status {
            url: "u".into(),
            status,
        };
        let transport = Error::Transport {
            url: "u".into(),
            message: "reset".into(),
        };
        let cases = [
            (status(503), 0, 3, true),
            (status(429), 1, 3, true),
            (status(503), 2, 3, false),
            (status(404), 0, 3, false),
            (transport, 0, 1, false),
            (Error::Cancelled { model: "m".into() }, 0, 5, false),
        ];
        for (e, attempt, max, want) in cases {
            assert_eq!(
                retry_again(&e, attempt, max),
                want,
                "{e} after attempt {attempt}/{max}"
            );
        }
    }

    /// A file error says which operation failed on which path (fs-err), is the crate's one
    /// I/O variant, and keeps its kind; it is local, so no other origin is tried.
    #[test]
    fn file_errors_name_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-models-dir");
        let e = remove_other_forms(&missing, "a_driving_tinygrad.pkl").unwrap_err();
        let Error::Io(io) = &e else {
            panic!("not an I/O error: {e:?}")
        };
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        assert!(
            e.to_string().starts_with(&format!(
                "failed to read directory `{}`: ",
                missing.display()
            )),
            "{e}"
        );
        assert!(e.is_local());
    }

    #[test]
    fn plans_match_the_chunk_format() {
        let p = plan_pieces("a.pkl", 10, 3, 4).unwrap();
        assert_eq!(
            p.iter()
                .map(|p| (p.remote.as_str(), p.offset, p.len))
                .collect::<Vec<_>>(),
            [
                ("a.pkl.chunk01of03", 0, 4),
                ("a.pkl.chunk02of03", 4, 4),
                ("a.pkl.chunk03of03", 8, 2)
            ]
        );
        assert_eq!(plan_pieces("a.pkl", 10, 0, 0).unwrap()[0].remote, "a.pkl");
        assert_eq!(plan_pieces("a.pkl", 10, 1, 999).unwrap()[0].len, 10);
        assert!(
            plan_pieces("a.pkl", 10, 3, 3).is_err(),
            "last chunk would be 4 > 3"
        );
        assert!(
            plan_pieces("a.pkl", 10, 3, 5).is_err(),
            "two chunks already hold it all"
        );
        assert!(plan_pieces("a.pkl", 10, 3, 0).is_err());
    }

    #[test]
    fn ranges_merge() {
        type Ranges = &'static [(u64, u64)];
        let table: &[(Ranges, (u64, u64), Ranges)] = &[
            (&[], (0, 5), &[(0, 5)]),
            (&[(0, 5)], (5, 9), &[(0, 9)]),
            (&[(0, 5)], (7, 9), &[(0, 5), (7, 9)]),
            (&[(0, 5), (7, 9)], (4, 8), &[(0, 9)]),
            (&[(2, 3)], (3, 3), &[(2, 3)]),
            (&[(2, 8)], (3, 4), &[(2, 8)]),
        ];
        for (have, add, want) in table {
            let mut r = have.to_vec();
            add_range(&mut r, *add);
            assert_eq!(&r, want, "{have:?} + {add:?}");
        }
    }

    /// A resume starts each segment after the prefix already on disk and keeps wholly present
    /// segments (empty) so their piece is still finished and checked.
    #[test]
    fn segments_resume_inside_a_piece() {
        let pieces = plan_pieces("a", 5 << 20, 2, 3 << 20).unwrap();
        let mut partial = Partial::new();
        partial.insert(1, vec![(0, 1000)]);
        partial.insert(2, vec![(0, 2 << 20)]);
        let segs = plan_segments(&pieces, &BTreeSet::new(), &partial, 1);
        assert_eq!(
            segs,
            [
                Segment {
                    piece: 0,
                    start: 1000,
                    end: 3 << 20
                },
                Segment {
                    piece: 1,
                    start: 2 << 20,
                    end: 2 << 20
                }
            ]
        );
        assert_eq!(
            bytes_on_disk(&pieces, &BTreeSet::new(), &partial),
            1000 + (2 << 20)
        );
        assert_eq!(
            bytes_on_disk(&pieces, &BTreeSet::from([1]), &partial),
            5 << 20
        );
        // A range that does not start at a segment's start does not move it.
        partial.insert(1, vec![(10, 1000)]);
        assert_eq!(
            plan_segments(&pieces, &BTreeSet::new(), &partial, 1)[0].start,
            0
        );
    }

    #[test]
    fn segments_cover_each_missing_piece_once() {
        let pieces = plan_pieces("a", 5 << 20, 2, 3 << 20).unwrap();
        let segs = plan_segments(&pieces, &BTreeSet::new(), &Partial::new(), 4);
        for (i, p) in pieces.iter().enumerate() {
            let mut covered = 0;
            for s in segs.iter().filter(|s| s.piece == i) {
                assert_eq!(s.start, covered);
                covered = s.end;
            }
            assert_eq!(covered, p.len);
        }
        assert_eq!(segs.len(), 3 + 2);
        let segs = plan_segments(&pieces, &BTreeSet::from([1]), &Partial::new(), 1);
        assert_eq!(
            segs,
            [Segment {
                piece: 1,
                start: 0,
                end: 2 << 20
            }]
        );
    }
}
