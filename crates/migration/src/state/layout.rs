//! Where a generation's files live on the device and how each is written: the one seam the
//! refresh, the downloads and `resolve` ask instead of branching on the generation.
//!
//! [`DeviceFiles`] is built from the generation's contract (`manifest::contract`, decided by
//! the tree) and the data root. For a [`DeviceLayout::Flat`] contract (v25) it answers what the
//! device has always used: `<models>/<id>_driving_tinygrad.pkl`, `<models>/.catalog.json`, the
//! selection in the `Model` params. For a [`DeviceLayout::PerGeneration`] contract (upstream's
//! v26 and any later generation that inherits it) everything upstream reads lives under
//! `<models>/<gen>/` in upstream's own formats (the contract row's [`GenerationFiles`]):
//!
//! - `<gen>/<id>/<id>_driving[_<accelerator>]_tinygrad.pkl`;
//! - `<gen>/catalog.json`: the accepted manifest, keys sorted, Python's separators, atomic;
//! - `<gen>/preferences.json`: the selection, read and written under `flock` on
//!   `<gen>/.state.lock`, capped at the contract's size;
//! - `<gen>/.download-job.json`: the one download job, owned by whoever holds `flock` on
//!   `<gen>/.download.lock` ([`DownloadJob`]).
//!
//! Our own state files (journal, remembered choice, verification cache, trust records) stay in
//! `<models>/`: nothing upstream reads is kept twice.

use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use manifest::contract::{Contract, DeviceLayout, GenerationFiles, TreeDeclaration};
use manifest::{Generation, ModelId};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::state::effects::Effects;
use crate::state::effects::lock;

/// Which artifact of a model: the standard one, or its accelerator build (v25: `chestnut`,
/// v26: `amd`; the contract's [`manifest::contract::AcceleratorRule`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Standard,
    Accelerator,
}

/// Where the selection is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SelectionStore {
    /// The `Model`/`DrivingModel` and profile params (v25).
    Params,
    /// `preferences.json` under the state lock (v26).
    Preferences,
}

/// A generation's files on this device (see the module docs).
#[derive(Debug, Clone)]
pub struct DeviceFiles {
    contract: &'static Contract,
    models: PathBuf,
    generation: Generation,
    tree: Option<Arc<TreeDeclaration>>,
    /// The writer every file upstream reads goes through (the job file and the preferences
    /// too), so each write is an effect of the crash enumeration and a dry run writes nothing.
    effects: Effects,
}

impl DeviceFiles {
    /// The files of `generation`, which runs `contract`, under the data root `data_dir`;
    /// `tree` is what the tree declared (its reviewed catalog is what upstream checks
    /// preferences against).
    pub fn new(
        contract: &'static Contract,
        data_dir: &Path,
        generation: Generation,
        tree: Option<Arc<TreeDeclaration>>,
    ) -> Self {
        Self {
            contract,
            models: data_dir.join("models"),
            generation,
            tree,
            effects: Effects::none(),
        }
    }

    /// These files, written through `effects` (the device's writer: [`Effects`]).
    pub fn with_effects(mut self, effects: Effects) -> Self {
        self.effects = effects;
        self
    }

    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The tree's declaration, when it made one.
    pub fn tree(&self) -> Option<&TreeDeclaration> {
        self.tree.as_deref()
    }

    /// The per-generation formats (`None` on a flat layout).
    pub fn generation_files(&self) -> Option<&'static GenerationFiles> {
        match self.contract.device_layout {
            DeviceLayout::Flat => None,
            DeviceLayout::PerGeneration => self.contract.generation_files.as_ref(),
        }
    }

    /// The directory holding the generation's files: `<models>` (flat) or `<models>/<gen>`.
    pub fn root(&self) -> PathBuf {
        match self.contract.device_layout {
            DeviceLayout::Flat => self.models.clone(),
            DeviceLayout::PerGeneration => self.models.join(self.generation.to_string()),
        }
    }

    /// The directory a model's artifacts are installed in.
    pub fn artifact_dir(&self, id: &ModelId) -> PathBuf {
        match self.contract.device_layout {
            DeviceLayout::Flat => self.models.clone(),
            DeviceLayout::PerGeneration => self.root().join(id.as_str()),
        }
    }

    /// An artifact's file name: `<id>_driving_tinygrad.pkl`, or the accelerator build's.
    pub fn artifact_name(&self, id: &ModelId, variant: Variant) -> String {
        match variant {
            Variant::Standard => manifest::layout::artifact_file_name(id).to_string(),
            Variant::Accelerator => self.contract.accelerator_file_name(id),
        }
    }

    /// Where an artifact is installed (and where modeld's resolver looks for it).
    pub fn artifact_path(&self, id: &ModelId, variant: Variant) -> PathBuf {
        self.artifact_dir(id).join(self.artifact_name(id, variant))
    }

    /// The accepted manifest: `<models>/.catalog.json` (flat) or `<gen>/catalog.json`.
    pub fn catalog_path(&self) -> PathBuf {
        match self.generation_files() {
            None => self.models.join(crate::state::device::CATALOG_FILE),
            Some(f) => self.root().join(f.catalog),
        }
    }

    /// The artifact directories on the device whose staging directory a download of this
    /// layout may have left ([`downloader::STAGING_DIR`] under each), sorted: flat, `<models>`;
    /// per generation, every model's directory under `<gen>/` (a directory named as a model id,
    /// never a link), whether or not the catalog still lists it. Read-only.
    pub fn staging_parents(&self) -> Vec<PathBuf> {
        if self.generation_files().is_none() {
            return vec![self.models.clone()];
        }
        let Ok(rd) = std::fs::read_dir(self.root()) else {
            return Vec::new();
        };
        let mut dirs: Vec<PathBuf> = rd
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter(|e| (e.file_name().to_str()).is_some_and(|n| n.parse::<ModelId>().is_ok()))
            .map(|e| e.path())
            .collect();
        dirs.sort();
        dirs
    }

    /// A staging directory of an earlier layout this one no longer downloads into: per
    /// generation, the flat layout's `<models>` (v25's `<models>/.starpilot-staging`); flat,
    /// none.
    pub fn retired_staging_parent(&self) -> Option<PathBuf> {
        self.generation_files().map(|_| self.models.clone())
    }

    /// A path under `<models>` relative to it, as `gc`, a purge and the daily ledger name it.
    pub fn models_relative(&self, path: &Path) -> String {
        let rel = path.strip_prefix(&self.models).unwrap_or(path);
        rel.to_string_lossy().into_owned()
    }

    /// After an install into artifact directory `dir`, or `gc`'s sweep of it: per generation,
    /// a model's directory holds its artifacts only, so the downloader's staging directory, once
    /// empty, is removed (one left non-empty by an interrupted download stays for its resume).
    /// Flat: the staging directory is shared by every model and stays.
    pub fn tidy_staging(&self, dir: &Path) {
        if self.generation_files().is_some() {
            // `remove_dir` removes an empty directory only, and never follows a symlink.
            let _ = std::fs::remove_dir(dir.join(downloader::STAGING_DIR));
        }
    }

    /// Whether a generation migration purges the old generation's driving artifacts before it
    /// downloads (flat: the new artifacts take the old ones' names), or only once the
    /// selected models of the new generation are in place (per generation: they live apart,
    /// so the old ones stay until the new ones are there).
    pub fn purge_before_download(&self) -> bool {
        self.generation_files().is_none()
    }

    /// Where the selection is kept.
    pub fn selection_store(&self) -> SelectionStore {
        match self.generation_files() {
            None => SelectionStore::Params,
            Some(_) => SelectionStore::Preferences,
        }
    }

    /// Of the flat layout's selection and catalog state (the `Model`, `DrivingModel` and
    /// profile params, the catalog params, the `.model_*.json` caches), what this layout
    /// writes: `params` and `files` as they are on a flat layout, where upstream's v25 modeld
    /// and UIs read them; nothing per generation, where upstream's v26 code reads the
    /// selection from `preferences.json` and the catalog from `catalog.json` only and no
    /// param at all, so a second copy could only come to disagree with them (the v25 values
    /// stay as v25 left them, as upstream's own v26 leaves them).
    pub fn flat_state_writes<P, F>(&self, params: Vec<P>, files: Vec<F>) -> (Vec<P>, Vec<F>) {
        match self.generation_files() {
            None => (params, files),
            Some(_) => (Vec::new(), Vec::new()),
        }
    }

    /// The accepted manifest `raw` as upstream's `atomic_json` writes it (keys sorted,
    /// Python's separators).
    fn python_sorted(&self, raw: &[u8]) -> Result<Vec<u8>> {
        let value: Value = serde_json::from_slice(raw).map_err(|e| Error::CorruptState {
            path: self.catalog_path(),
            message: format!("the accepted manifest is not JSON: {e}"),
        })?;
        Ok(manifest::json::to_python_sorted_string(&value).into_bytes())
    }

    /// The accepted manifest in the form upstream reads, when the layout keeps one apart from
    /// our own record (per generation): its path relative to `<models>` and its bytes (keys
    /// sorted, Python's separators, as upstream's `atomic_json` writes it). Flat: `None`, our
    /// `.catalog.json` is the catalog.
    pub fn upstream_catalog(&self, raw: &[u8]) -> Result<Option<(String, Vec<u8>)>> {
        let Some(files) = self.generation_files() else {
            return Ok(None);
        };
        let name = format!("{}/{}", self.generation, files.catalog);
        Ok(Some((name, self.python_sorted(raw)?)))
    }

    /// The per-generation files, or an error naming the contract that has none.
    fn per_generation(&self) -> Result<&'static GenerationFiles> {
        self.generation_files().ok_or_else(|| Error::CorruptState {
            path: self.root(),
            message: format!(
                "the {} contract keeps no per-generation files",
                self.contract.name
            ),
        })
    }

    fn lock_path(&self, name: &str) -> PathBuf {
        self.root().join(name)
    }

    /// Run `f` holding `flock` on the state lock (created when missing), as upstream does
    /// around every state read-modify-write.
    /// A dry run creates nothing: it takes the lock when the lock file is there, and reads
    /// without it when it is not (upstream replaces every state file atomically).
    pub fn with_state_lock<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let files = self.per_generation()?;
        let path = self.lock_path(files.state_lock);
        if self.effects.is_plan() && std::fs::symlink_metadata(&path).is_err() {
            return f();
        }
        let _held = lock_file(&path, Blocking::Wait)?.expect("a waiting lock is always taken");
        f()
    }

    /// `preferences.json` as upstream reads it (see [`Preferences::parse`]); defaults when it
    /// is missing or unreadable. Read under the state lock.
    pub fn read_preferences(&self) -> Result<Preferences> {
        self.with_state_lock(|| Ok(self.read_preferences_unlocked()))
    }

    fn read_preferences_unlocked(&self) -> Preferences {
        let bytes = self
            .per_generation()
            .ok()
            .and_then(|f| self.preferences_bytes(f));
        Preferences::parse(self.contract, self.tree_rows(), bytes.as_deref())
    }

    /// `preferences.json`'s bytes (`None`: missing, unreadable or over the contract's cap).
    fn preferences_bytes(&self, files: &GenerationFiles) -> Option<Vec<u8>> {
        let path = self.root().join(files.preferences);
        let cap = self.contract.preferences_max_bytes;
        self.effects.read(&path, cap).ok().flatten()
    }

    fn tree_rows(&self) -> &[manifest::contract::TreeCatalogRow] {
        self.tree.as_deref().map_or(&[], |t| t.catalog.as_slice())
    }

    /// The job as upstream reports it: the job file (when it is one upstream accepts) and
    /// whether its lock is held. A `running` job whose lock nobody holds was interrupted: it is
    /// rewritten so under the state lock, as upstream's manager does.
    pub fn job_status(&self) -> Result<JobStatus> {
        let files = self.per_generation()?;
        self.with_state_lock(|| {
            let job = self.read_job(files);
            let lock = self.lock_path(files.download_lock);
            // A dry run creates no lock file; one that is not there is held by nobody.
            let busy = !(self.effects.is_plan() && std::fs::symlink_metadata(&lock).is_err())
                && lock_file(&lock, Blocking::Try)?.is_none();
            let job = match job {
                Some(mut j) if !busy && j.state == JobState::Running => {
                    j.end(JobState::Interrupted, INTERRUPTED.to_string());
                    j.cancel_requested = false;
                    self.write_job(files, &j)?;
                    Some(j)
                }
                other => other,
            };
            Ok(JobStatus {
                job,
                downloading: busy,
            })
        })
    }

    /// The job file, when it is one upstream accepts (`None` otherwise).
    fn read_job(&self, files: &GenerationFiles) -> Option<Job> {
        let path = self.root().join(files.job);
        let bytes = self.effects.read(&path, JOB_LIMIT).ok().flatten()?;
        Job::parse(self.contract, &bytes)
    }

    /// Write the job file: an effect (a job started, ended, or found interrupted).
    fn write_job(&self, files: &GenerationFiles, job: &Job) -> Result<()> {
        self.effects.write_file(
            &self.models,
            &format!("{}/{}", self.generation, files.job),
            job.to_bytes(files).as_bytes(),
        )
    }

    /// Write a running job's progress text: through the same writer, but not an effect of
    /// the log. How many are written depends on time ([`JOB_PUBLISH`]), and each leaves what
    /// the job's start left (our job `running`, upstream's format), which the enumeration
    /// crashes after.
    fn write_job_progress(&self, files: &GenerationFiles, job: &Job) -> Result<()> {
        self.effects
            .cache_write(&self.root().join(files.job), job.to_bytes(files).as_bytes())
    }
}

/// What upstream's manager reads the job file with.
const JOB_LIMIT: u64 = 16 * 1024;
/// The progress a job left `running` by a dead process is rewritten with (upstream's words).
pub const INTERRUPTED: &str = "Previous model download was interrupted";

enum Blocking {
    Wait,
    Try,
}

/// `flock` on `path` (opened for append, created when missing, as upstream opens it): the
/// held file, or `None` when another open file description holds it and `how` is `Try`.
fn lock_file(path: &Path, how: Blocking) -> Result<Option<File>> {
    if let Some(parent) = path.parent() {
        fs_err::create_dir_all(parent)?;
    }
    let file = fs_err::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)?
        .into_parts()
        .0;
    let lock_error = |source| Error::Lock {
        path: path.to_path_buf(),
        source,
    };
    match how {
        Blocking::Wait => file.lock().map_err(lock_error)?,
        Blocking::Try => match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) => return Err(lock_error(e)),
        },
    }
    Ok(Some(file))
}

/// The selection as upstream's v26 manager keeps it in `preferences.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preferences {
    /// A non-GPU model of the tree's catalog, or the bundled selection.
    pub small: String,
    /// A GPU model of the tree's catalog, the bundled selection, or `""` (no big profile).
    pub big: String,
    pub user_favorites: Vec<String>,
    pub sort_mode: String,
    pub randomizer: bool,
    pub blacklisted_models: Vec<String>,
}

impl Preferences {
    /// What upstream starts from: the bundled model in both profiles, nothing else.
    pub fn defaults(contract: &Contract) -> Self {
        let sort = contract
            .generation_files
            .and_then(|f| f.sort_modes.first().copied())
            .unwrap_or_default();
        Self {
            small: contract.bundled_selection.to_string(),
            big: contract.bundled_selection.to_string(),
            user_favorites: Vec::new(),
            sort_mode: sort.to_string(),
            randomizer: false,
            blacklisted_models: Vec::new(),
        }
    }

    /// Whether `id` may stand in `profile` (`big`: a GPU model) under the tree's catalog.
    pub fn fits(
        contract: &Contract,
        rows: &[manifest::contract::TreeCatalogRow],
        id: &str,
        big: bool,
    ) -> bool {
        id == contract.bundled_selection
            || (big && id.is_empty())
            || rows
                .iter()
                .any(|r| r.id.as_str() == id && r.uses_external_gpu == big)
    }

    /// `preferences.json` read field by field as upstream reads it: a field that is missing or
    /// does not fit keeps its default; lists keep the catalog's ids, each once, in order.
    pub fn parse(
        contract: &Contract,
        rows: &[manifest::contract::TreeCatalogRow],
        bytes: Option<&[u8]>,
    ) -> Self {
        let mut p = Self::defaults(contract);
        let Some(Value::Object(saved)) = bytes.and_then(|b| serde_json::from_slice(b).ok()) else {
            return p;
        };
        for (key, big) in [("small", false), ("big", true)] {
            if let Some(Value::String(id)) = saved.get(key)
                && Self::fits(contract, rows, id, big)
            {
                *(if big { &mut p.big } else { &mut p.small }) = id.clone();
            }
        }
        for (key, out) in [
            ("userFavorites", &mut p.user_favorites),
            ("blacklistedModels", &mut p.blacklisted_models),
        ] {
            if let Some(Value::Array(items)) = saved.get(key) {
                *out = known_ids(rows, items.iter().filter_map(Value::as_str));
            }
        }
        if let Some(Value::Bool(b)) = saved.get("randomizer") {
            p.randomizer = *b;
        }
        if let Some(Value::String(mode)) = saved.get("sortMode") {
            p.set_sort_mode(contract, mode);
        }
        p
    }

    /// `mode` as the sort mode, when `contract` knows it.
    fn set_sort_mode(&mut self, contract: &Contract, mode: &str) {
        if (contract.generation_files).is_some_and(|f| f.sort_modes.contains(&mode)) {
            self.sort_mode = mode.to_string();
        }
    }

    /// The bytes upstream writes for these preferences.
    pub fn to_bytes(&self) -> Vec<u8> {
        let value = serde_json::json!({
            "small": self.small,
            "big": self.big,
            "userFavorites": self.user_favorites,
            "sortMode": self.sort_mode,
            "randomizer": self.randomizer,
            "blacklistedModels": self.blacklisted_models,
        });
        manifest::json::to_python_sorted_string(&value).into_bytes()
    }
}

/// The ids of `ids` that the tree's catalog lists, each once, in order.
fn known_ids<'a>(
    rows: &[manifest::contract::TreeCatalogRow],
    ids: impl Iterator<Item = &'a str>,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for id in ids {
        if rows.iter().any(|r| r.id.as_str() == id) && !out.iter().any(|o| o == id) {
            out.push(id.to_string());
        }
    }
    out
}

/// A job's state, named in the job file as upstream names it (`running`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Running,
    Completed,
    Failed,
    Interrupted,
}

/// `.download-job.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub job_id: String,
    pub state: JobState,
    /// The model being fetched (`""`: none).
    pub model: String,
    pub progress: String,
    pub download_all: bool,
    pub cancel_requested: bool,
    /// The variant name (`standard`, or the accelerator's key).
    pub variant: String,
}

impl Job {
    /// The job file as upstream accepts it; anything else is `None` (no job).
    pub fn parse(contract: &Contract, bytes: &[u8]) -> Option<Self> {
        let files = contract.generation_files?;
        let Value::Object(j) = serde_json::from_slice::<Value>(bytes).ok()? else {
            return None;
        };
        if j.get("schemaVersion").and_then(Value::as_i64) != Some(files.job_schema_version)
            || j.get("schemaVersion").is_some_and(Value::is_f64)
        {
            return None;
        }
        let id = j.get("jobId")?.as_str()?;
        if id.len() != files.job_id_hex_digits
            || !id
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return None;
        }
        let variant = match j.get("variant") {
            None => files.standard_variant,
            Some(v) => v.as_str()?,
        };
        if variant != files.standard_variant && variant != contract.accelerator.key {
            return None;
        }
        Some(Job {
            job_id: id.to_string(),
            state: serde_json::from_value(j.get("state")?.clone()).ok()?,
            model: j.get("model")?.as_str()?.to_string(),
            progress: j.get("progress")?.as_str()?.to_string(),
            download_all: j.get("downloadAll")?.as_bool()?,
            cancel_requested: j.get("cancelRequested")?.as_bool()?,
            variant: variant.to_string(),
        })
    }

    /// The job ended in `state` with its last `progress`: no model, no download-all.
    fn end(&mut self, state: JobState, progress: String) {
        (self.state, self.progress) = (state, progress);
        (self.model, self.download_all) = (String::new(), false);
    }

    /// The bytes upstream writes for this job.
    pub fn to_bytes(&self, files: &GenerationFiles) -> String {
        manifest::json::to_python_sorted_string(&serde_json::json!({
            "schemaVersion": files.job_schema_version,
            "jobId": self.job_id,
            "state": self.state,
            "model": self.model,
            "progress": self.progress,
            "downloadAll": self.download_all,
            "cancelRequested": self.cancel_requested,
            "variant": self.variant,
        }))
    }
}

/// The job as seen from outside: the file, and whether someone holds the download lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobStatus {
    pub job: Option<Job>,
    /// The download lock is held (by another process, or by another job of this one).
    pub downloading: bool,
}

/// Our download job: holds `flock` on the download lock for its life and keeps the job file
/// current, so upstream's manager and UI see it, its progress, and can cancel it.
#[derive(Debug)]
pub struct DownloadJob {
    files: DeviceFiles,
    job: Job,
    _lock: File,
}

impl DownloadJob {
    /// Start a job for `model` (`""` for a refresh or download-all): take the download lock
    /// without waiting ([`Error::Busy`] naming it when another manager is downloading), and
    /// write the running job under the state lock.
    pub fn start(
        files: &DeviceFiles,
        model: &str,
        variant: Variant,
        download_all: bool,
        progress: &str,
    ) -> Result<Self> {
        let gf = files.per_generation()?;
        files.with_state_lock(|| {
            let lock_path = files.lock_path(gf.download_lock);
            let lock =
                lock_file(&lock_path, Blocking::Try)?.ok_or(Error::Busy { path: lock_path })?;
            let job = Job {
                job_id: new_job_id(gf.job_id_hex_digits)?,
                state: JobState::Running,
                model: model.to_string(),
                progress: cut(progress, gf.job_progress_max_chars),
                download_all,
                cancel_requested: false,
                variant: match variant {
                    Variant::Standard => gf.standard_variant,
                    Variant::Accelerator => files.contract.accelerator.key,
                }
                .to_string(),
            };
            files.write_job(gf, &job)?;
            Ok(DownloadJob {
                files: files.clone(),
                job,
                _lock: lock,
            })
        })
    }

    /// Whether this job should stop: a cancel was requested on it (by any process), or the
    /// file no longer names it running.
    pub fn cancel_requested(&self) -> bool {
        let Ok(gf) = self.files.per_generation() else {
            return true;
        };
        match self.files.read_job(gf) {
            Some(j) => {
                j.job_id != self.job.job_id || j.state != JobState::Running || j.cancel_requested
            }
            None => true,
        }
    }

    /// Publish progress (and the model being fetched) under the state lock. A job file that
    /// no longer names this job running, or that asks it to cancel, keeps its bytes and the
    /// answer is [`JobUpdate::Stop`].
    pub fn publish(&mut self, progress: Option<&str>, model: Option<&str>) -> Result<JobUpdate> {
        let gf = self.files.per_generation()?;
        let files = self.files.clone();
        files.with_state_lock(|| {
            let Some(mut on_file) = files.read_job(gf) else {
                return Ok(JobUpdate::Stop);
            };
            if on_file.job_id != self.job.job_id || on_file.state != JobState::Running {
                return Ok(JobUpdate::Stop);
            }
            if let Some(p) = progress {
                on_file.progress = cut(p, gf.job_progress_max_chars);
            }
            if let Some(m) = model {
                on_file.model = m.to_string();
            }
            if on_file != self.job || progress.is_some() || model.is_some() {
                files.write_job_progress(gf, &on_file)?;
            }
            let stop = on_file.cancel_requested;
            self.job = on_file;
            Ok(if stop { JobUpdate::Stop } else { JobUpdate::Go })
        })
    }

    /// End the job: `completed` or `failed` with its last progress, model and download-all
    /// cleared, then the download lock is released.
    pub fn finish(self, failed: bool, progress: &str) -> Result<()> {
        let gf = self.files.per_generation()?;
        let files = self.files.clone();
        files.with_state_lock(|| {
            if let Some(mut j) = files.read_job(gf)
                && j.job_id == self.job.job_id
            {
                let state = if failed {
                    JobState::Failed
                } else {
                    JobState::Completed
                };
                j.end(state, cut(progress, gf.job_progress_max_chars));
                files.write_job(gf, &j)?;
            }
            drop(self);
            Ok(())
        })
    }
}

/// What a running job is told when it publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobUpdate {
    Go,
    Stop,
}

fn cut(s: &str, max_chars: usize) -> String {
    s.chars().take(max_chars).collect()
}

/// A fresh job id: `digits` lowercase hex digits from the kernel's random source.
fn new_job_id(digits: usize) -> Result<String> {
    let mut bytes = vec![0u8; digits.div_ceil(2)];
    fs_err::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let mut id: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    id.truncate(digits);
    Ok(id)
}

/// The shortest time between two progress texts written to the job file.
pub const JOB_PUBLISH: std::time::Duration = std::time::Duration::from_millis(250);

/// How often a running job looks at the job file for a cancel set by another process.
pub const JOB_POLL: std::time::Duration = std::time::Duration::from_millis(100);

impl DeviceFiles {
    /// Run a download of `model` (`""`: a download of all) the way this layout keeps its jobs.
    /// Flat: `f` runs with `cancel` as it is. Per generation: under a [`DownloadJob`] (or
    /// [`Error::Busy`] when another manager holds the download lock): `f` gets a token that is
    /// also cancelled when any process sets `cancelRequested` on the job, and a publisher of
    /// progress texts the job file carries; the job ends `completed` or `failed` with `f`.
    pub fn under_job<T>(
        &self,
        model: &str,
        variant: Variant,
        download_all: bool,
        cancel: &downloader::CancelToken,
        f: impl FnOnce(&downloader::CancelToken, &(dyn Fn(&str) + Sync)) -> Result<T>,
    ) -> Result<T> {
        if self.generation_files().is_none() {
            return f(cancel, &|_| {});
        }
        let job = DownloadJob::start(self, model, variant, download_all, "Starting download")?;
        let job = std::sync::Mutex::new(job);
        let inner = downloader::CancelToken::new();
        // The watcher wakes at once when `f` ends (the sender is dropped), else every poll.
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let result = std::thread::scope(|s| {
            let (job, inner) = (&job, &inner);
            s.spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    finished.recv_timeout(JOB_POLL)
                {
                    if cancel.is_cancelled() || lock(job).cancel_requested() {
                        inner.cancel();
                        return;
                    }
                }
            });
            // Progress reaches the job file at most every [`JOB_PUBLISH`] (each write is an
            // fsynced replace); the first text at once.
            let last = std::sync::Mutex::new(None::<std::time::Instant>);
            let publish = |text: &str| {
                let mut last = lock(&last);
                if last.is_some_and(|t| t.elapsed() < JOB_PUBLISH) {
                    return;
                }
                *last = Some(std::time::Instant::now());
                if let Ok(JobUpdate::Stop) = lock(job).publish(Some(text), None) {
                    inner.cancel();
                }
            };
            let r = f(inner, &publish);
            drop(done);
            r
        });
        let job = job.into_inner().unwrap_or_else(|p| p.into_inner());
        // A simulated crash inside `f` stops everything at once, as kill -9 would: the job
        // file stays `running` with nobody holding its lock (upstream reads it interrupted).
        if let Err(Error::Crashed { .. }) = &result {
            return result;
        }
        let (failed, text) = match &result {
            Ok(_) => (false, "Downloaded!".to_string()),
            Err(e) => (true, e.to_string()),
        };
        job.finish(failed, &text)?;
        result
    }
}

/// What the user chose on a flat-layout generation, as its params held it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlatChoice {
    /// The selection and the two profiles (canonical ids; `None`: unset).
    pub slots: crate::rules::choice::Slots,
    /// `UserFavorites`, `BlacklistedModels` (comma-joined ids).
    pub favorites: Option<String>,
    pub blacklisted: Option<String>,
    pub sort_mode: Option<String>,
    pub randomizer: bool,
}

/// The preferences a per-generation device starts with when it comes from a flat one: the
/// user's selection and profiles carried over (the old contract's bundled id becomes the new
/// one's; a model absent from the tree's catalog, or of the wrong kind for its profile, becomes
/// the bundled model), the big profile disabled stays disabled, favourites, exclusions, sort
/// mode and randomizer kept where the new contract knows them. Pure.
pub fn carry_flat_choice(
    from: &Contract,
    to: &Contract,
    rows: &[manifest::contract::TreeCatalogRow],
    choice: &FlatChoice,
) -> Preferences {
    let mut p = Preferences::defaults(to);
    let map = |id: &str| -> String {
        if id == from.bundled_selection || crate::rules::contract::is_builtin_id(id) {
            to.bundled_selection.to_string()
        } else {
            id.to_string()
        }
    };
    let gpu = |id: &str| {
        rows.iter()
            .any(|r| r.id.as_str() == id && r.uses_external_gpu)
    };
    let small = choice
        .slots
        .small
        .as_deref()
        .or(choice.slots.selection.as_deref());
    if let Some(id) = small.map(map)
        && Preferences::fits(to, rows, &id, false)
    {
        p.small = id;
    }
    p.big = match choice.slots.big.as_deref() {
        Some(crate::rules::contract::BIG_DISABLED) => String::new(),
        Some(id) => Some(map(id))
            .filter(|id| *id != to.bundled_selection && Preferences::fits(to, rows, id, true))
            .unwrap_or_else(|| to.bundled_selection.to_string()),
        // No big profile chosen: a GPU model selected is the big one.
        None => match choice.slots.selection.as_deref() {
            Some(id) if gpu(id) => id.to_string(),
            _ => to.bundled_selection.to_string(),
        },
    };
    let list = |raw: &Option<String>| {
        known_ids(rows, raw.iter().flat_map(|r| r.split(',')).map(str::trim))
    };
    p.user_favorites = list(&choice.favorites);
    p.blacklisted_models = list(&choice.blacklisted);
    if let Some(mode) = &choice.sort_mode {
        p.set_sort_mode(to, mode);
    }
    p.randomizer = choice.randomizer;
    p
}

// ---- What the generation's own files say (read as upstream reads them) ----

impl DeviceFiles {
    /// The accepted manifest as upstream's `catalog(root)` takes it: `<gen>/catalog.json` when
    /// it passes the contract's whole-manifest rules for this generation, the tree's compiler
    /// revision and its reviewed catalog; `None` when it is missing, unreadable or refused
    /// (upstream then has only the tree's rows, which install nothing). `None` on a flat layout.
    pub fn accepted_catalog(&self) -> Option<manifest::Manifest> {
        let files = self.generation_files()?;
        let tree = self.tree()?;
        let limits = manifest::Limits::default();
        let bytes = self
            .effects
            .read(
                &self.root().join(files.catalog),
                crate::state::bounded::CATALOG_LIMIT,
            )
            .ok()
            .flatten()?;
        let problems = manifest::validate_for_contract(
            &bytes,
            manifest::ValidationMode::Reader,
            self.contract,
            &manifest::Expectation {
                generation: Some(self.generation),
                revision: Some(&tree.compiler_revision),
                tree: Some(tree),
            },
            &limits,
        );
        if !problems.is_empty() {
            return None;
        }
        manifest::Manifest::from_slice(&bytes).ok()
    }

    /// These preferences (read under this generation's state lock) as upstream would read the
    /// same bytes in generation `to`: against `to`'s reviewed catalog, so an id `to` does not
    /// list is the bundled model (small, big) or left out (favourites, exclusions).
    pub fn read_preferences_as(&self, to: &DeviceFiles) -> Result<Preferences> {
        let files = self.per_generation()?;
        self.with_state_lock(|| {
            let bytes = self.preferences_bytes(files);
            Ok(Preferences::parse(
                to.contract,
                to.tree_rows(),
                bytes.as_deref(),
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use manifest::contract::{ContractName, TreeCatalogRow};

    fn rows() -> Vec<TreeCatalogRow> {
        [("sc2", false), ("pop223", false), ("big223", true)]
            .into_iter()
            .map(|(id, gpu)| TreeCatalogRow {
                id: id.parse().unwrap(),
                name: id.to_uppercase(),
                version: "v9".parse().unwrap(),
                uses_external_gpu: gpu,
                model_lab_eligible: false,
            })
            .collect()
    }

    fn slots(selection: Option<&str>, small: Option<&str>, big: Option<&str>) -> FlatChoice {
        FlatChoice {
            slots: crate::rules::choice::Slots {
                selection: selection.map(Into::into),
                small: small.map(Into::into),
                big: big.map(Into::into),
            },
            ..FlatChoice::default()
        }
    }

    /// The v25 choice carried into the v26 contract's preferences, case by case.
    #[test]
    fn a_flat_choice_is_carried() {
        let (v25, v26) = (ContractName::V25.contract(), ContractName::V26.contract());
        let b = v26.bundled_selection;
        let cases = [
            ("nothing chosen", slots(None, None, None), (b, b)),
            ("the built-in", slots(Some("rdf43"), None, None), (b, b)),
            (
                "a listed model",
                slots(Some("pop223"), None, None),
                ("pop223", b),
            ),
            (
                "absent from the catalog",
                slots(Some("gone1"), None, None),
                (b, b),
            ),
            (
                "small profile wins",
                slots(Some("pop223"), Some("sc2"), None),
                ("sc2", b),
            ),
            (
                "a GPU selection is big",
                slots(Some("big223"), None, None),
                (b, "big223"),
            ),
            (
                "big disabled",
                slots(Some("sc2"), None, Some("none")),
                ("sc2", ""),
            ),
            (
                "big profile",
                slots(Some("sc2"), None, Some("big223")),
                ("sc2", "big223"),
            ),
            (
                "big not a GPU model",
                slots(None, None, Some("sc2")),
                (b, b),
            ),
            ("big absent", slots(None, None, Some("gone1")), (b, b)),
            (
                "small is a GPU model",
                slots(None, Some("big223"), None),
                (b, b),
            ),
        ];
        for (what, choice, (small, big)) in cases {
            let p = carry_flat_choice(v25, v26, &rows(), &choice);
            assert_eq!((p.small.as_str(), p.big.as_str()), (small, big), "{what}");
        }
        let choice = FlatChoice {
            favorites: Some("sc2,gone1,sc2,big223".into()),
            blacklisted: Some("pop223".into()),
            sort_mode: Some("alphabetical".into()),
            randomizer: true,
            ..slots(Some("sc2"), None, None)
        };
        let p = carry_flat_choice(v25, v26, &rows(), &choice);
        assert_eq!(p.user_favorites, ["sc2", "big223"]);
        assert_eq!(p.blacklisted_models, ["pop223"]);
        assert_eq!(p.sort_mode, "name", "a v25 sort mode v26 does not know");
        assert!(p.randomizer);
        let p = carry_flat_choice(
            v25,
            v26,
            &rows(),
            &FlatChoice {
                sort_mode: Some("series".into()),
                ..choice
            },
        );
        assert_eq!(p.sort_mode, "series");
        // What is carried reads back as itself under upstream's reading rules.
        assert_eq!(Preferences::parse(v26, &rows(), Some(&p.to_bytes())), p);
    }

    /// Paths per layout: flat as today, per generation under `<gen>/<id>/`, for v26 and a
    /// made-up v27 with v26's contract.
    #[test]
    fn paths_per_layout() {
        let id: ModelId = "sc2".parse().unwrap();
        let data = Path::new("/data");
        let flat = DeviceFiles::new(
            ContractName::V25.contract(),
            data,
            Generation::new(25),
            None,
        );
        assert_eq!(
            flat.artifact_path(&id, Variant::Standard),
            Path::new("/data/models/sc2_driving_tinygrad.pkl")
        );
        assert_eq!(
            flat.artifact_path(&id, Variant::Accelerator),
            Path::new("/data/models/sc2_driving_chestnut_tinygrad.pkl")
        );
        assert_eq!(flat.catalog_path(), Path::new("/data/models/.catalog.json"));
        assert_eq!(flat.selection_store(), SelectionStore::Params);
        for n in [26, 27] {
            let f = DeviceFiles::new(ContractName::V26.contract(), data, Generation::new(n), None);
            let root = PathBuf::from(format!("/data/models/v{n}"));
            assert_eq!(f.root(), root);
            assert_eq!(
                f.artifact_path(&id, Variant::Standard),
                root.join("sc2/sc2_driving_tinygrad.pkl")
            );
            assert_eq!(
                f.artifact_path(&id, Variant::Accelerator),
                root.join("sc2/sc2_driving_amd_tinygrad.pkl")
            );
            assert_eq!(f.catalog_path(), root.join("catalog.json"));
            assert_eq!(f.selection_store(), SelectionStore::Preferences);
        }
    }
}
