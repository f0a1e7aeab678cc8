//! The decisions of `refresh` and `download`, taken from what was read: the real runs
//! (`manager`) act on them in their crash-safe order, the dry runs (`preview`) report them, so
//! the two cannot disagree. Apart from the reads they are given, they change nothing.

use std::collections::{BTreeMap, BTreeSet};

use manifest::{Generation, Manifest, ModelEntry, ModelId};

use crate::error::{Error, Result};
use crate::rules::choice::{self, Fate, Slots};
use crate::rules::contract::{self, BigProfile, Catalog, ModelKind, Outcome, Wanted};
use crate::rules::plan::{self, InstallStep, VerifyState};
use crate::state::journal::{Journal, journal_step, wanted_of};
use crate::state::view::DeviceView;

/// The journal a refresh goes on with ([`contract::start`] over `view`'s journal and
/// `ModelManifestVersion`), and whether it must be written first. `stored`: the layout's own
/// selection store (`Device::stored_slots`), which a migration keeps over the params.
pub(crate) fn journal_now(
    view: &DeviceView,
    catalog: &Catalog,
    stored: Option<Slots>,
) -> Result<(Option<Journal>, bool)> {
    let start = contract::start(
        view.journal().map(|j| j.to.to_string()).as_deref(),
        view.previous(),
        &view.generation.to_string(),
    );
    let remembered = || Ok(stored.unwrap_or_else(|| view.remembered()));
    journal_step(
        start,
        view.journal().cloned(),
        view.generation,
        catalog,
        remembered,
    )
}

/// What the user chose, and what the device wants for it under the catalog's rules: the
/// journal's record during a migration (the params say the built-in then), else the params
/// (`slots_now`) with `.choice.json` filling slots still in a fallback.
pub(crate) fn chosen(
    journal: Option<&Journal>,
    record: Option<&choice::Choice>,
    slots_now: &Slots,
    catalog: &Catalog,
) -> (Slots, Wanted) {
    match journal {
        Some(j) => (j.slots(), j.wanted(catalog)),
        None => {
            let raw = choice::remember(record, slots_now);
            let wanted = wanted_of(&raw, catalog);
            (raw, wanted)
        }
    }
}

/// What the installs of a refresh came to, per wanted catalog model.
#[derive(Debug, Default)]
pub(crate) struct Installs {
    /// Verified: kept, or installed now.
    pub ok: BTreeSet<ModelId>,
    /// A verified copy of an earlier publish is there.
    pub old_copy: BTreeSet<ModelId>,
    /// Not had this time, and why.
    pub failed: BTreeMap<ModelId, choice::Failure>,
    /// GPU-only models not fetched because no Chestnut is ready ([`InstallStep::NeedsChestnut`]):
    /// no failure is counted, a big profile naming one is kept.
    pub needs_chestnut: BTreeSet<ModelId>,
}

impl Installs {
    /// [`plan::refresh_step`] for one wanted catalog model, recorded: a kept model is ok, one
    /// whose retry is not due failed without an attempt, a GPU-only model without a ready
    /// Chestnut waits for one, an outdated copy is noted.
    pub fn step(
        &mut self,
        entry: &ModelEntry,
        state: VerifyState,
        retry: Option<&choice::Retry>,
        chestnut: downloader::egpu::Chestnut,
        now_unix: u64,
        caller: choice::Caller,
    ) -> InstallStep {
        let id = entry.id();
        if state == VerifyState::Outdated {
            self.old_copy.insert(id.clone());
        }
        let step = plan::refresh_step(
            state,
            choice::due(retry, now_unix, caller),
            entry.uses_external_gpu(),
            chestnut,
        );
        match step {
            InstallStep::NeedsChestnut => {
                self.needs_chestnut.insert(id.clone());
            }
            InstallStep::Keep => {
                self.ok.insert(id.clone());
            }
            InstallStep::Wait => {
                let reason = retry.map(|r| r.reason.clone()).unwrap_or_default();
                self.failed
                    .insert(id.clone(), choice::Failure::NotTried(reason));
            }
            InstallStep::Fetch => {}
        }
        step
    }
}

/// Where a refresh ends, from what its installs came to: each wanted model's fate, what is
/// written (`contract::decide`, held while driving when `onroad_slots`, the params then, are
/// given) and the remembered choice after it.
pub(crate) struct Settled {
    pub fates: BTreeMap<ModelId, Fate>,
    pub outcome: Outcome,
    pub next: choice::Choice,
}

pub(crate) fn settle(
    (raw, wanted): (&Slots, &Wanted),
    catalog: &Catalog,
    installs: &Installs,
    local_present: &dyn Fn(&ModelId) -> bool,
    record: Option<&choice::Choice>,
    onroad_slots: Option<&Slots>,
    now_unix: u64,
) -> Settled {
    let available = |id: &ModelId| match contract::kind(id) {
        ModelKind::BuiltIn => true,
        ModelKind::Catalog => installs.ok.contains(id) || installs.old_copy.contains(id),
        ModelKind::Local => local_present(id),
    };
    // A big profile naming a GPU-only model that waits for a Chestnut is kept (modeld loads the
    // big profile only with a ready Chestnut, and the first refresh with one fetches it).
    let kept_big = |id: &ModelId| installs.needs_chestnut.contains(id);
    let mut fates: BTreeMap<ModelId, Fate> = BTreeMap::new();
    for id in wanted.all() {
        let waits = installs.needs_chestnut.contains(&id);
        let f = match (waits, &wanted.profiles.big) {
            // Kept in its slot: nothing to retry.
            (true, BigProfile::Model(b)) if *b == id && id != wanted.selection => Fate::Ok,
            // The selection stands in as the built-in until a Chestnut is ready.
            (true, _) => Fate::Temporary(choice::Failure::NotTried(
                downloader::egpu::EXTERNAL_GPU_REQUIRED.to_string(),
            )),
            (false, _) => choice::fate(
                &id,
                catalog,
                available(&id),
                installs.old_copy.contains(&id),
                installs.failed.get(&id).cloned(),
            ),
        };
        fates.insert(id, f);
    }
    let mut outcome = contract::decide(wanted, catalog, &available, &kept_big);
    if let Some(slots_now) = onroad_slots {
        outcome = choice::hold_onroad(outcome, slots_now, record, catalog);
    }
    let written = choice::written_slots(&outcome);
    let mut next = choice::after_refresh(record, raw, wanted, &fates, &written, now_unix);
    // Waiting for a Chestnut is not a failure: no backoff, the first refresh with one fetches.
    next.retry
        .retain(|id, _| !installs.needs_chestnut.iter().any(|w| w.as_str() == id));
    Settled {
        fates,
        outcome,
        next,
    }
}

/// What `manager::write_contract` writes, in its order: the params (`None`: removed), then the files
/// of the models directory with their bytes.
pub(crate) type ContractWrites = (
    Vec<(&'static str, Option<String>)>,
    Vec<(&'static str, Vec<u8>)>,
);

pub(crate) fn contract_writes(catalog: &Catalog, outcome: &Outcome) -> ContractWrites {
    let mut params = contract::selection_writes(outcome);
    params.extend(catalog.params().into_iter().map(|(k, v)| (k, Some(v))));
    let files = catalog
        .caches()
        .into_iter()
        // Python's default `json.dumps` layout, no trailing newline, as upstream writes them.
        .map(|(name, body)| (name, crate::rules::shape::dumps(&body).into_bytes()))
        .collect();
    (params, files)
}

/// What `download <ID>` is asked for, canonical (upstream canonicalises the requested key
/// first: `sc`→`sc2`, `napv4`→`remove-avgpoolv4`).
pub(crate) enum Requested {
    /// Nothing to download.
    BuiltIn(ModelId),
    /// Nothing to download.
    Local(ModelId),
    Catalog(ModelEntry),
}

/// The model `download <ID>` works on; a catalog model must be in the stored `catalog` (read
/// only then).
pub(crate) fn requested(
    id: &ModelId,
    generation: Generation,
    catalog: impl FnOnce() -> Result<Manifest>,
) -> Result<Requested> {
    let canonical = contract::canonicalise(id);
    if contract::is_builtin_id(canonical.as_str()) {
        return Ok(Requested::BuiltIn(canonical));
    }
    if canonical.is_local() {
        return Ok(Requested::Local(canonical));
    }
    let entry = catalog()?
        .get(&canonical)
        .cloned()
        .ok_or_else(|| Error::UnknownModel {
            id: canonical.to_string(),
            generation: generation.to_string(),
        })?;
    Ok(Requested::Catalog(entry))
}

/// A GPU-only model needs a ready Chestnut, unless the one-request override is set (`allow`).
pub(crate) fn gpu_rule(
    entry: &ModelEntry,
    chestnut: downloader::egpu::Chestnut,
    allow: bool,
) -> Result<()> {
    downloader::egpu::single_download(entry.uses_external_gpu(), chestnut, allow).map_err(|_| {
        Error::ExternalGpuRequired {
            id: entry.id().to_string(),
        }
    })
}
