//! `refresh --dry-run`: the refresh itself in plan mode ([`Device::planning`]): the same reads
//! and checks (onroad, the manifest fetch and its signature, the catalog, the installed models),
//! the same decisions, every effect logged and skipped, later reads seeing the planned values,
//! downloads assumed to succeed. The plan is read off the typed log, so it cannot drift from the
//! run. `download --dry-run` is [`crate::run::downloads::plan`].

use manifest::ModelId;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::rules::choice::CHOICE_FILE;
use crate::rules::plan::InstallStep;
use crate::run::manager::{Run, failed_fetch};
use crate::state::device::{
    CATALOG_FILE, CATALOG_SIGNATURE_FILE, Device, JOURNAL_FILE, REFUSED_FILE,
};
use crate::state::device::{RefusedModel, VerifyState};
pub use crate::state::effects::ParamChange;
use crate::state::effects::{Changes, Effect};
use crate::state::journal::read_journal;
use crate::state::trust_state as trust;

pub use crate::run::downloads::{
    Action, DownloadPlanReport, ModelDownload, Planned, plan as download,
};

/// What `refresh` would do, as `refresh --dry-run --json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RefreshPlan {
    /// Always true: `"dry_run": true` leads its `--json`.
    pub dry_run: bool,
    pub generation: String,
    pub manifest_origin: String,
    pub manifest_url: String,
    pub models: usize,
    pub refused_entries: Vec<RefusedModel>,
    /// A migration would start or resume, from `migrated_from` (as the param says it).
    pub migrating: bool,
    pub migrated_from: Option<String>,
    pub would_purge: Vec<String>,
    /// Catalog models the run would download, with the state of what is installed now.
    pub would_download: Vec<PlannedDownload>,
    /// Installed and verified: kept.
    pub would_keep: Vec<ModelId>,
    /// Their retry is not due yet: skipped.
    pub not_due: Vec<ModelId>,
    /// GPU-only models not fetched: no Chestnut is ready.
    pub needs_chestnut: Vec<ModelId>,
    pub selected: ModelId,
    pub fell_back_to_builtin: bool,
    /// State files of the models directory whose bytes would change (or appear).
    pub would_write: Vec<String>,
    pub would_remove: Vec<String>,
    pub would_set_params: Vec<ParamChange>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlannedDownload {
    pub id: ModelId,
    pub installed: VerifyState,
}

/// The dry run of [`crate::refresh`] `by` (the `refresh` command's is
/// [`crate::rules::choice::Caller::Person`]: no retry waits for its backoff). Errors are the real run's; [`refresh_failure`] says what it
/// writes then.
pub fn refresh(device: &Device, by: &Run) -> Result<RefreshPlan> {
    let plan = device.planning();
    let r = crate::run::manager::refresh(&plan, by)?;
    let run = &r.went_through;
    let (would_write, would_remove, would_set_params) = changes(device, &plan)?;
    let steps = |want: InstallStep| run.steps.iter().filter(move |s| s.2 == want);
    let ids = |want| steps(want).map(|s| s.0.clone()).collect();
    let would_download = steps(InstallStep::Fetch).map(|(id, installed, _)| PlannedDownload {
        id: id.clone(),
        installed: *installed,
    });
    Ok(RefreshPlan {
        dry_run: true,
        generation: r.generation.to_string(),
        manifest_origin: r.manifest_origin,
        manifest_url: run.manifest_url.clone(),
        models: r.models,
        refused_entries: r.refused_entries,
        migrating: run.journal.is_some(),
        migrated_from: run.journal.as_ref().and_then(|j| j.from.clone()),
        would_purge: r.purged,
        would_download: would_download.collect(),
        would_keep: ids(InstallStep::Keep),
        not_due: ids(InstallStep::Wait),
        needs_chestnut: ids(InstallStep::NeedsChestnut),
        selected: r.selected,
        fell_back_to_builtin: r.fell_back_to_builtin,
        would_write,
        would_remove,
        would_set_params,
    })
}

/// What a refresh whose manifest fetch failed writes before it returns the error.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailedRefreshPlan {
    /// `Some(from)`: the offline first boot would start (or carry on with) the migration.
    pub migrate_from: Option<Option<String>>,
    pub would_purge: Vec<String>,
    pub would_write: Vec<String>,
    pub would_set_params: Vec<ParamChange>,
}

impl FailedRefreshPlan {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// What `refresh` writes when its fetch fails with `e`: the real failure tail
/// (`manager::failed_fetch`: the refusal report, the offline first boot) in plan mode.
pub fn refresh_failure(device: &Device, e: &Error) -> Result<FailedRefreshPlan> {
    let plan = device.planning();
    failed_fetch(&plan, e)?;
    let log = plan.effects().effects();
    let journaled = log
        .iter()
        .any(|e| matches!(e, Effect::WriteFile { name, .. } if name == JOURNAL_FILE));
    let (would_write, _, would_set_params) = changes(device, &plan)?;
    Ok(FailedRefreshPlan {
        migrate_from: match journaled {
            true => read_journal(&plan)?.map(|j| j.from),
            false => None,
        },
        would_purge: (log.into_iter())
            .filter_map(|e| match e {
                Effect::Purge { name } => Some(name),
                _ => None,
            })
            .collect(),
        would_write,
        would_set_params,
    })
}

/// [`Device::planned_changes`], the files written in the order the trust, catalog, journal and
/// choice files are stored, then the caches.
fn changes(device: &Device, plan: &Device) -> Result<Changes> {
    const ORDER: [&str; 7] = [
        trust::ACCEPTED_RELEASE_FILE,
        trust::REFUSED_MANIFEST_FILE,
        CATALOG_FILE,
        CATALOG_SIGNATURE_FILE,
        REFUSED_FILE,
        JOURNAL_FILE,
        CHOICE_FILE,
    ];
    let mut c = plan.planned_changes(device)?;
    c.0.sort_by_key(|n| ORDER.iter().position(|o| o == n).unwrap_or(ORDER.len()));
    Ok(c)
}
