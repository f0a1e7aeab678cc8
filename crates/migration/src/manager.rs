//! The operations of the manager: refresh (with the journaled generation migration), download,
//! verify and gc. Each runs under the manager lock, taken by the caller.
//!
//! Migration state machine, journaled in `<models>/.migration.json` (written atomically before
//! each phase starts):
//!
//! 1. the new catalog is stored (`.catalog.json`), then the journal is written with phase
//!    `purge` and the selection to keep;
//! 2. `purge`: every non-local driving artifact is deleted (idempotent), then phase `download`;
//! 3. `download`: the kept selection is downloaded and verified (an already verified install is
//!    kept); if it cannot be had, the five selection params are set to the built-in;
//! 4. the catalog params are written, then `ModelManifestVersion`, then the journal is removed.
//!
//! A crash anywhere leaves the journal, and the next run resumes at the recorded phase, so the
//! end state is the same as an uninterrupted run. `resolve` answers the built-in while a journal
//! exists, so modeld never loads an old-generation pickle in between.

use std::collections::BTreeSet;
use std::fs;

use chunker::atomic::{remove_if_exists, sync_dir, write_atomic};
use downloader::{CancelToken, Downloader, Event, Installed};
use manifest::{Manifest, ModelEntry, ModelId};
use serde::{Deserialize, Serialize};

use crate::device::{Device, JOURNAL_FILE, Selection, VerifyState};
use crate::error::{Error, IoContext, Result};
use crate::params::keys;
use crate::plan;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Purge,
    Download,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    pub from: Option<String>,
    pub to: String,
    pub selected: String,
    pub phase: Phase,
}

/// What a refresh did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefreshReport {
    pub generation: String,
    pub manifest_origin: String,
    pub models: usize,
    pub migrated_from: Option<String>,
    pub purged: Vec<String>,
    pub selected: String,
    pub fell_back_to_builtin: bool,
}

/// Progress text for `ModelDownloadProgress` and the terminal.
pub type ProgressFn<'a> = &'a (dyn Fn(&str) + Sync);

/// `rdf43` and its old alias `rdf`.
pub fn is_builtin_id(id: &str) -> bool {
    id == manifest::layout::BUILTIN_MODEL_ID || id == "rdf"
}

/// Read the journal, if any.
pub fn read_journal(device: &Device) -> Result<Option<Journal>> {
    let path = device.models_dir().join(JOURNAL_FILE);
    match fs::read(&path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| Error::CorruptState {
                path,
                message: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Io { path, source: e }),
    }
}

fn write_journal(device: &Device, j: &Journal) -> Result<()> {
    let path = device.models_dir().join(JOURNAL_FILE);
    write_atomic(&path, &serde_json::to_vec_pretty(j).expect("serializable")).ctx(&path)
}

/// Fetch the manifest, store it, migrate if the generation changed (or a migration was
/// interrupted), and update the catalog params.
pub fn refresh(
    device: &Device,
    dl: &Downloader,
    cancel: &CancelToken,
    progress: ProgressFn,
) -> Result<RefreshReport> {
    device.ensure_dirs()?;
    let generation = device.config.generation;
    let fetched = dl.fetch_manifest(generation)?;
    device.store_catalog(&fetched.manifest)?;
    let catalog = device.require_catalog()?;

    let previous = device.params.get_str(keys::MODEL_MANIFEST_VERSION)?;
    let mut journal = read_journal(device)?;
    let target = generation.to_string();
    if let Some(j) = journal.as_mut()
        && j.to != target
    {
        // A migration to another generation was interrupted and this build reads a different
        // one: whatever that run downloaded is another generation's pickle, so migrate again
        // from the purge, keeping the selection it recorded.
        j.to = target.clone();
        j.phase = Phase::Purge;
        write_journal(device, j)?;
    }
    if journal.is_none() && previous.as_deref() != Some(target.as_str()) {
        let j = Journal {
            from: previous.clone(),
            to: target.clone(),
            selected: device.selection()?.id,
            phase: Phase::Purge,
        };
        write_journal(device, &j)?;
        journal = Some(j);
    }
    let mut report = RefreshReport {
        generation: target.clone(),
        manifest_origin: fetched.origin,
        models: catalog.models().len(),
        migrated_from: None,
        purged: Vec::new(),
        selected: device.selection()?.id,
        fell_back_to_builtin: false,
    };
    if let Some(mut j) = journal {
        report.migrated_from = j.from.clone();
        if j.phase == Phase::Purge {
            report.purged = purge(device)?;
            j.phase = Phase::Download;
            write_journal(device, &j)?;
        }
        let sel = ensure_selected(device, dl, &catalog, &j.selected, cancel, progress)?;
        report.fell_back_to_builtin = sel.is_builtin() && !is_builtin_id(&j.selected);
        report.selected = sel.id.clone();
        write_catalog_params(device, &catalog)?;
        device.params.put(keys::MODEL_MANIFEST_VERSION, &j.to)?;
        let path = device.models_dir().join(JOURNAL_FILE);
        remove_if_exists(&path).ctx(&path)?;
        sync_dir(device.models_dir()).ctx(&device.models_dir())?;
    } else {
        write_catalog_params(device, &catalog)?;
        // Same generation: keep the selection unless it left the catalog.
        let sel = device.selection()?;
        if !sel.is_builtin()
            && !sel.id.starts_with(ModelId::LOCAL_PREFIX)
            && sel
                .id
                .parse::<ModelId>()
                .ok()
                .and_then(|id| catalog.get(&id).cloned())
                .is_none()
        {
            device.select(&builtin_selection(&catalog))?;
            report.fell_back_to_builtin = true;
            report.selected = manifest::layout::BUILTIN_MODEL_ID.to_string();
        }
    }
    Ok(report)
}

/// Delete every non-local driving artifact in the models dir.
fn purge(device: &Device) -> Result<Vec<String>> {
    let dir = device.models_dir();
    let names: Vec<String> = fs::read_dir(&dir)
        .ctx(&dir)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file() || t.is_symlink()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    let plan = plan::purge_plan(names.iter().map(String::as_str));
    for name in &plan {
        let p = dir.join(name);
        remove_if_exists(&p).ctx(&p)?;
    }
    sync_dir(&dir).ctx(&dir)?;
    let _ = fs::remove_file(dir.join(crate::device::VERIFIED_FILE));
    Ok(plan)
}

/// The built-in selection, with its name and version from the catalog when listed there.
fn builtin_selection(catalog: &Manifest) -> Selection {
    let id = manifest::layout::builtin_model_id();
    let mut sel = Selection::builtin();
    if let Some(e) = catalog.get(&id) {
        if let Some(n) = e.name() {
            sel.name = n.to_string();
        }
        if let Some(v) = e.version() {
            sel.version = v.to_string();
        }
    }
    sel
}

/// Make `selected` usable for this generation: keep a verified install, else download it; if
/// that fails (or it is not in the catalog), select the built-in. Returns the final selection.
fn ensure_selected(
    device: &Device,
    dl: &Downloader,
    catalog: &Manifest,
    selected: &str,
    cancel: &CancelToken,
    progress: ProgressFn,
) -> Result<Selection> {
    let builtin = builtin_selection(catalog);
    let id = match selected.parse::<ModelId>() {
        Ok(id) if !is_builtin_id(selected) => id,
        _ => {
            device.select(&builtin)?;
            return Ok(builtin);
        }
    };
    if id.is_local() {
        let sel = device.selection()?;
        return Ok(sel);
    }
    let Some(entry) = catalog.get(&id) else {
        progress("Selected model unavailable; using built-in model.");
        device.select(&builtin)?;
        return Ok(builtin);
    };
    progress(&format!("Downloading selected model \"{id}\"..."));
    match install(device, dl, entry, cancel, progress) {
        Ok(_) => {
            let sel = Selection::of_entry(entry);
            device.select(&sel)?;
            Ok(sel)
        }
        // Cancelled or a local I/O failure: stop with the journal in place, so the next run
        // tries again instead of giving up the selection.
        Err(Error::Download(e))
            if e.is_local() && !matches!(e, downloader::Error::InsufficientSpace { .. }) =>
        {
            Err(Error::Download(e))
        }
        Err(Error::Io { path, source }) => Err(Error::Io { path, source }),
        Err(_) => {
            progress("Selected model unavailable; using built-in model.");
            device.select(&builtin)?;
            Ok(builtin)
        }
    }
}

/// Install `entry` unless a verified copy is already there. `Ok(None)` = already installed.
pub fn install(
    device: &Device,
    dl: &Downloader,
    entry: &ModelEntry,
    cancel: &CancelToken,
    progress: ProgressFn,
) -> Result<Option<Installed>> {
    if device.verify_entry(entry, false)? == VerifyState::Verified {
        return Ok(None);
    }
    device.forget(entry.id())?;
    let percent = PercentFilter::default();
    let on_event = |e: Event| match e {
        Event::Progress { done, total } => {
            if let Some(pct) = percent.advance(done, total) {
                progress(&format!("{pct}%"));
            }
        }
        Event::Verifying => progress("Verifying authenticity..."),
        _ => {}
    };
    let installed = dl.download(
        device.config.generation,
        entry,
        &device.models_dir(),
        cancel,
        &on_event,
    )?;
    // Record the fresh verification so the next resolve is a stat, not a re-hash.
    device.record_verified(entry, &installed.sha256, installed.size)?;
    Ok(Some(installed))
}

/// `download <ID>`: the catalog entry, downloaded and verified.
/// Turns byte counts into the percentages the UI shows: each one once, and never going down,
/// although parallel workers report out of order.
#[derive(Default)]
struct PercentFilter(std::sync::Mutex<Option<u64>>);

impl PercentFilter {
    fn advance(&self, done: u64, total: u64) -> Option<u64> {
        if total == 0 {
            return None;
        }
        let pct = done.min(total) * 100 / total;
        let mut last = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if last.is_some_and(|prev| pct <= prev) {
            return None;
        }
        *last = Some(pct);
        Some(pct)
    }
}

pub fn download_model(
    device: &Device,
    dl: &Downloader,
    id: &ModelId,
    cancel: &CancelToken,
    progress: ProgressFn,
) -> Result<Option<Installed>> {
    if is_builtin_id(id.as_str()) {
        progress("Built-in model already downloaded.");
        return Ok(None);
    }
    if id.is_local() {
        progress("Local model, nothing to download.");
        return Ok(None);
    }
    let catalog = device.require_catalog()?;
    let entry = catalog.get(id).ok_or_else(|| Error::UnknownModel {
        id: id.to_string(),
        generation: device.config.generation.to_string(),
    })?;
    let r = install(device, dl, entry, cancel, progress)?;
    progress("Downloaded!");
    Ok(r)
}

/// Every downloadable catalog model that is not installed yet (external-GPU models skipped).
pub fn downloadable(catalog: &Manifest) -> Vec<&ModelEntry> {
    catalog
        .models()
        .iter()
        .filter(|e| e.is_supported() && e.artifact().is_some() && !e.id().is_local())
        .filter(|e| e.id().as_str() != manifest::layout::BUILTIN_MODEL_ID && !e.uses_external_gpu())
        .collect()
}

/// Comma-joined catalog params, in catalog order (names cannot contain commas: the manifest
/// crate refuses them).
fn write_catalog_params(device: &Device, catalog: &Manifest) -> Result<()> {
    let models: Vec<&ModelEntry> = catalog
        .models()
        .iter()
        .filter(|e| e.is_supported())
        .collect();
    let join = |f: &dyn Fn(&ModelEntry) -> String| {
        models.iter().map(|e| f(e)).collect::<Vec<_>>().join(",")
    };
    let p = &device.params;
    p.put(keys::AVAILABLE_MODELS, &join(&|e| e.id().to_string()))?;
    p.put(
        keys::AVAILABLE_MODEL_NAMES,
        &join(&|e| e.name().unwrap_or_default().to_string()),
    )?;
    p.put(
        keys::AVAILABLE_MODEL_SERIES,
        &join(&|e| e.series().unwrap_or_default().to_string()),
    )?;
    p.put(
        keys::AVAILABLE_MODEL_ARTIFACT_FORMATS,
        &join(&|e| {
            e.artifact_format()
                .map(|f| f.to_string())
                .unwrap_or_default()
        }),
    )?;
    p.put(
        keys::MODEL_RELEASED_DATES,
        &join(&|e| e.released().map(|d| d.to_string()).unwrap_or_default()),
    )?;
    p.put(
        keys::MODEL_VERSIONS,
        &join(&|e| e.version().map(|v| v.to_string()).unwrap_or_default()),
    )?;
    let favs: Vec<String> = models
        .iter()
        .filter(|e| e.community_favorite() == Some(true))
        .map(|e| e.id().to_string())
        .collect();
    p.put(keys::COMMUNITY_FAVORITES, &favs.join(","))?;
    Ok(())
}

/// `gc`: remove stray temporaries and artifacts of models not in the catalog; never `local-*`.
pub fn gc(device: &Device) -> Result<Vec<String>> {
    let catalog = device.require_catalog()?;
    let ids: BTreeSet<String> = catalog.ids().map(|i| i.to_string()).collect();
    let dir = device.models_dir();
    let names: Vec<String> = fs::read_dir(&dir)
        .ctx(&dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    let plan = plan::gc_plan(names.iter().map(String::as_str), &ids);
    for name in &plan {
        let p = dir.join(name);
        if p.is_dir() {
            fs::remove_dir_all(&p).ctx(&p)?;
        } else {
            remove_if_exists(&p).ctx(&p)?;
        }
    }
    sync_dir(&dir).ctx(&dir)?;
    Ok(plan)
}

#[cfg(test)]
mod percent_tests {
    use super::PercentFilter;

    #[test]
    fn progress_percentages_never_go_backwards_or_repeat() {
        let f = PercentFilter::default();
        let shown: Vec<u64> = [
            (13, 100),
            (12, 100),
            (13, 100),
            (50, 100),
            (40, 100),
            (100, 100),
        ]
        .into_iter()
        .filter_map(|(d, t)| f.advance(d, t))
        .collect();
        assert_eq!(shown, vec![13, 50, 100]);
        assert_eq!(f.advance(5, 0), None);
    }
}
