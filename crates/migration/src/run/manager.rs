//! The operations of the manager: refresh (with the journaled generation migration), download,
//! verify and gc. Each runs under the manager lock, taken by the caller.
//!
//! Migration state machine, journaled in `<models>/.migration.json` (written atomically before
//! each phase starts):
//!
//! 1. the new catalog is stored (`.catalog.json`), then the journal is written with phase
//!    `purge` and the selection to keep;
//! 2. `purge`: every non-local driving artifact is deleted (idempotent), then phase `download`;
//! 3. `download`: the kept selection and profile models are downloaded and verified (an already
//!    verified install is kept); what cannot be had is replaced by the built-in (selection,
//!    small profile) or dropped (big profile), see `contract::decide`;
//! 4. the selection and profile params, the catalog params and the three JSON caches are
//!    written, then `ModelManifestVersion`, then the journal is removed.
//!
//! A refresh of the same generation runs steps 3 and 4 without a journal: it re-checks the
//! selection and repairs a device whose selected artifact is missing or of another generation.
//!
//! A crash anywhere leaves the journal, and the next run resumes at the recorded phase, so the
//! end state is the same as an uninterrupted run. `resolve` answers the built-in while a journal
//! exists, so modeld never loads an old-generation pickle in between.

use fs_err as fs;
use std::collections::BTreeSet;

use downloader::{CancelToken, Downloader, Event, Installed};
use manifest::{Generation, ModelEntry, ModelId, UnixSeconds};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::report::progress::{Progress, ProgressFn, Transferred};
use crate::rules::choice::{self, Caller, Failure, Fate};
use crate::rules::contract::{self, Catalog, Outcome};
use crate::rules::decisions::{Installs, Settled, chosen, contract_writes, journal_now, settle};
use crate::rules::plan::{self, InstallStep};
use crate::state::device::{Device, JOURNAL_FILE, VerifyState};
use crate::state::effects::lock;
use crate::state::journal::{Journal, Phase, write_journal};
use crate::state::params::keys;
use crate::state::view::{DeviceView, param_slots};

/// Steps 1–2 of a migration (journal, built-in everywhere, purge), or where an interrupted
/// one stands. `catalog` is the new generation's, or the offline stand-in (built-in and local
/// models only) when no manifest could be fetched. Returns the journal (`None` on the same
/// generation), the purged files, and whether this run pointed the params at the built-in (its
/// purge phase ran now).
pub(crate) fn begin_migration(
    device: &Device,
    view: &DeviceView,
    catalog: &Catalog,
) -> Result<(Option<Journal>, Vec<String>, bool)> {
    let (journal, write) = journal_now(view, catalog, device.slots_for_move(view.previous())?)?;
    if write && let Some(j) = &journal {
        write_journal(device, j)?;
    }
    let mut purged = Vec::new();
    if let Some(j) = &journal
        && j.phase == Phase::Purge
    {
        // Before anything is deleted, point everything modeld and the UIs read at the built-in
        // (the journal keeps what to restore): a modeld starting mid-migration then loads the
        // built-in, never an old-generation pickle and never a file about to be purged.
        // Onroad (the car may have left since the refresh began), nothing is purged.
        device.ensure_offroad("the migration")?;
        // Where the selection lives in the new layout (per generation: preferences.json),
        // the user's choice as the journal keeps it is carried there first, once.
        if device.files().selection_store() == crate::state::layout::SelectionStore::Preferences {
            device.carry_slots(
                manifest::contract::BASE_CONTRACT.contract(),
                &j.slots(),
                j.from.as_deref(),
            )?;
        }
        write_contract(
            device,
            catalog,
            &contract::interim(&j.wanted(catalog), catalog),
        )?;
        if device.files().purge_before_download() {
            purged = purge(device, j.from.as_deref())?;
        }
        let mut j = j.clone();
        j.phase = Phase::Download;
        write_journal(device, &j)?;
        return Ok((Some(j), purged, true));
    }
    Ok((journal, purged, false))
}

/// What a refresh did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefreshReport {
    pub generation: Generation,
    pub manifest_origin: String,
    pub models: usize,
    pub migrated_from: Option<String>,
    pub purged: Vec<String>,
    pub selected: ModelId,
    pub fell_back_to_builtin: bool,
    /// Chosen models that could not be had this time: the built-in (or a verified older copy)
    /// stands in and later refreshes retry them.
    pub retrying: Vec<String>,
    /// Chosen models absent from the catalog, dropped for good.
    pub dropped: Vec<String>,
    /// Chosen GPU-only models not fetched because no Chestnut is ready (a big profile naming
    /// one is kept; a selection naming one stands in as the built-in until one is ready).
    pub needs_chestnut: Vec<String>,
    /// Manifest entries left out of the catalog, each with its reason; the rest work.
    pub refused_entries: Vec<crate::state::device::RefusedModel>,
    /// Artifacts the daily byte budget held back (the daemon's automatic refresh only): not a
    /// failure, so no retry is scheduled for them; the model stays pending.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub held_back: Vec<crate::rules::budget::HeldBack>,
    /// What it went through besides (the dry run reports it); not in `--json`.
    #[serde(skip)]
    pub(crate) went_through: RefreshRun,
}

/// What a refresh went through besides its report (the dry run reports it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RefreshRun {
    pub manifest_url: String,
    /// The journal it went on with: a migration started or resumed.
    pub journal: Option<Journal>,
    /// Each wanted catalog model, its state before, and what the run did with it.
    pub steps: Vec<(ModelId, VerifyState, InstallStep)>,
}

/// The catalog a device knows without a manifest (the offline first boot: a build of another
/// generation than the device's, started with no network): the built-in and its local models.
/// [`begin_migration`] over it journals the choice, points everything modeld and the UIs read
/// at the built-in and purges the old generation's driving artifacts; once a manifest is
/// fetched, `refresh` resumes the journal at its download phase and installs the user's model.
fn offline_catalog(device: &Device) -> Result<Catalog> {
    let builtin = manifest::Manifest::from_value(serde_json::json!({"models": [{
        "id": manifest::layout::BUILTIN_MODEL_ID,
        "name": manifest::layout::BUILTIN_MODEL_NAME,
        "version": manifest::layout::BUILTIN_MODEL_VERSION.to_string(),
    }]}))?;
    device.device_catalog(&builtin)
}

/// The failure tail of a refresh whose manifest fetch failed with `e`: a trust refusal is
/// recorded; offline (or every manifest unusable), a device on another generation runs the
/// offline first boot now (not on a cancel or a trust refusal, which changes nothing:
/// docs/device.md, *Trust*).
pub(crate) fn failed_fetch(device: &Device, e: &Error) -> Result<()> {
    let Error::Download(d) = e else {
        return Ok(());
    };
    let refusals = downloader::trust::refusals(d);
    if !refusals.is_empty() {
        let generation = device.config.generation;
        crate::state::trust_state::record_refusal(device, generation, &refusals)
    } else if matches!(d, downloader::Error::Cancelled { .. }) {
        Ok(())
    } else {
        // The offline first boot: the journal and purge steps over the offline catalog (a
        // device on this generation already changes nothing).
        let catalog = offline_catalog(device)?;
        begin_migration(device, &DeviceView::read(device).strict()?, &catalog)?;
        Ok(())
    }
}

/// The first step of `run` on a device whose params still belong to another generation than
/// its tree's (the tree changed since the last refresh), taken before any network: the offline
/// first boot's steps (see [`failed_fetch`]) — the choice journaled, everything modeld and the
/// UIs read pointed at the built-in, the old generation's driving artifacts purged — so no
/// reader of the params (modeld's "load `<id>_driving_tinygrad.pkl` when present" included)
/// opens an old-generation pickle while the first refresh is still fetching. The refresh then
/// resumes the journal at its download phase, exactly as after an offline boot. Offroad only;
/// a device with no generation on record, on its tree's generation, or with a migration already
/// past its purge, is not touched. Returns the generation the params came from when it changed anything.
pub fn settle_new_tree(device: &Device) -> Result<Option<String>> {
    device.ensure_offroad("the first step on a new tree")?;
    device.ensure_dirs()?;
    let view = DeviceView::read(device).strict()?;
    // A device with no generation on record (a first start) has no old pickle named anywhere:
    // nothing to make safe, and nothing is written before a manifest is had (a refused one
    // changes nothing, see docs/device.md, *Trust*).
    if view.previous().is_none() {
        return Ok(None);
    }
    let catalog = offline_catalog(device)?;
    let (journal, _purged, changed) = begin_migration(device, &view, &catalog)?;
    Ok(changed.then(|| {
        journal
            .and_then(|j| j.from)
            .unwrap_or_else(|| "an unknown generation".to_string())
    }))
}

/// Who runs a refresh, when, and how it is stopped and reports: what the steps of one refresh
/// share besides the device. [`Run::new`] is the daemon's refresh now, quiet and never
/// cancelled; the fields say otherwise.
#[derive(Clone)]
pub struct Run<'a> {
    pub dl: &'a Downloader,
    /// Raised by SIGTERM, the car going onroad, or a cancel from the UI.
    pub cancel: CancelToken,
    pub progress: ProgressFn<'a>,
    /// Unix seconds, which decide which retries are due.
    pub now_unix: u64,
    /// A person's refresh ([`Caller::Person`], the `refresh` command) tries every pending model
    /// at once; the daemon's ([`Caller::Daemon`]) waits for each one's backoff.
    pub caller: Caller,
}

impl<'a> Run<'a> {
    pub fn new(dl: &'a Downloader) -> Self {
        Run {
            dl,
            cancel: CancelToken::new(),
            progress: &|_| {},
            now_unix: UnixSeconds::now().0,
            caller: Caller::Daemon,
        }
    }
}

/// What installing the wanted catalog models came to.
#[derive(Default)]
struct InstallRound {
    installs: Installs,
    /// Each wanted catalog model, its state before, and what the run did with it.
    steps: Vec<(ModelId, VerifyState, InstallStep)>,
    /// Models whose catalog bytes modeld could not start here: no retry is scheduled for them
    /// (nothing to retry until the catalog lists other bytes, which are fetched at once).
    failed_to_start: BTreeSet<ModelId>,
    /// Models the daily byte budget held back, and what it said of each.
    held_back: BTreeSet<ModelId>,
    held: Vec<crate::rules::budget::HeldBack>,
    /// The first install refused for want of space: the refresh ends with it (exit 8), once
    /// everything else is written.
    no_space: Option<Error>,
}

/// Fetch the manifest, store it, migrate if the generation changed (or a migration was
/// interrupted), then make everything modeld and the UIs read agree with the catalog: the
/// selection and profile params (repaired to the built-in where a wanted model cannot be had),
/// the catalog params and the three JSON caches. On a device in plan mode
/// ([`Device::planning`]) it is the dry run: downloads are assumed to succeed.
pub fn refresh(device: &Device, by: &Run) -> Result<RefreshReport> {
    // Onroad: not one request, not one file touched.
    device.ensure_offroad("refresh")?;
    device.ensure_dirs()?;
    let (fetched, refused) = fetch_and_store(device, by.dl, &by.cancel)?;
    // What the decisions take, read once (the catalog just stored among it); the params again
    // only after a purge phase of this run pointed them at the built-in.
    let mut view = DeviceView::read(device);
    let manifest = view.take_catalog()?;
    let catalog = device.device_catalog(&manifest)?;
    let view = view.strict()?;
    let (journal, purged, interim) = begin_migration(device, &view, &catalog)?;
    let record = view.choice().cloned();
    // A layout's own selection store (per generation: preferences.json, upstream's or carried
    // there by a purge phase) is what the user chose; else the params.
    let slots_now = match (interim, device.stored_slots()?) {
        (_, Some(stored)) => stored,
        (true, None) => param_slots(device)?,
        (false, None) => view.slots(),
    };
    let (raw, wanted) = chosen(journal.as_ref(), record.as_ref(), &slots_now, &catalog);
    // Every wanted catalog model verified (kept) or installed; what cannot be had is replaced.
    let mut round = install_wanted(device, by, &manifest, &wanted, record.as_ref())?;
    let mut report = RefreshReport {
        generation: device.config.generation,
        manifest_origin: fetched.origin,
        models: manifest.models().len(),
        migrated_from: journal.as_ref().and_then(|j| j.from.clone()),
        purged,
        selected: wanted.selection.clone(),
        fell_back_to_builtin: false,
        retrying: Vec::new(),
        dropped: Vec::new(),
        needs_chestnut: Vec::new(),
        refused_entries: refused,
        held_back: std::mem::take(&mut round.held),
        went_through: RefreshRun {
            manifest_url: fetched.url,
            journal: journal.clone(),
            steps: std::mem::take(&mut round.steps),
        },
    };
    // An `IsOnroad` that cannot be read is not taken as offroad: the selection is held as onroad.
    let onroad = device.is_onroad().unwrap_or(true);
    let Settled {
        fates,
        outcome,
        mut next,
    } = settle(
        (&raw, &wanted),
        &catalog,
        &round.installs,
        &|id| device.local_present(id),
        record.as_ref(),
        onroad.then_some(&slots_now),
        by.now_unix,
    );
    next.retry
        .retain(|id, _| !round.failed_to_start.iter().any(|f| f.as_str() == id));
    round.report(
        &mut report,
        &fates,
        &outcome,
        &wanted.selection,
        by.progress,
    );
    // The choice first, staged (see `choice::staged`): a crash anywhere in the param writes
    // reads every slot as ours, so neither a fallback nor a switch back loses the choice.
    device.store_choice(&choice::staged(&next, &slots_now))?;
    write_contract(device, &catalog, &outcome)?;
    device.store_choice(&next)?;
    report.selected = outcome.selection.id.clone();
    report.fell_back_to_builtin = outcome.fell_back;

    if let Some(j) = journal {
        finish_migration(device, &j, &mut report)?;
    }
    // Blocked on space: everything else is done (the built-in or the older copy stands in), and
    // the refresh says so with the amount needed (exit 8), instead of "nothing to do".
    match round.no_space {
        Some(no_space) => Err(no_space),
        None => Ok(report),
    }
}

/// A migration's last steps, with the new selection in place: a layout that keeps generations
/// apart purges the old one's driving artifacts only now (idempotent: a resumed run purges what
/// is left), then `ModelManifestVersion`, then the journal goes.
fn finish_migration(device: &Device, j: &Journal, report: &mut RefreshReport) -> Result<()> {
    if !device.files().purge_before_download() {
        report.purged = purge(device, j.from.as_deref())?;
    }
    device
        .params
        .put(keys::MODEL_MANIFEST_VERSION, &j.to.to_string())?;
    device.remove_file(JOURNAL_FILE)
}

/// Fetch the manifest (cancellable: SIGTERM, the car going onroad; signature checked when keys
/// are trusted), store it with the entries it refused, and mark bad what modeld failed to start
/// since the last look. A failed fetch goes through [`failed_fetch`].
fn fetch_and_store(
    device: &Device,
    dl: &Downloader,
    cancel: &CancelToken,
) -> Result<(
    downloader::FetchedManifest,
    Vec<crate::state::device::RefusedModel>,
)> {
    let fetched = match crate::state::trust_state::fetch_accepted(device, dl, cancel) {
        Ok(f) => f,
        Err(e) => {
            failed_fetch(device, &e)?;
            return Err(e);
        }
    };
    crate::state::trust_state::store_accepted(device, &fetched)?;
    // modeld may have failed to start what this manager installed since the daemon last
    // looked (or with no daemon running): marked bad now, before anything is fetched again.
    crate::state::load_receipt::notice_failed_start(device)?;
    let refused: Vec<crate::state::device::RefusedModel> =
        fetched.refused_entries.iter().map(Into::into).collect();
    device.write_json(crate::state::device::REFUSED_FILE, &refused)?;
    Ok((fetched, refused))
}

/// Each wanted catalog model kept (verified), left to wait, or installed now; an install
/// failure that must stop the refresh stops it here.
fn install_wanted(
    device: &Device,
    by: &Run,
    manifest: &manifest::Manifest,
    wanted: &contract::Wanted,
    record: Option<&choice::Choice>,
) -> Result<InstallRound> {
    let mut round = InstallRound::default();
    let chestnut = device.chestnut();
    for id in wanted.to_install() {
        let Some(entry) = manifest.get(&id) else {
            continue;
        };
        let state = device.verify_entry(entry, false)?;
        let retry = record.and_then(|r| r.retry.get(id.as_str()));
        let step = (round.installs).step(entry, state, retry, chestnut, by.now_unix, by.caller);
        round.steps.push((id.clone(), state, step));
        match step {
            InstallStep::Keep | InstallStep::Wait | InstallStep::NeedsChestnut => continue,
            InstallStep::Fetch => {}
        }
        (by.progress)(&Progress::DownloadingSelected(id.clone()));
        match install(device, by.dl, entry, &by.cancel, by.progress) {
            Ok(_) => {
                round.installs.ok.insert(id);
            }
            Err(e) => round.failed(id, e)?,
        }
    }
    Ok(round)
}

impl InstallRound {
    /// Record why `id` was not installed, or stop the refresh with `e`.
    fn failed(&mut self, id: ModelId, e: Error) -> Result<()> {
        match e {
            // A simulated crash, a cancel, a local I/O failure, or an origin whose files do not
            // match its manifest yet (a republish in progress): stop here, so the next run tries
            // again instead of giving up the selection. During a migration the journal stays
            // and the params already point at the built-in; on the same generation nothing was
            // written, so the selection is kept as it was.
            e @ Error::Crashed { .. } => return Err(e),
            // The car went onroad: stop before the download, keep everything for offroad.
            e @ Error::Onroad { .. } => return Err(e),
            Error::Download(e)
                if e.is_not_yet()
                    || (e.is_local()
                        && !matches!(e, downloader::Error::InsufficientSpace { .. })) =>
            {
                return Err(Error::Download(e));
            }
            e @ Error::Io(_) => return Err(e),
            // modeld could not start these very bytes: not an attempt, nothing fetched; the
            // built-in stands in and the choice stays until the catalog lists other bytes.
            Error::FailedToStart { why, .. } => {
                self.failed_to_start.insert(id.clone());
                self.installs.failed.insert(id, Failure::NotTried(why));
            }
            // Held back by the daily byte budget: not an attempt, so no failure is counted and
            // no backoff starts; the daemon logs it once a day.
            Error::HeldBack(held) => {
                self.held_back.insert(id.clone());
                let why = Failure::NotTried(held.to_string());
                self.installs.failed.insert(id, why);
                self.held.push(held);
            }
            // Anything else (every origin refused it, a full disk): the built-in, or the
            // verified older copy, stands in, and later refreshes retry it.
            e => {
                let why = Failure::Tried(e.to_string());
                self.installs.failed.insert(id, why);
                if let Error::Download(downloader::Error::InsufficientSpace { .. }) = &e {
                    self.no_space.get_or_insert(e);
                }
            }
        }
        Ok(())
    }

    /// The models retrying, dropped and waiting for a Chestnut, in the report; what became of
    /// the selection, and a want of space, in the progress.
    fn report(
        &self,
        report: &mut RefreshReport,
        fates: &std::collections::BTreeMap<ModelId, Fate>,
        outcome: &Outcome,
        selection: &ModelId,
        progress: ProgressFn,
    ) {
        let needs_chestnut = &self.installs.needs_chestnut;
        for (id, f) in fates {
            match f {
                _ if needs_chestnut.contains(id) => {}
                Fate::Temporary(_) | Fate::OldCopyInUse(_) => report.retrying.push(id.to_string()),
                Fate::Dropped => report.dropped.push(id.to_string()),
                Fate::Ok => {}
            }
        }
        report.needs_chestnut = needs_chestnut.iter().map(|id| id.to_string()).collect();
        match fates.get(selection) {
            _ if needs_chestnut.contains(selection) => progress(&Progress::ExternalGpuRequired),
            Some(Fate::Dropped) => progress(&Progress::SelectedUnavailable),
            _ if self.held_back.contains(selection) => progress(&Progress::HeldBack),
            Some(Fate::Temporary(_)) => progress(&Progress::SelectedRetrying),
            Some(Fate::OldCopyInUse(_)) => progress(&Progress::UpdateRetrying),
            _ if outcome.fell_back => progress(&Progress::SelectedUnavailable),
            _ => {}
        }
        if let Some(Error::Download(downloader::Error::InsufficientSpace {
            needed,
            available,
            ..
        })) = &self.no_space
        {
            progress(&Progress::NoSpace {
                short: needed.saturating_sub(*available),
            });
        }
    }
}

/// Write what modeld and the UIs read: selection and profile params, catalog params, caches
/// (where the layout keeps them: `DeviceFiles::flat_state_writes`).
pub(crate) fn write_contract(device: &Device, catalog: &Catalog, outcome: &Outcome) -> Result<()> {
    let (params, files) = contract_writes(catalog, outcome);
    let (params, files) = device.files().flat_state_writes(params, files);
    for (key, value) in params {
        match value {
            Some(v) => device.params.put(key, &v)?,
            None => device.params.remove(key)?,
        }
    }
    for (name, body) in files {
        device.write_file(name, &body)?;
    }
    Ok(())
}

/// Delete every non-local driving artifact in the models dir, and those generation `from`
/// installed under a root of its own in this layout (`<from>/<id>/`; its other files are
/// upstream's and kept).
fn purge(device: &Device, from: Option<&str>) -> Result<Vec<String>> {
    let names = device.model_file_names()?;
    let mut plan = plan::purge_plan(names.iter().map(String::as_str));
    let dir = device.models_dir();
    device
        .effects()
        .cache_remove(&dir.join(crate::state::device::VERIFIED_FILE));
    for name in &plan {
        device.effects().purge(&dir, name)?;
    }
    let files = device.files();
    for (sub, name) in device.previous_artifacts(from)? {
        device.effects().purge(&sub, &name)?;
        plan.push(files.models_relative(&sub.join(&name)));
    }
    Ok(plan)
}

/// Install `entry` unless a verified copy is already there. `Ok(None)` = already installed.
pub fn install(
    device: &Device,
    dl: &Downloader,
    entry: &ModelEntry,
    cancel: &CancelToken,
    progress: ProgressFn,
) -> Result<Option<Installed>> {
    device.ensure_offroad(&format!("the download of {}", entry.id()))?;
    // With trusted keys, bytes the signed manifest does not pin are never fetched: refused
    // before anything is written (`downloader::trust::digest_rule`).
    dl.check_signed(&dl.target(entry)?)?;
    let chestnut = device.chestnut();
    // A Chestnut variant the signature does not pin is left out (listed by `status` as not
    // installable); the model itself still installs.
    let variant = downloader::egpu::artifacts_to_fetch(entry, chestnut, dl.contract())?
        .into_iter()
        .nth(1)
        .filter(|v| dl.check_signed(v).is_ok());
    // The decision `download --dry-run` reports (`preview::download`); a requested download
    // is always due.
    let state = device.verify_entry(entry, false)?;
    let keep = plan::install_step(state, true) == InstallStep::Keep;
    // Planned (a dry run): the download is assumed to succeed.
    if !keep && device.effects().is_plan() {
        device.effects().installed(entry.id().as_str())?;
    }
    if keep || device.effects().is_plan() {
        if let Some(v) = variant {
            install_variant(device, dl, &v, cancel)?;
        }
        return Ok(None);
    }
    // An artifact modeld could not start on this device is not fetched again while the
    // catalog lists these very bytes (`load_receipt`).
    if let Some(why) = crate::state::load_receipt::condemned(device, entry) {
        return Err(Error::FailedToStart {
            id: entry.id().to_string(),
            why,
        });
    }
    // A verified copy of an earlier publish stays (and stays on record) until the new bytes
    // are installed over it.
    if state != VerifyState::Outdated {
        device.forget(entry.id())?;
    }
    let label = entry.name().unwrap_or(entry.id().as_str());
    let target = dl.target(entry)?;
    let Some(installed) = install_target(device, dl, &target, label, cancel, progress)? else {
        // Verified there already (put there by another manager): nothing fetched.
        return Ok(None);
    };
    // Record the fresh verification so the next resolve is a stat, not a re-hash.
    device.record_verified(entry, &installed.sha256, installed.size)?;
    device.effects().installed(entry.id().as_str())?;
    if let Some(v) = variant {
        install_variant(device, dl, &v, cancel)?;
    }
    Ok(Some(installed))
}

/// Download `target` (a model's standard artifact) where the device's layout installs it, under
/// the layout's download job (per generation: the job file upstream's manager and UI read,
/// its progress as `<label>: NN%`, and a cancel set on it by any process). A file already there
/// with the target's size and SHA-256 (another manager's verified install) is kept and nothing
/// is fetched: `Ok(None)`. Nothing is recorded: the caller records the verification and the
/// effect.
pub fn install_target(
    device: &Device,
    dl: &Downloader,
    target: &downloader::Target,
    label: &str,
    cancel: &CancelToken,
    progress: ProgressFn,
) -> Result<Option<Installed>> {
    if variant_in_place(device, target) {
        return Ok(None);
    }
    let artifact = within_budget(device, target)?;
    let percent = PercentFilter::default();
    // For the finished transfer's log line: when it started, the origins tried, the bytes
    // already staged when this run first reported.
    let started = std::time::Instant::now();
    let origins = std::sync::Mutex::new(Vec::<String>::new());
    let first_done = std::sync::Mutex::new(None::<u64>);
    (device.effects).create_dir(&device.files().artifact_dir(&target.id))?;
    let on_event = |e: Event, publish: Publish| match e {
        Event::Origin { origin } => lock(&origins).push(origin_name(&origin).to_string()),
        Event::Progress { done, total } => {
            lock(&first_done).get_or_insert(done);
            if let Some(pct) = percent.advance(done, total) {
                progress(&Progress::Percent(Transferred { done, total }));
                publish(&format!("{label}: {pct}%"));
            }
        }
        Event::Verifying => progress(&Progress::Verifying),
        Event::Fetched { bytes, .. } => count_fetched(device, &artifact, target, bytes),
        _ => {}
    };
    let standard = crate::state::layout::Variant::Standard;
    download_in_layout(device, dl, target, standard, cancel, &on_event).map(|installed| {
        let origin = origin_name(&installed.origin).to_string();
        let mut after = origins.into_inner().unwrap_or_else(|p| p.into_inner());
        after.retain(|o| *o != origin);
        after.dedup();
        let staged = first_done.into_inner().unwrap_or_else(|p| p.into_inner());
        progress(&Progress::Fetched(crate::report::progress::Fetched {
            what: target.id.to_string(),
            size: installed.size,
            moved: installed.size - staged.unwrap_or(0).min(installed.size),
            took: started.elapsed(),
            origin,
            after,
        }));
        Some(installed)
    })
}

/// An origin's name, `Hugging Face`, from how the downloader shows it (`Hugging Face (<base>)`).
fn origin_name(shown: &str) -> &str {
    shown.split_once(" (").map_or(shown, |(name, _)| name)
}

/// With a ready external GPU, a model's accelerator build (the contract's: v25
/// `<id>_driving_chestnut_tinygrad.pkl`, v26 `<gen>/<id>/<id>_driving_amd_tinygrad.pkl`) is
/// fetched beside it, unless the same file is already there and verifies.
fn install_variant(
    device: &Device,
    dl: &Downloader,
    target: &downloader::Target,
    cancel: &CancelToken,
) -> Result<()> {
    if variant_in_place(device, target) {
        return Ok(());
    }
    if device.effects().is_plan() {
        return device.effects().installed(target.local_name.as_str());
    }
    let artifact = within_budget(device, target)?;
    let on_event = |e: Event, _: Publish| {
        if let Event::Fetched { bytes, .. } = e {
            count_fetched(device, &artifact, target, bytes)
        }
    };
    let accelerator = crate::state::layout::Variant::Accelerator;
    download_in_layout(device, dl, target, accelerator, cancel, &on_event)?;
    device.effects().installed(target.local_name.as_str())
}

/// A download job's publisher of progress texts (`DeviceFiles::under_job`).
type Publish<'a> = &'a (dyn Fn(&str) + Sync);

/// Download `target` (`variant`) into its directory under the layout's job; `on_event` gets
/// each event and the job's progress publisher. The staging directory is tidied after.
fn download_in_layout(
    device: &Device,
    dl: &Downloader,
    target: &downloader::Target,
    variant: crate::state::layout::Variant,
    cancel: &CancelToken,
    on_event: &(dyn Fn(Event, Publish) + Sync),
) -> Result<Installed> {
    let files = device.files();
    let dir = files.artifact_dir(&target.id);
    let installed = files.under_job(
        target.id.as_str(),
        variant,
        false,
        cancel,
        |cancel, publish| {
            let generation = device.config.generation;
            Ok(dl.download_target(generation, target, &dir, cancel, &|e| on_event(e, publish))?)
        },
    )?;
    files.tidy_staging(&dir);
    Ok(installed)
}

/// The ledger's name for `target` (its path under the models directory), once the daily budget
/// allows a transfer of it: on a device held to a budget (the daemon's automatic refresh), a
/// transfer that could take today's count past it is not started ([`Error::HeldBack`]).
fn within_budget(device: &Device, target: &downloader::Target) -> Result<String> {
    let artifact = artifact_name(device, target);
    if let (Some(budget), Some(size)) = (device.budget, target.size) {
        let today = crate::rules::budget::today();
        let spent = crate::rules::budget::read(&device.models_dir(), today).spent(&artifact);
        if let Some(held) = crate::rules::budget::hold(&artifact, spent, size, budget, today) {
            return Err(Error::HeldBack(held));
        }
    }
    Ok(artifact)
}

/// `target`'s name in the daily ledger: its path under the models directory, under the
/// generation it is of (`v25/<id>_driving_tinygrad.pkl`, `v26/<id>/…`).
fn artifact_name(device: &Device, target: &downloader::Target) -> String {
    let rel = device.files().models_relative(&target_path(device, target));
    // A flat layout gives every generation's build of a model the same file name: the ledger
    // names the generation too, so the bytes of the generation moved from are not counted
    // against the new generation's artifact.
    let generation = device.config.generation.to_string();
    if rel.starts_with(&format!("{generation}/")) {
        rel
    } else {
        format!("{generation}/{rel}")
    }
}

/// Count bytes fetched of `target` in the daily ledger (not in a planned run). A ledger that
/// cannot be written is not a reason to stop a download: the count is best effort, and
/// `status` says when it is unknown.
fn count_fetched(device: &Device, artifact: &str, target: &downloader::Target, bytes: u64) {
    if device.effects().is_plan() {
        return;
    }
    let size = target.size.unwrap_or(bytes);
    let _ = crate::rules::budget::count(
        &device.models_dir(),
        artifact,
        size,
        bytes,
        crate::rules::budget::today(),
    );
}

/// Whether a model's Chestnut build is there and matches its digest (then it is not fetched).
pub(crate) fn variant_in_place(device: &Device, target: &downloader::Target) -> bool {
    let path = target_path(device, target);
    // Purged earlier in a planned run: not there any more.
    device.effects().exists(&path)
        && target.sha256.is_some_and(|want| {
            chunker::Sha256Digest::of_file(&path)
                .is_ok_and(|(got, size)| got == want && target.size.is_none_or(|s| s == size))
        })
}

/// An entry's artifact and its accelerator build, those that make a download target on a
/// device of `contract` (its artifact format and accelerator rule).
pub(crate) fn entry_targets(
    e: &ModelEntry,
    contract: &'static manifest::Contract,
) -> Vec<downloader::Target> {
    let variant = downloader::Target::accelerator_variant(e, contract)
        .ok()
        .flatten();
    (downloader::Target::from_entry_for(e, contract)
        .ok()
        .into_iter())
    .chain(variant)
    .collect()
}

/// Where `target` is installed on `device`.
fn target_path(device: &Device, target: &downloader::Target) -> std::path::PathBuf {
    let dir = device.files().artifact_dir(&target.id);
    dir.join(target.local_name.as_str())
}

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
        let mut last = lock(&self.0);
        if last.is_some_and(|prev| pct <= prev) {
            return None;
        }
        *last = Some(pct);
        Some(pct)
    }
}

/// What `gc` removed, as `gc --json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct GcReport {
    pub removed: Vec<String>,
}

/// What `gc` would remove (`gc` on [`Device::planning`]), as `gc --dry-run --json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct GcPlan {
    /// Always true: `"dry_run": true` leads its `--json`.
    pub dry_run: bool,
    pub would_remove: Vec<String>,
}

/// `gc`: remove stray temporaries and artifacts of models not in the catalog; never `local-*`,
/// and never a Python temporary while a Python download may be using it
/// (`plan::python_temps_to_remove`: none is open and none was written in the last 15 min).
/// On [`Device::planning`] it is `gc --dry-run`.
pub fn gc(device: &Device) -> Result<Vec<String>> {
    let catalog = device.require_catalog()?;
    let ids: BTreeSet<String> = catalog.ids().map(|i| i.to_string()).collect();
    let dir = device.models_dir();
    let names: Vec<String> = fs::read_dir(&dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    let temps: Vec<plan::PythonTemp> = names
        .iter()
        .filter(|n| plan::is_python_temp(n))
        .map(|n| python_temp(&dir, n))
        .collect();
    let removable = plan::python_temps_to_remove(&temps);
    let mut plan = plan::gc_plan(names.iter().map(String::as_str), &ids, &removable);
    for name in &plan {
        device.effects().collect(&dir, name)?;
    }
    device.effects().sync(&dir)?;
    plan.extend(gc_staging(device, &catalog)?);
    Ok(plan)
}

/// `gc` of the staging directories: in each one the layout downloads into
/// (`DeviceFiles::staging_parents`: `<models>`, or every model's directory under `<gen>/`),
/// staged files and records no plan of `catalog` can use (`downloader::unusable_staged`:
/// another digest, a model gone); per generation also every staged file and record of v25's
/// `<models>/.starpilot-staging`, which it no longer downloads into. Named relative to
/// `<models>` (`.starpilot-staging/<name>`, `v26/<id>/.starpilot-staging/<name>`); removed
/// unless on [`Device::planning`].
fn gc_staging(device: &Device, catalog: &manifest::Manifest) -> Result<Vec<String>> {
    let targets: Vec<downloader::Target> = (catalog.models().iter())
        .flat_map(|e| entry_targets(e, device.contract()))
        .collect();
    let hexes: Vec<Option<String>> = targets
        .iter()
        .map(|t| t.sha256.map(|d| d.to_hex()))
        .collect();
    let usable: Vec<downloader::Usable<'_>> = targets
        .iter()
        .zip(&hexes)
        .map(|(t, h)| downloader::Usable {
            local_name: t.local_name.as_str(),
            sha256_hex: h.as_deref(),
        })
        .collect();
    let files = device.files();
    let plan = device.effects().is_plan();
    // The staging directories this layout downloads into keep what a download may resume; one
    // it no longer downloads into (v25's, on a per-generation device) keeps nothing.
    let dirs = (files
        .staging_parents()
        .into_iter()
        .map(|d| (d, &usable[..])))
    .chain(files.retired_staging_parent().map(|d| (d, &[][..])));
    let mut removed = Vec::new();
    for (dir, usable) in dirs {
        let staging = dir.join(downloader::STAGING_DIR);
        for n in downloader::collect_unusable(&dir, usable, plan)? {
            removed.push(files.models_relative(&staging.join(n)));
        }
        // An emptied staging directory goes, as after an install.
        if !plan {
            files.tidy_staging(&dir);
        }
    }
    Ok(removed)
}

/// A Python temporary as `gc` sees it: its age from its mtime, and whether a process holds it
/// open (any `/proc/<pid>/fd/*` that links to it).
fn python_temp(dir: &std::path::Path, name: &str) -> plan::PythonTemp {
    let path = dir.join(name);
    let age = std::fs::symlink_metadata(&path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| std::time::SystemTime::now().duration_since(t).ok());
    plan::PythonTemp {
        name: name.to_string(),
        age,
        open: open_by_any_process(&path),
    }
}

/// Whether any process has `path` open, from `/proc/*/fd`. Processes whose descriptors cannot
/// be read (another user's, without privilege) are not seen: the age rule still protects a
/// download in flight (`plan::python_temps_to_remove`).
fn open_by_any_process(path: &std::path::Path) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    procs.flatten().any(|p| {
        let is_pid = p
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
        is_pid
            && std::fs::read_dir(p.path().join("fd")).is_ok_and(|fds| {
                fds.flatten()
                    .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == path))
            })
    })
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
