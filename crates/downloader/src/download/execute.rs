//! One origin's run: resolve the plan, open staging, fetch the segments with parallel workers
//! (each range retried, resumed, checked against the plan), verify the whole, install.
//!
//! Nothing waits on the disk or the digest while bytes can flow: workers only receive, write
//! and start writeback; a [`Follower`] hashes the bytes in artifact order as they land; a
//! recorder thread makes finished pieces durable. A byte written twice voids the followed
//! digest, and the staging file is then hashed whole.

use std::collections::{BTreeSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use chunker::{Hasher, Sha256Digest};
use fs_err::os::unix::fs::FileExt;
use manifest::{FileName, Generation};

use super::inspect::{hash_file, hash_region};
use super::plan::{
    Block, Piece, Plan, Segment, add_range, bytes_on_disk, plan_blocks, plan_pieces, plan_segments,
    present_ranges,
};
use super::resolve::{implied_plan, resolve_plan};
use super::retry::with_retries;
use super::staged::{RANGE_RECORD_STEP, Staging, install};
use super::{CancelToken, DownloadConfig, Event, Installed, Target};
use crate::error::{Error, Result};
use crate::http::{Ctl, Http};
use crate::origin::Origin;
use crate::policy::Measured;
use crate::stale_store;

struct Run<'a> {
    job: &'a Job<'a>,
    plan: &'a Plan,
    pieces: Vec<Piece>,
    urls: Vec<String>,
    staging: &'a Staging,
    ctl: Ctl,
    queue: Mutex<VecDeque<Block>>,
    open_segments: Mutex<Vec<usize>>,
    done_bytes: AtomicU64,
    /// Bytes already on disk when the run started (resumed, not fetched now).
    resumed: u64,
    abort: Arc<AtomicBool>,
    error: Mutex<Option<Error>>,
    /// Pieces already fetched once more from their first byte after failing their digest.
    refetched: Mutex<BTreeSet<usize>>,
    /// Byte ranges of the artifact on disk (before the run, and written by it), for the
    /// [`Follower`].
    written: Mutex<Vec<(u64, u64)>>,
    wrote: Condvar,
    /// Some byte was written twice: the followed digest is void.
    rewritten: AtomicBool,
    /// Every worker has returned (the follower stops waiting for bytes that will not come).
    workers_done: AtomicBool,
    /// Whether the plan is the origin's (`None`: still waiting for its answer); nothing is
    /// recorded before it is `Some(true)`.
    confirmed: Mutex<Option<bool>>,
    settled: Condvar,
}

/// Fetch the artifact from one origin into staging, verify it and install it.
pub(crate) struct Job<'a> {
    pub http: &'a Http,
    pub config: &'a DownloadConfig,
    pub generation: Generation,
    /// The contract the device reads its origin under (where a piece count comes from).
    pub contract: &'static manifest::Contract,
    pub target: &'a Target,
    pub models_dir: &'a Path,
    pub cancel: &'a CancelToken,
    pub on_event: &'a (dyn Fn(Event) + Sync),
    /// Asked while the transfer runs, with what it moved so far and the bytes still needed:
    /// `true` moves the download to the other origin ([`crate::policy::leave`]).
    pub leave: &'a (dyn Fn(Measured, u64) -> bool + Sync),
    /// Stores that served other bytes ([`crate::stale_store`]).
    pub stale: &'a stale_store::Memory,
    /// Every payload byte received from the network, including bytes later discarded (a chunk
    /// that failed its digest, a body that ignored `Range`): what a byte budget counts.
    pub received: &'a AtomicU64,
}

/// What one origin publishes for the job's target, as pieces with their URLs, and the
/// transfer's control (deadline counted from the start of this origin's try). A few small
/// requests, no payload, nothing written.
pub(crate) struct Resolved {
    pub plan: Plan,
    pub pieces: Vec<Piece>,
    pub urls: Vec<String>,
    pub ctl: Ctl,
}

/// The URL of the job's remote file `name` on `origin`.
fn url_on(job: &Job<'_>, origin: &Origin, name: &str) -> Result<String> {
    let file: FileName = name.parse().map_err(|e| Error::NotDownloadable {
        model: job.target.id.to_string(),
        reason: format!("bad remote file name: {e}"),
    })?;
    Ok(origin.artifact_url(job.generation, &job.target.id, &file))
}

/// The transfer's control for an artifact of `size` bytes (its deadline counted from `start`),
/// or, while the size is unknown, the manifest's budget.
fn control(job: &Job<'_>, start: Instant, size: Option<u64>) -> Ctl {
    let deadline = match size {
        Some(size) => job.config.http.artifact_deadline(start, size),
        None => start + job.config.http.origin_deadline,
    };
    let budget = deadline.saturating_duration_since(start);
    Ctl::new(job.cancel, job.target.id.as_str(), budget, deadline)
}

pub(crate) fn resolve_from(job: &Job<'_>, origin: &Origin) -> Result<Resolved> {
    let url_of = |name: &str| url_on(job, origin, name);
    let start = Instant::now();
    // What the entry leaves open is learned under the manifest's budget; the transfer then
    // gets the artifact's deadline, counted from the same start.
    let ctl = control(job, start, job.target.size);
    let (plan, chunk_len) = resolve_plan(
        job.http,
        job.config,
        job.target,
        job.contract.chunk_count_from_manifest,
        &ctl,
        &url_of,
    )?;
    let ctl = control(job, start, Some(plan.size));
    placed(job, origin, plan, chunk_len, ctl)
}

/// The plan placed as pieces with their URLs.
fn placed(
    job: &Job<'_>,
    origin: &Origin,
    plan: Plan,
    chunk_len: u64,
    ctl: Ctl,
) -> Result<Resolved> {
    let remote = job.target.remote_name.as_str();
    let url_of = |name: &str| url_on(job, origin, name);
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
    Ok(Resolved {
        plan,
        pieces,
        urls,
        ctl,
    })
}

/// What the entry implies the origin publishes, placed, for a transfer to start on while the
/// origin is asked ([`implied_plan`]); `None` when bytes of it are already staged (a resume
/// continues their recorded layout, so it asks first).
fn implied(job: &Job<'_>, origin: &Origin) -> Option<Resolved> {
    let (plan, chunk_len) = implied_plan(job.target, job.contract.chunk_count_from_manifest)?;
    let staged = job.target.staging_name()?;
    let staging = job.models_dir.join(crate::STAGING_DIR);
    if fs_err::symlink_metadata(staging.join(staged)).is_ok() {
        return None;
    }
    let ctl = control(job, Instant::now(), Some(plan.size));
    placed(job, origin, plan, chunk_len, ctl).ok()
}

/// Download the job's target from `origin`; `measured` gets what this origin's payload transfer
/// measured (bytes fetched now, not resumed ones, and the time from the first range request).
pub(crate) fn download_from(
    job: &Job<'_>,
    origin: &Origin,
    measured: &mut Measured,
) -> Result<Installed> {
    // Per generation: the same file name of another generation is another store.
    let qualified = format!("{}/{}", job.generation, job.target.local_name);
    let (origin_name, local) = (origin.to_string(), qualified.as_str());
    let remembered = job.stale.get(&origin_name, local);
    // Nothing remembered of this store: the transfer starts on what the entry implies while
    // the origin is asked; when the origin says otherwise, it starts over on its word.
    let implied = remembered.is_none().then(|| implied(job, origin)).flatten();
    let (said, now, result) = match implied {
        Some(guess) => {
            let said = plan_state(job, origin, &guess);
            match transfer(job, origin, guess, true, measured) {
                Outcome::Done(result) => (said, None, result),
                Outcome::Unresolved(e) => return Err(e),
                Outcome::Replan(resolved) => {
                    let said = plan_state(job, origin, &resolved);
                    let result = transfer(job, origin, resolved, false, measured).done();
                    (said, None, result)
                }
            }
        }
        None => {
            let resolved = resolve_from(job, origin)?;
            let said = plan_state(job, origin, &resolved);
            // What the store says now, compared only when something is remembered of it.
            let now = remembered
                .as_ref()
                .map(|_| with_sidecar(job, origin, said.clone(), &resolved.ctl));
            if let (Some(r), Some(now)) = (&remembered, &now)
                && stale_store::decide(Some(r), now, Instant::now()) == stale_store::Go::Skip
            {
                return Err(Error::StoreUnchanged {
                    what: format!("{local} from {origin}"),
                    served: r.served,
                });
            }
            let result = transfer(job, origin, resolved, false, measured).done();
            (said, now, result)
        }
    };
    match &result {
        Ok(_) => job.stale.forget(&origin_name, local),
        Err(e) if e.is_not_yet() => {
            let served = match e {
                Error::DigestMismatch { actual, .. } => Some(*actual),
                _ => None,
            };
            // A fresh budget for the sidecar: the transfer's may be spent.
            let ctl = control(job, Instant::now(), None);
            let state = now.unwrap_or_else(|| with_sidecar(job, origin, said, &ctl));
            job.stale.remember(stale_store::Served {
                state,
                served,
                at: Instant::now(),
            });
        }
        Err(_) => {}
    }
    result
}

/// What a resolved plan says of the store, as [`stale_store`] compares it (without its sidecar).
fn plan_state(job: &Job<'_>, origin: &Origin, resolved: &Resolved) -> stale_store::StoreState {
    stale_store::StoreState {
        origin: origin.to_string(),
        local_name: format!("{}/{}", job.generation, job.target.local_name),
        expected: resolved.plan.sha256,
        size: resolved.plan.size,
        chunk_count: resolved.plan.chunk_count,
        first_len: resolved.pieces.first().map_or(0, |p| p.len),
        sidecar: None,
    }
}

/// `state` with the store's own `.sha256` sidecar, if it publishes one that parses (one small
/// request; a failure is `None`).
fn with_sidecar(
    job: &Job<'_>,
    origin: &Origin,
    mut state: stale_store::StoreState,
    ctl: &Ctl,
) -> stale_store::StoreState {
    state.sidecar = chunker::sidecar_name(job.target.remote_name.as_str())
        .parse::<FileName>()
        .ok()
        .and_then(|name| {
            let url = origin.artifact_url(job.generation, &job.target.id, &name);
            let body = job.http.get_small(&url, 1024, ctl).ok()?;
            super::resolve::parse_remote_sidecar(&body, &url).ok()
        });
    state
}

/// How a transfer ended.
enum Outcome {
    /// Installed, or failed on what the origin publishes.
    Done(Result<Installed>),
    /// Started on the entry's word, but the origin publishes another layout: nothing was
    /// recorded or installed, the staged bytes are gone; start over on this.
    Replan(Resolved),
    /// Started on the entry's word, but asking the origin failed: nothing was recorded or
    /// installed, the staged bytes are gone, as if nothing had started.
    Unresolved(Error),
}

impl Outcome {
    /// The result of a transfer on the origin's own word (which never ends otherwise).
    fn done(self) -> Result<Installed> {
        match self {
            Outcome::Done(result) => result,
            Outcome::Unresolved(e) => Err(e),
            Outcome::Replan(_) => unreachable!("only a transfer on the entry's word replans"),
        }
    }
}

/// The transfer of what `resolved` planned from `origin`: staging, ranges, verify, install.
/// On the entry's word (`implied`) the origin is asked meanwhile: nothing is recorded, verified
/// or installed before it gives the same plan; another answer drops what was written.
fn transfer(
    job: &Job<'_>,
    origin: &Origin,
    resolved: Resolved,
    implied: bool,
    measured: &mut Measured,
) -> Outcome {
    let Resolved {
        plan,
        pieces,
        urls,
        ctl,
    } = resolved;
    let target = job.target;
    let staging = match Staging::open(
        job.models_dir,
        &target.local_name,
        &plan,
        &pieces,
        job.contract.download_margin(job.config.space_margin),
    ) {
        Ok(staging) => staging,
        // The origin's answer comes before any error of ours, as when it is asked first.
        Err(_) if implied => {
            return match resolve_from(job, origin) {
                Ok(resolved) => Outcome::Replan(resolved),
                Err(e) => Outcome::Unresolved(e),
            };
        }
        Err(e) => return Outcome::Done(Err(e)),
    };
    let run = Run::new(job, &plan, &staging, pieces, urls, ctl, implied);
    let (followed, asked) = thread::scope(|s| {
        let asked = implied.then(|| {
            s.spawn(|| {
                let answer = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    resolve_from(job, origin)
                }))
                .unwrap_or_else(|_| {
                    Err(Error::protocol(
                        &run.urls[0],
                        "the thread asking the origin panicked",
                    ))
                });
                run.settle(
                    answer
                        .as_ref()
                        .is_ok_and(|r| r.plan == plan && r.pieces == run.pieces),
                );
                answer
            })
        });
        let followed = run.drive(job.leave, measured);
        (followed, asked.and_then(|h| h.join().ok()))
    });
    if implied && !run.confirmed() {
        staging.discard();
        return match asked {
            Some(Ok(resolved)) => Outcome::Replan(resolved),
            Some(Err(e)) => Outcome::Unresolved(e),
            None => unreachable!("the asking thread catches its panics"),
        };
    }
    let actual = match run.verified(followed, origin) {
        Ok(actual) => actual,
        Err(Unverified { error, discard }) => {
            if discard {
                staging.discard();
            }
            return Outcome::Done(Err(error));
        }
    };
    let path = match install(&staging, job.models_dir, &target.local_name, &plan) {
        Ok(path) => path,
        Err(e) => return Outcome::Done(Err(e)),
    };
    (job.on_event)(Event::Installed { path: path.clone() });
    Outcome::Done(Ok(Installed {
        path,
        size: plan.size,
        sha256: actual,
        digest_source: plan.digest_source,
        origin: origin.to_string(),
    }))
}

/// Why a transfer ended without an artifact to install, and whether its staged bytes go (kept
/// otherwise, for a resume).
struct Unverified {
    error: Error,
    discard: bool,
}

impl<'a> Run<'a> {
    /// The run over what staging already holds: the segments still missing, spread over the
    /// connections as blocks, and the bytes the follower may hash at once.
    fn new(
        job: &'a Job<'a>,
        plan: &'a Plan,
        staging: &'a Staging,
        pieces: Vec<Piece>,
        urls: Vec<String>,
        mut ctl: Ctl,
        implied: bool,
    ) -> Run<'a> {
        let config = job.config;
        let (done, partial) = staging.recorded();
        let segments = plan_segments(&pieces, &done, &partial, config.ranges_per_chunk);
        let present = present_ranges(&pieces, &segments, plan.size);
        let blocks = plan_blocks(segments, config.connections.max(1));
        let mut open_segments = vec![0usize; pieces.len()];
        for s in blocks.iter().flatten() {
            open_segments[s.piece] += 1;
        }
        let resumed = bytes_on_disk(&pieces, &done, &partial);
        let abort = Arc::new(AtomicBool::new(false));
        ctl.abort = Some(abort.clone());
        Run {
            job,
            ctl,
            plan,
            urls,
            staging,
            queue: Mutex::new(blocks.into_iter().collect()),
            open_segments: Mutex::new(open_segments),
            done_bytes: AtomicU64::new(resumed),
            resumed,
            abort,
            error: Mutex::new(None),
            refetched: Mutex::new(BTreeSet::new()),
            written: Mutex::new(present),
            wrote: Condvar::new(),
            rewritten: AtomicBool::new(false),
            workers_done: AtomicBool::new(false),
            confirmed: Mutex::new((!implied).then_some(true)),
            settled: Condvar::new(),
            pieces,
        }
    }

    /// Run the workers, the recorder and the follower to their end, asking `leave` four times a
    /// second whether to move to the other origin; `measured` gets what moved. Returns the
    /// digest the follower computed, when it followed every byte.
    fn drive(
        &self,
        leave: &(dyn Fn(Measured, u64) -> bool + Sync),
        measured: &mut Measured,
    ) -> Option<Sha256Digest> {
        // A transfer started on the entry's word alone reports nothing before its first byte:
        // while the origin is silent the UI keeps the request's acknowledgement, not a "0%".
        let implied = self
            .confirmed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none();
        if !implied {
            (self.job.on_event)(Event::Progress {
                done: self.resumed,
                total: self.plan.size,
            });
        }
        let started = Instant::now();
        let moved = || Measured {
            bytes: self
                .done_bytes
                .load(Ordering::SeqCst)
                .saturating_sub(self.resumed),
            elapsed: started.elapsed(),
        };
        thread::scope(|s| {
            let (records, recorded) = mpsc::channel::<Record>();
            let recorder = s.spawn(|| self.record(recorded));
            let follower = s.spawn(|| Follower::new(self).follow());
            let handles: Vec<_> = (0..self.job.config.connections.max(1))
                .map(|_| {
                    let records = records.clone();
                    s.spawn(|| self.worker(records))
                })
                .collect();
            drop(records);
            // Watch the transfer's rate: the policy may move it to the other origin.
            let mut last_check = Instant::now();
            while !handles.iter().all(|h| h.is_finished()) {
                thread::sleep(Duration::from_millis(10));
                if self.stopped() || last_check.elapsed() < Duration::from_millis(250) {
                    continue;
                }
                last_check = Instant::now();
                let m = moved();
                let remaining =
                    (self.plan.size).saturating_sub(self.done_bytes.load(Ordering::SeqCst));
                if leave(m, remaining) {
                    self.fail(Error::LeftForFaster {
                        url: self.urls[0].clone(),
                        rate: m.rate().unwrap_or(0),
                    });
                }
            }
            for h in handles {
                let _ = h.join();
            }
            *measured = moved();
            {
                let _guard = self.written.lock().unwrap();
                self.workers_done.store(true, Ordering::SeqCst);
                self.wrote.notify_all();
            }
            if !self.stopped() {
                (self.job.on_event)(Event::Verifying);
            }
            let _ = recorder.join();
            follower.join().ok().flatten()
        })
    }

    /// After the transfer: its first error, a cancel, or the artifact's digest (the one
    /// `followed`, or the staging file hashed again when some byte was written twice), which
    /// must be the plan's; then, once more, a cancel.
    fn verified(
        &self,
        followed: Option<Sha256Digest>,
        origin: &Origin,
    ) -> std::result::Result<Sha256Digest, Unverified> {
        let plan = self.plan;
        let keep = |error| Unverified {
            error,
            discard: false,
        };
        if let Some(error) = self.error.lock().unwrap().take() {
            // Without per-chunk digests a digest failure cannot say which bytes are bad: drop
            // them all. With them, only the failing chunk was forgotten (in `finish_piece`);
            // every verified chunk is kept. Anything else keeps what is on disk for a resume.
            let discard =
                matches!(error, Error::DigestMismatch { .. }) && plan.chunk_sha256.is_none();
            return Err(Unverified { error, discard });
        }
        self.check_cancel().map_err(keep)?;
        let actual = match followed {
            Some(d) if !self.rewritten.load(Ordering::SeqCst) => d,
            _ => hash_file(&self.staging.file, plan.size, &self.ctl).map_err(keep)?,
        };
        if actual != plan.sha256 {
            return Err(Unverified {
                error: Error::DigestMismatch {
                    what: format!(
                        "{} from {origin} (digest from the {})",
                        self.job.target.local_name, plan.digest_source
                    ),
                    expected: plan.sha256,
                    actual,
                },
                discard: true,
            });
        }
        self.check_cancel().map_err(keep)?;
        Ok(actual)
    }

    fn check_cancel(&self) -> Result<()> {
        if self.job.cancel.is_cancelled() {
            return Err(Error::cancelled(&self.job.target.id));
        }
        Ok(())
    }
}

impl Run<'_> {
    fn stopped(&self) -> bool {
        self.abort.load(Ordering::SeqCst) || self.job.cancel.is_cancelled()
    }

    /// The origin answered a transfer started on the entry's word: with the same plan
    /// (`same`; what waits to be recorded is recorded), or not (the workers stop, nothing of
    /// theirs is recorded).
    fn settle(&self, same: bool) {
        *self.confirmed.lock().unwrap() = Some(same);
        if !same {
            self.abort.store(true, Ordering::SeqCst);
        }
        self.settled.notify_all();
    }

    /// Whether the plan is known to be the origin's (always, unless started on the entry's
    /// word and not yet, or not, confirmed).
    fn confirmed(&self) -> bool {
        *self.confirmed.lock().unwrap() == Some(true)
    }

    /// Wait for the origin's answer ([`Run::settle`]); whether it confirmed the plan.
    fn wait_confirmed(&self) -> bool {
        let confirmed = self.confirmed.lock().unwrap();
        let confirmed = self.settled.wait_while(confirmed, |c| c.is_none()).unwrap();
        *confirmed == Some(true)
    }

    fn fail(&self, e: Error) {
        let mut slot = self.error.lock().unwrap();
        if slot.is_none() {
            *slot = Some(e);
        }
        self.abort.store(true, Ordering::SeqCst);
    }

    fn worker(&self, records: mpsc::Sender<Record>) {
        // This connection's next range when it was sent ahead ([`Ahead`]), and the block it
        // belongs to when that block was taken off the queue for it.
        let mut ahead: Option<Ahead> = None;
        let mut next_block: Option<Block> = None;
        loop {
            if self.stopped() {
                return;
            }
            let taken = next_block.take();
            let Some(block) = taken.or_else(|| self.queue.lock().unwrap().pop_front()) else {
                return;
            };
            // A stop between two segments of the block ends the worker as at the loop's top.
            let res = block.iter().enumerate().try_for_each(|(k, seg)| {
                if self.stopped() {
                    return Ok(());
                }
                // What this connection fetches after `seg`: the block's next segment, else the
                // first of the next block, taken off the queue only when it is sent ahead
                // (moments before this connection is free).
                let mut following = || match block.get(k + 1) {
                    Some(s) => Some(s.clone()),
                    None => {
                        if next_block.is_none() {
                            next_block = self.queue.lock().unwrap().pop_front();
                        }
                        next_block.as_ref().and_then(|b| b.first().cloned())
                    }
                };
                self.fetch_segment(seg, &records, &mut ahead, &mut following)?;
                let finished = {
                    let mut open = self.open_segments.lock().unwrap();
                    open[seg.piece] -= 1;
                    open[seg.piece] == 0
                };
                if finished {
                    self.finish_piece(seg.piece, &records)
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

    /// A piece is complete: check its own digest when the manifest has one, then have it made
    /// durable and recorded (on the recorder thread: this connection goes on receiving).
    fn finish_piece(&self, i: usize, records: &mpsc::Sender<Record>) -> Result<()> {
        let piece = &self.pieces[i];
        if let Some(list) = &self.plan.chunk_sha256 {
            let want = list[i];
            let mut h = Hasher::new();
            hash_region(&self.staging.file, piece.offset, piece.len, &mut h)?;
            let got = h.finish();
            if got != want {
                // Only this chunk's bytes are known bad: forget them, keep every other chunk.
                // (Through the recorder, after any range of it still queued there.)
                let _ = records.send(Record::Forget(piece.index));
                if self.refetched.lock().unwrap().insert(i) {
                    self.rewritten.store(true, Ordering::SeqCst);
                    // Bytes resumed from an earlier run or origin, or a prefix a broken answer
                    // left before a retry, may be the bad ones: fetch the whole chunk once more
                    // from its first byte before giving up on this origin.
                    self.done_bytes.fetch_sub(piece.len, Ordering::SeqCst);
                    self.open_segments.lock().unwrap()[i] = 1;
                    self.queue.lock().unwrap().push_back(vec![Segment {
                        piece: i,
                        start: 0,
                        end: piece.len,
                    }]);
                    return Ok(());
                }
                return Err(Error::DigestMismatch {
                    what: format!("chunk {} ({})", piece.index, self.urls[i]),
                    expected: want,
                    actual: got,
                });
            }
        }
        let _ = records.send(Record::Done(piece.index));
        Ok(())
    }

    /// The recorder thread: fsync and record what the workers finished, in order, once the plan
    /// is confirmed (nothing of an unconfirmed one). A failure stops the run.
    fn record(&self, records: mpsc::Receiver<Record>) {
        let confirmed = self.wait_confirmed();
        for r in records {
            if !confirmed {
                continue;
            }
            let res = match r {
                Record::Done(index) => self.staging.mark_done(index),
                Record::Range(index, a, b) => self.staging.mark_range(index, a, b),
                Record::Forget(index) => self.staging.forget(index),
            };
            if let Err(e) = res {
                self.fail(e);
            }
        }
    }

    /// Bytes `[at, at + n)` of the artifact are written: the follower may hash them. It is
    /// woken when a write crosses a [`FOLLOW_STEP`] boundary or ends a segment (`last`), not for
    /// every small write (it also looks by itself every 50 ms).
    fn wrote(&self, at: u64, n: u64, last: bool) {
        let mut w = self.written.lock().unwrap();
        add_range(&mut w, (at, at + n));
        if last || at / FOLLOW_STEP != (at + n) / FOLLOW_STEP {
            self.wrote.notify_all();
        }
    }

    fn fetch_segment(
        &self,
        seg: &Segment,
        records: &mpsc::Sender<Record>,
        ahead: &mut Option<Ahead>,
        following: &mut dyn FnMut() -> Option<Segment>,
    ) -> Result<()> {
        if seg.start == seg.end {
            return Ok(());
        }
        let mut written = 0u64;
        let mut etag: Option<String> = None;
        let res = with_retries(self.job.config, &self.ctl, &self.urls[seg.piece], || {
            self.try_segment(seg, &mut written, &mut etag, records, ahead, following)
        });
        if res.is_err() && self.confirmed() {
            // Stopping (cancel, SIGTERM, this origin given up): what this segment has on disk
            // is kept for the next run, when each chunk's digest can check it (only on a plan
            // the origin confirmed).
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
        records: &mpsc::Sender<Record>,
        ahead: &mut Option<Ahead>,
        following: &mut dyn FnMut() -> Option<Segment>,
    ) -> Result<()> {
        let piece = &self.pieces[seg.piece];
        let Answer {
            mut body,
            answered,
            latency,
        } = self.answer(seg, written, etag, ahead)?;
        let mut sent_next = false;
        let seg_len = seg.end - seg.start;
        let mut buf = vec![0u8; 256 * 1024];
        // Where this attempt's bytes not yet handed to the disk begin.
        let mut unflushed = piece.offset + seg.start + *written;
        while *written < seg_len {
            if self.stopped() {
                return Err(Error::cancelled(&self.job.target.id));
            }
            // Never ask for more than the segment still needs: extra bytes a server sends are
            // never read, let alone written.
            let want = (seg_len - *written).min(buf.len() as u64) as usize;
            let n = body.read(&mut buf[..want])?;
            self.job.received.fetch_add(n as u64, Ordering::SeqCst);
            if n == 0 {
                return Err(Error::transport(
                    &self.urls[seg.piece],
                    format!("body ended after {} of {} bytes", *written, seg_len),
                ));
            }
            let at = piece.offset + seg.start + *written;
            debug_assert!(at + n as u64 <= self.plan.size);
            self.staging.file.write_all_at(&buf[..n], at)?;
            let before = *written;
            *written += n as u64;
            let end = at + n as u64;
            if end - unflushed >= WRITEBACK_STEP || *written == seg_len {
                start_writeback(&self.staging.file, unflushed, end);
                unflushed = end;
            }
            self.wrote(at, n as u64, *written == seg_len);
            if before / RANGE_RECORD_STEP != *written / RANGE_RECORD_STEP {
                let _ = records.send(Record::Range(piece.index, seg.start, seg.start + *written));
            }
            if !sent_next
                && let Some(lead) = lead_bytes(*written, answered.elapsed(), latency)
                && seg_len - *written <= lead
            {
                sent_next = true;
                *ahead = self.send_ahead(following);
            }
            self.progress(n as u64);
        }
        body.finish();
        Ok(())
    }

    /// The answer to the request for the rest of `seg` (taken up from the one sent ahead when
    /// it is that range), checked: the range asked for, or the whole piece (then `written`
    /// starts over, skipping what lies before the segment).
    fn answer(
        &self,
        seg: &Segment,
        written: &mut u64,
        etag: &mut Option<String>,
        ahead: &mut Option<Ahead>,
    ) -> Result<Answer> {
        let piece = &self.pieces[seg.piece];
        let url = &self.urls[seg.piece];
        let start = seg.start + *written;
        let last = seg.end - 1;
        let protocol = |message: String| Error::protocol(url, message);
        let mismatch = |message: String| Error::size_mismatch(url, message);
        let validator = if *written > 0 { etag.as_deref() } else { None };
        // This range went out ahead when the previous one was ending: take up its answer.
        let sent_ahead = ahead
            .take()
            .filter(|a| (a.seg.piece, a.seg.start, a.seg.end) == (seg.piece, start, seg.end));
        let (sent, mut body) = match sent_ahead {
            Some(a) if validator.is_none() => (a.pending.sent_at(), a.pending.wait(&self.ctl)?),
            _ => (
                Instant::now(),
                self.job
                    .http
                    .get(url, Some((start, last)), validator, &self.ctl)?,
            ),
        };
        // How long this answer took to start: the next range goes out that long before this
        // one ends.
        let answered = Instant::now();
        let latency = answered.duration_since(sent);
        match body.meta.status {
            206 => {
                let verdict = range_verdict((start, last), body.meta.content_range, piece.len);
                if verdict != RangeVerdict::Ok {
                    let message = format!(
                        "asked for bytes {start}-{last} of {}, got Content-Range {:?}",
                        piece.len, body.meta.content_range
                    );
                    return Err(match verdict {
                        RangeVerdict::OtherFile => mismatch(message),
                        _ => protocol(message),
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
                if *written > 0 {
                    self.rewritten.store(true, Ordering::SeqCst);
                }
                *written = 0;
                body.skip(seg.start)?;
            }
        }
        if body.meta.etag.is_some() {
            *etag = body.meta.etag.clone();
        }
        Ok(Answer {
            body,
            answered,
            latency,
        })
    }

    /// This connection's next range (`following`), sent now so that its answer's latency
    /// passes while the current one's last bytes arrive; `None` when there is none or it could
    /// not be sent (it is asked for again in its turn).
    fn send_ahead(&self, following: &mut dyn FnMut() -> Option<Segment>) -> Option<Ahead> {
        let n = following().filter(|n| n.start < n.end)?;
        let pending = self
            .job
            .http
            .get_later(&self.urls[n.piece], (n.start, n.end - 1), &self.ctl)
            .ok()?;
        Some(Ahead { seg: n, pending })
    }

    /// `n` more bytes done, reported in steps of at most [`PROGRESS_STEP`] however large the
    /// write: a small model still reports many percentages.
    fn progress(&self, n: u64) {
        let mut left = n;
        while left > 0 {
            let step = left.min(PROGRESS_STEP);
            left -= step;
            let done = self.done_bytes.fetch_add(step, Ordering::SeqCst) + step;
            (self.job.on_event)(Event::Progress {
                done,
                total: self.plan.size,
            });
        }
    }
}

/// A range request's answer, checked, and when it came: the next range is sent ahead
/// `latency` before this one ends.
struct Answer {
    body: crate::http::Body,
    answered: Instant,
    latency: Duration,
}

/// A connection's next range, sent before its current answer ended ([`Http::get_later`]) so
/// that the next answer's latency passes while this one's last bytes arrive: one request of
/// a connection ahead at most, taken up by the next [`Run::try_segment`] of that range.
struct Ahead {
    seg: Segment,
    pending: crate::http::Pending,
}

/// How many bytes before the end of an answer its connection's next range is sent: what it
/// delivers in `latency` at its rate so far; `None` until a rate is known. Pure.
pub(crate) fn lead_bytes(written: u64, elapsed: Duration, latency: Duration) -> Option<u64> {
    if written < LEAD_MIN_BYTES || elapsed < LEAD_MIN_TIME {
        return None;
    }
    let rate = written as f64 / elapsed.as_secs_f64();
    Some((rate * latency.as_secs_f64()) as u64)
}

const LEAD_MIN_BYTES: u64 = 256 * 1024;
const LEAD_MIN_TIME: Duration = Duration::from_millis(50);

/// What the recorder thread makes durable and records ([`Staging::mark_done`],
/// [`Staging::mark_range`], [`Staging::forget`]).
enum Record {
    Done(u32),
    Range(u32, u64, u64),
    Forget(u32),
}

/// The largest step of one [`Event::Progress`] (a write of more reports several).
const PROGRESS_STEP: u64 = 8 * 1024;

/// Bytes hashed per read-back of the follower.
const FOLLOW_STEP: u64 = 1 << 20;
/// Bytes a worker writes between two writeback starts.
const WRITEBACK_STEP: u64 = 8 << 20;

/// The artifact's SHA-256, computed in artifact order over the bytes as they reach the staging
/// file (read back at once, from the page cache), so that when the transfer ends only its last
/// bytes are left to hash.
struct Follower<'r, 'a> {
    run: &'r Run<'a>,
    hasher: Hasher,
    /// Bytes `[0, pos)` are hashed.
    pos: u64,
}

impl<'r, 'a> Follower<'r, 'a> {
    fn new(run: &'r Run<'a>) -> Self {
        Self {
            run,
            hasher: Hasher::new(),
            pos: 0,
        }
    }

    /// The digest of the whole artifact, or `None` when the run stopped first or a byte was
    /// written twice (the caller then hashes the file whole).
    fn follow(mut self) -> Option<Sha256Digest> {
        let size = self.run.plan.size;
        let mut buf = vec![0u8; FOLLOW_STEP as usize];
        while self.pos < size {
            let ready = self.wait_for_bytes()?;
            while self.pos < ready {
                if self.run.rewritten.load(Ordering::SeqCst) {
                    return None;
                }
                let n = (ready - self.pos).min(FOLLOW_STEP) as usize;
                self.run
                    .staging
                    .file
                    .read_exact_at(&mut buf[..n], self.pos)
                    .ok()?;
                self.hasher.update(&buf[..n]);
                self.pos += n as u64;
            }
        }
        Some(self.hasher.finish())
    }

    /// Wait until bytes past `pos` are on disk; the end of the contiguous run from `pos`.
    /// `None` when none will come (stopped, every worker returned, a byte written twice).
    fn wait_for_bytes(&self) -> Option<u64> {
        let run = self.run;
        let mut written = run.written.lock().unwrap();
        loop {
            if run.rewritten.load(Ordering::SeqCst) || run.stopped() {
                return None;
            }
            if let Some(&(a, b)) = written
                .iter()
                .find(|(a, b)| *a <= self.pos && self.pos < *b)
            {
                debug_assert!(a <= self.pos);
                return Some(b);
            }
            if run.workers_done.load(Ordering::SeqCst) {
                return None;
            }
            written = run
                .wrote
                .wait_timeout(written, Duration::from_millis(50))
                .unwrap()
                .0;
        }
    }
}

/// Start writing `[from, to)` back to the disk without waiting (`sync_file_range`), so the
/// install's fsync, which gives durability, only waits for the last bytes; failures are ignored.
fn start_writeback(file: &fs_err::File, from: u64, to: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor; the call only schedules I/O on it.
        unsafe {
            libc::sync_file_range(
                file.as_raw_fd(),
                from as libc::off64_t,
                (to - from) as libc::off64_t,
                libc::SYNC_FILE_RANGE_WRITE,
            );
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, from, to);
}

/// What a `206`'s `Content-Range` says about the file behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangeVerdict {
    /// The range asked for, of a file of the planned length.
    Ok,
    /// The origin's file has another length than the manifest implies (its total differs; a
    /// shorter file also clamps the range): "not yet" ([`Error::is_not_yet`]), e.g. a store
    /// half-way through a republish.
    OtherFile,
    /// Another range of a file of the right length, or no usable header: a broken server.
    Broken,
}

/// The rule for a `206` answer to a request for bytes `start..=last` of a piece of `len`
/// bytes. Pure.
pub(crate) fn range_verdict(
    (start, last): (u64, u64),
    content_range: Option<(u64, u64, Option<u64>)>,
    len: u64,
) -> RangeVerdict {
    match content_range {
        Some((_, _, Some(total))) if total != len => RangeVerdict::OtherFile,
        Some((a, b, _)) if a == start && b == last => RangeVerdict::Ok,
        _ => RangeVerdict::Broken,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The next range goes out as many bytes before the end as the answer delivers in its own
    /// latency, once its rate is known.
    #[test]
    fn lead_table() {
        let ms = Duration::from_millis;
        let mib = 1u64 << 20;
        let cases = [
            // 16 MiB in 1 s, 20 ms to answer: a third of a MiB ahead.
            (16 * mib, ms(1000), ms(20), Some(16 * mib / 50)),
            // 32 MiB/s, 100 ms: 3.2 MiB ahead.
            (32 * mib, ms(1000), ms(100), Some(32 * mib / 10)),
            (8 * mib, ms(2000), ms(0), Some(0)),
            // Too early to know the rate.
            (100 * 1024, ms(1000), ms(20), None),
            (mib, ms(10), ms(20), None),
        ];
        for (written, elapsed, latency, want) in cases {
            let got = lead_bytes(written, elapsed, latency);
            match (got, want) {
                (Some(g), Some(w)) => assert!(g.abs_diff(w) <= 1, "{g} vs {w}"),
                _ => assert_eq!(got, want),
            }
        }
    }

    /// Every disagreement between the planned length and the origin's file is "other file"
    /// (not yet); only a wrong answer about a file of the right length is a broken server.
    #[test]
    fn range_verdict_table() {
        use RangeVerdict::*;
        let cases = [
            ((0, 99), Some((0, 99, Some(100))), 100, Ok),
            ((0, 99), Some((0, 99, None)), 100, Ok),
            ((50, 99), Some((50, 99, Some(100))), 100, Ok),
            // Longer file: the range is as asked, the total is not.
            ((0, 99), Some((0, 99, Some(150))), 100, OtherFile),
            // Shorter file: the server clamps the range to its end.
            ((0, 99), Some((0, 79, Some(80))), 100, OtherFile),
            ((50, 99), Some((50, 79, Some(80))), 100, OtherFile),
            // Right length, wrong range: a broken server.
            ((0, 99), Some((10, 99, Some(100))), 100, Broken),
            ((0, 99), Some((0, 79, None)), 100, Broken),
            ((0, 99), None, 100, Broken),
        ];
        for (asked, got, len, want) in cases {
            assert_eq!(
                range_verdict(asked, got, len),
                want,
                "{asked:?} {got:?} of {len}"
            );
        }
    }
}
