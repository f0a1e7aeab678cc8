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
use manifest::ModelId;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::manager::{download_model, downloadable, install, refresh};
use crate::params::keys;
use crate::progress::Progress;

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
    if device.memory.get_bool(keys::DOWNLOAD_ALL_MODELS)? {
        return Ok(Some(Request::DownloadAll));
    }
    Ok(device
        .memory
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
        Error::Download(downloader::Error::InsufficientSpace { .. }) => {
            Progress::Failed("not enough free space".into())
        }
        Error::Download(d @ downloader::Error::ManifestUnavailable { .. }) => {
            match crate::trust_state::refusal_text(d) {
                Some(text) => Progress::ManifestRefused(text),
                None => Progress::Offline,
            }
        }
        Error::Download(_) => Progress::Failed("model could not be downloaded and verified".into()),
        other => Progress::Failed(other.to_string()),
    }
}

/// Serve one request to the end; returns the final progress.
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
    let outcome: Result<Progress> = match request {
        Request::DownloadAll => (|| {
            let catalog = device.require_catalog()?;
            for entry in downloadable(&catalog) {
                if cancel.is_cancelled() {
                    return Ok(Progress::Cancelled);
                }
                say(&Progress::Downloading(contract_name(entry)));
                install(device, dl, entry, cancel, &say)?;
            }
            Ok(Progress::AllDownloaded)
        })(),
        Request::Download { id: Some(id), .. } => {
            download_model(device, dl, id, cancel, &say).map(|_| {
                let canonical = crate::contract::canonical_id(id.as_str());
                match canonical.parse().map(|c| crate::contract::kind(&c)) {
                    Ok(crate::contract::ModelKind::BuiltIn) => Progress::BuiltinAlreadyDownloaded,
                    Ok(crate::contract::ModelKind::Local) => Progress::LocalNothingToDownload,
                    _ => Progress::Downloaded,
                }
            })
        }
        Request::Download { raw, id: None } => {
            Ok(Progress::Failed(format!("{raw:?} is not a model id")))
        }
    };
    let last = outcome.unwrap_or_else(|e| failure_progress(&e));
    say(&last);
    last
}

fn contract_name(entry: &manifest::ModelEntry) -> String {
    crate::contract::clean_name(entry.name().unwrap_or(entry.id().as_str()))
}

/// Clear a handled request and the cancel flag.
pub fn finish(device: &Device, request: &Request) -> Result<()> {
    match request {
        Request::DownloadAll => device.memory.remove(keys::DOWNLOAD_ALL_MODELS)?,
        Request::Download { raw, .. } => {
            if device.memory.get_str(keys::MODEL_TO_DOWNLOAD)?.as_deref() == Some(raw.as_str()) {
                device.memory.remove(keys::MODEL_TO_DOWNLOAD)?;
            }
        }
    }
    device.memory.remove(keys::CANCEL_MODEL_DOWNLOAD)
}

/// A cancel token that trips when the UI sets `CancelModelDownload`, until `stop` is set.
fn watch_cancel(device: &Device, stop: &Arc<AtomicBool>) -> (CancelToken, thread::JoinHandle<()>) {
    let token = CancelToken::new();
    let t = token.clone();
    let memory = device.memory.clone();
    let stop = stop.clone();
    let h = thread::spawn(move || {
        while !stop.load(Ordering::SeqCst) {
            if memory
                .get_bool(keys::CANCEL_MODEL_DOWNLOAD)
                .unwrap_or(false)
            {
                t.cancel();
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    });
    (token, h)
}

/// One poll: serve the pending request (watching for a cancel), or drop a leftover cancel flag
/// when nothing runs. Returns the request served, if any.
pub fn poll_once(device: &Device, dl: &Downloader) -> Result<Option<(Request, Progress)>> {
    let Some(request) = read_request(device)? else {
        if device.memory.get_bool(keys::CANCEL_MODEL_DOWNLOAD)? {
            // Nothing to cancel: a leftover flag must not cancel the next download.
            device.memory.remove(keys::CANCEL_MODEL_DOWNLOAD)?;
        }
        return Ok(None);
    };
    let stop = Arc::new(AtomicBool::new(false));
    let (cancel, watcher) = watch_cancel(device, &stop);
    let last = serve(device, dl, &request, &cancel);
    stop.store(true, Ordering::SeqCst);
    let _ = watcher.join();
    finish(device, &request)?;
    Ok(Some((request, last)))
}

/// The daemon loop: refresh at start and every `refresh_every`, poll requests every `poll`.
/// `log` receives one line per refresh failure or failed request. The caller holds the lock.
pub fn run(
    device: &Device,
    dl: &Downloader,
    poll: Duration,
    refresh_every: Duration,
    log: &dyn Fn(&str),
) -> Result<()> {
    let say = |p: &Progress| {
        let _ = device
            .memory
            .put(keys::MODEL_DOWNLOAD_PROGRESS, &p.to_string());
    };
    let mut last_refresh: Option<Instant> = None;
    loop {
        if last_refresh.is_none_or(|t| t.elapsed() >= refresh_every) {
            if let Err(e) = refresh(device, dl, &CancelToken::new(), &say) {
                log(&format!("refresh failed: {e}"));
                if let Error::Download(d) = &e
                    && let Some(text) = crate::trust_state::refusal_text(d)
                {
                    say(&Progress::ManifestRefused(text));
                }
            }
            last_refresh = Some(Instant::now());
        }
        if let Some((_, p)) = poll_once(device, dl)?
            && matches!(
                p,
                Progress::Failed(_) | Progress::Cancelled | Progress::Offline
            )
        {
            log(&format!("download: {p}"));
        }
        thread::sleep(poll);
    }
}
