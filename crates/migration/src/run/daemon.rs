//! The daemon's request protocol over the memory params, as the UI speaks it:
//! `DownloadAllModels=1` (every downloadable model), `ModelToDownload=<id>` (one model),
//! `CancelModelDownload=1` (stop the running one), answered in `ModelDownloadProgress`.
//!
//! Unlike the Python manager, each request is cleared once handled, and the cancel flag with it,
//! so neither a stale request nor a stale cancel survives; a `ModelToDownload` the UI replaced
//! while the previous one ran is a new request and is served next, not dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use downloader::{CancelToken, Downloader};
use manifest::{ModelEntry, ModelId};

use crate::error::{Error, Result, one_line};
use crate::report::progress::{DisplayName, FailReason, Progress};
use crate::run::downloads::{download_all, download_model};
use crate::run::manager::{Run, refresh};
use crate::state::device::Device;
use crate::state::effects::lock;
use crate::state::params::{ParamRead, keys};

/// One request read from the memory params.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    DownloadAll,
    /// `raw` is the param's value as read; it is cleared only while it still says the same.
    Download {
        raw: String,
        id: Option<ModelId>,
    },
}

/// The pending request in the memory params `memory`, `DownloadAllModels` first (upstream's
/// priority). A request param that cannot be read is an error naming it
/// ([`sweep_bad_params`] removes it first in the daemon).
pub fn read_request(memory: &crate::state::params::Params) -> Result<Option<Request>> {
    if memory.get_bool(keys::DOWNLOAD_ALL_MODELS)? {
        return Ok(Some(Request::DownloadAll));
    }
    Ok(match memory.read(keys::MODEL_TO_DOWNLOAD) {
        ParamRead::Absent => None,
        ParamRead::Value(raw) => Some(Request::Download {
            id: raw.to_ascii_lowercase().parse().ok(),
            raw,
        }),
        ParamRead::Unreadable(e) => return Err(e),
    })
}

/// The memory params the UI writes a request, its one-request GPU override or a cancel to.
pub const REQUEST_KEYS: [&str; 4] = [
    keys::DOWNLOAD_ALL_MODELS,
    keys::MODEL_TO_DOWNLOAD,
    keys::CANCEL_MODEL_DOWNLOAD,
    keys::ALLOW_GPU_WITHOUT_GPU,
];

/// A request param that could not be read (over the size cap, a FIFO, a directory, a symlink
/// to a device), removed by [`sweep_bad_params`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("request param {key} ignored: {problem}")]
pub struct BadParam {
    pub key: &'static str,
    /// Why it could not be read (names the path), and whether removing it failed.
    pub problem: String,
}

/// Remove every request param of `memory` that cannot be read (see [`BadParam`]), so no bad
/// one stops the daemon or is read again; the caller reports them. Never fails.
pub fn sweep_bad_params(memory: &crate::state::params::Params) -> Vec<BadParam> {
    let mut bad = Vec::new();
    for key in REQUEST_KEYS {
        if let ParamRead::Unreadable(e) = memory.read(key) {
            let why = one_line(&crate::state::params::unreadable(&e));
            let problem = match memory.discard(key) {
                Ok(()) => format!("{why}; removed"),
                Err(r) => format!("{why}; could not remove it: {}", one_line(&r.to_string())),
            };
            bad.push(BadParam { key, problem });
        }
    }
    bad
}

/// Whether a `CancelModelDownload` found when a request starts is for that request: written
/// after the request was (a cancel written before it, or with no time, was for an earlier one).
/// File times are coarse (a clock tick), so the same time counts as "before". Pure.
pub fn cancel_applies(
    cancel_written: Option<std::time::SystemTime>,
    request_written: Option<std::time::SystemTime>,
) -> bool {
    match (cancel_written, request_written) {
        (Some(c), Some(r)) => c > r,
        // The request param is gone already (the UI withdrew it): the cancel is for it.
        (Some(_), None) => true,
        (None, _) => false,
    }
}

/// The memory param that holds `request`.
fn request_key(request: &Request) -> &'static str {
    match request {
        Request::DownloadAll => keys::DOWNLOAD_ALL_MODELS,
        Request::Download { .. } => keys::MODEL_TO_DOWNLOAD,
    }
}

/// The progress text a failed request ends with.
pub fn failure_progress(e: &Error) -> Progress {
    match e {
        Error::Download(downloader::Error::Cancelled { .. }) => Progress::Cancelled,
        Error::Download(d @ downloader::Error::ManifestUnavailable { .. }) => {
            match crate::state::trust_state::refusal(d) {
                Some(r) => Progress::ManifestRefused(r),
                None => Progress::Offline,
            }
        }
        Error::ExternalGpuRequired { .. } => Progress::ExternalGpuRequired,
        other => Progress::Failed(FailReason::of(other)),
    }
}

/// Write `p` to the UI's `ModelDownloadProgress`, if it is for the UI ([`Progress::for_ui`]).
fn show_in_ui(device: &Device, p: &Progress) {
    if p.for_ui() {
        let _ = device
            .memory
            .put(keys::MODEL_DOWNLOAD_PROGRESS, &p.to_string());
    }
}

/// Where the daemon's progress goes besides the UI: its log (each finished transfer, one line)
/// and, for a foreground `run` on a terminal, the terminal (everything else: the bar, texts).
#[derive(Clone, Copy)]
pub struct Outlets<'a> {
    pub log: &'a (dyn Fn(&str) + Sync),
    pub terminal: Option<&'a (dyn Fn(&Progress) + Sync)>,
}

impl Outlets<'_> {
    /// `p` to the UI, the log or the terminal, as [`Outlets`] says.
    fn say(&self, device: &Device, p: &Progress) {
        show_in_ui(device, p);
        match p {
            Progress::Fetched(f) => (self.log)(&f.to_string()),
            _ => {
                if let Some(t) = self.terminal {
                    t(p)
                }
            }
        }
    }
}

/// Serve one request to the end; returns the final progress (written to
/// `ModelDownloadProgress` too).
pub fn serve(
    device: &Device,
    dl: &Downloader,
    request: &Request,
    cancel: &CancelToken,
) -> Progress {
    let say = |p: &Progress| show_in_ui(device, p);
    let last =
        serve_outcome(device, dl, request, cancel, &say).unwrap_or_else(|e| failure_progress(&e));
    say(&last);
    last
}

fn serve_outcome(
    device: &Device,
    dl: &Downloader,
    request: &Request,
    cancel: &CancelToken,
    say: &(dyn Fn(&Progress) + Sync),
) -> Result<Progress> {
    match request {
        Request::DownloadAll => {
            // Each model's percentages name it (`"<name>: 42%"`), not a bare percentage.
            let current = std::sync::Mutex::new(None::<DisplayName>);
            let start = |entry: &ModelEntry, before: bool| {
                if before {
                    let name = DisplayName::of(entry);
                    say(&Progress::Downloading(name.clone()));
                    *lock(&current) = Some(name);
                }
            };
            let named = |p: &Progress| match (p, &*lock(&current)) {
                (Progress::Percent(t), Some(name)) => say(&Progress::PercentOf(name.clone(), *t)),
                _ => say(p),
            };
            download_all(device, dl, cancel, &start, &named).map(|all| match all.cancelled {
                true => Progress::Cancelled,
                false => Progress::AllDownloaded,
            })
        }
        Request::Download { id: Some(id), .. } => {
            // Acknowledged at once, before any network: the name from the stored catalog.
            if let Some(name) = catalog_name(device, id) {
                say(&Progress::Downloading(name));
            }
            use crate::rules::contract::{ModelKind, canonicalise, kind};
            download_model(device, dl, id, cancel, say).map(|_| match kind(&canonicalise(id)) {
                ModelKind::BuiltIn => Progress::BuiltinAlreadyDownloaded,
                ModelKind::Local => Progress::LocalNothingToDownload,
                // Also when a verified copy was kept: upstream's text, which the UI takes as
                // "the model is there".
                ModelKind::Catalog => Progress::Downloaded,
            })
        }
        Request::Download { id: None, .. } => Ok(Progress::Failed(FailReason::NotAModel)),
    }
}

/// The display name of catalog model `id` (`None`: no stored catalog, or not in it).
fn catalog_name(device: &Device, id: &ModelId) -> Option<DisplayName> {
    let catalog = device.catalog().ok().flatten()?;
    let canonical = crate::rules::contract::canonical_id(id.as_str());
    catalog
        .models()
        .iter()
        .find(|e| e.id().as_str() == canonical)
        .map(DisplayName::of)
}

/// Clear a handled request and the cancel flag in the memory params `memory`.
pub fn finish(memory: &crate::state::params::Params, request: &Request) -> Result<()> {
    match request {
        Request::DownloadAll => memory.discard(keys::DOWNLOAD_ALL_MODELS)?,
        Request::Download { raw, .. } => match memory.read(keys::MODEL_TO_DOWNLOAD) {
            ParamRead::Value(v) if v != *raw => {} // replaced meanwhile: the next request
            _ => memory.discard(keys::MODEL_TO_DOWNLOAD)?,
        },
    }
    memory.discard(keys::CANCEL_MODEL_DOWNLOAD)
}

/// Why a running request stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// The UI set `CancelModelDownload`: the request is over.
    Cancelled,
    /// The car went onroad: the request stays pending and is served once offroad.
    Onroad,
    /// `IsOnroad` could no longer be read: not taken as offroad, so the download stops as for
    /// [`Interrupt::Onroad`] and the request waits until it can be read.
    RoadUnreadable,
    /// The daemon is stopping (SIGTERM): the request stays for the next start.
    Stopping,
}

/// What of `CancelModelDownload` stops a job.
#[derive(Debug, Clone, Copy)]
enum CancelBy {
    /// Any cancel flag set (a request, whose stale flag was dropped at its start).
    AnyFlag,
    /// Only a flag written after the job started: not the one there at its start, whose write
    /// time is given (a refresh, which no flag written before it was meant for).
    WrittenAfter(Option<std::time::SystemTime>),
}

/// A cancel token that trips within 50 ms when the UI sets `CancelModelDownload` (as
/// `cancel_by` says), the car goes onroad, or `stopping` is set; it records which, until `done`
/// is set.
fn watch(
    device: &Device,
    stopping: &Arc<AtomicBool>,
    done: &Arc<AtomicBool>,
    cancel_by: CancelBy,
) -> (
    CancelToken,
    Arc<std::sync::Mutex<Option<Interrupt>>>,
    thread::JoinHandle<()>,
) {
    let token = CancelToken::new();
    let why = Arc::new(std::sync::Mutex::new(None));
    let (t, w) = (token.clone(), why.clone());
    let device = device.clone();
    let (stopping, done) = (stopping.clone(), done.clone());
    let h = thread::spawn(move || {
        while !done.load(Ordering::SeqCst) {
            let cancelled = || {
                device
                    .memory
                    .get_bool(keys::CANCEL_MODEL_DOWNLOAD)
                    .unwrap_or(false)
                    && match cancel_by {
                        CancelBy::AnyFlag => true,
                        CancelBy::WrittenAfter(before) => {
                            device.memory.modified(keys::CANCEL_MODEL_DOWNLOAD) != before
                        }
                    }
            };
            let road = Road::of(device.is_onroad());
            if let Some(r) = interrupt(stopping.load(Ordering::SeqCst), &road, cancelled) {
                *lock(&w) = Some(r);
                t.cancel();
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
    });
    (token, why, h)
}

/// Why a running job stops, if it does: the daemon stopping, then the road (onroad, or an
/// `IsOnroad` that cannot be read, which is never taken as offroad), then a cancel that applies
/// (`cancelled`, read only when nothing before it stops the job). Pure.
fn interrupt(stopping: bool, road: &Road, cancelled: impl FnOnce() -> bool) -> Option<Interrupt> {
    match road {
        _ if stopping => Some(Interrupt::Stopping),
        Road::Onroad => Some(Interrupt::Onroad),
        Road::Unreadable(_) => Some(Interrupt::RoadUnreadable),
        Road::Offroad => cancelled().then_some(Interrupt::Cancelled),
    }
}

/// How one served request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
    /// Handled (done, failed for good, or cancelled by the UI): the request was cleared.
    Finished(Progress),
    /// Not over: onroad, stopping, no network, or the store not complete yet ("not yet"). The
    /// request is kept and served again after `retry_in`.
    Kept {
        progress: Progress,
        why: String,
        retry_in: Duration,
    },
    /// Failed for good (the request was cleared): what the UI was shown, and the error on one
    /// line, each origin's reason included (for the log).
    Failed { progress: Progress, why: String },
}

/// Whether a failure is "not yet": an origin's files disagree with its manifest.
fn is_not_yet(e: &Error) -> bool {
    matches!(e, Error::Download(d) if d.is_not_yet())
}

/// Whether a failure means "try again when the network is back" (never "failed for good").
fn is_offline(e: &Error) -> bool {
    match e {
        Error::Download(d) => d.is_offline(),
        Error::NoCatalog { .. } => true,
        _ => false,
    }
}

/// How soon the daemon asks a store that was "not yet" again, a refresh or a request:
/// [`crate::rules::choice::NOT_YET_RETRY`], or the refresh interval when that is shorter. Pure.
pub fn not_yet_wait(config: &DaemonConfig) -> Duration {
    crate::rules::choice::NOT_YET_RETRY.min(config.refresh_every)
}

/// How long the daemon waits after the `streak`-th "not yet" refresh in a row: [`not_yet_wait`],
/// doubled for each further one, never longer than the refresh interval (a bounded backoff, as
/// for any failure; a store that stays unchanged costs no transfer meanwhile, see
/// `downloader::stale_store`). Pure.
pub fn not_yet_backoff(config: &DaemonConfig, streak: u32) -> Duration {
    let factor = 1u32 << streak.saturating_sub(1).min(16);
    not_yet_wait(config)
        .saturating_mul(factor)
        .min(config.refresh_every.max(not_yet_wait(config)))
}

/// One poll: serve the pending request (watching for a cancel, stopping early when `stopping`
/// is set), or drop a leftover cancel flag when nothing runs. Returns the request served, if
/// any, and whether it was kept, and for how long (`config`'s retry intervals).
pub fn poll(
    device: &Device,
    dl: &Downloader,
    stopping: &Arc<AtomicBool>,
    config: &DaemonConfig,
    out: Outlets<'_>,
) -> Result<Option<(Request, Served)>> {
    // Kept for later, nothing shown but the stop: onroad, an unreadable road, stopping.
    let stopped = |why: &str| Served::Kept {
        progress: Progress::Cancelled,
        why: why.into(),
        retry_in: config.retry_offline,
    };
    let Some(request) = read_request(&device.memory)? else {
        // (One that cannot be read is the sweep's to remove and report.)
        if matches!(
            device.memory.read(keys::CANCEL_MODEL_DOWNLOAD),
            ParamRead::Value(_)
        ) {
            // Nothing to cancel: a leftover flag must not cancel the next download.
            device.memory.discard(keys::CANCEL_MODEL_DOWNLOAD)?;
        }
        return Ok(None);
    };
    // A cancel written before this request was for an earlier one.
    if !cancel_applies(
        device.memory.modified(keys::CANCEL_MODEL_DOWNLOAD),
        device.memory.modified(request_key(&request)),
    ) {
        device.memory.discard(keys::CANCEL_MODEL_DOWNLOAD)?;
    }
    if device.is_onroad()? {
        // Served once the car is offroad; not a byte fetched, not a file touched.
        return Ok(Some((request, stopped("deferred while driving"))));
    }
    let done = Arc::new(AtomicBool::new(false));
    let (cancel, why, watcher) = watch(device, stopping, &done, CancelBy::AnyFlag);
    let say = |p: &Progress| out.say(device, p);
    let outcome = serve_outcome(device, dl, &request, &cancel, &say);
    done.store(true, Ordering::SeqCst);
    let _ = watcher.join();
    let interrupt = *lock(&why);
    let served = match (outcome, interrupt) {
        (Err(_), Some(Interrupt::Onroad)) | (Err(Error::Onroad { .. }), _) => {
            stopped("deferred while driving")
        }
        (Err(_), Some(Interrupt::RoadUnreadable)) => {
            stopped("IsOnroad cannot be read, so it is not taken as offroad; kept until it can be")
        }
        (Err(_), Some(Interrupt::Stopping)) => {
            stopped("stopping; kept for the next start (finished chunks are kept)")
        }
        // The store is half-way through a republish: not a failure; asked again soon.
        (Err(e), _) if is_not_yet(&e) => {
            let wait = not_yet_wait(config);
            Served::Kept {
                progress: Progress::NotYet(wait),
                why: format!(
                    "not yet: the store's files do not match its manifest yet; nothing counted \
                     as a failure; next try in {} s: {}",
                    wait.as_secs(),
                    one_line(&e.to_string())
                ),
                retry_in: wait,
            }
        }
        (Err(e), _) if is_offline(&e) => Served::Kept {
            progress: Progress::Offline,
            why: format!("no network, will retry: {}", one_line(&e.to_string())),
            retry_in: config.retry_offline,
        },
        (Ok(p), _) => Served::Finished(p),
        (Err(e), _) => Served::Failed {
            progress: failure_progress(&e),
            why: one_line(&e.to_string()),
        },
    };
    match &served {
        Served::Finished(p) | Served::Failed { progress: p, .. } => {
            say(p);
            finish(&device.memory, &request)?;
        }
        Served::Kept { progress, .. } => say(progress),
    }
    Ok(Some((request, served)))
}

/// While a refresh runs (`done` unset), acknowledge each request the UI writes in
/// `ModelDownloadProgress` within a fraction of a second, whatever the origins do (a hanging
/// store holds a refresh for its deadline); it is served when the refresh ends.
fn acknowledge_while(
    device: &Device,
    done: &AtomicBool,
    stopping: &AtomicBool,
    log: &(dyn Fn(&str) + Sync),
) {
    let mut acknowledged: Option<Request> = None;
    while !done.load(Ordering::SeqCst) && !stopping.load(Ordering::SeqCst) {
        if let Ok(Some(request)) = read_request(&device.memory)
            && acknowledged.as_ref() != Some(&request)
        {
            show_in_ui(device, &Progress::AfterRefresh);
            log(&format!(
                "{}: received; served when the running refresh ends",
                describe(&request)
            ));
            acknowledged = Some(request);
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// Remove the request params that cannot be read, and say so in `ModelDownloadProgress` and
/// the log; then log what was read as absent since the last poll (params and state records).
fn report_bad_params(device: &Device, say: &dyn Fn(&Progress), log: &dyn Fn(&str)) {
    for bad in sweep_bad_params(&device.memory) {
        log(&bad.to_string());
        say(&Progress::Failed(FailReason::BadRequest));
    }
    for w in device.warnings().take() {
        log(&format!("warning: {w}"));
    }
}

/// Tuning of the daemon loop.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// How often the memory params are polled.
    pub poll: Duration,
    /// How often the manifest is refreshed (also once when the car goes offroad).
    pub refresh_every: Duration,
    /// How soon a refresh or request that found no network is tried again.
    pub retry_offline: Duration,
    /// What the automatic refresh may fetch of one artifact per UTC day
    /// ([`crate::rules::budget`]); requests from the UI are served past it (and counted).
    pub daily_budget: crate::rules::budget::DailyBudget,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(1),
            refresh_every: Duration::from_secs(3600),
            retry_offline: Duration::from_secs(30),
            daily_budget: crate::rules::budget::DailyBudget::default(),
        }
    }
}

/// What the daemon knows of `IsOnroad` at one poll.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Road {
    Offroad,
    Onroad,
    /// It cannot be read (over the size cap, not a regular file): not taken as "offroad", so
    /// nothing is refreshed or downloaded until it can be read. Why, on one line.
    Unreadable(String),
}

impl Road {
    /// The daemon's reading of [`Device::is_onroad`].
    pub fn of(read: Result<bool>) -> Road {
        match read {
            Ok(false) => Road::Offroad,
            Ok(true) => Road::Onroad,
            Err(e) => Road::Unreadable(one_line(&e.to_string())),
        }
    }
}

/// The log line for `IsOnroad` going from `before` to `now`, if the change warrants one: each
/// change is logged once, never each poll (an unreadable `IsOnroad` once when it becomes
/// unreadable, with why, and once when it can be read again). Pure.
pub fn road_change(before: &Road, now: &Road) -> Option<String> {
    const DEFERRED: &str = "deferred while driving: no refresh, purge or download until offroad";
    const OFFROAD: &str = "offroad: refreshing and serving pending requests";
    Some(match (before, now) {
        (Road::Unreadable(_), Road::Unreadable(_)) => return None,
        (a, b) if a == b => return None,
        (_, Road::Unreadable(why)) => format!(
            "IsOnroad cannot be read, so it is not taken as offroad: no refresh, purge or \
             download until it can be read ({why})"
        ),
        (Road::Unreadable(_), Road::Onroad) => format!("IsOnroad can be read again; {DEFERRED}"),
        (Road::Unreadable(_), Road::Offroad) => format!("IsOnroad can be read again; {OFFROAD}"),
        (_, Road::Onroad) => DEFERRED.to_string(),
        (_, Road::Offroad) => OFFROAD.to_string(),
    })
}

/// A request as the log names it.
pub(crate) fn describe(r: &Request) -> String {
    match r {
        Request::DownloadAll => "download all".into(),
        Request::Download { raw, .. } => format!("download {raw}"),
    }
}

/// The daemon loop: refresh at start, every `refresh_every` and when the car goes offroad;
/// serve requests every `poll`; nothing at all while onroad (requests wait); no automatic
/// refresh on a metered network (user requests are still served). Returns when `stopping` is
/// set (SIGTERM), within a poll step or the download's cancel latency, leaving a running
/// download resumable and its request pending. `log` gets one line at start, per job and per
/// result.
pub fn run(
    device: &Device,
    dl: &Downloader,
    config: &DaemonConfig,
    stopping: &Arc<AtomicBool>,
    log: &(dyn Fn(&str) + Sync),
    terminal: Option<&(dyn Fn(&Progress) + Sync)>,
) -> Result<()> {
    let out = Outlets { log, terminal };
    // What runs (contracts with a load receipt), on its own thread so that no refresh or
    // download delays it past the contract's republish interval; onroad too, when modeld runs.
    let done = AtomicBool::new(false);
    thread::scope(|s| {
        if device.load_receipt.is_some() {
            let done = &done;
            let device = device.clone();
            s.spawn(move || {
                let say = |p: &Progress| show_in_ui(&device, p);
                let mut running = crate::state::load_receipt::Watcher::default();
                while !stopping.load(Ordering::SeqCst) && !done.load(Ordering::SeqCst) {
                    running.tick(&device, Instant::now(), log, &say);
                    thread::sleep(Duration::from_millis(100));
                }
            });
        }
        let r = serve_loop(Daemon {
            device,
            dl,
            config,
            stopping,
            out,
        });
        done.store(true, Ordering::SeqCst);
        r
    })
}

/// What the daemon loop works with, from start to stop.
#[derive(Clone, Copy)]
struct Daemon<'a> {
    device: &'a Device,
    dl: &'a Downloader,
    config: &'a DaemonConfig,
    stopping: &'a Arc<AtomicBool>,
    out: Outlets<'a>,
}

/// What the daemon loop remembers from one poll to the next.
struct LoopState {
    road: Road,
    next_refresh: Instant,
    next_request: Instant,
    /// A refresh skipped on a metered network was logged (once, until it is not metered).
    metered_logged: bool,
    /// "Not yet" refreshes in a row (see `not_yet_backoff`).
    not_yet_streak: u32,
    /// Artifacts held back by the daily byte budget, logged once per artifact and day.
    held_logged: std::collections::BTreeSet<(String, u64)>,
    /// The progress a kept request last showed: a new request that waits for its retry is
    /// acknowledged with it at once.
    kept_progress: Option<(Request, Progress)>,
}

/// How a refresh the daemon ran ended.
struct RefreshEnded {
    result: Result<crate::run::manager::RefreshReport>,
    /// Stopped by a cancel the UI wrote while it ran.
    ui_cancelled: bool,
}

fn serve_loop(d: Daemon<'_>) -> Result<()> {
    let (device, config, log) = (d.device, d.config, d.out.log);
    log(&format!(
        "started: generation {}, models in {}, polling every {} ms, refreshing every {} s",
        device.config.generation,
        device.models_dir().display(),
        config.poll.as_millis(),
        config.refresh_every.as_secs()
    ));
    if Road::of(device.is_onroad()) == Road::Offroad {
        d.settle_new_tree();
    }
    let mut st = LoopState {
        road: Road::Offroad,
        next_refresh: Instant::now(),
        next_request: Instant::now(),
        metered_logged: false,
        not_yet_streak: 0,
        held_logged: std::collections::BTreeSet::new(),
        kept_progress: None,
    };
    while !d.stopping.load(Ordering::SeqCst) {
        report_bad_params(device, &|p: &Progress| d.say(p), log);
        let now = Road::of(device.is_onroad());
        if let Some(line) = road_change(&st.road, &now) {
            log(&line);
        }
        let was = std::mem::replace(&mut st.road, now);
        if st.road == Road::Offroad {
            if was != Road::Offroad {
                st.next_refresh = Instant::now();
                st.next_request = Instant::now();
            }
            if Instant::now() >= st.next_refresh {
                d.refresh_when_due(&mut st);
            }
            d.serve_requests(&mut st);
        }
        nap(config.poll, d.stopping);
    }
    log("stopped: any download in progress is kept and resumes at the next start");
    Ok(())
}

/// Wait `poll`, or less once `stopping` is set.
pub(crate) fn nap(poll: Duration, stopping: &AtomicBool) {
    let wake = Instant::now() + poll;
    while Instant::now() < wake && !stopping.load(Ordering::SeqCst) {
        thread::sleep(Duration::from_millis(20).min(poll));
    }
}

impl Daemon<'_> {
    fn say(&self, p: &Progress) {
        self.out.say(self.device, p)
    }

    /// A new tree: the params made safe for every reader before the first refresh goes online.
    fn settle_new_tree(&self) {
        let log = self.out.log;
        match crate::run::manager::settle_new_tree(self.device) {
            Ok(Some(from)) => log(&format!(
                "new tree: the device was on {from}; until the {} catalog is fetched everything \
                 modeld reads names the built-in (done before any network)",
                self.device.config.generation
            )),
            Ok(None) => {}
            Err(e) => log(&format!(
                "new tree: the offline first step failed (the refresh retries it): {}",
                one_line(&e.to_string())
            )),
        }
    }

    /// The refresh that is due: skipped on a metered network, else run and logged; sets when
    /// the next one is due.
    fn refresh_when_due(&self, st: &mut LoopState) {
        let log = self.out.log;
        let metered = self.device.params.get_bool(keys::NETWORK_METERED);
        if metered.unwrap_or(false) {
            if !st.metered_logged {
                log("refresh skipped: metered network (requests from the UI are still served)");
                st.metered_logged = true;
            }
            st.next_refresh = Instant::now() + self.config.retry_offline;
            return;
        }
        st.metered_logged = false;
        log("job: refresh");
        let ended = self.run_refresh();
        st.not_yet_streak = match &ended.result {
            Err(e) if !ended.ui_cancelled && is_not_yet(e) => st.not_yet_streak + 1,
            _ => 0,
        };
        let wait = self.refresh_ended(st, ended);
        st.next_refresh = Instant::now() + wait;
    }

    /// One refresh held to the daily byte budget (a UI request is not), stopped by SIGTERM, the
    /// car going onroad, or a cancel the UI writes while it runs (one already there is for a
    /// request, not for this refresh); requests written meanwhile are acknowledged.
    fn run_refresh(&self) -> RefreshEnded {
        let (device, stopping, log) = (self.device, self.stopping, self.out.log);
        let done = Arc::new(AtomicBool::new(false));
        let before = device.memory.modified(keys::CANCEL_MODEL_DOWNLOAD);
        let (cancel, why, watcher) = watch(device, stopping, &done, CancelBy::WrittenAfter(before));
        let mut automatic = device.clone();
        automatic.budget = Some(self.config.daily_budget);
        let out = self.out;
        let say = |p: &Progress| out.say(device, p);
        let result = thread::scope(|s| {
            s.spawn(|| acknowledge_while(device, &done, stopping, log));
            let by = Run {
                cancel,
                progress: &say,
                ..Run::new(self.dl)
            };
            let r = refresh(&automatic, &by);
            done.store(true, Ordering::SeqCst);
            r
        });
        let _ = watcher.join();
        let ui_cancelled = *lock(&why) == Some(Interrupt::Cancelled);
        RefreshEnded {
            result,
            ui_cancelled,
        }
    }

    /// Log how a refresh ended (and show a trust refusal or a UI cancel); returns how long until
    /// the next one.
    fn refresh_ended(&self, st: &mut LoopState, ended: RefreshEnded) -> Duration {
        let (config, log) = (self.config, self.out.log);
        match ended.result {
            Ok(r) => {
                for held in &r.held_back {
                    if st.held_logged.insert((held.id.clone(), held.until)) {
                        log(&held.to_string());
                    }
                }
                log(&format!(
                    "refresh: {} manifest from {}, {} models, {} entries refused, selected {}{}",
                    r.generation,
                    r.manifest_origin,
                    r.models,
                    r.refused_entries.len(),
                    r.selected,
                    if r.fell_back_to_builtin {
                        " (fell back to the built-in)"
                    } else {
                        ""
                    }
                ));
                config.refresh_every
            }
            Err(_) if ended.ui_cancelled => {
                self.say(&Progress::Cancelled);
                log(&format!(
                    "refresh cancelled from the UI (CancelModelDownload); next try in {} s",
                    config.retry_offline.as_secs()
                ));
                config.retry_offline
            }
            Err(e) if is_not_yet(&e) => {
                // An origin's files disagree with its manifest (a republish in progress): no
                // failure counted; asked again after a backoff that starts soon and doubles
                // while it stays "not yet".
                let wait = not_yet_backoff(config, st.not_yet_streak);
                log(&format!(
                    "refresh: not yet (the store's files do not match its manifest yet; nothing \
                     counted as a failure), next try in {} s: {}",
                    wait.as_secs(),
                    one_line(&e.to_string())
                ));
                wait
            }
            Err(e) => {
                let stopped = matches!(
                    e,
                    Error::Onroad { .. } | Error::Download(downloader::Error::Cancelled { .. })
                );
                let wait = if is_offline(&e) || stopped {
                    config.retry_offline
                } else {
                    config.refresh_every
                };
                log(&format!(
                    "refresh failed, will retry in {} s: {}",
                    wait.as_secs(),
                    one_line(&e.to_string())
                ));
                // A manifest refused on trust grounds is shown to the user.
                if let Error::Download(d) = &e
                    && let Some(r) = crate::state::trust_state::refusal(d)
                {
                    self.say(&Progress::ManifestRefused(r));
                }
                wait
            }
        }
    }

    /// Serve the pending request when its retry is due, acknowledge one that waits, or drop a
    /// leftover cancel flag. No error of one request (a param swapped under it, a full disk)
    /// stops the daemon: it is logged, and the next poll goes on.
    fn serve_requests(&self, st: &mut LoopState) {
        let (device, log) = (self.device, self.out.log);
        let poll = || poll(device, self.dl, self.stopping, self.config, self.out);
        match read_request(&device.memory) {
            Ok(Some(request)) if Instant::now() >= st.next_request => {
                log(&format!("job: {}", describe(&request)));
                match poll() {
                    Ok(Some((request, served))) => self.served(st, request, served),
                    Ok(None) => {}
                    Err(e) => log(&format!(
                        "{}: not served: {}",
                        describe(&request),
                        one_line(&e.to_string())
                    )),
                }
            }
            Ok(Some(request)) => {
                // Waiting for its retry: a request the UI wrote since is acknowledged at once
                // with why it waits, not left unanswered until then.
                if let Some((kept, progress)) = &st.kept_progress
                    && *kept != request
                {
                    self.say(progress);
                    log(&format!(
                        "{}: waits for the retry of {} ({progress})",
                        describe(&request),
                        describe(kept)
                    ));
                    st.kept_progress = Some((request, progress.clone()));
                }
            }
            Ok(None) => {
                // Nothing pending: drop a leftover cancel flag (see `poll`).
                if let Err(e) = poll() {
                    log(&format!("cancel flag: {}", one_line(&e.to_string())));
                }
            }
            Err(e) => log(&format!("request not read: {}", one_line(&e.to_string()))),
        }
    }

    /// Log how a served request ended; a kept one is served again after its retry.
    fn served(&self, st: &mut LoopState, request: Request, served: Served) {
        let log = self.out.log;
        match served {
            Served::Finished(p) => log(&format!("{}: {p}", describe(&request))),
            Served::Failed { progress, why } => {
                log(&format!("{}: {progress} ({why})", describe(&request)))
            }
            Served::Kept {
                why,
                retry_in,
                progress,
            } => {
                log(&format!("{}: kept pending ({why})", describe(&request)));
                st.next_request = Instant::now() + retry_in;
                st.kept_progress = Some((request, progress));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn a_job_stops_for_the_daemon_the_road_or_a_cancel_in_that_order() {
        let unreadable = || Road::Unreadable("IsOnroad: a directory".into());
        for (stopping, road, cancelled, want) in [
            (false, Road::Offroad, false, None),
            (false, Road::Offroad, true, Some(Interrupt::Cancelled)),
            (false, Road::Onroad, false, Some(Interrupt::Onroad)),
            (false, Road::Onroad, true, Some(Interrupt::Onroad)),
            // Never taken as offroad: a download stops as it does onroad.
            (false, unreadable(), false, Some(Interrupt::RoadUnreadable)),
            (false, unreadable(), true, Some(Interrupt::RoadUnreadable)),
            (true, Road::Onroad, true, Some(Interrupt::Stopping)),
            (true, unreadable(), false, Some(Interrupt::Stopping)),
            (true, Road::Offroad, false, Some(Interrupt::Stopping)),
        ] {
            assert_eq!(
                interrupt(stopping, &road, || cancelled),
                want,
                "{stopping} {road:?} {cancelled}"
            );
        }
    }

    #[test]
    fn a_cancel_applies_only_to_a_request_written_before_it() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let later = t + Duration::from_millis(4);
        for (cancel, request, applies) in [
            (None, Some(t), false),
            (None, None, false),
            // Written just before the new request: for the earlier one.
            (Some(t), Some(later), false),
            // The same clock tick: "before" (a UI cannot cancel within a tick of asking).
            (Some(t), Some(t), false),
            // Written after the request: for it, even before the daemon started it.
            (Some(later), Some(t), true),
            // The request withdrawn meanwhile.
            (Some(t), None, true),
        ] {
            assert_eq!(
                cancel_applies(cancel, request),
                applies,
                "{cancel:?} {request:?}"
            );
        }
    }

    /// `IsOnroad` changes as a table: each change logged once, an unreadable one once when it
    /// becomes unreadable (with why, even if why changes later) and once when it recovers.
    #[test]
    fn road_change_table() {
        use Road::*;
        let bad = |why: &str| Unreadable(why.to_string());
        let cases: [(Road, Road, Option<&str>); 11] = [
            (Offroad, Offroad, None),
            (Onroad, Onroad, None),
            (bad("a FIFO"), bad("a FIFO"), None),
            (bad("a FIFO"), bad("a directory"), None),
            (
                Offroad,
                Onroad,
                Some("deferred while driving: no refresh, purge or download until offroad"),
            ),
            (
                Onroad,
                Offroad,
                Some("offroad: refreshing and serving pending requests"),
            ),
            (
                Offroad,
                bad("a FIFO"),
                Some(
                    "IsOnroad cannot be read, so it is not taken as offroad: no refresh, purge \
                     or download until it can be read (a FIFO)",
                ),
            ),
            (
                Onroad,
                bad("x"),
                Some(
                    "IsOnroad cannot be read, so it is not taken as offroad: no refresh, purge \
                     or download until it can be read (x)",
                ),
            ),
            (
                bad("x"),
                Offroad,
                Some(
                    "IsOnroad can be read again; offroad: refreshing and serving pending requests",
                ),
            ),
            (
                bad("x"),
                Onroad,
                Some(
                    "IsOnroad can be read again; deferred while driving: no refresh, purge or \
                     download until offroad",
                ),
            ),
            (
                Road::of(Ok(true)),
                Road::of(Ok(false)),
                Some("offroad: refreshing and serving pending requests"),
            ),
        ];
        for (before, now, want) in cases {
            assert_eq!(
                road_change(&before, &now).as_deref(),
                want,
                "{before:?} -> {now:?}"
            );
        }
        let e = Road::of(Err(Error::CorruptState {
            path: "/data/params/d/IsOnroad".into(),
            message: "not a regular file\nsecond line".into(),
        }));
        let Unreadable(why) = &e else { panic!("{e:?}") };
        assert!(
            why.contains("/data/params/d/IsOnroad") && !why.contains('\n'),
            "{why}"
        );
    }

    /// A store that is "not yet" is asked again after 2 minutes, or sooner when the daemon
    /// refreshes more often.
    #[test]
    fn not_yet_wait_is_the_shorter_of_two_minutes_and_the_refresh_interval() {
        for (refresh, want) in [(3600, 120), (120, 120), (2, 2)] {
            let config = DaemonConfig {
                refresh_every: Duration::from_secs(refresh),
                ..DaemonConfig::default()
            };
            assert_eq!(
                not_yet_wait(&config),
                Duration::from_secs(want),
                "{refresh}"
            );
        }
    }

    /// "Not yet" in a row backs off: 2 min, 4, 8, ... never past the refresh interval; a
    /// daemon refreshing more often than every 2 minutes asks again at its interval.
    #[test]
    fn not_yet_backs_off_up_to_the_refresh_interval() {
        for (refresh, streak, want) in [
            (3600, 1, 120),
            (3600, 2, 240),
            (3600, 3, 480),
            (3600, 5, 1920),
            (3600, 6, 3600),
            (3600, 40, 3600),
            (3600, 0, 120),
            (120, 3, 120),
            (2, 1, 2),
            (2, 9, 2),
        ] {
            let config = DaemonConfig {
                refresh_every: Duration::from_secs(refresh),
                ..DaemonConfig::default()
            };
            assert_eq!(
                not_yet_backoff(&config, streak),
                Duration::from_secs(want),
                "{refresh} {streak}"
            );
        }
    }

    #[test]
    fn a_message_of_several_lines_is_one_log_line_with_every_reason() {
        for (text, line) in [
            ("plain", "plain"),
            (
                "download failed on every origin:\n  hf: timed out\n  github: 404 Not Found\n",
                "download failed on every origin: hf: timed out; github: 404 Not Found",
            ),
            ("a\n\nb", "a; b"),
            ("", ""),
        ] {
            let got = one_line(text);
            assert_eq!(got, line);
            assert!(!got.ends_with(':') && !got.contains('\n'));
        }
    }

    /// Every request param that cannot be read is removed and reported, each once; readable
    /// ones are left for the daemon to serve.
    #[test]
    fn bad_request_params_are_swept_and_good_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let memory = crate::state::params::Params::new(dir.path().join("d"));
        std::fs::create_dir_all(memory.dir()).unwrap();
        std::fs::File::create(memory.path(keys::MODEL_TO_DOWNLOAD))
            .unwrap()
            .set_len(crate::state::bounded::PARAM_LIMIT + 1)
            .unwrap();
        std::fs::create_dir(memory.path(keys::CANCEL_MODEL_DOWNLOAD)).unwrap();
        std::fs::write(memory.path(keys::DOWNLOAD_ALL_MODELS), b"1\0").unwrap();
        let bad = sweep_bad_params(&memory);
        let keys_of: Vec<&str> = bad.iter().map(|b| b.key).collect();
        assert_eq!(
            keys_of,
            [keys::MODEL_TO_DOWNLOAD, keys::CANCEL_MODEL_DOWNLOAD]
        );
        for b in &bad {
            let text = b.to_string();
            assert!(text.contains(b.key) && text.ends_with("removed"), "{text}");
            assert!(!memory.path(b.key).exists());
        }
        assert_eq!(read_request(&memory).unwrap(), Some(Request::DownloadAll));
        assert!(sweep_bad_params(&memory).is_empty());
    }
}
