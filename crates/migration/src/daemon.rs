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

use crate::device::Device;
use crate::downloads::{download_all, download_model};
use crate::error::{Error, Result};
use crate::manager::refresh;
use crate::params::keys;
use crate::progress::{DisplayName, FailReason, Progress};

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

/// The pending request, `DownloadAllModels` first (upstream's priority).
pub fn read_request(device: &Device) -> Result<Option<Request>> {
    read_request_in(&device.memory)
}

/// [`read_request`] from the memory params `memory`.
pub fn read_request_in(memory: &crate::params::Params) -> Result<Option<Request>> {
    if memory.get_bool(keys::DOWNLOAD_ALL_MODELS)? {
        return Ok(Some(Request::DownloadAll));
    }
    Ok(memory
        .get_str(keys::MODEL_TO_DOWNLOAD)?
        .map(|raw| Request::Download {
            id: raw.to_ascii_lowercase().parse().ok(),
            raw,
        }))
}

/// The progress text a failed request ends with.
pub fn failure_progress(e: &Error) -> Progress {
    match e {
        Error::Download(downloader::Error::Cancelled { .. }) => Progress::Cancelled,
        Error::Download(d @ downloader::Error::ManifestUnavailable { .. }) => {
            match crate::trust_state::refusal(d) {
                Some(r) => Progress::ManifestRefused(r),
                None => Progress::Offline,
            }
        }
        Error::ExternalGpuRequired { .. } => Progress::ExternalGpuRequired,
        other => Progress::Failed(FailReason::of(other)),
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
    let say = |p: &Progress| {
        let _ = device
            .memory
            .put(keys::MODEL_DOWNLOAD_PROGRESS, &p.to_string());
    };
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
            let start = |entry: &ModelEntry, before: bool| {
                if before {
                    say(&Progress::Downloading(DisplayName::of(entry)));
                }
            };
            download_all(device, dl, cancel, &start, say).map(|all| match all.cancelled {
                true => Progress::Cancelled,
                false => Progress::AllDownloaded,
            })
        }
        Request::Download { id: Some(id), .. } => {
            download_model(device, dl, id, cancel, say).map(|_| {
                let canonical = crate::contract::canonical_id(id.as_str());
                match canonical.parse().map(|c| crate::contract::kind(&c)) {
                    Ok(crate::contract::ModelKind::BuiltIn) => Progress::BuiltinAlreadyDownloaded,
                    Ok(crate::contract::ModelKind::Local) => Progress::LocalNothingToDownload,
                    _ => Progress::Downloaded,
                }
            })
        }
        Request::Download { id: None, .. } => Ok(Progress::Failed(FailReason::NotAModel)),
    }
}

/// Clear a handled request and the cancel flag.
pub fn finish(device: &Device, request: &Request) -> Result<()> {
    finish_in(&device.memory, request)
}

/// [`finish`] in the memory params `memory`.
pub fn finish_in(memory: &crate::params::Params, request: &Request) -> Result<()> {
    match request {
        Request::DownloadAll => memory.remove(keys::DOWNLOAD_ALL_MODELS)?,
        Request::Download { raw, .. } => {
            if memory.get_str(keys::MODEL_TO_DOWNLOAD)?.as_deref() == Some(raw.as_str()) {
                memory.remove(keys::MODEL_TO_DOWNLOAD)?;
            }
        }
    }
    memory.remove(keys::CANCEL_MODEL_DOWNLOAD)
}

/// Why a running request stopped early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupt {
    /// The UI set `CancelModelDownload`: the request is over.
    Cancelled,
    /// The car went onroad: the request stays pending and is served once offroad.
    Onroad,
    /// The daemon is stopping (SIGTERM): the request stays for the next start.
    Stopping,
}

/// A cancel token that trips within 50 ms when the UI sets `CancelModelDownload`, the car goes
/// onroad, or `stopping` is set; it records which, until `done` is set.
fn watch(
    device: &Device,
    stopping: &Arc<AtomicBool>,
    done: &Arc<AtomicBool>,
    ui_cancel: bool,
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
            let reason = if stopping.load(Ordering::SeqCst) {
                Some(Interrupt::Stopping)
            } else if device.is_onroad().unwrap_or(false) {
                Some(Interrupt::Onroad)
            } else if ui_cancel
                && device
                    .memory
                    .get_bool(keys::CANCEL_MODEL_DOWNLOAD)
                    .unwrap_or(false)
            {
                Some(Interrupt::Cancelled)
            } else {
                None
            };
            if let Some(r) = reason {
                *w.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                t.cancel();
                return;
            }
            thread::sleep(Duration::from_millis(50));
        }
    });
    (token, why, h)
}

/// How one served request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Served {
    /// Handled (done, failed for good, or cancelled by the UI): the request was cleared.
    Finished(Progress),
    /// Not over: onroad, stopping, or no network. The request is kept and served again later.
    Kept { progress: Progress, why: String },
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

/// One poll: serve the pending request (watching for a cancel), or drop a leftover cancel flag
/// when nothing runs. Returns the request served, if any, and its last progress.
pub fn poll_once(device: &Device, dl: &Downloader) -> Result<Option<(Request, Progress)>> {
    let stopping = Arc::new(AtomicBool::new(false));
    Ok(poll(device, dl, &stopping)?.map(|(r, s)| match s {
        Served::Finished(p) | Served::Kept { progress: p, .. } => (r, p),
    }))
}

/// [`poll_once`], stopping early when `stopping` is set; says whether the request was kept.
pub fn poll(
    device: &Device,
    dl: &Downloader,
    stopping: &Arc<AtomicBool>,
) -> Result<Option<(Request, Served)>> {
    let Some(request) = read_request(device)? else {
        if device.memory.get_bool(keys::CANCEL_MODEL_DOWNLOAD)? {
            // Nothing to cancel: a leftover flag must not cancel the next download.
            device.memory.remove(keys::CANCEL_MODEL_DOWNLOAD)?;
        }
        return Ok(None);
    };
    if device.is_onroad()? {
        // Served once the car is offroad; not a byte fetched, not a file touched.
        return Ok(Some((
            request,
            Served::Kept {
                progress: Progress::Cancelled,
                why: "deferred while driving".into(),
            },
        )));
    }
    let done = Arc::new(AtomicBool::new(false));
    let (cancel, why, watcher) = watch(device, stopping, &done, true);
    let say = |p: &Progress| {
        let _ = device
            .memory
            .put(keys::MODEL_DOWNLOAD_PROGRESS, &p.to_string());
    };
    let outcome = serve_outcome(device, dl, &request, &cancel, &say);
    done.store(true, Ordering::SeqCst);
    let _ = watcher.join();
    let interrupt = *why.lock().unwrap_or_else(|e| e.into_inner());
    let served = match (outcome, interrupt) {
        (Err(_), Some(Interrupt::Onroad)) | (Err(Error::Onroad { .. }), _) => Served::Kept {
            progress: Progress::Cancelled,
            why: "deferred while driving".into(),
        },
        (Err(_), Some(Interrupt::Stopping)) => Served::Kept {
            progress: Progress::Cancelled,
            why: "stopping; kept for the next start (finished chunks are kept)".into(),
        },
        (Err(e), _) if is_offline(&e) => Served::Kept {
            progress: Progress::Offline,
            why: format!("no network, will retry: {e}"),
        },
        (Ok(p), _) => Served::Finished(p),
        (Err(e), _) => Served::Finished(failure_progress(&e)),
    };
    match &served {
        Served::Finished(p) => {
            say(p);
            finish(device, &request)?;
        }
        Served::Kept { progress, .. } => say(progress),
    }
    Ok(Some((request, served)))
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
}

impl Default for DaemonConfig {
    fn default() -> Self {
        Self {
            poll: Duration::from_secs(1),
            refresh_every: Duration::from_secs(3600),
            retry_offline: Duration::from_secs(30),
        }
    }
}

fn describe(r: &Request) -> String {
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
    log: &dyn Fn(&str),
) -> Result<()> {
    let say = |p: &Progress| {
        let _ = device
            .memory
            .put(keys::MODEL_DOWNLOAD_PROGRESS, &p.to_string());
    };
    log(&format!(
        "started: generation {}, models in {}, polling every {} ms, refreshing every {} s",
        device.config.generation,
        device.models_dir().display(),
        config.poll.as_millis(),
        config.refresh_every.as_secs()
    ));
    let mut next_refresh = Instant::now();
    let mut next_request = Instant::now();
    let mut onroad_logged = false;
    let mut metered_logged = false;
    while !stopping.load(Ordering::SeqCst) {
        let onroad = device.is_onroad().unwrap_or(false);
        if onroad {
            if !onroad_logged {
                log("deferred while driving: no refresh, purge or download until offroad");
                onroad_logged = true;
            }
        } else {
            if onroad_logged {
                log("offroad: refreshing and serving pending requests");
                onroad_logged = false;
                next_refresh = Instant::now();
                next_request = Instant::now();
            }
            if Instant::now() >= next_refresh {
                if device.is_metered().unwrap_or(false) {
                    if !metered_logged {
                        log(
                            "refresh skipped: metered network (requests from the UI are still served)",
                        );
                        metered_logged = true;
                    }
                    next_refresh = Instant::now() + config.retry_offline;
                } else {
                    metered_logged = false;
                    log("job: refresh");
                    // Stopped by SIGTERM or the car going onroad like any download (not by the
                    // UI's cancel flag, which is about the UI's own requests).
                    let done = Arc::new(AtomicBool::new(false));
                    let (cancel, _, watcher) = watch(device, stopping, &done, false);
                    let result = refresh(device, dl, &cancel, &say);
                    done.store(true, Ordering::SeqCst);
                    let _ = watcher.join();
                    next_refresh = match result {
                        Ok(r) => {
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
                            Instant::now() + config.refresh_every
                        }
                        Err(e) if is_not_yet(&e) => {
                            // An origin's files disagree with its manifest (a republish in
                            // progress): not a failure, no backoff; asked again soon.
                            let wait = crate::choice::NOT_YET_RETRY.min(config.refresh_every);
                            let first = e.to_string();
                            let first = first.lines().next().unwrap_or("");
                            log(&format!(
                                "refresh: not yet (the store's files do not match its manifest \
                                 yet; nothing counted as a failure), next try in {} s: {first}",
                                wait.as_secs()
                            ));
                            Instant::now() + wait
                        }
                        Err(e) => {
                            let stopped = matches!(
                                e,
                                Error::Onroad { .. }
                                    | Error::Download(downloader::Error::Cancelled { .. })
                            );
                            let wait = if is_offline(&e) || stopped {
                                config.retry_offline
                            } else {
                                config.refresh_every
                            };
                            let first = e.to_string();
                            let first = first.lines().next().unwrap_or("");
                            log(&format!(
                                "refresh failed, will retry in {} s: {first}",
                                wait.as_secs()
                            ));
                            // A manifest refused on trust grounds is shown to the user.
                            if let Error::Download(d) = &e
                                && let Some(r) = crate::trust_state::refusal(d)
                            {
                                say(&Progress::ManifestRefused(r));
                            }
                            Instant::now() + wait
                        }
                    };
                }
            }
            if Instant::now() >= next_request
                && let Some(request) = read_request(device)?
            {
                log(&format!("job: {}", describe(&request)));
                if let Some((request, served)) = poll(device, dl, stopping)? {
                    match served {
                        Served::Finished(p) => log(&format!("{}: {p}", describe(&request))),
                        Served::Kept { why, .. } => {
                            let why = why.lines().next().unwrap_or("").to_string();
                            log(&format!("{}: kept pending ({why})", describe(&request)));
                            next_request = Instant::now() + config.retry_offline;
                        }
                    }
                }
            } else if read_request(device)?.is_none() {
                // Nothing pending: drop a leftover cancel flag (see `poll`).
                let _ = poll(device, dl, stopping)?;
            }
        }
        let wake = Instant::now() + config.poll;
        while Instant::now() < wake && !stopping.load(Ordering::SeqCst) {
            thread::sleep(Duration::from_millis(20).min(config.poll));
        }
    }
    log("stopped: any download in progress is kept and resumes at the next start");
    Ok(())
}
